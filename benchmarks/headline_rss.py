"""Whole-headline memory: the resident memory of every process of the headline run, summed, at its peak.

    python -m benchmarks.headline_rss [--quick]

Runs `bench run scenarios/300_robots_wan.yaml` (router, chaos proxy, three replicas, the fleet shards, the
runner) for a shortened window: 60 s measured after its 15 s warm-up, the partition at 20 s and the replica
restart at 40 s (the scenario's own faults, moved into the window), assertions off (a shortened run judges
nothing; its verdict is kept in the details). The twin samples each process tree's RSS every second
(bench.run.usage, cpu.parquet's `rss_mb:<process>` columns); the figure is the largest sum over one sample
of all processes (target: 3 GiB), and each process's own peak. `--quick`: the same scenario with 2 robots
per site for 5 s, no faults: it proves the pipeline runs, not the headline's size.
RSS counts shared library pages in every process that maps them (torch in each replica and shard), so the sum is an upper
bound of the memory the run needs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import Result

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "300_robots_wan.yaml"
TARGET_GIB = 3.0
FULL_SETS = ["duration_s=60", "faults.0.at=20", "faults.1.at=40", "assertions=[]"]
QUICK_SETS = [
    "duration_s=5",
    "warmup_s=2",
    "faults=[]",
    "assertions=[]",
    *(f"fleet.groups.{i}.count=2" for i in range(3)),
]


def peak_sum(columns: dict[str, list]) -> tuple[float, int]:
    """The largest sum over one sample of every `rss_mb:<process>` column (a process not running in a sample is
    None there), and the index of that sample."""
    names = [k for k in columns if k.startswith("rss_mb:")]
    rows = len(columns[names[0]]) if names else 0
    sums = [sum(columns[k][i] or 0.0 for k in names) for i in range(rows)]
    if not sums:
        raise ValueError("no rss_mb:<process> column in the run's cpu.parquet: the twin recorded no memory")
    best = max(range(rows), key=sums.__getitem__)
    return sums[best], best


def measure(quick: bool) -> dict:
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "bench.cli", "run", str(SCENARIO), "--quiet", "--reports", tmp]
        for s in QUICK_SETS if quick else FULL_SETS:
            cmd += ["--set", s]
        env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300 if quick else 900)
        summaries = sorted(Path(tmp).glob("*/*/summary.json"))
        if proc.returncode == 2 or not summaries:  # 0 pass, 1 fail, 3 inconclusive: the run ran; 2: it did not
            raise RuntimeError(f"bench run exited {proc.returncode}: {(proc.stderr or proc.stdout)[-600:]}")
        run_dir = summaries[-1].parent
        summary = json.loads((run_dir / "summary.json").read_text())
        table = pq.read_table(run_dir / "cpu.parquet")
        columns = {k: table.column(k).to_pylist() for k in table.column_names if k.startswith("rss_mb:")}
    total_mb, at = peak_sum(columns)
    procs = summary["memory"]["processes"]
    return {
        "scenario": SCENARIO.name,
        "sets": QUICK_SETS if quick else FULL_SETS,
        "robots": summary["robots"],
        "replicas": sum(1 for n in procs if n.startswith("server:")),
        "shards": sum(1 for n in procs if n.startswith("shard:")),
        "exit_code": proc.returncode,
        "verdict": summary.get("verdict"),
        "samples": len(next(iter(columns.values()))),
        "peak_total_rss_mb": round(total_mb, 1),
        "peak_sample": {k.split(":", 1)[1]: columns[k][at] for k in columns},
        "process_rss_mb_max": {n: m["rss_mb_max"] for n, m in procs.items()},
        "report_phase": summary["memory"].get("report_phase"),
    }


def run(quick: bool) -> Result:
    r = measure(quick)
    res = Result(details=r)
    res.add(
        f"peak RSS of all processes, summed ({r['robots']} robots, {r['replicas']} replicas, {r['shards']} shards)",
        r["peak_total_rss_mb"] / 1024,
        "GiB",
        target=None if quick else TARGET_GIB,
    )
    peaks = r["process_rss_mb_max"]
    for kind in ("server:", "shard:"):
        mine = [v for n, v in peaks.items() if n.startswith(kind)]
        if mine:
            res.add(f"largest {kind.rstrip(':')} process RSS", max(mine), "MiB")
    for name in ("router", "chaos-proxy", "runner"):
        if name in peaks:
            res.add(f"{name} RSS", peaks[name], "MiB")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.headline_rss", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    r = measure(args.quick)
    print(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
