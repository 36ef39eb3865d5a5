"""The headline twin's own CPU per answered request: shards, replicas, chaos proxy and router together.

    python -m benchmarks.twin_cost [--quick] [--base DIR] [--runs N] [--duration S]

Runs `bench run scenarios/300_robots_wan.yaml` without its faults and assertions for `--duration` seconds after
its warm-up (a shortened run judges nothing) and reads the run's `summary.json` (cpu.by_kind: cores of each kind
of process, averaged over the measured window) and `requests.parquet` (the requests of that window that a chunk
answered, outcome `ok`). The figure is

    CPU ms per answered request = sum of the kinds' cores x the window's seconds x 1000 / answered requests

and the same per kind. `--base DIR`: a checkout of older code (e.g. `git worktree add /tmp/base 696cc80`); its
runs alternate with this checkout's, `--runs` of each, on the same scenario file (this checkout's), so the two
codes see the same machine in the same minutes; the figure is then the ratio base / this (medians). On a 2-core
host the headline oversubscribes the CPU, and CPU time itself grows with contention (cache, steal): the ratio,
measured side by side, is the figure, not the absolute time. `--quick`: 2 robots a site for 5 s, one run: it
proves the pipeline, not the headline's size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import Result

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "300_robots_wan.yaml"
KINDS = ("shards", "replicas", "proxy", "router")
QUICK_SETS = ["warmup_s=2", *(f"fleet.groups.{i}.count=2" for i in range(3))]


def cost_of_run(summary: dict, requests: dict) -> dict:
    """A run's CPU per answered request, in total and per kind, from its summary.json and requests columns
    (`t`, `outcome`). Raises ValueError when the run answered nothing or measured no CPU."""
    by_kind = (summary.get("cpu") or {}).get("by_kind") or {}
    if not by_kind:
        raise ValueError("summary.json has no cpu.by_kind: the run measured no CPU split")
    window = float(summary["duration_s"])
    answered = sum(1 for t, o in zip(requests["t"], requests["outcome"]) if o == "ok" and 0.0 <= t <= window)
    if not answered:
        raise ValueError("no request of the measured window was answered")
    total = sum(float(by_kind.get(k, 0.0)) for k in KINDS)
    per = {k: round(float(by_kind.get(k, 0.0)) * window * 1e3 / answered, 3) for k in KINDS}
    shard = (summary.get("cpu") or {}).get("shard_threads") or {}
    return {
        "cores": round(total, 3),
        "by_kind": {k: by_kind.get(k) for k in KINDS},
        "answered": answered,
        "window_s": window,
        "host_percent": round(float((summary.get("cpu") or {}).get("host_percent") or 0.0), 1),
        "ms_per_answered": round(total * window * 1e3 / answered, 3),
        "ms_per_answered_by_kind": per,
        "loop_us_per_robot_tick": shard.get("loop_us_per_robot_tick"),
        "engine_ms_per_request": shard.get("engine_ms_per_request"),
        "verdict": summary.get("verdict"),
    }


def one_run(checkout: Path, scenario: Path, sets: list[str], timeout_s: float) -> dict:
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "bench.cli", "run", str(scenario), "--quiet", "--reports", tmp]
        for s in ["faults=[]", "assertions=[]", *sets]:
            cmd += ["--set", s]
        env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "PYTHONPATH": str(checkout)}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=checkout, timeout=timeout_s)
        summaries = sorted(Path(tmp).glob("*/*/summary.json"))
        if proc.returncode == 2 or not summaries:
            raise RuntimeError(
                f"bench run ({checkout}) exited {proc.returncode}: {(proc.stderr or proc.stdout)[-600:]}"
            )
        run_dir = summaries[-1].parent
        summary = json.loads((run_dir / "summary.json").read_text())
        requests = pq.read_table(run_dir / "requests.parquet", columns=["t", "outcome"]).to_pydict()
    return {"checkout": str(checkout), "exit_code": proc.returncode, **cost_of_run(summary, requests)}


def measure(quick: bool, base: Path | None = None, runs: int = 2, duration_s: float = 40.0) -> dict:
    sets = [f"duration_s={5 if quick else duration_s:g}", *(QUICK_SETS if quick else [])]
    timeout = 300 if quick else 900
    order = [ROOT] if quick else [c for _ in range(runs) for c in ([base, ROOT] if base else [ROOT])]
    results = [one_run(c, SCENARIO, sets, timeout) for c in order]
    mine = [r for r in results if r["checkout"] == str(ROOT)]
    out = {"scenario": SCENARIO.name, "sets": sets, "runs": results}
    out["ms_per_answered"] = statistics.median(r["ms_per_answered"] for r in mine)
    if base:
        theirs = [r for r in results if r["checkout"] == str(base)]
        out["base"] = str(base)
        out["base_ms_per_answered"] = statistics.median(r["ms_per_answered"] for r in theirs)
        out["ratio"] = round(out["base_ms_per_answered"] / out["ms_per_answered"], 3)
        out["ratio_by_kind"] = {
            k: round(
                statistics.median(r["ms_per_answered_by_kind"][k] for r in theirs)
                / max(statistics.median(r["ms_per_answered_by_kind"][k] for r in mine), 1e-9),
                3,
            )
            for k in KINDS
        }
    return out


def run(quick: bool) -> Result:
    r = measure(quick)
    res = Result(details=r)
    last = r["runs"][-1]
    res.add("twin CPU per answered request (shards + replicas + proxy + router)", r["ms_per_answered"], "ms")
    for k in KINDS:
        res.add(f"{k} CPU per answered request", last["ms_per_answered_by_kind"][k], "ms")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.twin_cost", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--base", type=Path, help="a checkout of older code, run alternately with this one")
    ap.add_argument("--runs", type=int, default=2, help="runs of each checkout (default 2)")
    ap.add_argument("--duration", type=float, default=40.0, help="measured seconds a run (default 40)")
    ap.add_argument("--out", type=Path, default=Path("reports/bench/twin_cost.json"))
    args = ap.parse_args(argv)
    r = measure(args.quick, args.base.resolve() if args.base else None, args.runs, args.duration)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(r, indent=1))
    print(json.dumps({k: v for k, v in r.items() if k != "runs"}, indent=1))
    for x in r["runs"]:
        print(
            f"{x['checkout']}: {x['ms_per_answered']} ms a request ({x['cores']} cores, {x['answered']} answered, "
            f"host {x['host_percent']} %), by kind {x['ms_per_answered_by_kind']}, loop {x['loop_us_per_robot_tick']} "
            f"us a robot-tick, verdict {x['verdict']}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
