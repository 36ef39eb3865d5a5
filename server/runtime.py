"""One loaded model and the batched inference path every request goes through.

    [InferItem(pipeline, obs, delay, prefixes), ...]          one per session, same model
        -> on CUDA: the batch's JPEGs in one nvjpeg call       server.accel (CPU decode otherwise)
        -> per-session preprocess (own Pipeline)               robot numpy -> model tensors
        -> stack (pinned, non-blocking copy on CUDA)
        -> predict_action_chunk(batch, delays, prefixes)       ONE forward pass
        -> emulated accelerator latency (manifest)             honest capacity figures on a CPU
        -> split -> per-session postprocess                    model -> robot space
    [InferResult(chunk_model, chunk_robot, timings) | error, ...]

Owns: `ModelRuntime` (the policy, its serving class, warm-up, the forward lock) and
`LocalPredictor` (the same path for one session in-process: the `rtc` edge engine's policy, used
for remote/local parity and for replaying captures).

Invariants: a per-sample failure (bad image, wrong state size) fails that sample only; the others
of the batch still run. Each sample keeps its own delay and prefix (design 8.5's blocker lifted).
Only the dispatch thread of this model calls `infer` (chunk-stateful policies rely on it). No result
carries a non-finite action: such a sample fails with NON_FINITE_ACTION instead (a robot executes what
it gets), and a warm-up pass that produces one refuses the checkpoint.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from server.accel import GpuJpegDecoder, decode_item_jpegs, to_device
from server.policies.base import STATE_KEY, PolicyLoadError, image_key
from server.policies.checkpoint import LoadedCheckpoint
from server.processors import Pipeline, ProcessorError, make_session_pipeline, prepare_prefix
from wire.messages import ErrorCode

log = logging.getLogger(__name__)

NON_FINITE_ACTION = ErrorCode.NON_FINITE_ACTION


def set_torch_threads(n: int) -> None:
    """Give the CALLING thread `n` intra-op threads (OpenMP and MKL). Both keep the count per thread: a
    thread the process starts later (a dispatch loop) begins with OpenMP's default, one per core, and its
    first large op spawns a helper team that spin-waits between the policy's many small ops. Seen on the
    2-core host: one replica in two or three, at random, burned 2-3x the CPU of its siblings for the same
    batches (52 % of its samples in libgomp). Call it at the start of every thread that runs a forward."""
    torch.set_num_threads(max(1, int(n)))


@dataclass
class EmulatedLatency:
    """Accelerator time added to every forward pass (reported as emulated wherever it shows)."""

    distribution: str = "fixed"  # fixed | normal | lognormal | uniform
    mean_ms: float = 0.0
    std_ms: float = 0.0
    min_ms: float = 0.0
    max_ms: float = float("inf")
    per_batch_item_ms: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    @classmethod
    def from_manifest(cls, value: Any) -> EmulatedLatency | None:
        if value is None:
            return None
        if isinstance(value, (int, float)):
            return cls(mean_ms=float(value))
        if isinstance(value, dict):
            return cls(**value)
        return cls(
            **{
                k: getattr(value, k)
                for k in ("distribution", "mean_ms", "std_ms", "min_ms", "max_ms", "per_batch_item_ms")
                if hasattr(value, k)
            }
        )

    def sample_ms(self, batch_size: int) -> float:
        d = self.distribution
        if d == "fixed":
            base = self.mean_ms
        elif d == "normal":
            base = self._rng.gauss(self.mean_ms, self.std_ms)
        elif d == "lognormal":
            mean, std = max(self.mean_ms, 1e-6), max(self.std_ms, 0.0)
            sigma2 = np.log(1.0 + (std / mean) ** 2)
            base = self._rng.lognormvariate(np.log(mean) - sigma2 / 2, np.sqrt(sigma2))
        elif d == "uniform":
            base = self._rng.uniform(self.min_ms, self.max_ms if np.isfinite(self.max_ms) else self.mean_ms * 2)
        else:
            raise ValueError(f"emulated_latency.distribution {d!r}: use fixed, normal, lognormal or uniform")
        base = min(max(base, self.min_ms), self.max_ms)
        return max(0.0, base + self.per_batch_item_ms * max(0, batch_size - 1))


@dataclass
class InferItem:
    """One session's request: robot-space observation, its own delay and prefixes, its own pipeline."""

    pipeline: Pipeline
    state: np.ndarray
    images: dict[str, Any] = field(default_factory=dict)  # name -> (H, W, 3) uint8 or EncodedImage
    inference_delay: int = 0
    prefix_model: np.ndarray | None = None
    prefix_robot: np.ndarray | None = None
    rtc: bool = False  # False: delay and prefix are not passed (append-mode session)


