"""The report phase's memory per request: what `collect` (bench.run.collect) holds for the servers' audit lines and
the edge's records.

    python -m benchmarks.report_memory [--requests 50000 200000] [--reps 3] [--baseline DIR] [--code DIR]

Writes a synthetic run: a 300-robot fleet's requests over three replicas (r2 on a clock 5 s off, as a replica on
another host), each as the audit line server/audit.py writes (its field order, the extras server/service.py and
server/guard.py add: one line in 1000 a `denied:` line), and the edge's request records as the Arrow stream a
shard writes (bench.fleet.records), joined on `client_mono_ns`. Then, in a fresh process per measurement (its
code tree first on the path), a real `bench.run.runner.Run` over those files does what the report phase does with
them: `collect` (the audit, the hop split join, server_requests.parquet and the other parquet files, the
checkpoints, attacks and denials), `fidelity_of` and `forward_series` (bench.run.verdict). Two figures per request
count: `audit` (the audit lines alone: `collect_audit`, what it holds afterwards) and `collect` (the whole path: the
peak, and what it holds afterwards). Memory is the process's peak resident set (VmHWM, reset just before the
measured step) and its RSS after, minus its RSS before; per request is the slope between the two request counts (the
fixed cost drops out), the median of `--reps` processes each. `--baseline DIR`: the same measurement of another
checkout (for example the main branch) in the same run, interleaved, and the ratio. No tick records here: see
`--ticks`.

    python -m benchmarks.report_memory --ticks 300000 1200000 [--reps 3] [--baseline DIR]

`--ticks SMALL LARGE`: instead, the whole report phase (`bench.run.verdict.judge`: collect, figures, assertions,
fidelity, summary.json, report.html) of two synthetic runs that differ only in their tick records (`write_ticks`: the
300-robot headline's shape, 10,000 requests each): the peak per robot-tick is the slope between them, what
`REPORT_BYTES_PER_TICK` prices (bench/run/sizing.py).

    python -m benchmarks.report_memory --replay reports/soak/20261126T112536Z [--replay DIR ...] [--baseline DIR]

`--replay RUN_DIR`: instead, a real run's whole report phase again (`bench.run.verdict.judge`: collect, figures,
assertions, fidelity, summary.json and report.html, written to a scratch copy), from its parquet files turned back into
the shards' Arrow streams, its servers' audit logs and its clock.json; the peak resident set over the RSS before
(VmHWM), per code tree, beside what the run itself recorded (summary.json `memory.report_phase`); with
`--baseline`, what the code saved per request and per robot-tick (the run's whole saving over either count).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import Result, cli, parse_with_out, run_main, write_report

REPORT = Path("reports/bench/report_memory.json")
ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "300_robots_wan.yaml"
ROBOTS = 300
REPLICAS = ("r0", "r1", "r2")
SKEWED = "r2"  # on a clock SKEW_S ahead of the runner's: collect_audit shifts its lines
SKEW_S = 5.0
DURATION_S = 60.0
T0_MS = 1_000_000.0  # the run's t = 0 on the runner's monotonic clock
FPS = 30.0
WARMUP_S = 15.0
TICK_RUN_REQUESTS = 10_000  # the per-tick runs' requests: the same in both sizes, so they drop out of the slope
UNLOADED = {"1": 2.1, "8": 3.4, "32": 6.0}


def write_run(directory: Path, requests: int) -> dict:
    """The synthetic run's files: logs/audit-<replica>.jsonl (the servers' lines) and records/requests.0.arrow (the
    edge's), plus each replica's log line with its unloaded forward time. Returns their paths."""
    import numpy as np
    import pyarrow as pa

    from bench.fleet import records
    from server.audit import FIELDS, _dumps

    rng = np.random.default_rng(7)
    logs, recs = directory / "logs", directory / "records"
    logs.mkdir(parents=True, exist_ok=True)
    recs.mkdir(parents=True, exist_ok=True)
    robot = rng.integers(0, ROBOTS, requests).astype(np.int32)
    t = np.sort(rng.uniform(0.0, DURATION_S, requests))
    sent_ns = ((T0_MS + t * 1e3 - 40.0) * 1e6).astype(np.int64) + np.arange(requests)  # unique join keys
    uuid = [f"robot-{i:012x}" for i in range(ROBOTS)]
    session = [f"{(i * 2654435761) % 2**64:016x}" for i in range(ROBOTS)]
    ckpt = "4e72cafa545b632352ac7c8826613803f1bd1fb4cd60e8d617e75f925d13af40"
    seq = np.zeros(ROBOTS, dtype=np.int64)
    files = {rid: open(logs / f"audit-{rid}.jsonl", "w") for rid in REPLICAS}
    try:
        for i in range(requests):
            r = int(robot[i])
            rid = REPLICAS[r % len(REPLICAS)]
            seq[r] += 1
            received = sent_ns[i] / 1e6 + 12.0 + (SKEW_S * 1e3 if rid == SKEWED else 0.0)
            sent = received + 20.0 + (i % 7)
            if i % 1000 == 999:  # server/guard.py's denial line
                rec = {
                    "session_id": None,
                    "client_uuid": uuid[r],
                    "seq_id": None,
                    "outcome": "denied:reset_unknown",
                    "denied_count": 1 + i % 3,
                    "detail": "reset for a session this server does not hold",
                    "replica_id": rid,
                }
            else:  # server/service.py's answered request
                rec = {
                    "session_id": session[r],
                    "client_uuid": uuid[r],
                    "seq_id": int(seq[r]),
                    "episode_id": r % 5,
                    "client_mono_ns": int(sent_ns[i]),
                    "queue_wait_ms": round(20.0 + i % 11 * 0.37, 3),
                    "inference_ms": 4.493,
                    "chunk_range": [0, 30],
                    "superseded_seqs": 0,
                    "outcome": "ok",
                    "model_id": "reacher",
                    "replica_id": rid,
                    "checkpoint_hash": ckpt,
                    "emulated_ms": 0.0,
                    "rtc_applied": False,
                    "forward_ms": round(4.0 + i % 13 * 0.11, 3),
                    "batch": 1 + i % 32,
                    "received_mono_ms": round(received, 3),
                    "sent_mono_ms": round(sent, 3),
                }
            line = {
                "ts": f"2026-11-26T11:25:{40 + t[i] / 1e3:09.6f}+00:00",
                "mono_ms": round(sent + 0.4, 3),
                **{k: rec.get(k) for k in FIELDS},
                **{k: v for k, v in rec.items() if k not in FIELDS},
            }
            files[rid].write(_dumps(line) + "\n")
    finally:
        for f in files.values():
            f.close()
    for rid in REPLICAS:
        (logs / f"server-{rid}.log").write_text(f"INFO unloaded forward ms by batch size: {json.dumps(UNLOADED)}\n")
    cols = {
        "robot": robot,
        "t": t + 0.05,
        "seq": np.arange(requests),
        "rtt_ms": np.full(requests, 60.0),
        "queue_wait_ms": np.full(requests, 21.0),
        "inference_ms": np.full(requests, 4.5),
        "network_ms": np.full(requests, 30.0),
        "encode_ms": np.full(requests, 1.2),
        "send_lag_ms": np.full(requests, 0.3),
        "merge_lag_ms": np.full(requests, 0.2),
        "delay_steps": np.full(requests, 2),
        "execution_steps": np.full(requests, 15),
        "steps_remaining": np.full(requests, 10),
        "superseded_seqs": np.zeros(requests),
        "outcome": ["ok"] * requests,
        "sent_ns": sent_ns,
        "downlink_from_router_ms": np.full(requests, np.nan),
    }  # no router stamps: the split is not measured
    batch = records.to_record_batch("requests", cols, requests)
    with pa.OSFile(str(recs / "requests.0.arrow"), "wb") as f, pa.ipc.new_stream(f, batch.schema) as w:
        w.write_batch(batch)
    return {"logs": str(logs), "records": str(recs)}


def write_ticks(directory: Path, ticks: int) -> None:
    """`ticks` tick records of the fleet (ROBOTS robots at FPS from -WARMUP_S, the headline's reacher: 2-wide
    actions) as the shards write them: records/ticks.<shard>.arrow, time-ordered, 16384 rows a batch. Their
    shape follows the 120 s headline's (300_robots_wan 20261126T132049Z): ~12 % None ticks (each episode's first
    second awaits a chunk; a stall now and then), ~5 % host-late, a session id (16 hex) per robot per ~2 min."""
    import numpy as np
    import pyarrow as pa

    from bench.fleet import records

    rng = np.random.default_rng(11)
    per_robot = -(-ticks // ROBOTS)
    k = np.repeat(np.arange(per_robot), ROBOTS)[:ticks]  # a robot's tick number: rows ordered by time, then robot
    robot = np.tile(np.arange(ROBOTS, dtype=np.int32), per_robot)[:ticks]
    t = -WARMUP_S + k / FPS
    episode = (k // 600).astype(np.int32)
    stall = (k % 3000 >= 2900) & (robot % 4 == 0)
    none = (k % 600 < 30) | stall
    cls = np.where(rng.random(ticks) < 0.05, 3, 0).astype(np.int8)
    seq = np.where(none, -1, k // 15).astype(np.int64)
    names = np.array(
        [""] + [f"{(i * 2654435761 + 97) % 2**64:016x}" for i in range(ROBOTS * (per_robot // 4000 + 1))], dtype=object
    )
    session = names[np.where(k < 30, 0, 1 + robot.astype(np.int64) * (per_robot // 4000 + 1) + k // 4000)]
    state = np.array(["STREAMING", "STALLED", "CONNECTING"], dtype=object)[np.where(stall, 1, np.where(k < 30, 2, 0))]
    source = np.array(["chunk", "none"], dtype=object)[none.astype(np.int8)]
    cols = {
        "robot": robot,
        "t": t,
        "lateness_ms": rng.gamma(2.0, 0.4, ticks).astype(np.float32),
        "host_delay_ms": rng.gamma(2.0, 0.3, ticks).astype(np.float32),
        "engine_ms": rng.gamma(2.0, 0.05, ticks).astype(np.float32),
        "tick_class": cls,
        "state_digest": rng.integers(0, 2**32, ticks, dtype=np.uint32),
        "seq": seq,
        "session_id": session,
        "episode_id": np.where(none, -1, episode),
        "chunk_index": np.where(none, -1, k % 15).astype(np.int32),
        "action_age_s": np.where(none, np.nan, (k % 15) / FPS).astype(np.float32),
        "source": source,
        "is_none": none,
        "engine_state": state,
        "robot_episode": episode,
    }
    values = rng.uniform(-1.0, 1.0, 2 * ticks).astype(np.float32)
    schema = records.arrow_schema("ticks")
    (directory / "records").mkdir(parents=True, exist_ok=True)
    with pa.OSFile(str(directory / "records" / "ticks.0.arrow"), "wb") as f, pa.ipc.new_stream(f, schema) as w:
        for a in range(0, ticks, 16384):
            b = min(a + 16384, ticks)
            n = np.count_nonzero(~none[a:b])
            offsets = np.concatenate([[0], np.cumsum(np.where(none[a:b], 0, 2))]).astype(np.int32)
            action = pa.ListArray.from_arrays(
                pa.array(offsets), pa.array(values[2 * a : 2 * a + 2 * n]), mask=pa.array(none[a:b])
            )
            arrays = [pa.array(cols[name][a:b], type=schema.field(name).type) for name in schema.names[:-1]]
            w.write_batch(pa.RecordBatch.from_arrays([*arrays, action], schema=schema))


# What both measuring children start with: their arguments, the imports the report phase will pull in anyway (so
# importing them is not measured), and the two readings: RSS now, and the peak since clear_refs reset it.
CHILD_PRELUDE = r"""
import gc, json, re, shutil, sys, time
from pathlib import Path
args = json.loads(sys.argv[1])
import numpy as np, psutil, pyarrow, pyarrow.parquet as pq
from bench.fleet import clock as clocks
from bench.run.runner import Run
try:  # the run's phases as functions over its declared state (bench.run.state)
    from bench.run.collect import collect, collect_audit
    from bench.run.verdict import fidelity_of, forward_series, judge
    open_run = lambda s, d: Run(s, d, progress=False).state
