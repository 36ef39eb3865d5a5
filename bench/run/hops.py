"""Each request's round trip split into hops on one clock: robot -> router -> replica and back, and the clock facts.

`hop_split` splits a request's network time at the replica (uplink, downlink) with the robot's shard's clock
offset (bench.fleet.clock), `router_split` at the first router by its wall-clock stamp (moved across a cluster's
nodes by `cluster_stamp_error`); a (shard, replica) pair whose clocks are less sure than
HOP_SPLIT_MAX_CLOCK_ERROR of its one-way hop gets NaN, and `clock_facts` says so in summary.json.
"""

from __future__ import annotations

import numpy as np

from bench.fleet import clock as clocks
from bench.run.state import RunState

HOP_SPLIT_MAX_CLOCK_ERROR = 0.25  # of a pair's median one-way hop: a split whose clocks are less sure is dropped


def audit_lines(sent_ns: np.ndarray, audit) -> dict[str, np.ndarray]:
    """Each request's audit line, joined on client_mono_ns (`sent_ns`: the raw stamp of its header, echoed), as
    arrays over the requests: `matched` (bool), the line's `received_mono_ms`, `sent_mono_ms`, `queue_wait_ms`,
    `inference_ms` and `clock_uncertainty_ms` (0 where the line has none), NaN where no line matches, and its
    `replica` ("" where none).
    Only answered lines with both stamps join; of two lines with one stamp, the first by stamp, received, sent,
    clock uncertainty, replica. `audit`: the servers' audit lines (bench.evidence.audit's table)."""
    from bench.evidence.audit import equals, floats, integers, strings

    key, has_key = integers(audit, "client_mono_ns")
    received_all, sent_all = floats(audit, "received_mono_ms"), floats(audit, "sent_mono_ms")
    known = equals(audit, "outcome", "ok") & has_key & (key != 0) & ~np.isnan(received_all) & ~np.isnan(sent_all)
    error_all = np.nan_to_num(floats(audit, "clock_uncertainty_ms"), nan=0.0)
    replica_all = strings(audit, "replica")[known]
    _, replica_code = np.unique(replica_all, return_inverse=True)
    order = np.lexsort((replica_code, error_all[known], sent_all[known], received_all[known], key[known]))
    keys, rows = key[known][order], np.nonzero(known)[0][order]
    fields = {
        "received_mono_ms": received_all,
        "sent_mono_ms": sent_all,
        "clock_uncertainty_ms": error_all,
        "queue_wait_ms": floats(audit, "queue_wait_ms"),
        "inference_ms": floats(audit, "inference_ms"),
    }
    sent_ns = np.asarray(sent_ns, dtype=np.int64)
    out = {name: np.full(len(sent_ns), np.nan) for name in fields}
    out["replica"] = np.full(len(sent_ns), "", dtype=replica_all.dtype if len(replica_all) else str)
    out["matched"] = np.zeros(len(sent_ns), bool)
    if not len(keys) or not len(sent_ns):
        return out
    at = np.clip(np.searchsorted(keys, sent_ns), 0, len(keys) - 1)
    hit = (keys[at] == sent_ns) & (sent_ns > 0)
    line = at[hit]
    for name, values in fields.items():
        out[name][hit] = values[rows[line]]
    out["replica"][hit] = replica_all[order][line]
    out["matched"] = hit
    return out


def server_overhead(lines: dict[str, np.ndarray]) -> np.ndarray:
    """Each request's `server_overhead_ms` from its audit line (`lines`: audit_lines'): the replica's time on it
    outside its queue wait and its forward pass (sent - received - queue_wait_ms - inference_ms: the batch's
    assembly, the replies' encode and send, one after another). Both stamps are on one replica's clock: no offset,
    no clock error, so it is kept where hop_split drops a pair. NaN where no line matches. `network_ms` (rtt -
    queue wait - inference) = uplink_ms + downlink_ms + server_overhead_ms."""
    return (lines["sent_mono_ms"] - lines["received_mono_ms"] - lines["queue_wait_ms"] - lines["inference_ms"]).astype(
        np.float32
    )