@dataclass
class InferResult:
    chunk_model: np.ndarray | None = None  # (T, A) float32
    chunk_robot: np.ndarray | None = None
    error: str | None = None  # per-sample failure: the message for the client
    error_code: str = ""
    rtc_applied: bool = False
    preprocess_ms: float = 0.0
    forward_ms: float = 0.0  # the shared forward pass (incl. emulated latency), same for the batch
    batch: int = 0  # samples in that forward pass
    emulated_ms: float = 0.0
    postprocess_ms: float = 0.0

    @property
    def inference_ms(self) -> float:
        return self.preprocess_ms + self.forward_ms + self.postprocess_ms


def compiles_on_cuda(policy) -> bool:
    """Whether `policy` replays CUDA graphs (flow_transformer's `compile` on a CUDA device)."""
    hp = getattr(policy, "hp", None) or {}
    device = getattr(policy, "param_device", None)
    return bool(hp.get("compile")) and getattr(device, "type", "cpu") == "cuda"


class LocalForward:
    """The batched forward pass on this process's policy: the default `dispatch.backend` (server.dispatch has
    the Ray Serve one, with the same call). A policy that replays CUDA graphs (`compiles_on_cuda`) is called from
    one thread of its device's whichever thread asks (the warm-up's, each dispatch loop's, Ray Serve's): torch's
    CUDA-graph trees are per thread, and in torch 2.11 a graph captured on one thread asserts when another
    replays it (pytorch/pytorch#123177, fixed by #184357 after that release). The thread is the device's, not the
    model's: two compiled models of one size share Dynamo's graphs, so their replays must come from one thread
    too; the GPU's work does not overlap anyway. It runs with the torch thread count of the thread that made it."""

    backend = "local"
    _device_threads: dict[str, Any] = {}  # device -> its forward thread (a one-worker executor), for the process
    _device_threads_lock = threading.Lock()

    def __init__(self, policy, one_thread: bool | None = None):
        self.policy = policy
        self._thread = None
        if compiles_on_cuda(policy) if one_thread is None else one_thread:
            self._thread = self.device_thread(str(getattr(policy, "param_device", "cpu")))

    @classmethod
    def device_thread(cls, device: str):
        from concurrent.futures import ThreadPoolExecutor

        with cls._device_threads_lock:
            if device not in cls._device_threads:
                cls._device_threads[device] = ThreadPoolExecutor(
                    max_workers=1,
                    thread_name_prefix=f"forward-{device}",
                    initializer=set_torch_threads,
                    initargs=(torch.get_num_threads(),),
                )
            return cls._device_threads[device]

    def __call__(self, batch, delays, prefixes):
        if self._thread is None:
            return self.policy.predict_action_chunk(batch, delays, prefixes)
        return self._thread.submit(self.policy.predict_action_chunk, batch, delays, prefixes).result()

    def close(self) -> None:
        """Nothing to release: the device's thread serves every model on it for the life of the process (idle, it
        waits; the interpreter joins it at exit)."""


