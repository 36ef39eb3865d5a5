"""What Ray Serve dispatch costs per forward pass against the in-process one (server/dispatch.py).

    python -m benchmarks.dispatch [--calls 200] [--batches 1 8 64]

The same checkpoint, the same micro-batches (half the sessions guided by RTC, as in a mixed fleet), one
call at a time: `local` runs `predict_action_chunk` in this process (LocalForward), `ray_serve` sends the
batch to a one-replica Serve deployment on a private Ray started here and waits for the chunk. Reports the
median and p99 time per call and their difference (Serve's own cost: serialisation, the handle's routing,
the actor call). One call at a time measures the latency a micro-batch pays; the deployment's throughput
with several replicas in flight depends on the cores given to it and is not measured here.
Writes reports/bench/dispatch.json.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from benchmarks.common import cli, parse_with_out, write_report

REPORT = Path("reports/bench/dispatch.json")
CHECKPOINT = Path(__file__).resolve().parents[1] / "bench" / "checkpoints" / "reacher"


def _batch(runtime, size: int, rng: np.random.Generator):
    """(batch, delays, prefixes) as the scheduler hands them to a forward: normalised state, RTC on even rows."""
    import torch

    cfg = runtime.config
    state = torch.as_tensor(rng.normal(size=(size, cfg.state_dim)).astype(np.float32))
    delays, prefixes = [], []
    for i in range(size):
        rtc = i % 2 == 0
        delays.append(2 if rtc else 0)
        prefixes.append(
            torch.as_tensor(rng.normal(scale=0.1, size=(runtime.execution_horizon, cfg.action_dim)).astype(np.float32))
            if rtc
            else None
        )
    return {"observation.state": state}, delays, prefixes


def _time(forward, args, calls: int) -> dict:
    for _ in range(5):
        forward(*args)  # warm-up: first calls pay allocation and (for Serve) the replica's first dispatch
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        forward(*args)
        times.append((time.perf_counter() - t0) * 1e3)
    return {
        "p50_ms": round(float(np.percentile(times, 50)), 3),
        "p99_ms": round(float(np.percentile(times, 99)), 3),
        "mean_ms": round(float(np.mean(times)), 3),
        "calls": calls,
    }


def measure(calls: int, batches: list[int]) -> dict:
    """Local vs Ray Serve time per call at each batch size; {"skipped": why} without Ray Serve."""
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError:
        return {"skipped": "Ray Serve is not installed (pip install -e '.[cluster]')"}

    from server.dispatch import RayServeForward
    from server.policies.checkpoint import load_checkpoint
    from server.runtime import LocalForward, ModelRuntime, set_torch_threads

    set_torch_threads(1)
    runtime = ModelRuntime(load_checkpoint(str(CHECKPOINT)))
    local = LocalForward(runtime.policy)
    serve_forward = RayServeForward.deploy(
        model_id="reacher",
        replica_id="bench",
        repo_or_path=str(CHECKPOINT),
        device="cpu",
        dtype="float32",
        torch_threads=1,
        replicas=1,
        cpus_per_replica=1.0,
        gpus_per_replica=0.0,
        max_inflight=2,
        address=None,
    )
    rows = {}
    try:
        for size in batches:
            batch = _batch(runtime, size, np.random.default_rng(size))
            same = local(*batch).numpy().tobytes() == serve_forward(*batch).numpy().tobytes()
            lo, se = _time(local, batch, calls), _time(serve_forward, batch, calls)
            rows[str(size)] = {
                "local": lo,
                "ray_serve": se,
                "same_bytes": same,
                "serve_overhead_p50_ms": round(se["p50_ms"] - lo["p50_ms"], 3),
            }
            print(
                f"batch {size:3d}: local p50 {lo['p50_ms']:7.3f} ms p99 {lo['p99_ms']:7.3f} | ray_serve p50 "
                f"{se['p50_ms']:7.3f} ms p99 {se['p99_ms']:7.3f} | Serve adds {rows[str(size)]['serve_overhead_p50_ms']:.3f}"
                f" ms per call | same bytes: {same}",
                flush=True,
            )
    finally:
        serve_forward.close()
    return {"checkpoint": "reacher", "calls": calls, "batches": rows}


def run(quick: bool):
    from benchmarks.common import Result

    r = measure(20 if quick else 200, [1, 8] if quick else [1, 8, 64])
    if "skipped" in r:
        return Result(skipped=r["skipped"])
    res = Result(details=r)
    for size, row in r["batches"].items():
        res.add(f"Ray Serve adds per call p50, batch {size}", row["serve_overhead_p50_ms"], "ms")
        res.add(
            f"Ray Serve chunks byte-identical to local, batch {size}",
            1.0 if row["same_bytes"] else 0.0,
            "",
            target=1.0,
            better="higher",
            budget=True,
        )
    return res


def main(argv: list[str] | None = None) -> dict:
    parser = cli(__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    args = parse_with_out(parser, argv, REPORT)
    report = measure(args.calls, args.batches)
    if "skipped" in report:
        print(f"dispatch: skipped: {report['skipped']}")
        return report
    return write_report(args.out, report)


if __name__ == "__main__":
    main()
