"""What each child of a run is given: a replica's manifest, a shard's robots, an attacker's spec, the routers'
flags and the robots' identities (with mtls, their certificates), all read from the scenario and the run's state.

Pure of processes: nothing here starts one (bench.run.starters does, with what these return). Invariant: a robot's
row in `run.robot_table` and its spec in its shard's are made together, so the records join on the robot id.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from bench.run.manifests import overrides as manifest_overrides
from bench.run.manifests import replica_manifest, replica_priority
from bench.run.state import RunState
from bench.scenario.load import REPO_ROOT
from wire.procs import free_port

OBSERVATION_RATE_FACTOR = 10  # a router's cap on a link's observations, times the fleet's fastest fps


def manifest_for(run: RunState, replica) -> dict:
    port = free_port()
    audit = run.logs / f"audit-{replica.id}.jsonl"
    run_keys = {
        "model_id": replica.model_id,
        "replica_id": replica.id,
        "max_sessions": replica.max_sessions,
        "zenoh": {"connect_endpoints": [run.replica_router.get(replica.id, run.router_endpoint)]},
        "health_port": port,
        "audit_path": str(audit),
        # normal unless BENCH_REPLICA_PRIORITY says otherwise (docs/bench.md "The replicas' priority")
        "dispatch_priority": replica_priority(),
    }
    if run.host != "127.0.0.1":
        # nodes on other hosts: the replica's node is not known yet, so its health server listens on every
        # address and the scraper reads it at the node's address (`_health_url`)
        run_keys["health_host"] = "0.0.0.0"
    if run.s.security == "mtls":
        f = run.pki.server(replica.id)
        run_keys["zenoh"]["tls"] = {
            "root_ca_certificate": f.ca,
            "connect_certificate": f.cert,
            "connect_private_key": f.key,
        }
    return replica_manifest(run.s, replica, run_keys)


def assign_identities(run: RunState) -> None:
    """Fixed client uuids (GROUP-INDEX) when certificates or attackers need to name robots; with mtls,
    a run PKI under <run>/pki (keys 0600) and each robot's certificate (CN = its uuid)."""
    run.identities = {}
    if run.s.security != "mtls" and not run.s.attackers:
        return
    if run.s.security == "mtls":
        from bench.security.pki import Pki

        run.pki = Pki(run.run_dir / "pki")
    for g in run.s.groups:
        for i in range(g.count):
            uuid = g.engine.get("client_uuid") if g.count == 1 and g.engine.get("client_uuid") else f"{g.name}-{i}"
            ident = {"client_uuid": uuid}
            if run.s.security == "mtls":
                f = run.pki.robot(uuid)
                ident.update(tls_ca=f.ca, tls_cert=f.cert, tls_key=f.key)
            run.identities[(g.name, i)] = ident


def router_args(run: RunState) -> list[str]:
    """wire.transport flags every router of this run gets: sessions sized from the fleet, and observations a link
    capped at OBSERVATION_RATE_FACTOR times the fleet's fastest control rate (a robot sends at most one a tick:
    a flooding one is shed at the router, as docs/security.md advises), except under per-node routers (the cap
    is per link, and a link between two routers carries a node's robots)."""
    from bench.run.sizing import router_max_sessions

    args = ["--max-sessions", str(router_max_sessions(run.s))]
    if run.routers == "per_node":
        return args
    fastest = max(g.fps for g in run.s.groups)
    return args + ["--max-observation-rate-hz", f"{OBSERVATION_RATE_FACTOR * fastest:g}"]


def attacker_spec(run: RunState, a: dict, start_unix: float) -> dict:
    from bench.robots.core import robot_type

    gname, _, idx = a["target"].partition("/")
    g = run.s.group(gname)
    cls = robot_type(g.robot)
    replica = next((r for r in run.s.replicas if r.model_id == g.model_id), run.s.replicas[0])
    manifest = manifest_overrides(run.s, replica)
    sec = manifest.get("security", {}) or {}
    lim = manifest.get("limits", {}) or {}
    from wire.keys import task_slug

    spec = {
        "name": a["name"],
        "credentials": a["credentials"],
        "attacks": a["attacks"],
        "start_unix": start_unix,
        "uuid": a["name"],
        "victim_uuid": run.identities[(gname, int(idx))]["client_uuid"],
        "victim_task": task_slug(g.task),
        "model_id": g.model_id,
        "replica_id": replica.id,
        "fps": g.fps,
        "action_names": list(cls.action_names),
        "state_dim": len(cls.state_names),
        "cameras": list(g.cameras.names) if g.cameras else [],
        "cam_h": g.cameras.height if g.cameras else 0,
        "cam_w": g.cameras.width if g.cameras else 0,
        "flood_hz": a["flood_hz"],
        "flood_s": a["flood_s"],
        "rate_limit_hz": sec.get("max_request_rate_hz", 100.0),
        "rate_burst": sec.get("request_burst"),
        "max_observation_bytes": sec.get("max_observation_bytes") or lim.get("max_message_bytes"),
        "endpoint": run.sites[g.site].endpoint,
    }
    if spec["rate_burst"] is None:
        spec["rate_burst"] = spec["rate_limit_hz"]
    if run.s.security == "mtls":
        from bench.security.pki import Pki

        mon = run.pki.issue("bench-monitor")
        spec["monitor_tls"] = {"ca": mon.ca, "cert": mon.cert, "key": mon.key}
        if a["credentials"] == "own_cert":
            f = run.pki.robot(a["name"])
            spec["tls"] = {"ca": f.ca, "cert": f.cert, "key": f.key}
        elif a["credentials"] == "none":
            spec["tls"] = {"ca": run.pki.ca_cert_path.as_posix()}
        else:
            f = Pki(run.run_dir / "pki-foreign", ca_name="foreign-ca").robot(a["name"])
            spec["tls"] = {"ca": run.pki.ca_cert_path.as_posix(), "cert": f.cert, "key": f.key}
    return spec