class ModelRuntime:
    """A loaded checkpoint plus the batched forward path. One per model in the process."""

    def __init__(
        self, loaded: LoadedCheckpoint, emulated: EmulatedLatency | None = None, execution_horizon: int | None = None
    ):
        self.loaded = loaded
        self.policy = loaded.policy
        self.config = loaded.config
        self.emulated = emulated
        self.execution_horizon = int(execution_horizon or self.config.execution_horizon)
        self.supports_rtc = bool(getattr(type(self.policy), "supports_rtc", False))
        # which RTC an rtc_enabled session gets: the checkpoint's (hyper_params.rtc_mode: flow_matching, flow_transformer)
        self.rtc_mode = (
            (getattr(self.policy, "hp", {}) or {}).get("rtc_mode", "guidance") if self.supports_rtc else None
        )
        self.forward_lock = threading.Lock()
        self.forward_count = 0
        # where the batched forward pass runs: this process (default) or Ray Serve (server.dispatch)
        self.forward = LocalForward(self.policy)
        # CUDA only (None elsewhere, or without torchvision): the batch's JPEGs in one nvjpeg call
        self.jpeg_decoder = GpuJpegDecoder.for_device(self.policy.param_device)

    # -- descriptors the session layer reads --------------------------------------------------
    @property
    def action_names(self) -> list[str]:
        return list(self.config.action_names)

    @property
    def cameras(self) -> dict[str, list[int]]:
        """camera -> [h, w, c] as the wire's SessionAck/Status carry it (config stores [3, H, W])."""
        return {n: [s[1], s[2], s[0]] for n, s in self.config.image_features.items()}

    def new_pipeline(self) -> Pipeline:
        return make_session_pipeline(self.loaded)

    def reset_policy(self) -> None:
        self.policy.reset()

    def _warmup_frames(self) -> dict[str, Any]:
        images = {name: np.zeros((s[1], s[2], 3), np.uint8) for name, s in self.config.image_features.items()}
        if self.jpeg_decoder is not None and images:
            # JPEG frames, as robots send them: the GPU decoder's first call sets itself up (the first request
            # after a start paid ~0.7 s outside its forward pass on the H200 while warm-up frames were raw)
            from wire.images import encode_image

            images = {name: encode_image(frame, "jpeg", 90) for name, frame in images.items()}
        return images

    def _dummy_items(self, size: int, images: dict[str, Any], prefixed: bool) -> list[InferItem]:
        """`size` zero observations of new sessions, each with a zero RTC prefix (`prefixed`) or none."""
        state = np.zeros(self.config.state_dim, np.float32)
        prefix = np.zeros((self.execution_horizon, self.config.action_dim), np.float32) if prefixed else None
        return [
            InferItem(self.new_pipeline(), state, images, 1, prefix, prefix, rtc=self.supports_rtc) for _ in range(size)
        ]

    def _warmup_pass(self, size: int, images: dict[str, Any], prefixed: bool) -> None:
        """One dummy pass of `size` samples, with an RTC prefix (`prefixed`) or without; raises on its error."""
        res = self.infer(self._dummy_items(size, images, prefixed), emulate=False)[0]
        if res.error_code == NON_FINITE_ACTION:  # a zero observation overflowing: the checkpoint itself is broken
            raise PolicyLoadError(
                f"warm-up forward pass on a zero observation: {res.error}; fix or re-export the "
                "checkpoint (a replica that started would refuse every request)"
            )
        if res.error:
            raise RuntimeError(f"warm-up forward pass failed: {res.error}")

    @property
    def _prefix_kinds(self) -> tuple[bool, ...]:
        """The request kinds a warm-up passes: without an RTC prefix, and with one where the policy takes it."""
        return (False, True) if self.supports_rtc else (False,)

    def warmup(self, n: int) -> float:
        """`n` rounds of dummy forward passes (with and without an RTC prefix); returns the mean ms per round."""
        if n <= 0:
            return 0.0
        images = self._warmup_frames()
        t0 = time.perf_counter()
        for _ in range(n):  # both paths each time: the first guided pass pays its own set-up
            for prefixed in self._prefix_kinds:
                self._warmup_pass(1, images, prefixed)
        self.reset_policy()
        return (time.perf_counter() - t0) * 1e3 / n

    def warm_buckets(self, max_batch: int) -> list[int]:
        """A policy that compiles per bucket (flow_transformer's `compile`): one pass of every bucket a batch of up
        to `max_batch` can be padded to, with an RTC prefix and without (an episode's first request has none: a
        batch of those is the plain pass), so every graph a request can reach is built before the replica says it
        is ready. A bucket first met by requests compiled inside their forward pass: 9.0 s on the 2-core VM, every
        robot of that batch past its budget. Returns the bucket sizes warmed (none for other policies)."""
        hp = getattr(self.policy, "hp", None) or {}
        if not hp.get("compile") or not hasattr(self.policy, "buckets"):
            return []
        top = self.policy.bucket(max(1, int(max_batch)))
        sizes = [b for b in self.policy.buckets() if b <= top] or [top]
        images = self._warmup_frames()
        for size in sizes:
            for prefixed in self._prefix_kinds:
                self._warmup_pass(size, images, prefixed)
        self.reset_policy()
        return sizes

    def unloaded_forward_ms(self, max_batch: int, repeats: int = 5) -> dict[int, float]:
        """Forward-pass ms (the fastest of `repeats`: the least disturbed) at batch sizes 1, 2, 4, ... up to
        min(max_batch, 64), the way requests run (guided where the policy supports it, emulated latency included,
        frames as JPEGs through a GPU decoder where the replica has one): the replica's own unloaded reference,
        against which the bench reads a starved replica as a ratio and replays its queue (bench fidelity). A fleet's
        replicas measure it together as they start, so a median read their neighbours' start-up as much as their
        own speed (2-core VM: 6.8 ms at batch 1, 2.9 at 16). Raw frames on a GPU replica took a path no request
        takes (77 MB stacked on the host and copied over inside the timed pass at batch 64 of 2 x 224x224).
        A policy that pads a batch to its buckets (flow_transformer's `batch_buckets`, or `compile`'s) is timed at
        each bucket, and the table gives each bucket's time at the smallest size padded to it as well: a batch of
        40 runs bucket 64's pass, and a reader that interpolates (bench fidelity) between 32 and 64 read 53 ms for
        a 73 ms pass, the 20 ms between them the bench's share (an H100, 128 sessions, p50 batch 40)."""
        images = self._warmup_frames()
        top = min(max(1, max_batch), 64)
        buckets = self.padding_buckets(top)
        sizes = [1 << k for k in range(top.bit_length())]
        if buckets:  # and past the largest bucket (a batch it cannot pad), the batch's own size
            sizes = buckets + ([top] if top > buckets[-1] else [])
        out: dict[int, float] = {}
        for n in sizes:
            items = self._dummy_items(n, images, self.supports_rtc)
            out[n] = round(min(self.infer(items)[0].forward_ms for _ in range(repeats)), 3)
        for low, bucket in zip([0, *buckets], buckets):  # the smallest batch each bucket serves reads its time
            out.setdefault(low + 1, out[bucket])
        self.reset_policy()
        return dict(sorted(out.items()))

    def padding_buckets(self, top: int) -> list[int]:
        """The sizes a batch of up to `top` samples is padded to (the policy's `buckets()`, up to the one `top`
        pads to); [] for a policy that runs every batch at its own size."""
        buckets = getattr(self.policy, "buckets", None)
        sizes = sorted(set(buckets())) if callable(buckets) else []
        last = next((b for b in sizes if b >= top), sizes[-1] if sizes else 0)
        return [b for b in sizes if b <= last]

    # -- the hot path -----------------------------------------------------------------------------
    def infer(self, items: list[InferItem], emulate: bool = True) -> list[InferResult]:
        results = [InferResult() for _ in items]
        batches: list[dict[str, torch.Tensor]] = []
        live: list[int] = []
        delays: list[int] = []
        prefixes: list[torch.Tensor | None] = []
        images = [item.images for item in items]
        decode_ms = 0.0
        if self.jpeg_decoder is not None and any(images):
            t0 = time.perf_counter()
            images = decode_item_jpegs(self.jpeg_decoder, images)
            decode_ms = (time.perf_counter() - t0) * 1e3  # one call for the batch: every item waited for all of it
        for i, item in enumerate(items):
            t0 = time.perf_counter()
            try:
                obs = {STATE_KEY: item.state}
                for name, frame in images[i].items():
                    obs[image_key(name)] = frame
                batch = item.pipeline.preprocess(obs)
                prefix = None
                if item.rtc and self.supports_rtc:
                    prefix = prepare_prefix(
                        item.pipeline, item.prefix_model, item.prefix_robot, None, self.execution_horizon
                    )
            except (ProcessorError, ValueError) as exc:  # a WireError keeps its own code (a corrupt JPEG: BAD_IMAGE)
                results[i].error, results[i].error_code = str(exc), getattr(exc, "code", "BAD_TENSOR")
                continue
            except Exception as exc:  # a decoder or torch error on one sample must not fail the batch
                results[i].error, results[i].error_code = f"{type(exc).__name__}: {exc}", "INTERNAL"
                continue
            results[i].preprocess_ms = decode_ms + (time.perf_counter() - t0) * 1e3
            batches.append(batch)
            live.append(i)
            delays.append(int(item.inference_delay) if item.rtc else 0)
            prefixes.append(prefix)
            results[i].rtc_applied = prefix is not None
        if not live:
            return results
        t0 = time.perf_counter()
        device = self.policy.param_device
        dtype = self.policy.param_dtype
        stacked = {k: _stack([b[k] for b in batches], device, dtype) for k in batches[0]}
        prefixes = [to_device(p, device, dtype) if p is not None else None for p in prefixes]
        try:
            with self.forward_lock:
                chunks = self.forward(stacked, delays, prefixes)
                self.forward_count += 1
            # In the pass's time: on CUDA the kernels run after the call returns, and this copy waits for them.
            # Timed before it, the pass's GPU tail was in no server figure (14-35 ms p50 on an H100, compiled
            # vla_300m, 8-64 sessions) and the bench read it as network. A device error surfaces here too.
            chunks = chunks.detach().to("cpu", torch.float32)
        except Exception as exc:
            msg = f"forward pass failed: {type(exc).__name__}: {exc}"
            log.exception("forward pass failed for a batch of %d", len(live))
            for i in live:
                results[i].error, results[i].error_code = msg, "INTERNAL"
            return results
        emulated_ms = 0.0
        if emulate and self.emulated is not None:
            emulated_ms = self.emulated.sample_ms(len(live))
            spent = (time.perf_counter() - t0) * 1e3
            if emulated_ms > spent:  # the emulated accelerator time replaces, not adds to, our CPU time
                time.sleep((emulated_ms - spent) / 1e3)
        forward_ms = (time.perf_counter() - t0) * 1e3
        for row, i in enumerate(live):
            t1 = time.perf_counter()
            try:
                robot = items[i].pipeline.postprocess(chunks[row : row + 1])
            except Exception as exc:
                results[i].error, results[i].error_code = f"postprocess failed: {exc}", "INTERNAL"
                continue
            chunk_model, chunk_robot = chunks[row].numpy().copy(), robot.numpy().astype(np.float32, copy=False)
            where = _non_finite(chunk_model, chunk_robot)
            if where:  # never sent: a robot executes what it gets (an overflow in the model or its stats, NaN weights)
                results[i].error, results[i].error_code = where, NON_FINITE_ACTION
                continue
            results[i].chunk_model = chunk_model
            results[i].chunk_robot = chunk_robot
            results[i].forward_ms = forward_ms
            results[i].batch = len(live)
            results[i].emulated_ms = emulated_ms
            results[i].postprocess_ms = (time.perf_counter() - t1) * 1e3
        return results