except ImportError:  # --baseline/--code: a checkout whose Run held its phases as methods
    collect, collect_audit, judge = Run.collect, Run.collect_audit, Run.judge
    fidelity_of, forward_series = Run.fidelity, Run._forward_series
    open_run = lambda s, d: Run(s, d, progress=False)
from bench.scenario.load import load_scenario

def rss_mb():
    return psutil.Process().memory_info().rss / 2**20

def hwm_mb():
    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024
"""


CHILD = (
    CHILD_PRELUDE
    + r"""

run_dir = Path(args["run_dir"])
shutil.copytree(args["records"], run_dir / "records")
(run_dir / "logs").mkdir(parents=True)
for p in Path(args["logs"]).glob("server-*.log"):
    shutil.copy(p, run_dir / "logs" / p.name)
run = open_run(load_scenario(args["scenario"]), run_dir)
run.servers = {rid: {"audit": str(Path(args["logs"]) / f"audit-{rid}.jsonl")} for rid in args["replicas"]}
run.clocks = {f"server:{args['skewed']}": clocks.ClockOffset(args["skew_s"], 0.0002, 0.0004)}
getattr(run, "state", run).t0_mono = args["t0_ms"] / 1e3  # an older Run: its live state
run.fault_log = []
if args["mode"] == "judge":  # the robots as the runner lists them (bench.run.specs.shard_specs)
    run.robot_table = [{"robot": r, "group": g.name, "engine": g.engine_kind, "index": i, "site": g.site,
                        "shard": r % len(args["replicas"]), "robot_type": g.robot, "fps": g.fps,
                        "max_action_age_s": 1.5, "deadline_s": 1 / 6}
                       for r, (g, i) in enumerate((g, i) for g in run.s.groups for i in range(g.count))]
