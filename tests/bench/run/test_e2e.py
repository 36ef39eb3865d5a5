"""End to end: `bench run` on a short scenario with the real router, chaos proxy, policy server and
edge engines; the outputs exist, the verdict is right, and no child process survives the run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bench.run.procset import group_alive

REPO = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCENARIO = """\
name: e2e
description: four robots, ten seconds, one replica, a short partition
duration_s: 10
warmup_s: 4
seed: 3
fleet:
  shards: 2
  groups:
    - name: lab
      robot: reacher
      count: 4
      site: lab
      policy: {checkpoint}
      cameras: {{kind: synthetic, names: [front], height: 32, width: 32}}
      engine: {{buffer_time_s: 0.5, max_action_age_s: 1.0, fallback: hold}}
sites:
  lab: {{profile: lan}}
servers:
  replicas:
    - {{id: r0, checkpoint: {checkpoint}, max_sessions: 8}}
faults:
  - {{at: 4, target: site:lab, action: partition, duration: 2}}
assertions:
  - dead_robots == 0
  - staleness_violations == 0
  - requests > 10
  - p99(rtt_ms) < 1000
  - p99(uplink_ms) + p99(downlink_ms) < 2000
  - states(group=lab) contains [STREAMING, STALLED, STREAMING]
  - max(rss_mb[server:r0]) < 4000 and min(open_fds[server:r0]) > 0
  - leftover_processes == 0 and leftover_shm == 0
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    shipped = REPO / "bench" / "checkpoints" / "reacher"
    if (shipped / "model.safetensors").is_file():
        return str(shipped)
    from bench.training.train import train_robot_policy

    out = tmp_path_factory.mktemp("ckpt") / "reacher"
    return str(train_robot_policy("reacher", out, seed=0, episodes=4, steps=20, evaluate=False))