def _non_finite(chunk_model: np.ndarray, chunk_robot: np.ndarray) -> str:
    """'' when both chunks are finite; else what is not, for the NON_FINITE_ACTION message."""
    bad = [
        (name, chunk)
        for name, chunk in (("model-space", chunk_model), ("robot-space", chunk_robot))
        if not np.isfinite(chunk).all()
    ]
    if not bad:
        return ""
    name, chunk = bad[0]
    rows = np.flatnonzero(~np.isfinite(chunk).reshape(chunk.shape[0], -1).all(axis=1))
    return (
        f"the policy produced non-finite actions ({name} chunk rows {rows[:8].tolist()}"
        f"{' ...' if rows.size > 8 else ''} of {chunk.shape[0]}); the chunk was withheld. An observation far "
        f"outside the training range can overflow the model; if every observation gets this, the checkpoint's "
        f"weights or stats hold NaN or inf"
    )


def _stack(tensors: list[torch.Tensor], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """One batch tensor on the model's device: CPU rows are concatenated on the host and copied once."""
    if all(t.device.type == "cpu" for t in tensors):
        return to_device(torch.cat(tensors, dim=0), device, dtype)
    return torch.cat([t.to(device=device, dtype=dtype, non_blocking=True) for t in tensors], dim=0)


class LocalPredictor:
    """The server's inference path for one in-process session, in the edge `rtc` engine's shape.

    `predict_action_chunk(obs, inference_delay, prefix)` -> (chunk_model, chunk_robot): `prefix` is the
    model-space leftover (what the rtc engine passes); `obs` holds "state" and optional "images" and
    "prefix_robot". Same pipeline, same policy, same numbers as the server: the parity baseline.
    """

    def __init__(self, runtime: ModelRuntime, rtc: bool = True, torch_threads: int = 1):
        self.runtime = runtime
        self.pipeline = runtime.new_pipeline()
        self.rtc = rtc and runtime.supports_rtc
        # Each calling thread gets the replica's intra-op threads (manifest torch_threads, 1 by default) on its
        # first call: another count changes the GEMMs' summation order, hence the chunk's last bits (on an
        # AVX-512 host the reacher's chunk at 2 threads differed from 1 thread's by up to 3e-3 after guidance),
        # and the parity baseline must be the server's numbers; it also keeps OpenMP teams from spinning
        # against a shard's control loop (set_torch_threads).
        self.torch_threads = int(torch_threads)
        self._threads_set = threading.local()

    @classmethod
    def from_checkpoint(
        cls, path: str, rtc: bool = True, device: str = "cpu", torch_threads: int = 1
    ) -> LocalPredictor:
        from server.policies.checkpoint import load_checkpoint

        return cls(ModelRuntime(load_checkpoint(path, device=device)), rtc=rtc, torch_threads=torch_threads)

    def predict_action_chunk(self, obs: dict, inference_delay: int, prefix: np.ndarray | None):
        if not getattr(self._threads_set, "done", False):
            set_torch_threads(self.torch_threads)
            self._threads_set.done = True
        item = InferItem(
            self.pipeline,
            np.asarray(obs["state"], np.float32),
            dict(obs.get("images") or {}),
            int(inference_delay),
            prefix,
            obs.get("prefix_robot"),
            rtc=self.rtc,
        )
        res = self.runtime.infer([item], emulate=False)[0]
        if res.error:
            raise RuntimeError(res.error)
        return res.chunk_model, res.chunk_robot

    def reset(self) -> None:
        self.pipeline.reset()
        self.runtime.reset_policy()
