"""A finished run's records into its evidence: every shard's Arrow streams merged into the run's parquet files,
each request's round trip split into hops (robot -> router -> replica and back) on one clock, and the bench's share of
each hop, of the queue wait and of the forward pass (docs/bench.md "How much is the bench").

`collect` is the run's collect phase: it reads the run's state (bench.run.state: its scenario, children, clocks,
logs, robot table, proxies' legs) and leaves what the verdict reads on it (`audit`, `hop_split_dropped`,
`router_split_dropped`, `hop_floors`, `robot_hops`, `server_replay`, `encode_floors`). Invariant: a figure that cannot
be computed becomes NaN or a note, never a lost record: the parquet files are written whatever the split meets.
The split itself is bench.run.hops's, the bench's share bench.run.benchshare's (their names are re-exported here).
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
from bench.run.benchshare import (  # noqa: F401 - re-exported
    by_site_and_node,
    hop_bench_share,
    robot_hop_bench_share,
    server_bench_share,
    unloaded_forward,
)
from bench.run.hops import (  # noqa: F401 - re-exported
    HOP_SPLIT_MAX_CLOCK_ERROR,
    audit_lines,
    clock_facts,
    cluster_stamp_error,
    hop_split,
    per_robot,
    robot_clocks,
    router_split,
    router_split_facts,
    server_overhead,
)
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
        if kind in records.OPTIONAL_KINDS and not t.num_rows:
            continue
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
    final_states, parity, raises, moves = {}, {}, {}, {}
    for msg in run.done.values():
        for r, st in (msg.get("final_states") or {}).items():
            final_states[int(r)] = st
        for r, n in (msg.get("moves") or {}).items():
            moves[int(r)] = int(n)
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
        moves=moves,
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