def hop_split(
    sent_ns: np.ndarray,
    t_recv_s: np.ndarray,
    audit,
    robot_offset_ms: np.ndarray | None = None,
    robot_uncertainty_ms: np.ndarray | None = None,
    robot_shard: np.ndarray | None = None,
    lines: dict[str, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """Each answered request's uplink and downlink, ms: `uplink_ms` from the robot stamping it (`sent_ns`, its
    header's client_mono_ns) to the server receiving it (audit `received_mono_ms`), `downlink_ms` from the server
    handing the chunk to Zenoh (audit `sent_mono_ms`) to the robot receiving it (`t_recv_s`, monotonic seconds).
    `audit`: the servers' audit lines (bench.evidence.audit's table), joined by audit_lines (`lines`: that join,
    when the caller made it already).

    Clocks (bench.fleet.clock): `t_recv_s` and the audit rows are on the runner's clock (collect_audit shifts a
    replica on another clock, and gives its rows `clock_uncertainty_ms`); `sent_ns` is the robot's, moved onto
    the runner's by `robot_offset_ms` (its shard's offset, per row; none = the same clock). `network_ms`, their sum
    and server_overhead's, needs no offset; the split does. Per (shard, replica) pair:
    when its two clocks' combined uncertainty exceeds HOP_SPLIT_MAX_CLOCK_ERROR of the pair's median one-way hop
    ((uplink + downlink) / 2), all of its requests get NaN (all, not the long hops only, which would bias what is
    left). NaN where no audit line matches. Returns (uplink, downlink, the dropped pairs: {shard, replica,
    requests, clock_error_ms, hop_ms_p50})."""
    line = audit_lines(sent_ns, audit) if lines is None else lines
    up = np.full(len(sent_ns), np.nan, dtype=np.float32)
    down = np.full(len(sent_ns), np.nan, dtype=np.float32)
    hit, replicas = line["matched"], line["replica"]
    if not hit.any():
        return up, down, []
    robot_ms = np.asarray(sent_ns, dtype=np.int64) / 1e6
    if robot_offset_ms is not None:
        robot_ms = robot_ms - np.asarray(robot_offset_ms, dtype=float)
    u = line["received_mono_ms"] - robot_ms
    d = np.asarray(t_recv_s, dtype=float) * 1e3 - line["sent_mono_ms"]
    robot_error = np.zeros(len(sent_ns)) if robot_uncertainty_ms is None else np.asarray(robot_uncertainty_ms, float)
    shards = np.full(len(sent_ns), -1) if robot_shard is None else np.asarray(robot_shard)
    error = line["clock_uncertainty_ms"] + robot_error
    keep = hit.copy()
    dropped = []
    for shard, replica in sorted({(int(a), str(b)) for a, b in zip(shards[hit], replicas[hit])}):
        rows = hit & (shards == shard) & (replicas == replica)
        err = float(np.max(error[rows]))
        hop = float(np.median((u[rows] + d[rows]) / 2.0))
        if err > 0 and not err <= HOP_SPLIT_MAX_CLOCK_ERROR * hop:
            keep &= ~rows
            dropped.append(
                {
                    "shard": shard,
                    "replica": replica,
                    "requests": int(rows.sum()),
                    "clock_error_ms": round(err, 3),
                    "hop_ms_p50": round(hop, 3),
                }
            )
    up[keep] = u[keep]
    down[keep] = d[keep]
    return up, down, dropped


def router_split(
    run: RunState,
    audit,
    sent_ns: np.ndarray,
    sent_ms: np.ndarray,
    up: np.ndarray,
    down: np.ndarray,
    down_from_router: np.ndarray,
    robots: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Each request's uplink and downlink split at the first router routing it, by that router's timestamp (a
    Zenoh router stamps what it routes, by default): `uplink_to_router_ms` from the robot's stamp (`sent_ms`, on
    the runner's clock; `sent_ns` the raw stamp, the join key) to the router (the robot's send, the site's proxy,
    the router's receive; audit `routed_mono_ms`) and
    `uplink_from_router_ms` the rest of the uplink (the router's forwarding, the server's receive up to its
    callback); `downlink_to_router_ms` (the server's send, the router's receive) and `downlink_from_router_ms`
    (the router's forwarding, the proxy, the robot's receive: the engine's record). NaN where unstamped.

    The stamp is the router's wall clock, read as an age against the receiver's (the replica's for the
    observation, the robot's for the chunk). In a cluster run the two may be other hosts' clocks: each request's
    parts are moved by the measured offset between the stamping router's node and the receiver's
    (cluster_stamp_error; `robots`: each request's robot); a (shard, replica) pair whose wall clocks are
    unsure by more than HOP_SPLIT_MAX_CLOCK_ERROR of its one-way hop gets NaN, as in hop_split
    (`run.router_split_dropped`)."""
    from bench.evidence.audit import by_stamp, equals, floats

    (routed,) = by_stamp(audit, equals(audit, "outcome", "ok"), sent_ns, [floats(audit, "routed_mono_ms")])
    down_from = np.asarray(down_from_router, dtype=float)
    run.router_split_dropped = []
    if run.cluster is not None:
        up_err, down_err, keep = cluster_stamp_error(run, audit, sent_ns, robots, up, down)
        routed, down_from = routed - up_err, down_from + down_err
        routed[~keep], down_from[~keep] = np.nan, np.nan
    up_to = routed - sent_ms
    up_to[np.isnan(np.asarray(up, dtype=float))] = np.nan  # a pair hop_split left out: its clocks too unsure
    return {
        "uplink_to_router_ms": up_to.astype(np.float32),
        "uplink_from_router_ms": (up - up_to).astype(np.float32),
        "downlink_to_router_ms": (down - down_from).astype(np.float32),
        "downlink_from_router_ms": down_from.astype(np.float32),
    }


def cluster_stamp_error(
    run: RunState, audit, sent_ns: np.ndarray, robots: np.ndarray | None, up: np.ndarray, down: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request of a cluster run, ms: how far its observation's router stamp, read on its replica's node, is
    off (the stamping router's node's wall clock minus the replica's node's: `routed_mono_ms` is that much
    late), and its chunk's, read on its robot's node (the stamping node's minus the robot's:
    `downlink_from_router_ms` is that much short), and which requests keep a split (the largest combined
    uncertainty of two offsets among those kept to `run.router_split_error_ms`). The stamping routers
    (bench.run.mesh): with `per_node` routers the robot's node's for the observation and the replica's node's
    for the chunk; with the driver's, the hub's for both (this host, offset 0). Nodes' offsets:
    `run.node_walls` (measured at the start and near the end, combined). NaN and not kept where a node or its
    offset is unknown; a (shard, replica) pair unsure by more than HOP_SPLIT_MAX_CLOCK_ERROR of its median
    one-way hop ((uplink + downlink) / 2) is not kept, all of it (`run.router_split_dropped`)."""
    from bench.evidence.audit import by_stamp, equals, strings

    n = len(sent_ns)
    robots = np.full(n, -1) if robots is None else np.asarray(robots)
    shard = per_robot(run, robots, "shard", -1).astype(np.int64)
    (row,) = by_stamp(audit, equals(audit, "outcome", "ok"), sent_ns, [np.arange(audit.num_rows, dtype=float)])
    found = np.isfinite(row)
    replica = np.full(n, "", dtype=object)
    replica[found] = strings(audit, "replica")[row[found].astype(np.int64)]

    def apart(a: clocks.ClockOffset, b: clocks.ClockOffset) -> tuple[float, float]:
        """Clock a less clock b, ms, and how unsure that is (none for one clock)."""
        return (a.offset_s - b.offset_s) * 1e3, (0.0 if a is b else (a.uncertainty_s + b.uncertainty_s) * 1e3)

    node = run.child_nodes.get
    hub = clocks.SAME_CLOCK  # the driver's router runs on this host
    walls = run.node_walls
    up_err, down_err = np.full(n, np.nan), np.full(n, np.nan)
    keep = np.zeros(n, dtype=bool)
    run.router_split_error_ms = 0.0
    for k, rid in sorted({(int(a), str(b)) for a, b in zip(shard, replica)}):
        rows = (shard == k) & (replica == rid)
        robot_node, replica_node = node(f"shard:{k}"), node(f"server:{rid}")
        if k < 0 or not rid or robot_node not in walls or replica_node not in walls:
            continue
        robot_wall, replica_wall = walls[robot_node], walls[replica_node]
        up_stamp, down_stamp = (robot_wall, replica_wall) if run.routers == "per_node" else (hub, hub)
        (ue, uu), (de, du) = apart(up_stamp, replica_wall), apart(down_stamp, robot_wall)
        up_err[rows], down_err[rows] = ue, de
        hop = (
            float(np.nanmedian((np.asarray(up, float)[rows] + np.asarray(down, float)[rows]) / 2.0))
            if np.isfinite(np.asarray(up, float)[rows]).any()
            else float("nan")
        )
        err = max(uu, du)
        if err > 0 and not err <= HOP_SPLIT_MAX_CLOCK_ERROR * hop:
            run.router_split_dropped.append(
                {
                    "shard": k,
                    "replica": rid,
                    "requests": int(rows.sum()),
                    "clock_error_ms": round(err, 3),
                    "hop_ms_p50": round(hop, 3),
                }
            )
            continue
        keep |= rows
        run.router_split_error_ms = max(run.router_split_error_ms, err)
    return up_err, down_err, keep


def per_robot(run: RunState, robots: np.ndarray, field: str, default) -> np.ndarray:
    """Each row's robot's `field` in the run's robot table (`default` where the robot or its field is unknown):
    a numpy array of objects."""
    of = {r["robot"]: r.get(field) for r in run.robot_table}
    out = [of.get(int(r)) for r in robots]
    return np.array([default if v is None or v == "" else v for v in out], dtype=object)


def robot_clocks(run: RunState, robots: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray]:
    """Per record row: its robot's shard's clock offset and uncertainty, ms (None, None: all on this clock), and
    the shard."""
    shard = per_robot(run, robots, "shard", -1).astype(np.int64)
    by_shard = {k: run.clocks.get(f"shard:{k}", clocks.SAME_CLOCK) for k in {r["shard"] for r in run.robot_table}}
    if all(o.same_clock for o in by_shard.values()):
        return None, None, shard
    offsets = np.array([by_shard[k].offset_s * 1e3 if k in by_shard else np.nan for k in shard])
    errors = np.array([by_shard[k].uncertainty_s * 1e3 if k in by_shard else np.inf for k in shard])
    return offsets, errors, shard


def clock_facts(run: RunState) -> dict:
    """summary.json's `clock`: each child's offset and whether the uplink/downlink split could be trusted."""
    pairs = run.hop_split_dropped or []
    dropped = sum(p["requests"] for p in pairs)
    split = {
        "valid": not pairs,
        "requests_dropped": dropped,
        "dropped_pairs": pairs,
        "max_clock_error_of_hop": HOP_SPLIT_MAX_CLOCK_ERROR,
    }
    if pairs:
        split["note"] = f"{dropped} answered requests have no uplink_ms/downlink_ms: " + "; ".join(
            f"shard {p['shard']} -> {p['replica']}: clocks unsure by {p['clock_error_ms']:.2f} ms, over "
            f"{HOP_SPLIT_MAX_CLOCK_ERROR:.0%} of the {p['hop_ms_p50']:.2f} ms one-way hop"
            for p in pairs
        )
    facts = {"children": {n: o.to_json() for n, o in sorted(run.clocks.items())}, "hop_split": split}
    if run.cluster is not None:  # the router stamps' split across the nodes' wall clocks (cluster_stamp_error)
        facts["node_walls"] = {n: o.to_json() for n, o in sorted(run.node_walls.items())}
        facts["router_split"] = router_split_facts(run)
    return facts


def router_split_facts(run: RunState) -> dict:
    """summary.json's `clock.router_split` in a cluster run: whether every request's hops could be split at the
    router across its nodes' wall clocks, the largest clock error of those split, and the pairs left unsplit."""
    pairs = run.router_split_dropped or []
    dropped = sum(p["requests"] for p in pairs)
    out = {
        "valid": not pairs,
        "requests_dropped": dropped,
        "dropped_pairs": pairs,
        "clock_error_ms": round(float(run.router_split_error_ms), 3),
        "max_clock_error_of_hop": HOP_SPLIT_MAX_CLOCK_ERROR,
    }
    if pairs:
        out["note"] = f"{dropped} answered requests have no hops split at the router: " + "; ".join(
            f"shard {p['shard']} -> {p['replica']}: the nodes' wall clocks unsure by {p['clock_error_ms']:.2f} ms, "
            f"over {HOP_SPLIT_MAX_CLOCK_ERROR:.0%} of the {p['hop_ms_p50']:.2f} ms one-way hop"
            for p in pairs
        )
    return out