def shard_specs(run: RunState) -> list[dict]:
    """Deal robots round-robin over the shards (each group spread over all shards)."""
    from bench.fleet.shard import robot_spec
    from bench.run.sizing import group_request_rates, shard_count

    # `auto` sized from robots, fps and the cores (the cluster's, with --cluster); an integer as written
    run.n_shards = shard_count(run.s, run.cluster.cpus() if run.cluster is not None else None)
    # requests a second one robot of each group sends (a cluster node's proxies are sized by its robots')
    run.request_rates = dict(zip((g.name for g in run.s.groups), group_request_rates(run.s)))
    specs = [
        {
            "shard": k,
            "robots": [],
            "records_dir": str(run.rec_dir),
            "seed": run.s.seed,
            "engine_factory": run.engine_factory,
            "engine_workers": run.s.engine_workers,
            "record": dict(run.s.record),  # bench.run.dataset: the shard records observations (and frames)
        }
        for k in range(run.n_shards)
    ]
    rid = 0
    run.robot_table = []
    group_index = {g.name: gi for gi, g in enumerate(run.s.groups)}
    for gi, g in enumerate(run.s.groups):
        for i in range(g.count):
            shard = rid % run.n_shards
            spec = robot_spec(
                rid,
                gi,
                i,
                g,
                run.s.seed,
                run.sites[g.site].endpoint,
                seed_group_index=group_index.get(g.seeds_of) if g.seeds_of else None,
            )
            spec["engine"].update(run.identities.get((g.name, i), {}))
            specs[shard]["robots"].append(spec)
            run.robot_table.append(
                {
                    "robot": rid,
                    "group": g.name,
                    "engine": g.engine_kind,
                    "index": i,
                    "site": g.site,
                    "shard": shard,
                    "robot_type": g.robot,
                    "fps": g.fps,
                    "max_action_age_s": spec["engine"].get("max_action_age_s", math.inf),
                    "deadline_s": rtc_budget_s(spec["engine"], g.fps),
                }
            )
            rid += 1
    return specs


def node_proxy_processes(run: RunState, specs: list[dict], placed: dict) -> dict[str, int]:
    """Chaos proxy processes for each node that got shards (`placed`: shard -> its child): the requests of
    the robots on the node's shards, within its CPUs beyond its router and what Ray reserved there for the
    run's shards and replicas (bench.run.sizing.node_proxy_processes)."""
    from collections import Counter

    from bench.run.sizing import node_proxy_processes

    c = run.s.cluster
    cpus = {n["node_id"]: n["cpus"] for n in run.cluster.nodes()}
    requests: Counter = Counter()
    reserved: Counter = Counter()
    for spec in specs:
        node = placed[spec["shard"]].locate()["node_id"]
        reserved[node] += c.get("shard_cpus", 1.0)
        requests[node] += sum(run.request_rates[run.robot_table[robot["robot"]]["group"]] for robot in spec["robots"])
    for info in run.servers.values():
        node = info["child"].locate()["node_id"]  # placed and located before the shards (start_servers)
        if node in requests:
            reserved[node] += c.get("replica_cpus", 1.0)
    return {
        node: node_proxy_processes(n, len(run.s.sites), cpus.get(node, 1), reserved[node])
        for node, n in requests.items()
    }


def server_argv(manifest: Path, test_skew: bool = False) -> list[str]:
    """policy-server through this interpreter (no reliance on PATH). `test_skew` (tests only): its monotonic clock
    shifted by BENCH_TEST_MONO_SKEW_S before the server's modules load (bench.fleet.clock.apply_test_skew)."""
    skew = "from bench.fleet.clock import apply_test_skew; apply_test_skew(); " if test_skew else ""
    return [
        sys.executable,
        "-c",
        f"import sys; {skew}from server.cli import main; sys.exit(main())",
        "--manifest",
        str(manifest),
    ]


def rtc_budget_s(engine: dict, fps: float) -> float:
    """A request's deadline for goodput. With an RTC prefix: the latency budget H*dt/2 (design P10). Without one
    (rtc off or execution_horizon 0, where H*dt/2 is 0 and no request could meet it): buffer_time_s, the
    playback the queue had left when the engine asked, so an answer within it arrives before the queue runs dry
    (0.5 s where the engine derives its buffer from the delay it measures)."""
    import dataclasses

    from edge import RemoteEngineConfig

    defaults = {f.name: f.default for f in dataclasses.fields(RemoteEngineConfig)}
    horizon = int(engine.get("execution_horizon", defaults["execution_horizon"]))
    if engine.get("rtc_enabled", defaults["rtc_enabled"]) and horizon > 0:
        return horizon / float(fps) / 2.0
    buffer = engine.get("buffer_time_s", defaults["buffer_time_s"])
    # a derived buffer depends on the delay measured at run time: 0.5 s, the old fixed default
    return 0.5 if buffer is None else float(buffer)


def child_files(paths: list[str]) -> dict[str, bytes]:
    """What a cluster child reads, for its actor's `put_files` (each path once)."""
    return {p: Path(p).read_bytes() for p in dict.fromkeys(paths)}


def pythonpath() -> str:
    existing = os.environ.get("PYTHONPATH", "")
    return str(REPO_ROOT) + (os.pathsep + existing if existing else "")
