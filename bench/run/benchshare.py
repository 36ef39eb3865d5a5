"""The bench's share of a run: how much of each hop, of the queue wait and of the forward pass the bench host added.

Each hop beyond its replica's floor or its site's asked delay (bench.evidence.fidelity), and the queue wait
and forward pass replayed on the replica's unloaded forward times (bench.evidence.replay); docs/bench.md
"How much is the bench". Each writes what it used on the run's state for summary.json `fidelity`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.evidence import fidelity as fid
from bench.run.hops import per_robot
from bench.run.legs import window_legs
from bench.run.state import RunState


def unloaded_forward(run: RunState) -> dict[str, dict | None]:
    """Each replica's unloaded forward ms by batch size, from its log (read once)."""
    if run.unloaded is None:
        run.unloaded = {rid: fid.unloaded_forward(run.logs / f"server-{rid}.log") for rid in run.servers}
    return run.unloaded


def hop_bench_share(run: RunState, audit, sent_ns: np.ndarray, split: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per request, each hop between the router and the replica (fid.SERVER_HOPS, from `split`: router_split's)
    beyond its replica's floor for it (fid.hop_excess), as `<hop>_bench_ms`; the floors by replica to
    `run.hop_floors` (summary.json `fidelity.bench_share`)."""
    from bench.evidence.audit import by_stamp, equals, strings

    (row,) = by_stamp(audit, equals(audit, "outcome", "ok"), sent_ns, [np.arange(audit.num_rows, dtype=float)])
    found = np.isfinite(row)
    replica = np.full(len(sent_ns), "", dtype=object)
    replica[found] = strings(audit, "replica")[row[found].astype(np.int64)]
    out, run.hop_floors = {}, {}
    for name in fid.SERVER_HOPS:
        out[name[:-3] + "_bench_ms"], floors = fid.hop_excess(split[name], replica)
        for rid, floor in floors.items():
            run.hop_floors.setdefault(rid, {})[name] = floor
    return out


def robot_hop_bench_share(
    run: RunState, robots: np.ndarray, split: dict[str, np.ndarray], sent_ms: np.ndarray, t_recv: np.ndarray
) -> dict[str, np.ndarray]:
    """Per request (`robots`: its robot; `sent_ms`, `t_recv`: its send, ms, and its answer's arrival, s, on the
    runner's monotonic clock), each hop between the robot and the router (fid.ROBOT_HOPS, from `split`) beyond what its
    site's proxy asked around its time (fid.robot_hop_excess), as `<hop>_bench_ms`; what was used, by hop and
    site, to `run.robot_hops` (summary.json `fidelity.bench_share`). A cluster run with per_node routers keys them
    by site and node (by_site_and_node): a robot's chunks cross its own node's copy of its site's proxy, whose
    maxima by 100 ms are on that node's clock."""
    site = per_robot(run, robots, "site", "")
    legs = window_legs(run)
    asked = run.leg_asked or {}
    recv_ms = np.asarray(t_recv, dtype=float) * 1e3
    shift = np.zeros(len(site))  # the runner's clock to the proxy's
    node_start, node_end = run.node_leg_start or {}, run.node_leg_end
    node_legs = {n: window_legs(run, node_start.get(n) or {}, end) for n, end in node_end.items()} if node_end else None
    if node_legs is not None:  # cluster, per_node routers: each robot's hops through its node's copy of its site
        site, legs, asked, shift = by_site_and_node(run, robots, site, node_legs)
    windows = {
        "uplink_to_router_ms": (sent_ms + shift, sent_ms + split["uplink_to_router_ms"] + shift),
        "downlink_from_router_ms": (recv_ms - split["downlink_from_router_ms"] + shift, recv_ms + shift),
    }
    out, run.robot_hops = {}, {}
    for name, direction in fid.ROBOT_HOPS:
        by_s = {site: (legs_asked or {}).get(direction) for site, legs_asked in asked.items()}
        out[name[:-3] + "_bench_ms"], run.robot_hops[name] = fid.robot_hop_excess(
            split[name], site, legs, direction, by_s, windows[name]
        )
    return out


def by_site_and_node(run: RunState, robots: np.ndarray, site: np.ndarray, node_legs: dict) -> tuple:
    """A cluster run's robot-side hops per site and node (`per_node` routers: a robot's chunks cross its own
    node's copy of its site's proxy): each request's key `site@node` (the node id's first 12 characters), the
    legs and the maxima by 100 ms under those keys (`node_legs`: the window's legs per node and site,
    `run.node_asked`), and each request's shift from the runner's clock to its node's, ms (NaN where the
    node's clock is unknown: bounded by the run's most asked)."""
    parts = run.node_asked or {}
    node = [run.child_nodes.get(f"shard:{k}") or "" for k in per_robot(run, robots, "shard", -1)]
    keyed = np.array([f"{s}@{n[:12]}" if s and n else "" for s, n in zip(site, node)], dtype=object)
    legs = {f"{s}@{n[:12]}": snap for n, by_site in node_legs.items() for s, snap in by_site.items()}
    asked = {f"{s}@{n[:12]}": a for n, p in parts.items() for s, a in (p.get("asked") or {}).items()}
    shift = np.array([(parts.get(n) or {}).get("offset_ms", np.nan) for n in node], dtype=float)
    return keyed, legs, asked, shift


def server_bench_share(run: RunState, audit, sent_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per request (`sent_ns`: its stamp), the queue wait and the forward pass the bench host added on its
    replica (bench.evidence.replay), NaN where not measured; the replicas' replay figures to
    `run.server_replay` (summary.json `fidelity.queue_replay`)."""
    import yaml

    from bench.evidence import replay
    from bench.evidence.audit import by_stamp, equals

    sched = {}
    for rid, info in run.servers.items():
        try:
            manifest = yaml.safe_load(Path(info["manifest"]).read_text())
        except (KeyError, OSError, yaml.YAMLError, TypeError):
            continue  # its dispatch rule unknown: server_share says it was not replayed
        sched[rid] = replay.Scheduling.of_manifest(manifest, (manifest or {}).get("model_id"))
    try:
        qw, inf, run.server_replay = replay.server_share(audit, unloaded_forward(run), sched)
    except Exception as exc:  # a figure of the evidence: the run's records must still be written
        run.server_replay = [{"note": f"the queue replay failed: {exc!r}"}]
        return np.full(len(sent_ns), np.nan, np.float32), np.full(len(sent_ns), np.nan, np.float32)
    return tuple(by_stamp(audit, equals(audit, "outcome", "ok"), sent_ns, [qw, inf]))