gc.collect()
before = rss_mb()
Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the RSS now
t = time.perf_counter()
if args["mode"] == "audit":
    held = collect_audit(run)
elif args["mode"] == "judge":  # the whole report phase: collect, figures, assertions, fidelity, summary, report
    outcome = judge(run, None)
    assert not outcome.error, outcome.error
else:
    data = collect(run)
    fidelity = fidelity_of(run, data)
    series = forward_series(run)
    assert "note" not in fidelity, fidelity.get("note")
    assert len(fidelity["replicas"]) == len(args["replicas"]) and series, (fidelity, series)
seconds = time.perf_counter() - t
peak, after = hwm_mb(), rss_mb()
print(json.dumps({"rss_before_mb": round(before, 2), "peak_mb": round(peak - before, 2),
                  "held_mb": round(after - before, 2), "seconds": round(seconds, 3)}))
"""
)


REPLAY_CHILD = (
    CHILD_PRELUDE
    + r"""

src, run_dir = Path(args["source"]), Path(args["run_dir"])
shutil.copytree(args["records"], run_dir / "records")
(run_dir / "logs").symlink_to((src / "logs").resolve())
clock = json.loads((src / "clock.json").read_text())
summary = json.loads((src / "summary.json").read_text())
run = open_run(load_scenario(src / "scenario.yaml"), run_dir)
run.servers = {r.id: {"audit": str(src / "logs" / f"audit-{r.id}.jsonl"), "manifest": src / "manifests" / f"{r.id}.yaml"}
               for r in run.s.replicas}