def test_bench_run_short_scenario(tmp_path, checkpoint):
    for mod in ("edge", "server.cli", "chaos.launch", "chaos.timeline"):
        pytest.importorskip(mod)
    scenario = tmp_path / "e2e.yaml"
    scenario.write_text(textwrap.dedent(SCENARIO.format(checkpoint=checkpoint)))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.cli", "run", str(scenario), "--reports", str(tmp_path / "reports"), "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=150,
    )
    runs = list((tmp_path / "reports" / "e2e").iterdir())
    assert len(runs) == 1, proc.stderr
    run = runs[0]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["verdict"] == "pass", (proc.stderr, json.dumps(summary["assertions"], indent=1))
    assert proc.returncode == 0
    assert summary["robots"] == 4 and summary["ticks"] > 1000
    # every shard reported how its control loop ran (SCHED_FIFO where the host permits it)
    assert summary["host"]["loop_priority"] and set(summary["host"]["loop_priority"]) <= {
        "SCHED_FIFO 10",
        "nice -10",
        "normal",
    }
    # and the replica's dispatch loop, from its log (bench.run.manifests.replica_priority: normal by default)
    assert summary["host"]["replica_priority"] == ["normal"]
    assert summary["host"]["speed_probe_ms"]["before_ms"] > 0 and summary["host"]["speed_probe_ms"]["after_ms"] > 0
    assert summary["figures"]["rtt_ms"]["count"] > 10
    # the network time split at the server: each leg is real time, and the two fit inside the round trip
    f = summary["figures"]
    assert f["uplink_ms"]["count"] > 0.9 * f["rtt_ms"]["count"] and f["downlink_ms"]["count"] == f["uplink_ms"]["count"]
    assert 0 < f["uplink_ms"]["p50"] and 0 < f["downlink_ms"]["p50"]
    assert f["uplink_ms"]["p50"] + f["downlink_ms"]["p50"] <= f["network_ms"]["p50"] + 1.0
    # both one-way hops split again at the router, by its timestamp: each part real time, adding up to the whole
    req = pq.read_table(run / "requests.parquet").to_pydict()
    rows = [i for i, o in enumerate(req["outcome"]) if o == "ok" and req["uplink_ms"][i] == req["uplink_ms"][i]]
    for way in ("uplink", "downlink"):
        to, after = req[f"{way}_to_router_ms"], req[f"{way}_from_router_ms"]
        # positive, but for a request whose receiver was preempted between reading its two clocks (a loaded host)
        positive = sum(1 for i in rows if to[i] > 0 and after[i] > 0)
        assert rows and positive >= 0.95 * len(rows), (way, positive, len(rows))
        assert all(abs(to[i] + after[i] - req[f"{way}_ms"][i]) < 0.01 for i in rows), way
    # and the rest of network_ms is the replica's own time outside its queue and forward pass, from its audit line
    assert all(
        abs(req["uplink_ms"][i] + req["downlink_ms"][i] + req["server_overhead_ms"][i] - req["network_ms"][i]) < 0.05
        for i in rows
    )
    assert f["server_overhead_ms"]["count"] >= f["uplink_ms"]["count"] and f["server_overhead_ms"]["p50"] > 0
    # the replica's queue replayed: each answered request has its queue wait's and forward pass's bench parts
    replay = summary["fidelity"]["queue_replay"]
    assert [q["replica"] for q in replay] == ["r0"] and replay[0]["requests"] > 10 and "note" not in replay[0]
    assert all(req["queue_wait_bench_ms"][i] == req["queue_wait_bench_ms"][i] for i in rows)
    # and its two hops between the router and the replica, beyond the replica's floor for each (never negative)
    share = summary["fidelity"]["bench_share"]
    for hop in ("uplink_from_router_ms", "downlink_to_router_ms"):
        part = req[hop[:-3] + "_bench_ms"]
        assert all(part[i] >= 0 for i in rows) and 0 < share[hop]["floor_ms"]["r0"] < 50, (hop, share.get(hop))
    # and its two hops between the robot and the router, beyond what the site's proxy asked (no toxic here: nothing)
    for hop in ("uplink_to_router_ms", "downlink_from_router_ms"):
        part = req[hop[:-3] + "_bench_ms"]
        assert all(part[i] >= 0 for i in rows) and share[hop]["sites"]["lab"]["asked_ms_max"] == 0.0, share.get(hop)
    assert share["network_ms_taken_off"] == 0.0 and share["rtt_ms"]["p50"] is not None
    assert "Each replica's queue replayed" in (run / "report.html").read_text()
    assert [f["target"] for f in summary["faults"]] == ["site:lab"]
    # every robot's state changes, grouped by kind: each robot started and got a session
    kinds = {(c["from"], c["to"]): c for c in summary["state_changes"]}
    assert (
        kinds[("CONNECTING", "STREAMING")]["robots"] == 4
        and "State changes and why" in (run / "report.html").read_text()
    )
    cases = ET.parse(run / "junit.xml").getroot().find("testsuite").findall("testcase")
    assert len(cases) == 8
    # psutil's record of every process: memory and descriptors over time, what was left at the end
    mem = summary["memory"]
    assert {"router", "server:r0", "shard:0", "shard:1", "runner"} <= set(mem["processes"])
    assert all(m["rss_mb_max"] > 0 and m["fds_end"] > 0 for m in mem["processes"].values())
    assert mem["leftover_processes"] == 0 and mem["report_phase"]["peak_rss_mb"] > 0
    assert f["rss_mb[server:r0]"]["count"] >= 5 and "rss_growth_ratio[router]" in f
    # the preflight's cost model at the run's own speed probe, beside the CPU each kind of process measured
    cpu = summary["cpu"]
    assert set(cpu["estimate"]["split"]) == set(cpu["by_kind"]) == {"shards", "replicas", "proxy", "router"}
    assert cpu["by_kind"]["shards"] > 0 and cpu["estimate"]["cores_needed"] > 0 and cpu["estimate_ratio"] > 0
    # and unscaled, at the reference probe: the two differ by the run's probe against the reference
    from bench.run.usage import COST_REFERENCE_PROBE_MS

    probe = cpu["estimate"]["probe_ms"]
    assert cpu["estimate_ratio_at_reference"] == pytest.approx(
        cpu["estimate_ratio"] * probe / COST_REFERENCE_PROBE_MS, abs=0.02
    )
    assert "with the model unscaled" in (run / "report.html").read_text()
    # the replica's forward pass priced from its own checkpoint, timed on this host (bench.run.forwardcost)
    assert cpu["estimate"]["forward_cpu_ms"]["r0"]["source"] in ("measured", "cached")
    assert "preflight's cost model" in (run / "report.html").read_text()
    # inside the shards, by thread: the control loop stepped robots, the engines' workers sent the requests
    threads = cpu["shard_threads"]
    assert threads["shards"] == 2 and threads["ticks"] >= summary["ticks"] and threads["requests"] > 10
    assert threads["cores"]["loop"] > 0 and threads["cores"]["engine"] > 0, threads
    assert threads["loop_us_per_robot_tick"] > 0 and threads["engine_ms_per_request"] > 0
    assert 0.95 <= threads["accounted"] <= 1.001, threads  # the roles sum to the shards' own CPU
    assert "cores by thread" in (run / "report.html").read_text()
    assert "threads account for" in (run / "report.html").read_text()
    assert "<svg" in (run / "report.html").read_text()
    for name in ("ticks.parquet", "requests.parquet", "transitions.parquet", "logs/router.log", "logs/server-r0.log"):
        assert (run / name).is_file(), name
    from bench.run.sizing import router_max_sessions
    from bench.scenario.load import load_scenario

    sized = router_max_sessions(load_scenario(run / "scenario.yaml"))  # the router got the fleet's size
    # and a cap on each link's observations, 10x the fleet's 30 Hz (docs/security.md)
    assert f"(max sessions {sized}) (max 300 observations/s a link)" in (run / "logs/router.log").read_text()
    table = json.loads((run / "processes.json").read_text())
    assert {"router", "server:r0", "shard:0", "shard:1"} <= {r["name"] for r in table}
    assert not [r for r in table if group_alive(r["pid"])]


