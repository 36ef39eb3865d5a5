"""`bench run --cluster ray` on a real multi-node Ray cluster on this machine (ray.cluster_utils.Cluster:
a head and two more raylets, each its own node with its own resources): a fleet spread over the nodes
passes through per-node Zenoh routers and site proxies, a kill -9 of a replica on another node is
survived, and a node, or a node's router, that dies mid-run ends the run with exit 2 naming the node
instead of hanging."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is the optional `cluster` extra")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]

SCENARIO = """\
name: cluster_probe
duration_s: {duration}
warmup_s: 3
seed: 3
fleet:
  groups:
    - name: lab
      robot: reacher
      count: 4
      fps: 30
      site: lab
      engine: {{buffer_time_s: 0.4, max_action_age_s: 1.0, fallback: hold, trim: consumed, max_offline_s: 30,
                reconnect_max_backoff_s: 1.0}}
sites:
  lab: {{profile: lan, overrides: {{latency.latency: 2}}}}  # a toxic, so the proxies' legs count chunks
servers:
  replicas:
    - {{id: r0, checkpoint: reacher, max_sessions: 8}}
cluster: {{placement: spread, shard_cpus: 1, replica_cpus: 1{routers}}}
faults: {faults}
assertions:
  - dead_robots == 0
  - staleness_violations == 0
{extra}
"""


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    workers = [c.add_node(num_cpus=1), c.add_node(num_cpus=1)]
    c.wait_for_nodes()
    try:
        yield c, workers
    finally:
        c.shutdown()


def _run(
    cluster_address: str,
    tmp_path: Path,
    *,
    duration=8,
    faults="[]",
    extra="",
    routers="",
    timeout=240,
    while_running=None,
    env_extra: dict | None = None,
) -> tuple[int, str, dict | None]:
    path = tmp_path / "cluster_probe.yaml"
    path.write_text(
        SCENARIO.format(
            duration=duration, faults=faults, extra=extra, routers=f", routers: {routers}" if routers else ""
        )
    )
    env = dict(os.environ, RAY_ADDRESS=cluster_address, PYTHONPATH=str(ROOT), MUJOCO_GL="egl", **(env_extra or {}))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.cli",
            "run",
            str(path),
            "--cluster",
            "ray",
            "--quiet",
            "--reports",
            str(tmp_path / "reports"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
    if while_running is not None:
        while_running(tmp_path / "reports")
    out, _ = proc.communicate(timeout=timeout)
    summaries = sorted((tmp_path / "reports").glob("cluster_probe/*/summary.json"))
    return proc.returncode, out, json.loads(summaries[-1].read_text()) if summaries else None


def test_a_fleet_spread_over_three_nodes_passes_through_per_node_routers_and_the_summary_names_them(cluster, tmp_path):
    """The shard on one node reaches the replica on another through its node's proxy and router, the driver's
    router and the replica's node router; a partition of the site reaches the node's copy of the proxy."""
    c, _ = cluster
    # as if on other hosts: the children's CPU is read on their nodes through their actors (BENCH_TEST_CPU_REMOTE),
    # the shard's clock reads 5 s ahead of the driver's and the replica's node's 3 s behind
    rc, out, summary = _run(
        c.address,
        tmp_path,
        faults="[{at: 2, target: 'site:lab', action: partition, duration: 2}]",
        extra="  - unrecovered_robots == 0",
        env_extra={"BENCH_TEST_CPU_REMOTE": "1", "BENCH_TEST_MONO_SKEW_S": "5", "BENCH_TEST_REPLICA_MONO_SKEW_S": "-3"},
    )
    assert rc == 0, out
    facts = summary["cluster"]
    assert facts["kind"] == "ray" and facts["node_count"] == 3 and facts["placement"] == "spread"
    assert facts["routers"] == "per_node"
    placed = {
        child: n["node_id"]
        for n in facts["nodes"]
        for child in n["children"]
        if child.startswith(("shard:", "server:"))
    }
    assert set(placed) == {"shard:0", "server:r0"}
    assert placed["shard:0"] != placed["server:r0"], "spread put the shard and the replica on one node"
    nodes = {n["node_id"]: n for n in facts["nodes"]}
    with_router = {i for i, n in nodes.items() if "router" in n}
    assert with_router == set(placed.values()), "one router on each node that hosts a child, none elsewhere"
    first, second = sorted((nodes[i] for i in with_router), key=lambda n: len(n["router"]["peers"]))
    assert (first["router"]["peers"], second["router"]["peers"]) == ([], [first["router"]["endpoint"]]), (
        "the second node router joins the first (the mesh), not only the hub"
    )
    shard_node, replica_node = nodes[placed["shard:0"]], nodes[placed["server:r0"]]
    assert "chaos_proxy" in shard_node and "chaos_proxy" not in replica_node  # site proxies where robots are
    # 4 robots on a 1-CPU node: one proxy process (bench.run.sizing.node_proxy_processes), the site on it
    assert (shard_node["chaos_proxy"]["processes"], shard_node["chaos_proxy"]["site_process"]) == (1, {"lab": 0})
    assert shard_node["router"]["endpoint"] != replica_node["router"]["endpoint"]
    run_dir = next((tmp_path / "reports").glob("cluster_probe/*/"))
    spec = json.loads((run_dir / "manifests" / "shard-0.json").read_text())
    assert {r["engine"]["connect_endpoints"][0] for r in spec["robots"]} == {shard_node["chaos_proxy"]["sites"]["lab"]}
    manifest = (run_dir / "manifests" / "r0.yaml").read_text()
    assert replica_node["router"]["endpoint"] in manifest  # the replica joined its own node's router
    assert summary["figures"]["ticks"] > 0 and any((tmp_path / "reports").rglob("robots.parquet"))
    import pyarrow.parquet as pq

    t = pq.read_table(run_dir / "transitions.parquet").to_pydict()
    cut = [ti for ti, to in zip(t["t"], t["to_state"]) if to == "RECONNECTING" and 2.0 <= ti <= 5.0]
    assert cut, "the partition did not reach the robots' proxy on their node"
    # the legs are summed over every copy of the site's proxy: only the node's carried the robots' bytes
    assert any(leg["chunks"] > 0 for leg in summary["fidelity"]["legs"]), summary["fidelity"]["legs"]
    # every child's clock was measured: the shard's over its TCP control link, the replica's node's through its actor
    clock = summary["clock"]
    shard, replica = clock["children"]["shard:0"], clock["children"]["server:r0"]
    assert abs(shard["offset_ms"] - 5000) <= shard["uncertainty_ms"] + 1e-3 and not shard["same_clock"], clock
    assert abs(replica["offset_ms"] + 3000) <= replica["uncertainty_ms"] + 1e-3 and not replica["same_clock"], clock
    # the split across the clocks (8 s apart): right, or left out where ±(both uncertainties) is too much for a
    # LAN hop of ~1 ms, and the report says so; never 8 s off
    up, net = summary["figures"]["uplink_ms"], summary["figures"]["network_ms"]
    split = clock["hop_split"]
    assert (
        split["valid"] == (split["requests_dropped"] == 0)
        and up["count"] + split["requests_dropped"] >= net["count"] * 0.9
    )
    assert up["count"] == 0 or 0 < up["p50"] <= net["p50"] + 1.0, (up, net)
    # the hops split at the router too: each node's wall clock (a router stamps with it) measured through its actors
    # (this host's here: exactly 0); the parts add up to the hop wherever the hop is split
    walls, at_router = clock["node_walls"], clock["router_split"]
    assert set(walls) == set(placed.values()) and all(w["same_clock"] for w in walls.values()), walls
    assert at_router["valid"] and at_router["clock_error_ms"] == 0, at_router
    req = pq.read_table(run_dir / "requests.parquet").to_pydict()
    from_router = [v for v in req["downlink_from_router_ms"] if v is not None and v == v]
    assert len(from_router) >= 0.9 * net["count"] and min(from_router) > 0, (len(from_router), net["count"])
    parts = [
        (u, a, b)
        for u, a, b in zip(req["uplink_ms"], req["uplink_to_router_ms"], req["uplink_from_router_ms"])
        if u is not None and u == u
    ]
    assert all(abs(a + b - u) < 0.01 for u, a, b in parts), parts[:5]
    # the robot side, bounded by the shard's node's copy of its site's proxy around each request's time (its maxima
    # by 100 ms on that node's clock)
    sites = summary["fidelity"]["bench_share"]["downlink_from_router_ms"]["sites"]
    assert list(sites) == [f"lab@{placed['shard:0'][:12]}"] and all(v["asked_by_time"] for v in sites.values()), sites
    # the replica's audit times were moved onto the driver's clock: they fall in the run's window there
    t0_ms = json.loads((run_dir / "clock.json").read_text())["t0_mono_ms"]
    received = [
        v for v in pq.read_table(run_dir / "server_requests.parquet").column("received_mono_ms").to_pylist() if v
    ]
    assert received and t0_ms - 3_500 <= min(received) and max(received) <= t0_ms + 8_500, (t0_ms, min(received))
    cpu = summary["cpu"]  # every process on a node, its router and proxy too, read there and named with it
    remote = {"shard:0", "server:r0", *(n for n in cpu["node_of"] if n.startswith(("router:", "chaos-proxy:")))}
    assert set(cpu["node_of"]) == remote and len(remote) == 5 and cpu["split"]["shard:0"] > 0, cpu
    assert cpu["node_of"]["chaos-proxy:" + placed["shard:0"][:12]] == cpu["node_of"]["shard:0"], cpu["node_of"]
    assert {p for n in cpu["nodes"].values() for p in n["processes"]} == remote
    assert all(n["samples"] > 0 and 0 <= n["host_percent"] <= 100 for n in cpu["nodes"].values()), cpu["nodes"]


def test_an_mtls_fleet_spread_over_the_nodes_passes_through_per_node_routers_with_their_own_certificates(
    cluster, tmp_path
):
    """security: mtls with per-node routers (the default): every link is TLS, each node router has its own
    certificate and enforces the run's access rules, robots reach their node's router through its proxy."""
    c, _ = cluster
    rc, out, summary = _run(c.address, tmp_path, duration=6, extra="security: mtls")
    assert rc == 0, out
    facts = summary["cluster"]
    assert facts["routers"] == "per_node"
    routed = {n["node_id"]: n for n in facts["nodes"] if "router" in n}
    assert len(routed) == 2 and all(n["router"]["endpoint"].startswith("tls/") for n in routed.values()), routed
    run_dir = next((tmp_path / "reports").glob("cluster_probe/*/"))
    from cryptography import x509

    for node_id, n in routed.items():  # its own key; CN the role the rules admit as a peer, its node in the SAN
        cert_path = run_dir / "pki" / f"router-{node_id[:12]}.pem"
        assert n["router"]["certificate"] == str(cert_path)
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        assert cert.subject.rfc4514_string() == "CN=node-router"
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert f"{node_id[:12]}.node.invalid" in sans.get_values_for_type(x509.DNSName)
    assert sorted(len(n["router"]["peers"]) for n in routed.values()) == [0, 1]  # meshed over mTLS too
    rules_path = run_dir / "router-access-control.json"  # the hub's, and every node router's
    assert {n["router"]["access_rules"] for n in routed.values()} == {str(rules_path)}
    rules = json.loads(rules_path.read_text())["access_control"]
    peers = {cn for s in rules["subjects"] if s["id"].startswith("peer-") for cn in s["cert_common_names"]}
    assert peers == {"router", "node-router"}
    (shard_node,) = [n for n in routed.values() if "chaos_proxy" in n]
    spec = json.loads((run_dir / "manifests" / "shard-0.json").read_text())
    assert {r["engine"]["connect_endpoints"][0] for r in spec["robots"]} == {shard_node["chaos_proxy"]["sites"]["lab"]}
    assert shard_node["chaos_proxy"]["sites"]["lab"].startswith("tls/")  # TLS through the node's TCP proxy
    assert summary["figures"]["ticks"] > 0


def test_with_the_driver_s_router_the_hops_are_split_and_the_robot_side_read_by_100_ms(cluster, tmp_path):
    """`routers: driver`: every link crosses to the hub, which stamps both ways (this host's wall clock), and the
    robots cross the driver's site proxies, whose maxima by 100 ms are on this host's clock."""
    c, _ = cluster
    rc, out, summary = _run(c.address, tmp_path, routers="driver")
    assert rc == 0, out
    assert summary["cluster"]["routers"] == "driver" and not any("router" in n for n in summary["cluster"]["nodes"])
    assert summary["clock"]["router_split"]["valid"], summary["clock"]
    share = summary["fidelity"]["bench_share"]
    for hop in ("uplink_to_router_ms", "downlink_from_router_ms"):
        assert set(share[hop]["sites"]) == {"lab"} and share[hop]["sites"]["lab"]["asked_by_time"], share[hop]
    for hop in ("uplink_from_router_ms", "downlink_to_router_ms"):
        assert share[hop]["requests_measured"] > 0.9, share[hop]


def test_a_replica_killed_on_another_node_is_restarted_there_and_the_fleet_recovers(cluster, tmp_path):
    """Then a `router` restart, which restarts every router: the driver's and each node's, on its node. Then the
    driver's router alone killed for 3 s (`router:hub`): the node routers' direct link carries the robots' requests
    to the replica meanwhile, so no robot notices."""
    c, _ = cluster
    rc, out, summary = _run(
        c.address,
        tmp_path,
        duration=22,
        faults="[{at: 3, target: 'server:r0', action: kill, duration: 3}, "
        "{at: 11, target: router, action: restart}, "
        "{at: 16, target: 'router:hub', action: kill, duration: 3}]",
        extra="  - reconnects >= 1\n  - unrecovered_robots == 0",
    )
    assert rc == 0, out
    (hub,) = [f for f in summary["faults"] if f.get("target") == "router:hub"]
    assert hub["error"] is None and hub["t_end"] is not None, hub
    import pyarrow.parquet as pq

    run_dir = next((tmp_path / "reports").glob("cluster_probe/*/"))
    t = pq.read_table(run_dir / "transitions.parquet").to_pydict()
    lost = [(ti, to) for ti, to in zip(t["t"], t["to_state"]) if hub["t_start"] <= ti <= hub["t_end"] + 0.5]
    assert lost == [], f"robots noticed the hub's death: {lost}"
    req = pq.read_table(run_dir / "requests.parquet", columns=["t", "outcome"]).to_pydict()
    answered = [
        ti for ti, o in zip(req["t"], req["outcome"]) if o == "ok" and hub["t_start"] + 0.5 <= ti <= hub["t_end"]
    ]
    assert len(answered) >= 4, f"{len(answered)} requests answered while the hub was down"
    (kill,) = [f for f in summary["faults"] if f.get("action") == "kill" and f.get("target") == "server:r0"]
    assert kill["t_end"] is not None, kill
    (restart,) = [f for f in summary["faults"] if f.get("target") == "router"]
    assert restart["error"] is None, restart
    node_logs = sorted(run_dir.glob("logs/router-*.log"))
    assert len(node_logs) == 2 and all(p.read_text().count("router ready") == 2 for p in node_logs), (
        "every node router was restarted on its node"
    )


def test_a_node_router_that_dies_unplanned_fails_the_run_naming_its_node(cluster, tmp_path):
    """The system failed, not the bench: the run goes on to its end and fails (exit 1) on `unplanned_exits`."""
    c, _ = cluster

    def kill_a_node_router_once_running(reports: Path):
        deadline = time.monotonic() + 120
        rows: list = []
        while not rows and time.monotonic() < deadline:
            tables = list(reports.rglob("processes.json"))  # written once every process started
            rows = [r for r in json.loads(tables[0].read_text()) if r["name"].startswith("router:")] if tables else []
            time.sleep(0.2)  # no event tells another process's file appeared
        os.killpg(rows[0]["pid"], 9)  # the cluster's nodes are this host: its pid is ours to signal

    t0 = time.monotonic()
    # 12 s: the router dies as processes.json appears (before the warm-up), so the run has 15 s to see the exit
    rc, out, summary = _run(c.address, tmp_path, duration=12, while_running=kill_a_node_router_once_running)
    assert rc == 1, out
    assert "EXIT  router:" in out and "on node " in out and "exited with -9" in out, out
    (exit_window,) = [f for f in summary["faults"] if f["action"] == "unplanned_exit"]
    assert exit_window["target"].startswith("router:") and "on node " in exit_window["detail"]
    assert summary["figures"]["unplanned_exits"] == 1.0 and summary["error"] is None
    assert time.monotonic() - t0 < 150


def test_a_node_that_dies_mid_run_ends_the_run_with_exit_2_naming_the_node(cluster, tmp_path):
    """Last in this module: it removes the worker nodes from the module's cluster."""
    c, workers = cluster

    def remove_workers_once_running(reports: Path):
        deadline = time.monotonic() + 120
        while not any(reports.rglob("clock.json")) and time.monotonic() < deadline:  # written as drive() sends the
            time.sleep(0.2)  # start barrier: past start-up, whatever the host's load; no event crosses processes
        assert any(reports.rglob("clock.json")), "the run never reached its start barrier"
        for node in workers:  # spread put at least one of shard and replica on a worker
            c.remove_node(node, allow_graceful=False)

    t0 = time.monotonic()
    rc, out, summary = _run(c.address, tmp_path, duration=30, while_running=remove_workers_once_running)
    assert rc == 2, out
    assert "node" in out and "is gone or not answering" in (out + json.dumps(summary or {}))
    assert time.monotonic() - t0 < 120, "the run did not notice the dead node promptly"