run.clocks = {k: clocks.ClockOffset(o["offset_ms"] / 1e3, o["uncertainty_ms"] / 1e3, o["rtt_ms"] / 1e3, o["exchanges"],
                                    o["same_clock"]) for k, o in clock.get("offsets", {}).items()}
getattr(run, "state", run).t0_mono = clock["t0_mono_ms"] / 1e3
run.robot_table = pq.read_table(src / "robots.parquet").to_pylist()
run.fault_log = summary.get("faults") or []
before = rss_mb()
Path("/proc/self/clear_refs").write_text("5")
t = time.perf_counter()
outcome = judge(run, None)
seconds = time.perf_counter() - t
peak = hwm_mb()
print(json.dumps({"rss_before_mb": round(before, 1), "peak_mb": round(peak - before, 1), "seconds": round(seconds, 1),
                  "error": outcome.error, "verdict": outcome.verdict}))
"""
)


def prepare_replay(source: Path, directory: Path) -> dict:
    """The run's record kinds back as the shards' Arrow streams (what `collect` merges), in `directory`."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench.fleet import records

    recs = directory / "records"
    recs.mkdir(parents=True)
    counts = {}
    for kind in records.SCHEMAS:
        path = source / f"{kind}.parquet"
        if not path.is_file():
            continue
        pf = pq.ParquetFile(path)
        schema = records.arrow_schema(kind)
        counts[kind] = pf.metadata.num_rows
        have = [n for n in schema.names if n in pf.schema_arrow.names]  # requests: not the hop split's columns
        with pa.OSFile(str(recs / f"{kind}.0.arrow"), "wb") as f, pa.ipc.new_stream(f, schema) as w:
            for batch in pf.iter_batches(batch_size=65536, columns=have):
                # a column the run's bench did not record yet (an older run): NaN, as a float column reads unknown
                w.write_batch(
                    pa.RecordBatch.from_arrays(
                        [
                            batch.column(n)
                            if n in have
                            else pa.array(np.full(batch.num_rows, np.nan), schema.field(n).type)
                            for n in schema.names
                        ],
                        schema=schema,
                    )
                )
    audit = sum(1 for p in (source / "logs").glob("audit-*.jsonl") for _ in open(p, "rb"))
    return {"records": str(recs), "rows": counts, "audit_lines": audit}


