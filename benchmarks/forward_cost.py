"""flow_transformer's work per call, counted rather than timed: the FLOPs and the dispatched ATen ops of a guided, a
plain and a training-time call at each batch size, on torch's meta device (shapes only, nothing allocated or computed:
the vla_300m preset counts on any host in ~30 s).

    python -m benchmarks.forward_cost                                # vla_300m, 2 x 224x224 cameras, batch 1 8 32 64
    python -m benchmarks.forward_cost --preset tiny --image-size 64

FLOPs (torch.utils.flop_counter's formulas: matmuls, convolutions, attention) are what a call costs where the device is
compute-bound (large batches on a GPU, or compiled); dispatched ops (each an eager kernel launch, or a view's host-side
work) are what it costs where the host's dispatch is the bound (small batches eager on a GPU, where a call of
~13,400 dispatched ops is launch-bound: docs/results/, "Accelerator lease 1: H200"). Both are the same on every host and in every
run, so a change to the network is judged by them before any GPU time, with no noise; they say nothing about how fast
a device runs them (benchmarks.gpu_forward times that). The ops are the meta device's: an attention call is counted as
the one fused kernel a GPU runs (`FusedAttention`), but its backward (the guided VJP) and ops nested inside other
functions (nn.MultiheadAttention's own attention) as meta decomposes them, and nothing of autocast (the meta device
has none; on CUDA bf16 autocast adds casts). FLOPs are torch's (its FlopCounterMode's); the guided VJP's attention
backward is the decomposition's, which leaves out the gradients of the constant keys and values that a fused kernel's
backward computes too. Writes reports/bench/forward_cost.json.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, sdpa_flop_count

from benchmarks.common import Result, cli, parse_with_out, write_report
from benchmarks.gpu_forward import build, observations, passes, rtc_mode

PASSES = ("guided", "plain", "training_time")


class CountingMode(TorchDispatchMode):
    """Counts every ATen op dispatched inside it (`views` of them views) and the FLOPs of those torch has a formula
    for; with `FusedAttention` beside it, an attention call as the one kernel a GPU runs."""

    def __init__(self):
        super().__init__()
        self.ops = self.views = self.flops = 0
        self.fused = 0  # > 0 inside a fused kernel's call: its decomposition is not counted

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.fused:
            return out
        self.ops += 1
        self.views += bool(func.is_view)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.flops += formula(*args, **kwargs, out_val=out)
        return out


class FusedAttention(TorchFunctionMode):
    """F.scaled_dot_product_attention counted as one op with its FLOPs (torch's formula), as the fused kernel CUDA
    (and a CPU) runs: the meta device runs its math decomposition instead, ~16 ops a call, which would inflate the
    count by half at vla_300m. Its backward (the guided pass's VJP) still counts as that decomposition."""

    def __init__(self, counter: CountingMode):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        self.counter.fused += 1
        try:
            out = func(*args, **kwargs)
        finally:
            self.counter.fused -= 1
        q, k, v = args[:3]
        self.counter.ops += 1
        self.counter.flops += sdpa_flop_count(q.shape, k.shape, v.shape)
        return out


def count_call(fn) -> dict:
    mode = CountingMode()
    with mode, FusedAttention(mode):
        fn()
    return {"gflop": mode.flops / 1e9, "ops": mode.ops, "view_ops": mode.views}


def cost_figures(policy, sizes: list[int]) -> dict:
    """{batch: {pass: {gflop, ops, view_ops}}} of one predict_action_chunk per pass (gpu_forward.passes)."""
    gen = torch.Generator().manual_seed(0)
    out = {}
    for n in sizes:
        batch, prefix = observations(policy, n, gen)
        row = {}
        for label, prefixes, mode in passes(prefix):
            with rtc_mode(policy, mode):
                row[label] = count_call(lambda: policy.predict_action_chunk(batch, [3] * n, prefixes))
        out[str(n)] = row
    return out


def run(quick: bool) -> Result:
    """vla_300m counted on the meta device (any host)."""
    sizes = [1] if quick else [1, 8, 32, 64]
    policy = build("vla_300m", 2, 224, "meta", False)
    cost = cost_figures(policy, sizes)
    res = Result(details={"preset": "vla_300m", "cost": cost})
    for n in sizes:
        res.add(f"vla_300m training-time call, batch {n}: GFLOP", cost[str(n)]["training_time"]["gflop"], "GFLOP")
        res.add(f"vla_300m training-time call, batch {n}: dispatched ops", cost[str(n)]["training_time"]["ops"], "ops")
    return res


def main(argv=None) -> int:
    ap = cli(__doc__, prog="python -m benchmarks.forward_cost")
    ap.add_argument("--preset", default="vla_300m", help="flow_transformer preset")
    ap.add_argument("--cameras", type=int, default=2)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    args = parse_with_out(ap, argv, "reports/bench/forward_cost.json")
    started = time.perf_counter()
    try:
        policy = build(args.preset, args.cameras, args.image_size, "meta", False)
    except Exception as exc:  # noqa: BLE001  a bad preset or image size: the policy's own message
        print(f"benchmarks.forward_cost: {exc}", file=sys.stderr)
        return 2
    params = sum(p.numel() for p in policy.parameters())
    cost = cost_figures(policy, args.batches)
    report = {
        "preset": args.preset,
        "parameters": params,
        "cameras": args.cameras,
        "image_size": args.image_size,
        "torch": torch.__version__,
        "cost": cost,
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(
        f"flow_transformer {args.preset} ({params / 1e6:.1f}M params), {args.cameras} x "
        f"{args.image_size}x{args.image_size} cameras, torch {torch.__version__}: one call's work, counted"
    )
    print(f"{'batch':>6} " + " ".join(f"{p.replace('_', '-') + ' GFLOP':>20} {'ops (views)':>14}" for p in PASSES))
    for n in args.batches:
        row = cost[str(n)]
        print(
            f"{n:>6} "
            + " ".join(f"{row[p]['gflop']:>20.1f} {row[p]['ops']:>7} ({row[p]['view_ops']:>5})" for p in PASSES)
        )
    write_report(args.out, report, say="->")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
