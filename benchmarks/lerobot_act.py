"""A LeRobot ACT's forward pass through the server's policy wrapper, timed at micro-batch sizes, and design P10's
sessions estimate from it.

    python -m benchmarks.lerobot_act                                  # state-only ACT, dim_model 256, batch 1 4 16
    python -m benchmarks.lerobot_act --camera front:96x96 --batches 1 4

A random-weight ACT written by LeRobot's save_pretrained (server.policies.lerobot_random: state 6 + environment
state 3, 6 actions, chunk 20) is loaded by the server's own `load_checkpoint` and run through `ModelRuntime.infer`,
the path every request takes (per-session LeRobot processors, one stacked forward pass); `forward_ms` is the pass,
`per_request_ms` the pass plus that sample's pre- and postprocessing. P10: `N_max = min(0.8 / (r t), (H dt / 2 - RTT)
/ t)` with capacity_act's nominal r = 1 Hz, H = 10, dt = 1/15 s, RTT = 1 ms, `t` the forward time per request (batch
1: no micro-batching; batch B: the pass / B). Writes reports/bench/lerobot_act.json.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import Result, cli, parse_with_out, write_report

P10 = {"r_hz": 1.0, "horizon": 10, "dt_s": 1 / 15, "rtt_s": 0.001}  # scenarios/capacity_act.yaml's formula


def measure(
    directory: Path, batches: list[int], repeats: int, trained_fps: float = 15.0, threads: int = 1
) -> dict[str, object]:
    """{batch: {forward_ms p50/min, per_request_ms p50}} of `ModelRuntime.infer` on the LeRobot checkpoint."""
    import numpy as np
    import torch

    from server.policies.checkpoint import load_checkpoint
    from server.runtime import InferItem, ModelRuntime, set_torch_threads

    set_torch_threads(threads)
    runtime = ModelRuntime(load_checkpoint(directory, trained_fps=trained_fps))
    runtime.warmup(2)
    cfg = runtime.config
    rng = np.random.default_rng(0)
    out: dict[str, object] = {
        "parameters": sum(p.numel() for p in runtime.policy.parameters()),
        "torch": torch.__version__,
        "threads": threads,
        "batches": {},
    }
    for n in batches:
        items = [
            InferItem(
                runtime.new_pipeline(),
                rng.standard_normal(cfg.state_dim).astype(np.float32),
                {c: rng.integers(0, 256, (s[1], s[2], 3), dtype=np.uint8) for c, s in cfg.image_features.items()},
            )
            for _ in range(n)
        ]
        runtime.infer(items, emulate=False)  # this size's first pass
        forward, per_request = [], []
        for _ in range(repeats):
            res = runtime.infer(items, emulate=False)
            forward.append(res[0].forward_ms)
            per_request.append(statistics.median(r.inference_ms for r in res))
        out["batches"][str(n)] = {
            "forward_ms_p50": round(statistics.median(forward), 3),
            "forward_ms_min": round(min(forward), 3),
            "per_request_ms_p50": round(statistics.median(per_request), 3),
        }
    return out


def p10(forward_ms: float, batch: int) -> dict:
    """P10's two bounds and N_max at `P10`'s inputs (the formula of bench.evidence.capacity.n_max, which this
    package may not import: benchmarks sit beside the bench, not on it)."""
    t_s = forward_ms / 1e3 / batch
    util = 0.8 / (P10["r_hz"] * t_s)
    latency = (P10["horizon"] * P10["dt_s"] / 2.0 - P10["rtt_s"]) / t_s
    return {
        "utilization_bound": round(util, 1),
        "latency_bound": round(latency, 1),
        "n_max": round(min(util, latency), 1),
    }


def bench(args_dir: Path | None, state_dim, env_state_dim, action_dim, chunk, dim_model, cameras, batches, repeats):
    from server.policies.lerobot_random import write_random_checkpoint

    with tempfile.TemporaryDirectory(prefix="lerobot_act_") as tmp:
        directory = args_dir or Path(tmp) / "act"
        if args_dir is None or not (directory / "config.json").is_file():
            write_random_checkpoint(
                directory, "act", state_dim, action_dim, chunk, dim_model, cameras, env_state_dim=env_state_dim
            )
        report = measure(directory, batches, repeats)
    report["checkpoint"] = {
        "state_dim": state_dim,
        "env_state_dim": env_state_dim,
        "action_dim": action_dim,
        "chunk": chunk,
        "dim_model": dim_model,
        "cameras": [f"{n}:{h}x{w}" for n, h, w in cameras],
    }
    report["p10"] = {n: p10(row["forward_ms_p50"], int(n)) for n, row in report["batches"].items()}
    report["p10_inputs"] = P10
    return report


def run(quick: bool) -> Result:
    repeats = 5 if quick else 50
    report = bench(None, 6, 3, 6, 20, 256, [], [1, 4, 16], repeats)
    res = Result(details=report)
    for n, row in report["batches"].items():
        res.add(f"ACT (dim 256, state-only) forward, batch {n}", row["forward_ms_p50"], "ms")
    res.add("P10 N_max at batch 1 (capacity_act's r, H, dt, RTT)", report["p10"]["1"]["n_max"], "sessions")
    return res


def main(argv=None) -> int:
    from server.policies.lerobot_random import RandomCheckpointError, parse_camera

    ap = cli(__doc__, prog="python -m benchmarks.lerobot_act")
    ap.add_argument("--checkpoint", type=Path, default=None, help="a LeRobot ACT directory (default: a random one)")
    ap.add_argument("--state-dim", type=int, default=6)
    ap.add_argument("--env-state-dim", type=int, default=3)
    ap.add_argument("--action-dim", type=int, default=6)
    ap.add_argument("--chunk", type=int, default=20)
    ap.add_argument("--dim-model", type=int, default=256)
    ap.add_argument("--camera", action="append", default=[], help="NAME:HxW, repeatable")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeats", type=int, default=50)
    args = parse_with_out(ap, argv, "reports/bench/lerobot_act.json")
    started = time.perf_counter()
    try:
        cameras = [parse_camera(c) for c in args.camera]
        report = bench(
            args.checkpoint,
            args.state_dim,
            args.env_state_dim,
            args.action_dim,
            args.chunk,
            args.dim_model,
            cameras,
            args.batches,
            args.repeats,
        )
    except RandomCheckpointError as exc:
        print(f"benchmarks.lerobot_act: {exc}", file=sys.stderr)
        return 2
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(
        f"LeRobot ACT ({report['parameters'] / 1e6:.2f}M params, {report['checkpoint']}), torch {report['torch']}, "
        f"{report['threads']} thread: ModelRuntime.infer"
    )
    print(f"{'batch':>6} {'forward p50 ms':>15} {'min ms':>8} {'per request ms':>15} {'P10 N_max':>10}")
    for n, row in report["batches"].items():
        print(
            f"{n:>6} {row['forward_ms_p50']:>15.2f} {row['forward_ms_min']:>8.2f} {row['per_request_ms_p50']:>15.2f} "
            f"{report['p10'][n]['n_max']:>10.1f}"
        )
    write_report(args.out, report, say="->")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