THREE_SITES = """\
name: e2e_sites
description: three sites, each on its own chaos proxy process; one partitioned
duration_s: 10
warmup_s: 4
seed: 5
fleet:
  shards: 1
  groups:
{groups}
sites:
  eu: {{profile: lan}}
  us: {{profile: lan}}
  ap: {{profile: lan}}
servers:
  replicas:
    - {{id: r0, checkpoint: {checkpoint}, max_sessions: 8}}
faults:
  - {{at: 4, target: site:us, action: partition, duration: 2}}
assertions:
  - dead_robots == 0
  - states(group=us) contains [STREAMING, STALLED, STREAMING]
  - group[eu].fallback_tick_ratio < 0.05 and group[ap].fallback_tick_ratio < 0.05
"""


def test_sites_on_three_proxy_processes_each_get_their_own_and_a_partition_reaches_only_its_site(tmp_path, checkpoint):
    """bench.run.sizing.proxy_processes gives 1,000_robots_wan three proxy loops on 16 cores: the same local run
    path, forced here (BENCH_PROXY_PROCESSES) on a short fleet of three sites."""
    import os

    from bench.run.sizing import PROXY_PROCESSES_ENV

    groups = "\n".join(
        f"    - {{name: {s}, robot: reacher, count: 2, site: {s}, policy: {checkpoint}, engine: "
        f"{{buffer_time_s: 0.5, max_action_age_s: 1.0, fallback: hold}}}}"
        for s in ("eu", "us", "ap")
    )
    scenario = tmp_path / "sites.yaml"
    scenario.write_text(THREE_SITES.format(groups=groups, checkpoint=checkpoint))
    env = {**os.environ, PROXY_PROCESSES_ENV: "3"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.cli", "run", str(scenario), "--reports", str(tmp_path / "r"), "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
    )
    runs = list((tmp_path / "r" / "e2e_sites").iterdir())
    assert len(runs) == 1, proc.stderr
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["verdict"] == "pass", (proc.stderr[-3000:], json.dumps(summary["assertions"], indent=1))
    assert summary["chaos_proxy"]["processes"] == 3
    assert sorted(summary["chaos_proxy"]["site_process"].values()) == [0, 1, 2]  # one site a process
    assert {g["site"] for g in summary["fidelity"]["legs"]} == {"eu", "us", "ap"}  # each proxy's legs read back
    logs = {p.name for p in (runs[0] / "logs").iterdir()}
    assert {"chaos-proxy.log", "chaos-proxy-1.log", "chaos-proxy-2.log"} <= logs, logs
    assert summary["memory"]["leftover_processes"] == 0
    bad = subprocess.run(
        [sys.executable, "-m", "bench.cli", "run", str(scenario), "--reports", str(tmp_path / "r2"), "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, PROXY_PROCESSES_ENV: "three"},
    )
    assert bad.returncode == 2 and PROXY_PROCESSES_ENV in bad.stderr and "Traceback" not in bad.stderr
