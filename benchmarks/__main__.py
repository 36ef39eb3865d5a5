"""Runs the benchmark suite: `python -m benchmarks [NAME ...] [--quick] [--out-dir DIR]`; `--readme` instead.

Each named benchmark (all when none is named) runs through its `run(quick)` and writes
DIR/NAME.json (figures, units, targets, machine facts, load average at start and end); the run
writes DIR/summary.md (one table) and prints it. `--quick` sizes each benchmark to seconds and
judges no timing target (only budgets: see benchmarks.common). Exit 0 when every benchmark ran and
every judged target is met; 1 when one failed or missed a judged target; 2 for an unknown name.
Each benchmark runs in a process of its own (spawned): one benchmark's imports and native libraries
cannot break another (MuJoCo's software EGL, llvmpipe, and triton's LLVM cannot share a process: triton
loaded after a rendered frame crashes it), its memory figures start from a fresh interpreter, and a
crashed benchmark is reported as an error beside the others' figures.
`--readme` runs nothing: it rewrites README.md's "Performance" table from DIR's reports of a full run
(benchmarks.readme); exit 2 when the reports or the README's markers cannot make it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.common import load_average, run_isolated, summary_table

# cheap first: a broken benchmark shows in seconds
NAMES = (
    "codec",
    "scheduling",
    "cameras",
    "robot_step",
    "robot_memory",
    "router_memory",
    "proxy",
    "engine",
    "engine_calls",
    "server",
    "server_memory",
    "peers",
    "headline_rss",
    "twin_cost",
    "report_memory",
    "dispatch",
    "forward_cost",
    "lerobot_act",
    "gpu_forward",
    "speed_probe",
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run (default: all): {', '.join(NAMES)}")
    ap.add_argument("--quick", action="store_true", help="seconds each; figures only, timing targets not judged")
    ap.add_argument("--out-dir", type=Path, default=Path("reports/bench"))
    ap.add_argument(
        "--readme",
        nargs="?",
        const=Path("README.md"),
        type=Path,
        metavar="README",
        help="run nothing; rewrite the Performance table of README (default README.md) from --out-dir's reports",
    )
    args = ap.parse_args(argv)
    if args.readme is not None:
        from benchmarks.readme import ReadmeError, update_readme

        try:
            print(update_readme(args.readme, args.out_dir, NAMES), end="")
        except (ReadmeError, OSError) as exc:
            print(f"python -m benchmarks --readme: {exc}", file=sys.stderr)
            return 2
        print(f"rewrote the Performance table of {args.readme}")
        return 0
    unknown = [n for n in args.names if n not in NAMES]
    if unknown:
        print(
            f"python -m benchmarks: unknown benchmark {', '.join(unknown)}; the benchmarks are: {', '.join(NAMES)}",
            file=sys.stderr,
        )
        return 2
    names = list(dict.fromkeys(args.names)) or list(NAMES)
    reports: dict[str, dict] = {}
    for name in names:
        print(f"== {name}{' (quick)' if args.quick else ''}", flush=True)
        reports[name] = rep = run_isolated(name, args.quick, args.out_dir)
        state = "skipped: " + rep["skipped"] if rep.get("skipped") else rep.get("error") or f"{rep['seconds']:.1f} s"
        print(f"== {name}: {state}", flush=True)
    table = summary_table(reports)
    load = load_average()
    command = " ".join(["python -m benchmarks", *args.names, *(["--quick"] if args.quick else [])])
    head = (
        f"# Benchmarks{' (quick)' if args.quick else ''}\n\n`{command}`; load average at the end {load} (the machine "
        f"may be shared: compare ratios within one run).\n\n"
    )
    (args.out_dir / "summary.md").write_text(head + table)
    print(table)
    print(f"wrote {args.out_dir / 'summary.md'}")
    bad = [n for n, r in reports.items() if r.get("error") or r.get("failed_targets")]
    if bad:
        print(f"failed or missed a judged target: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