def replay(sources: list[Path], trees: dict[str, Path], reps: int, tmp: Path) -> dict:
    out = {}
    k = 0
    for source in sources:
        prep = prepare_replay(source, tmp / f"replay-{len(out)}")
        recorded = json.loads((source / "summary.json").read_text())["memory"].get("report_phase") or {}
        row = {
            "rows": prep["rows"],
            "audit_lines": prep["audit_lines"],
            "recorded_report_phase": recorded,
            "recorded_growth_mb": round(recorded["peak_rss_mb"] - recorded["rss_before_mb"], 1) if recorded else None,
        }
        for rep in range(reps):
            for name, code in trees.items():
                k += 1
                args = {
                    "source": str(source.resolve()),
                    "records": prep["records"],
                    "run_dir": str(tmp / f"replay-run-{k}"),
                }
                env = {**os.environ, "PYTHONPATH": str(code), "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
                proc = subprocess.run(
                    [sys.executable, "-c", REPLAY_CHILD, json.dumps(args)],
                    capture_output=True,
                    text=True,
                    env=env,
                    cwd=str(code),
                    timeout=1800,
                )
                if proc.returncode != 0:
                    raise RuntimeError(f"{code} replay of {source}: exit {proc.returncode}: {proc.stderr[-1500:]}")
                got = json.loads(proc.stdout.strip().splitlines()[-1])
                if got["error"]:
                    raise RuntimeError(f"{code} replay of {source}: the report failed: {got['error'][:1500]}")
                row.setdefault(name, []).append(got)
                print(
                    f"replay {source.name} rep {rep + 1} {name:8}: peak +{got['peak_mb']:.1f} MB over "
                    f"{got['rss_before_mb']:.0f} MB, {got['seconds']:.1f} s (the run recorded +{row['recorded_growth_mb']} MB)",
                    flush=True,
                )
        for name in trees:
            row[f"{name}_peak_mb"] = statistics.median(x["peak_mb"] for x in row[name])
        if "baseline" in trees:
            saved = (row["baseline_peak_mb"] - row["code_peak_mb"]) * 2**20
            row["saved_bytes_per_request"] = round(saved / max(prep["rows"].get("requests", 0), 1), 1)
            row["saved_bytes_per_tick"] = round(saved / max(prep["rows"].get("ticks", 0), 1), 1)
            print(
                f"replay {source.name}: peak {row['baseline_peak_mb']:.0f} -> {row['code_peak_mb']:.0f} MB "
                f"({row['saved_bytes_per_tick']:.0f} B a robot-tick saved over {prep['rows'].get('ticks', 0)} ticks)",
                flush=True,
            )
        out[str(source)] = row
    return out


def measure_one(code: Path, files: dict, mode: str, tmp: Path, tag: str) -> dict:
    args = {
        **files,
        "mode": mode,
        "run_dir": str(tmp / tag),
        "scenario": str(SCENARIO),
        "replicas": list(REPLICAS),
        "skewed": SKEWED,
        "skew_s": SKEW_S,
        "t0_ms": T0_MS,
    }
    env = {**os.environ, "PYTHONPATH": str(code), "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(code),
        timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{code} {mode}: exit {proc.returncode}: {proc.stderr[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_ticks(sizes: tuple[int, int], trees: dict[str, Path], reps: int) -> dict:
    """The whole report phase (`bench.run.verdict.judge`) of synthetic runs that differ only in their tick count: its peak per
    robot-tick, the slope between the two sizes (medians of `reps` processes each, the trees interleaved)."""
    small, large = sizes
    raw: dict = {name: {n: [] for n in sizes} for name in trees}
    with tempfile.TemporaryDirectory(prefix="report-memory-") as tmp:
        tmp = Path(tmp)
        runs = {}
        for n in sizes:
            runs[n] = write_run(tmp / f"input-{n}", TICK_RUN_REQUESTS)
            write_ticks(tmp / f"input-{n}", n)
        k = 0
        for rep in range(reps):
            for n in sizes:
                for name, code in trees.items():
                    k += 1
                    got = measure_one(code, runs[n], "judge", tmp, f"run-{k}")
                    raw[name][n].append(got)
                    print(
                        f"rep {rep + 1} {name:8} judge {n:8d} ticks: peak +{got['peak_mb']:7.1f} MB, "
                        f"held +{got['held_mb']:7.1f} MB, {got['seconds']:.2f} s",
                        flush=True,
                    )
    figures: dict = {}
    for name in trees:
        med = {
            n: {key: statistics.median(x[key] for x in raw[name][n]) for key in ("peak_mb", "held_mb", "seconds")}
            for n in sizes
        }
        figures[name] = {
            "tree": str(trees[name]),
            "commit": _git(trees[name]),
            "median": {str(n): med[n] for n in sizes},
            "peak_bytes_per_tick": round((med[large]["peak_mb"] - med[small]["peak_mb"]) * 2**20 / (large - small), 1),
        }
        print(
            f"{name} ({figures[name]['commit']}): the whole report phase peaks "
            f"{figures[name]['peak_bytes_per_tick']:.0f} B a robot-tick"
        )
    report = {
        "ticks": list(sizes),
        "requests": TICK_RUN_REQUESTS,
        "reps": reps,
        "robots": ROBOTS,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "tick_figures": figures,
        "raw": raw,
    }
    if "baseline" in trees and figures["baseline"]["peak_bytes_per_tick"]:
        report["ratio_code_to_baseline"] = {
            "peak_bytes_per_tick": round(
                figures["code"]["peak_bytes_per_tick"] / figures["baseline"]["peak_bytes_per_tick"], 3
            )
        }
        print("code / baseline:", report["ratio_code_to_baseline"])
    return report


def _git(code: Path) -> str | None:
    out = subprocess.run(["git", "-C", str(code), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return out.stdout.strip() or None


def main(argv: list[str] | None = None) -> dict:
    parser = cli(__doc__)
    parser.add_argument(
        "--requests",
        type=int,
        nargs=2,
        default=[50_000, 200_000],
        metavar=("SMALL", "LARGE"),
        help="the two request counts whose difference gives the per-request slope",
    )
    parser.add_argument("--reps", type=int, default=3, help="fresh processes per figure (the median is reported)")
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout measured (default: this one)")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout measured in the same run")
    parser.add_argument(
        "--replay",
        type=Path,
        action="append",
        default=[],
        metavar="RUN_DIR",
        help="replay this real run's whole report phase instead (repeatable)",
    )
    parser.add_argument(
        "--ticks",
        type=int,
        nargs=2,
        default=None,
        metavar=("SMALL", "LARGE"),
        help="instead, the whole report phase per robot-tick: these two tick counts, "
        f"{TICK_RUN_REQUESTS} requests each",
    )
    args = parse_with_out(parser, argv, REPORT)
    small, large = args.requests
    if not 0 < small < large or args.reps < 1:
        parser.error("--requests needs 0 < SMALL < LARGE and --reps >= 1")
    if args.ticks is not None and not 0 < args.ticks[0] < args.ticks[1]:
        parser.error("--ticks needs 0 < SMALL < LARGE")
    trees = {"code": args.code.resolve()}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    for source in args.replay:
        missing = [
            f for f in ("summary.json", "clock.json", "scenario.yaml", "robots.parquet") if not (source / f).is_file()
        ]
        if missing:
            parser.error(f"--replay {source}: not a run directory with its files ({', '.join(missing)} missing)")
    if args.replay:
        with tempfile.TemporaryDirectory(prefix="report-memory-") as tmp:
            report = {
                "replay": replay(args.replay, trees, args.reps, Path(tmp)),
                "reps": args.reps,
                "trees": {n: {"tree": str(c), "commit": _git(c)} for n, c in trees.items()},
                "load_average": [round(x, 2) for x in os.getloadavg()],
            }
        return write_report(args.out, report)
    if args.ticks is not None:
        return write_report(args.out, measure_ticks(tuple(args.ticks), trees, args.reps))
    raw: dict = {name: {mode: {n: [] for n in (small, large)} for mode in ("audit", "collect")} for name in trees}
    with tempfile.TemporaryDirectory(prefix="report-memory-") as tmp:
        tmp = Path(tmp)
        runs = {n: write_run(tmp / f"input-{n}", n) for n in (small, large)}
        k = 0
        for rep in range(args.reps):
            for n in (small, large):
                for mode in ("audit", "collect"):
                    for name, code in trees.items():  # interleaved: a load change hits both trees alike
                        k += 1
                        got = measure_one(code, runs[n], mode, tmp, f"run-{k}")
                        raw[name][mode][n].append(got)
                        print(
                            f"rep {rep + 1} {name:8} {mode:7} {n:7d} requests: peak +{got['peak_mb']:7.1f} MB, "
                            f"held +{got['held_mb']:7.1f} MB, {got['seconds']:.2f} s",
                            flush=True,
                        )
    figures: dict = {}
    for name in trees:
        figures[name] = {"tree": str(trees[name]), "commit": _git(trees[name])}
        for mode in ("audit", "collect"):
            med = {
                n: {
                    key: statistics.median(x[key] for x in raw[name][mode][n])
                    for key in ("peak_mb", "held_mb", "seconds")
                }
                for n in (small, large)
            }
            slope = {
                key: round((med[large][key] - med[small][key]) * 2**20 / (large - small), 1)
                for key in ("peak_mb", "held_mb")
            }
            figures[name][mode] = {
                "median": {str(n): med[n] for n in med},
                "peak_bytes_per_request": slope["peak_mb"],
                "held_bytes_per_request": slope["held_mb"],
            }
    report = {
        "requests": [small, large],
        "reps": args.reps,
        "robots": ROBOTS,
        "replicas": list(REPLICAS),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "figures": figures,
        "raw": raw,
    }
    if "baseline" in trees:
        report["ratio_code_to_baseline"] = {
            f"{mode}_{key}": round(figures["code"][mode][key] / figures["baseline"][mode][key], 3)
            for mode in ("audit", "collect")
            for key in ("peak_bytes_per_request", "held_bytes_per_request")
            if figures["baseline"][mode][key]
        }
    for name in trees:
        f = figures[name]
        print(
            f"{name} ({f['commit']}): audit lines peak {f['audit']['peak_bytes_per_request']:.0f} B/request, held "
            f"{f['audit']['held_bytes_per_request']:.0f}; whole collect peak {f['collect']['peak_bytes_per_request']:.0f}"
            f" B/request, held {f['collect']['held_bytes_per_request']:.0f}"
        )
    if "ratio_code_to_baseline" in report:
        print("code / baseline:", report["ratio_code_to_baseline"])
    return write_report(args.out, report)


def run(quick: bool) -> Result:
    res = run_main(main, ["--requests", "10000", "40000", "--reps", "1"] if quick else [])
    f = res.details["figures"]["code"]
    res.add("report phase peak per request (collect, fidelity)", f["collect"]["peak_bytes_per_request"], "B")
    res.add("audit lines held per request (collect_audit)", f["audit"]["held_bytes_per_request"], "B")
    return res


if __name__ == "__main__":
    main()
