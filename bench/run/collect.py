"""A finished run's records into its evidence: every shard's Arrow streams merged into the run's parquet files,
each request's round trip split into hops (robot -> router -> replica and back) on one clock, and the bench's share of
each hop, of the queue wait and of the forward pass (docs/bench.md "How much is the bench").

`collect` is the run's collect phase: it reads the run's state (bench.run.state: its scenario, children, clocks,
logs, robot table, proxies' legs) and leaves what the verdict reads on it (`audit`, `hop_split_dropped`,
`router_split_dropped`, `hop_floors`, `robot_hops`, `server_replay`, `encode_floors`). Invariant: a figure that cannot
be computed becomes NaN or a note, never a lost record: the parquet files are written whatever the split meets.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from bench.evidence import fidelity as fid
from bench.evidence import figures as figs
from bench.fleet import clock as clocks
from bench.fleet import records
from bench.run.legs import window_legs
from bench.run.samplelog import SampleLog
from bench.run.state import RunState


def cpu_table(samples: SampleLog):
    """The CPU samples as columns `t`, `host_percent`, `speed_probe_ms` (null but every 10th) and
    `cpu:<process>` (% of a core) for every process ever sampled: one not yet started or already gone is
    null in that row; `rss_mb:<process>` and `fds:<process>` likewise."""
    import pyarrow as pa

    cols = {f"cpu:{k}": pa.array(samples.column("processes", k), pa.float64()) for k in samples.keys("processes")}
    for key, typ in (("rss_mb", pa.float64()), ("fds", pa.int64())):  # memory and descriptors, when sampled
        for k in samples.keys(key):
            cols[f"{key}:{k}"] = pa.array(samples.column(key, k), typ)
    return pa.table(
        {
            "t": samples.column("t"),
            "host_percent": samples.column("host_percent"),
            "speed_probe_ms": pa.array(samples.column("speed_probe_ms"), pa.float64()),
            **cols,
        }
    )


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


def audit_table(run: RunState):
    """The audit table `collect` read (an empty one before it ran)."""
    import pyarrow as pa

    audit = run.audit
    return audit if audit is not None else pa.table({})


def collect(run: RunState) -> figs.RunData:
    """Merge every shard's Arrow streams into parquet files; return numpy views for figures."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench.evidence.audit import checkpoints_by_session, rows_with_prefix

    run.audit = audit = collect_audit(run)
    tables = {}
    for kind in records.SCHEMAS:
        if kind in ("ticks", "requests", "transitions"):  # a robot's rows together, in time
            t = records.collect_sorted(run.rec_dir, kind)  # never the unsorted whole beside the sorted one
        else:
            t = records.collect(run.rec_dir, kind)
        if kind == "requests":
            t_recv = t.column("t").to_numpy() + float(run.t0_mono or 0.0)
            offset_ms, error_ms, shard = robot_clocks(run, t.column("robot").to_numpy())
            lines = audit_lines(t.column("sent_ns").to_numpy(), audit)
            up, down, run.hop_split_dropped = hop_split(
                t.column("sent_ns").to_numpy(), t_recv, audit, offset_ms, error_ms, shard, lines
            )
            t = (
                t.append_column("uplink_ms", pa.array(up))
                .append_column("downlink_ms", pa.array(down))
                .append_column("server_overhead_ms", pa.array(server_overhead(lines)))
            )
            sent_ms = t.column("sent_ns").to_numpy() / 1e6  # the robots' stamps, on the runner's clock
            if offset_ms is not None:
                sent_ms = sent_ms - np.asarray(offset_ms, dtype=float)
            split = router_split(
                run,
                audit,
                t.column("sent_ns").to_numpy(),
                sent_ms,
                up,
                down,
                t.column("downlink_from_router_ms").to_numpy(),
                t.column("robot").to_numpy(),
            )
            for name, values in split.items():
                if name in t.column_names:
                    t = t.set_column(t.column_names.index(name), name, pa.array(values))
                else:
                    t = t.append_column(name, pa.array(values))
            qw_bench, inf_bench = server_bench_share(run, audit, t.column("sent_ns").to_numpy())
            t = t.append_column("queue_wait_bench_ms", pa.array(qw_bench)).append_column(
                "inference_bench_ms", pa.array(inf_bench)
            )
            try:  # a figure of the evidence: the run's records must be written whatever it meets
                hops = {
                    **hop_bench_share(run, audit, t.column("sent_ns").to_numpy(), split),
                    **robot_hop_bench_share(run, t.column("robot").to_numpy(), split, sent_ms, t_recv),
                }
            except Exception as exc:
                print(f"bench: the hops' bench share could not be split: {exc!r}", file=sys.stderr)
                hops = {
                    h[:-3] + "_bench_ms": np.full(t.num_rows, np.nan, np.float32)
                    for h in fid.SERVER_HOPS + tuple(h for h, _ in fid.ROBOT_HOPS)
                }
            for name, values in hops.items():
                t = t.append_column(name, pa.array(values))
            encode_bench, run.encode_floors = fid.encode_excess(
                t.column("encode_ms").to_numpy(), per_robot(run, t.column("robot").to_numpy(), "group", "")
            )
            t = t.append_column("encode_bench_ms", pa.array(encode_bench))
        pq.write_table(t, run.run_dir / f"{kind}.parquet")
        tables[kind] = t
    robots_tab = (
        pa.Table.from_pylist(run.robot_table, schema=None)
        if run.robot_table
        else pa.table({"robot": pa.array([], pa.int32())})
    )
    pq.write_table(robots_tab, run.run_dir / "robots.parquet")
    if audit.num_rows:
        pq.write_table(audit, run.run_dir / "server_requests.parquet")
    if run.server_samples:
        pq.write_table(pa.Table.from_pylist(list(run.server_samples)), run.run_dir / "server_metrics.parquet")
    if run.cpu.samples:
        pq.write_table(cpu_table(run.cpu.samples), run.run_dir / "cpu.parquet")
    for p in run.rec_dir.glob("*.arrow"):
        p.unlink()  # merged into the parquet files above
    try:
        run.rec_dir.rmdir()
    except OSError:
        pass
    ticks = figs.table_to_numpy(tables["ticks"].drop_columns(["action"])) if tables["ticks"].num_rows else {}
    final_states, parity, raises = {}, {}, {}
    for msg in run.done.values():
        for r, st in (msg.get("final_states") or {}).items():
            final_states[int(r)] = st
        for r, raised in (msg.get("engine_raises") or {}).items():
            raises[int(r)] = int(raised["count"])
        for r, counts in (msg.get("parity") or {}).items():
            parity[int(r)] = counts
    data = figs.RunData(
        robots={k: np.asarray(v) for k, v in figs.table_to_numpy(robots_tab).items()},
        ticks=ticks,
        requests=figs.table_to_numpy(tables["requests"]),
        transitions=figs.table_to_numpy(tables["transitions"]),
        episodes=figs.table_to_numpy(tables["episodes"]),
        loop=figs.table_to_numpy(tables["loop"]),
        duration_s=run.s.duration_s,
        fault_windows=[w for w in run.fault_log if w.get("t_start") is not None],
        server_samples=run.server_samples,
        cpu_samples=run.cpu.samples,
        final_states=final_states,
        parity=parity,
        engine_raises=raises,
        session_checkpoints=checkpoints_by_session(audit),
        attacks=collect_attacks(run, audit),
        server_crashes=run.server_crashes,
        leftovers=run.leftover_report,
        security_denials=rows_with_prefix(audit, "outcome", "denied:"),
    )
    if data.attacks:
        (run.run_dir / "attacks.json").write_text(json.dumps(data.attacks, indent=1))
    if tables["ticks"].num_rows:
        from bench.robots import robot_type

        scale = {}
        for row in run.robot_table:
            cls = robot_type(row["robot_type"])
            scale[row["robot"]] = np.asarray(cls.action_high, float) - np.asarray(cls.action_low, float)
        data.seam = figs.measured_seam_inputs(ticks, ListRows(tables["ticks"].column("action")), scale)
    del tables, t  # what figures need is in `data` now (its numeric columns still views of Arrow buffers)
    pa.default_memory_pool().release_unused()
    return data


