"""Does the bench's work follow the speed probe? Correlation and elasticity of bench-like work's CPU time
against the probe timed around it, and how the in-run probe (a tenth of the loop) reads against a quarter.

    python -m benchmarks.speed_probe [--pairs 150]

The cost model (bench.run.sizing) scales its per-unit costs by the in-run speed probe
(bench.run.usage.speed_probe_cpu_ms), and fidelity judges a drift against the probe's shift. Both
assume that work like the bench's slows as the probe does. Each pair here times, in this thread's CPU
time: the probe, 4 ticks of 50 reacher robots' physics (RobotBatch.step), a stretch of the records'
Python (dicts, crc32, the latency tracker, JSON), the probe again. Over the pairs: the correlation of
log work with log probe (the mean of the two around it) and the elasticity (slope: 1 = the work slows
exactly as the probe). On a host whose speed never moves, the probe's spread is small and both figures
say little: the report gives the probe's 5th-95th percentile spread beside them. Writes
reports/bench/speed_probe.json.
"""

from __future__ import annotations

import json
import time
import zlib
from pathlib import Path

import numpy as np

from bench.robots import RobotBatch
from bench.run.usage import IN_RUN_PROBE_FRACTION, speed_probe_cpu_ms
from benchmarks.common import Result, cli, machine_facts, parse_with_out, run_main, write_report
from edge.latency import LatencyTracker

REPORT = Path("reports/bench/speed_probe.json")


def _physics(batch: RobotBatch) -> float:
    t0 = time.thread_time()
    for _ in range(4):
        batch.step(None)
    return (time.thread_time() - t0) * 1e3


def _records_python(tracker: LatencyTracker) -> float:
    t0 = time.thread_time()
    rows = []
    for i in range(3000):
        rows.append({"robot": i, "t": i * 0.1, "lateness_ms": 1.0, "state_digest": zlib.crc32(b"x" * 64)})
        tracker.add(0.05 + (i % 7) * 1e-3)
    json.dumps(rows[:200])
    return (time.thread_time() - t0) * 1e3


def _fit(probe: np.ndarray, work: np.ndarray) -> dict:
    lp, lw = np.log(probe), np.log(work)
    return {
        "median_ms": round(float(np.median(work)), 3),
        "correlation": round(float(np.corrcoef(lp, lw)[0, 1]), 3),
        "elasticity": round(float(np.polyfit(lp, lw, 1)[0]), 3),
    }


def measure(pairs: int) -> dict:
    batch = RobotBatch("reacher", 50, seed=0)
    batch.reset(seed=0)
    tracker = LatencyTracker(100, "percentile")
    rows = []
    for _ in range(pairs):
        before = speed_probe_cpu_ms(0.2)
        rows.append((before, _physics(batch), _records_python(tracker), speed_probe_cpu_ms(0.2)))
    r = np.array(rows)
    probe = (r[:, 0] + r[:, 3]) / 2
    short = np.array([(speed_probe_cpu_ms(IN_RUN_PROBE_FRACTION), speed_probe_cpu_ms(0.25)) for _ in range(pairs)])
    return {
        "pairs": pairs,
        "probe_ms_p5_p50_p95": [round(float(v), 1) for v in np.percentile(probe, [5, 50, 95])],
        "physics": _fit(probe, r[:, 1]),
        "records_python": _fit(probe, r[:, 2]),
        "in_run_probe_fraction": IN_RUN_PROBE_FRACTION,
        "in_run_over_quarter_median": round(float(np.median(short[:, 0] / short[:, 1])), 3),
    }


def run(quick: bool) -> Result:
    res = run_main(main, ["--pairs", "20"] if quick else [])
    rep = res.details
    for kind in ("physics", "records_python"):
        res.add(f"{kind}: correlation with the probe", rep[kind]["correlation"], "")
        res.add(f"{kind}: elasticity to the probe (1 = slows as the probe does)", rep[kind]["elasticity"], "")
    res.add("probe spread p95 / p5", rep["probe_ms_p5_p50_p95"][2] / rep["probe_ms_p5_p50_p95"][0], "x")
    res.add(
        f"in-run probe ({IN_RUN_PROBE_FRACTION:g} of the loop) / a quarter, median",
        rep["in_run_over_quarter_median"],
        "x",
    )
    return res


def main(argv: list[str] | None = None) -> dict:
    parser = cli(__doc__)
    parser.add_argument("--pairs", type=int, default=150)
    args = parse_with_out(parser, argv, REPORT)
    report = {"machine": machine_facts(), **measure(args.pairs)}
    for kind in ("physics", "records_python"):
        f = report[kind]
        print(
            f"{kind:15s} median {f['median_ms']:.2f} ms  correlation {f['correlation']:.2f}  "
            f"elasticity {f['elasticity']:.2f}"
        )
    print(
        f"probe p5/p50/p95 {report['probe_ms_p5_p50_p95']} ms over {args.pairs} pairs; in-run probe / a quarter "
        f"{report['in_run_over_quarter_median']:.3f}"
    )
    return write_report(args.out, report)


if __name__ == "__main__":
    main()
