"""flow_transformer forward time at batch 1/8/32/64 and the gain of micro-batching, on the GPU (or a CPU).

    python -m benchmarks.gpu_forward                                  # CUDA: the vla_300m preset, 2 x 224x224 cameras
    python -m benchmarks.gpu_forward --preset tiny --image-size 64   # any host: the same code at tiny size
    python -m benchmarks.gpu_forward --compile                        # + torch.compile (CUDA graphs per bucket;
                                                                      #   on a CPU inductor's C++ kernels)
    python -m benchmarks.gpu_forward --dtype bfloat16                 # weights stored in bf16 (model.dtype), not
                                                                      #   float32 whose autocast casts them at every
                                                                      #   step (timing: noise and t are bf16 then)

Builds the policy with random weights in this process (time does not depend on the weights), then:
- forward: `predict_action_chunk` at each batch size, every sample with an RTC prefix (an RTC
  session's request: the guided sampler with its autograd VJP), without one (plain), and with one
  under training-time RTC (the same weights read as `rtc_mode: training_time`, the prefix as clean
  tokens: what capacity_gpu's checkpoint serves); median ms per call (CUDA: synchronised around
  each call, never inside the sampling loop);
- runtime: `ModelRuntime.infer` at each batch size with JPEG-encoded camera frames, i.e. the
  server's whole batched path (per-session preprocess, nvjpeg decode where CUDA and torchvision
  are there, pinned copies, bucket padding, forward, postprocess);
- micro-batching gain at the largest batch size N, each pass apart: time of N one-at-a-time calls / time of
  one call of N (the throughput ratio of max_batch=N over max_batch=1 at N sessions).
`--passes plain training_time` leaves the guided pass out of every stage (its VJP's compile costs a short
lease more than the other two together; capacity_gpu serves training-time RTC).
Prints a table and writes reports/bench/gpu_forward.json with the device, torch version, the
host's load average and every figure. CPU figures are contaminated by whatever else runs.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext

import numpy as np
import torch

from benchmarks.common import Result, cli, parse_with_out, write_report

STAGES = ("forward", "micro_batching", "runtime")  # the default order: the issue's figures first
PASSES = ("guided", "plain", "training_time")


def build(preset: str, cameras: int, image_size: int, device: str, compile_: bool, dtype: str = "float32"):
    from server.policies import PolicyConfig, make_policy
    from server.policies.flow_transformer import preset_hyper_params

    names = ["front", "wrist", "left", "right"][:cameras]
    hp = preset_hyper_params(preset, compile=compile_)
    if preset == "tiny":
        hp["batch_buckets"] = [1, 8, 16, 32, 64]  # exercise the padding path on a CPU too
    config = PolicyConfig(
        type="flow_transformer",
        state_dim=10,
        action_dim=2,
        chunk_size=30,
        fps=15.0,
        execution_horizon=10,
        image_features={n: [3, image_size, image_size] for n in names},
        hyper_params=hp,
    )
    torch.manual_seed(0)
    # meta (benchmarks.forward_cost): built there, shapes only, no weights allocated
    with torch.device("meta") if device == "meta" else nullcontext():
        policy = make_policy(config)
    # dtype: the manifest's model.dtype (bfloat16: weights stored in bf16, no weight cast at each step; float32:
    # on CUDA the checkpoint's autocast bf16 casts each weight at each step)
    return policy.to(device=device, dtype=getattr(torch, dtype)).eval().requires_grad_(False)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn, device: torch.device, repeat: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    _sync(device)
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


@contextmanager
def rtc_mode(policy, mode: str):
    """The policy read as `rtc_mode: mode` for a while: timing only (the weights have the same shapes either way;
    random weights mean nothing in either mode), so a network built for guidance times a training-time pass."""
    before = (policy.hp["rtc_mode"], policy.prefix_conditioned)
    policy.hp["rtc_mode"], policy.prefix_conditioned = mode, mode == "training_time"
    try:
        yield policy
    finally:
        policy.hp["rtc_mode"], policy.prefix_conditioned = before


@contextmanager
def eager(policy):
    """A compiled policy's velocity network run eager for a while: the baseline of the compile's gain, timed in
    the same process on the same weights."""
    before = (policy._velocity_fn, policy._compiled, policy._grad_path)
    policy._velocity_fn, policy._compiled, policy._grad_path = policy.velocity, True, None  # _compiled: none meanwhile
    try:
        yield policy
    finally:
        policy._velocity_fn, policy._compiled, policy._grad_path = before


def observations(policy, n: int, gen: torch.Generator) -> tuple[dict, list]:
    """`n` random observations (the state, each camera's frame in [0, 1]) and `n` RTC prefixes, on the policy's
    device (values do not move the time, or the counts)."""
    cfg, device = policy.config, policy.param_device
    batch = {"observation.state": torch.randn(n, cfg.state_dim, generator=gen).to(device)}
    for name, shape in cfg.image_features.items():
        batch[f"observation.images.{name}"] = torch.rand(n, *shape, generator=gen).to(device)
    return batch, [torch.randn(cfg.execution_horizon, cfg.action_dim, generator=gen).to(device) for _ in range(n)]


def passes(prefix: list, which=PASSES) -> list[tuple[str, list, str]]:
    """(label, prefixes, rtc_mode) of the calls timed or counted, of the three (`which` of them): every sample with an
    RTC prefix (guided: the RTC-guided sampler with its VJP; training_time: the prefix as clean tokens) or none
    (plain)."""
    every = [
        ("guided", prefix, "guidance"),
        ("plain", [None] * len(prefix), "guidance"),
        ("training_time", prefix, "training_time"),
    ]
    return [p for p in every if p[0] in which]


def forward_figures(policy, sizes: list[int], repeat: int, warmup: int, on_size=None, which=PASSES) -> dict:
    """Median ms of each pass (`which` of guided, plain, training_time) at each batch size; `on_size(out)` after each
    (a caller stopped at its time limit keeps the sizes already timed). A compiled policy (`compile`) also times the
    same passes eager (`guided_eager`, `plain_eager`, `training_time_eager`) and the compile's gain on each
    (`compile_gain`; `compile_fallbacks`: a path whose compile failed and ran eager)."""
    device = policy.param_device
    gen = torch.Generator().manual_seed(1)
    out = {}
    for n in sizes:
        batch, prefix = observations(policy, n, gen)
        row = {}
        timed = passes(prefix, which)
        if policy.hp["compile"]:
            timed += [(label + "_eager", prefixes, mode) for label, prefixes, mode in passes(prefix, which)]
        for label, prefixes, mode in timed:
            try:
                with rtc_mode(policy, mode), eager(policy) if label.endswith("_eager") else nullcontext():
                    ms = time_calls(
                        lambda: policy.predict_action_chunk(batch, [3] * n, prefixes), device, repeat, warmup
                    )
            except Exception as exc:  # one failed pass (a compile on a device never tried) keeps the others' figures
                row[label] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                print(f"gpu_forward: the {label} pass at batch {n} failed: {row[label]['error']}", file=sys.stderr)
                continue
            row[label] = {
                "median_ms": statistics.median(ms),
                "min_ms": min(ms),
                "per_sample_ms": statistics.median(ms) / n,
            }
        for label in which:
            if "median_ms" in row.get(label + "_eager", {}) and "median_ms" in row[label]:
                row[label]["compile_gain"] = row[label + "_eager"]["median_ms"] / row[label]["median_ms"]
        out[str(n)] = row
        if on_size is not None:
            on_size(out)
    return out


def runtime_figures(policy, sizes: list[int], repeat: int, warmup: int, which=PASSES) -> dict:
    """ModelRuntime.infer with JPEG frames: the server's batched path, one call per micro-batch; guided RTC
    (`median_ms`) and training-time RTC (`training_time_ms`), each where `which` has it; where the frames decode on
    the GPU (nvjpeg), the training-time path again with the CPU decoder (`training_time_cpu_jpeg_ms`,
    `gpu_jpeg_gain`)."""
    from server.policies.checkpoint import LoadedCheckpoint
    from server.policies.stats import stats_to_tensors
    from server.runtime import InferItem, LocalForward, ModelRuntime
    from wire.images import encode_image

    cfg = policy.config
    stats = {
        "observation.state": {"mean": [0.0] * cfg.state_dim, "std": [1.0] * cfg.state_dim},
        "action": {"mean": [0.0] * cfg.action_dim, "std": [1.0] * cfg.action_dim},
    }
    runtime = ModelRuntime(LoadedCheckpoint(policy, cfg, stats_to_tensors(stats), "bench", {}))
    # the passes on the thread that called the other stages: a replica calls a CUDA-graph policy from one device
    # thread (LocalForward), but this benchmark's other stages captured their graphs on the calling thread, and
    # torch 2.11 asserts on a replay from another one (pytorch#123177): the runtime stage's first call would fall
    # back to eager ("AssertionError: ") and time eager passes as compiled ones
    runtime.forward = LocalForward(policy, one_thread=False)
    rng = np.random.default_rng(0)
    jpegs = {
        name: encode_image(rng.integers(0, 256, (s[1], s[2], 3), dtype=np.uint8), "jpeg", 90)
        for name, s in cfg.image_features.items()
    }
    prefix = np.zeros((cfg.execution_horizon, cfg.action_dim), np.float32)
    device = policy.param_device
    out = {"gpu_jpeg_decode": runtime.jpeg_decoder is not None}
    for n in sizes:
        items = [
            InferItem(
                runtime.new_pipeline(), np.zeros(cfg.state_dim, np.float32), dict(jpegs), 3, prefix, prefix, rtc=True
            )
            for _ in range(n)
        ]
        row = {}
        if "guided" in which:
            ms = time_calls(lambda: runtime.infer(items, emulate=False), device, repeat, warmup)
            row.update(median_ms=statistics.median(ms), per_sample_ms=statistics.median(ms) / n)
        if "training_time" not in which:
            out[str(n)] = row
            continue
        with rtc_mode(policy, "training_time"):  # what capacity_gpu's checkpoint serves
            tt = time_calls(lambda: runtime.infer(items, emulate=False), device, repeat, warmup)
            row["training_time_ms"] = statistics.median(tt)
            if runtime.jpeg_decoder is not None:  # the GPU decode's gain: the same path with the CPU decoder
                gpu_decoder, runtime.jpeg_decoder = runtime.jpeg_decoder, None
                try:
                    cpu = time_calls(lambda: runtime.infer(items, emulate=False), device, repeat, warmup)
                finally:
                    runtime.jpeg_decoder = gpu_decoder
                row["training_time_cpu_jpeg_ms"] = statistics.median(cpu)
                row["gpu_jpeg_gain"] = row["training_time_cpu_jpeg_ms"] / row["training_time_ms"]
        out[str(n)] = row
    return out


def gain_figures(policy, n: int, repeat: int, warmup: int, which=PASSES) -> dict:
    """N sessions: N calls of batch 1 against one call of batch N, for each pass of `which` (`{"sessions": N, pass:
    {...}}`; a pass that fails names why in its row and the others keep their figures)."""
    device = policy.param_device
    batch, prefix = observations(policy, n, torch.Generator().manual_seed(2))
    singles = [{k: v[i : i + 1] for k, v in batch.items()} for i in range(n)]
    out: dict = {"sessions": n}
    for label, prefixes, mode in passes(prefix, which):

        def one_at_a_time():
            for i in range(n):
                policy.predict_action_chunk(singles[i], [3], [prefixes[i]])

        try:
            with rtc_mode(policy, mode):
                # one pass after one warm-up call: a pass is n calls already (64 guided calls took 23.5 s on the H200;
                # the 6 whole passes this took before cost 141 s of a 15-minute device lease)
                policy.predict_action_chunk(singles[0], [3], [prefixes[0]])
                serial = statistics.median(time_calls(one_at_a_time, device, 1, 0))
                batched = statistics.median(
                    time_calls(lambda: policy.predict_action_chunk(batch, [3] * n, prefixes), device, repeat, warmup)
                )
        except Exception as exc:  # as forward_figures: one failed pass keeps the others' figures
            out[label] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            print(f"gpu_forward: micro-batching's {label} pass failed: {out[label]['error']}", file=sys.stderr)
            continue
        out[label] = {
            "one_at_a_time_ms": serial,
            "micro_batched_ms": batched,
            "throughput_one_at_a_time_rps": n / serial * 1e3,
            "throughput_micro_batched_rps": n / batched * 1e3,
            "gain": serial / batched,
        }
    return out


def run(quick: bool) -> Result:
    """vla_300m on the CUDA device; skipped (with the reason) on a host without one."""
    if not torch.cuda.is_available():
        return Result(skipped="no CUDA device (torch.cuda.is_available() is False); run on a GPU host")
    batches = [1, 8] if quick else [1, 8, 32, 64]
    policy = build("vla_300m", 2, 224, "cuda", False)
    repeat, warmup = (2, 1) if quick else (10, 3)
    forward = forward_figures(policy, batches, repeat, warmup)
    gain = gain_figures(policy, max(batches), repeat, warmup)
    res = Result(details={"device": torch.cuda.get_device_name(0), "forward": forward, "micro_batching": gain})
    for n in batches:
        # a failed pass (its row says why) is a figure with no value
        res.add(f"vla_300m guided forward, batch {n}", forward[str(n)]["guided"].get("median_ms"), "ms")
        res.add(f"vla_300m training-time forward, batch {n}", forward[str(n)]["training_time"].get("median_ms"), "ms")
    for label in ("guided", "training_time"):
        res.add(
            f"micro-batching gain at {gain['sessions']} sessions, {label.replace('_', '-')} pass",
            gain[label].get("gain"),
            "x",
        )
    return res


def main(argv=None) -> int:
    ap = cli(__doc__, prog="python -m benchmarks.gpu_forward")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--preset", default=None, help="flow_transformer preset (default: vla_300m on CUDA, tiny elsewhere)"
    )
    ap.add_argument("--cameras", type=int, default=2)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the velocity network (CUDA: CUDA graphs; CPU: needs a C++ compiler)",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="weights dtype, as the manifest's model.dtype (float32: on CUDA with bf16 autocast)",
    )
    ap.add_argument(
        "--stages",
        nargs="+",
        choices=STAGES,
        default=list(STAGES),
        help="what to time, in this order (default: all, forward first): a short lease times only what it "
        "lacks, e.g. --stages runtime",
    )
    ap.add_argument(
        "--passes",
        nargs="+",
        choices=PASSES,
        default=list(PASSES),
        help="which passes every stage times (default: all three), e.g. --passes plain training_time "
        "(the guided VJP's compile is the slowest)",
    )
    args = parse_with_out(ap, argv, "reports/bench/gpu_forward.json")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks.gpu_forward: --device cuda but torch sees no CUDA device; use --device cpu --preset tiny")
        return 2
    preset = args.preset or ("vla_300m" if device.type == "cuda" else "tiny")
    policy = build(preset, args.cameras, args.image_size, args.device, args.compile, args.dtype)
    params = sum(p.numel() for p in policy.parameters())
    started = time.perf_counter()
    report = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu ({os.cpu_count()} cores, {args.threads} thread(s))",
        "torch": torch.__version__,
        "preset": preset,
        "parameters": params,
        "cameras": args.cameras,
        "image_size": args.image_size,
        "compile": args.compile,
        "dtype": args.dtype,
        "autocast": policy.hp["autocast"] if device.type == "cuda" else "none",
        "load_avg_before": os.getloadavg(),
        "complete": False,
    }

    def save(stage: str, value) -> None:
        # written after every batch size and stage: a run stopped at its time limit keeps what it measured, the
        # issue's figures first (forward at each size, then micro-batching), the JPEG runtime path last
        report[stage] = value
        report["seconds"] = round(time.perf_counter() - started, 1)
        report["compile_fallbacks"] = list(getattr(policy, "compile_fallbacks", []))  # a compiled path run eager
        write_report(args.out, report, say=None)

    report["stages"], report["passes"] = list(args.stages), list(args.passes)
    which = tuple(args.passes)
    for stage in dict.fromkeys(args.stages):  # in the order given: what a lease needs most, first
        if stage == "forward":
            forward_figures(
                policy,
                args.batches,
                args.repeat,
                args.warmup,
                on_size=lambda out: save("forward", dict(out)),
                which=which,
            )
        elif stage == "micro_batching":
            save("micro_batching", gain_figures(policy, max(args.batches), args.repeat, args.warmup, which))
        else:
            save("runtime", runtime_figures(policy, args.batches, args.repeat, args.warmup, which))
    report["compile_fallbacks"] = list(getattr(policy, "compile_fallbacks", []))
    report["complete"] = True
    report["load_avg_after"] = os.getloadavg()
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(
        f"flow_transformer {preset} ({params / 1e6:.1f}M params) on {report['device']}, torch {torch.__version__}, "
        f"{args.cameras} x {args.image_size}x{args.image_size} cameras, compile={args.compile}, weights {args.dtype}; "
        f"load {report['load_avg_before'][0]:.2f} -> {report['load_avg_after'][0]:.2f}"
    )
    print(
        f"{'batch':>6} {'guided ms':>10} {'plain ms':>10} {'training-time ms':>17} {'guided ms/sample':>17} "
        f"{'runtime ms (jpeg)':>18} {'runtime training-time':>22}"
    )

    def cell(row: dict, key: str, width: int, spec: str = ".2f") -> str:  # a failed pass: "failed"; not run: "-"
        return format(format(row[key], spec) if key in row else "failed" if row else "-", f">{width}")

    for n in args.batches:  # a stage or pass not run: its cells read "-"
        f, r = report.get("forward", {}).get(str(n), {}), report.get("runtime", {}).get(str(n), {})
        g, p, t = f.get("guided", {}), f.get("plain", {}), f.get("training_time", {})
        print(
            f"{n:>6} {cell(g, 'median_ms', 10)} {cell(p, 'median_ms', 10)} {cell(t, 'median_ms', 17)} "
            f"{cell(g, 'per_sample_ms', 17, '.3f')} {cell(r, 'median_ms', 18)} {cell(r, 'training_time_ms', 22)}"
        )
    gains = []
    for n in args.batches if "forward" in report else ():
        row = report["forward"][str(n)]
        parts = [
            f"{k.replace('_', '-')} {row[k]['compile_gain']:.2f}x" for k in PASSES if "compile_gain" in row.get(k, {})
        ]
        if parts:
            gains.append(f"batch {n} " + ", ".join(parts))
        for label, timed in row.items():
            if "error" in timed:
                print(f"failed: {label} at batch {n}: {timed['error']}")
    if gains:
        print("torch.compile's gain over eager (same process, same weights): " + "; ".join(gains))
    for reason in report["compile_fallbacks"]:
        print(f"torch.compile: {reason}")
    runtime = report.get("runtime", {})
    decode = [
        f"batch {n} {runtime[str(n)]['training_time_cpu_jpeg_ms']:.1f} -> "
        f"{runtime[str(n)]['training_time_ms']:.1f} ms ({runtime[str(n)]['gpu_jpeg_gain']:.2f}x)"
        for n in args.batches
        if "gpu_jpeg_gain" in runtime.get(str(n), {})
    ]
    if decode:
        print("JPEG decode on the GPU against the CPU decoder, the training-time path: " + "; ".join(decode))
    g = report.get("micro_batching") or {}
    for label in PASSES:
        if "gain" in g.get(label, {}):
            print(
                f"micro-batching at {g['sessions']} sessions, the {label.replace('_', '-')} pass: "
                f"{g[label]['throughput_one_at_a_time_rps']:.1f} -> {g[label]['throughput_micro_batched_rps']:.1f} "
                f"requests/s (gain {g[label]['gain']:.2f}x)"
            )
        elif "error" in g.get(label, {}):
            print(f"failed: micro-batching's {label} pass: {g[label]['error']}")
    if runtime:
        print(f"gpu jpeg decode: {runtime['gpu_jpeg_decode']}")
    print(f"stages timed: {', '.join(args.stages)}; passes: {', '.join(args.passes)}")
    write_report(args.out, report, say="->")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