def collect_audit(run: RunState):
    """Every replica's audit log as one table (bench.evidence.audit), each on this runner's clock."""
    from bench.evidence import audit

    return audit.read(
        (rid, info["audit"], run.clocks.get(f"server:{rid}", clocks.SAME_CLOCK))
        for rid, info in run.servers.items()
        if info.get("audit") and Path(info["audit"]).is_file()
    )


def collect_attacks(run: RunState, audit) -> list[dict]:
    """attacks.jsonl, with the `audit_forged` verdicts resolved from the servers' audit lines (`audit`:
    bench.evidence.audit's table)."""
    from bench.evidence.audit import at_least, equals

    path = run.attack_log
    rows = []
    if path is not None and path.is_file():
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in rows:
        if r.get("judge") == "audit_forged":
            served = int(
                np.count_nonzero(
                    equals(audit, "client_uuid", r["victim"])
                    & equals(audit, "outcome", "ok")
                    & at_least(audit, "seq_id", r["seq_base"])
                )
            )
            r["outcome"] = "breached" if served else "denied"
            r["evidence"] += f"; the server served {served} of them (audit)"
    started = {a["name"] for a in run.s.attackers}
    finished = {r["attacker"] for r in rows}
    for name in sorted(started - finished):  # an attacker that died or never ran must not read as "all denied"
        rows.append(
            {
                "attacker": name,
                "attack": "*",
                "attempts": 0,
                "outcome": "error",
                "evidence": f"attacker {name} wrote no results; see logs/attacker-{name}.log",
            }
        )
    return rows


def unloaded_forward(run: RunState) -> dict[str, dict | None]:
    """Each replica's unloaded forward ms by batch size, from its log (read once)."""
    if run.unloaded is None:
        run.unloaded = {rid: fid.unloaded_forward(run.logs / f"server-{rid}.log") for rid in run.servers}
    return run.unloaded


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


class ListRows:
    """Row i of an Arrow list column as a numpy slice, without a Python list per row: `to_pylist` of a 30-minute,
    52-robot run's 2.8 M tick actions is millions of small lists held at once in the report phase."""

    def __init__(self, column):
        arr = column.combine_chunks() if hasattr(column, "combine_chunks") else column
        self.offsets = arr.offsets.to_numpy()
        # the values as recorded (float32, a view of the column): seam_inputs widens one robot's rows at a time
        self.values = arr.values.to_numpy(zero_copy_only=False)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]
