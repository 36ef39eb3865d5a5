"""`flow_transformer`: a transformer flow-matching chunk policy (an action expert) with RTC, two ways.

    observation ──► obs tokens: state (1) + per camera image tokens (conv grid or ViT patches)
                    ──► obs_layers encoder blocks ──► memory (B, N_obs, d)      once per call
                    ──► context: pooled condition + every action block's cross-attention K, V   once per call
    noise x(t=1) ──► action tokens (B, T, d) = in(x_t) + pos + time(t)
                    ──► num_layers blocks (adaLN on t + pooled obs): self-attention, cross-attention to memory
                    ──► v = out(tokens) + a(t) * x_t    ──Euler, num_steps──►  x(t=0) = the chunk

The sampler and the guidance are flow_matching's (same Euler times, same LeRobot prefix weights and
guidance weight schedule, imported from there); the VJP of x1_hat = x_t - t * v(x_t) runs through
torch.autograd here, which is cheap next to the forward of a network this size on a GPU (the
written-out MLP VJP stays with `flow_matching`). Sizes come from `hyper_params`, so one class is
tiny on a CPU (`PRESETS["tiny"]`: trains on the reacher demos in minutes) and VLA-sized on a GPU
(`PRESETS["vla_300m"]`: a pi0-sized action expert, ~350M parameters with its ViT stem).

GPU path (written for CUDA; CPU exercises all but the CUDA-only calls):
- `autocast: "bf16"` runs the forward under torch.autocast(cuda, bfloat16); the chunk comes back float32.
- `batch_buckets`: a batch is padded to the next bucket size (pad rows copy row 0 and are dropped
  afterwards), so a CUDA graph or a torch.compile specialisation exists for a few shapes only.
- `compile`: torch.compile of the velocity network, one specialisation per bucket: on CUDA
  mode="reduce-overhead" (CUDA graphs) for plain and training-time calls and a compile without CUDA
  graphs for the guided sampler's VJP; on a CPU inductor's default mode for all (generated C++; needs a
  C++ compiler, refused with a clear error without one). A compile that fails runs eager, with a warning.
- No host sync inside the sampling loop: every Euler time and guidance weight is a Python float
  computed before the loop, noise and prefix targets reach the device once, and nothing in the loop
  reads a device value back (tests/server/test_policies_flow_transformer.py enforces it on CPU).

`rtc_mode` and `max_prefix_rows` mean what they mean for flow_matching (same defaults, checks, errors):
"training_time" is training-time RTC (arXiv 2512.05964), which a transformer takes naturally, as
per-token flow time. `velocity(..., row_t)` embeds each action token's own time into its input, its
adaLN condition and its skip gain; the committed rows (the first min(d, len(prefix))) enter clean, at
time 0, are held at the given values at every Euler step (so they come out exactly as given) and are
out of the loss (flow_matching's `prefix_mask`, `sample_committed`, `prefix_flow_matching_loss`). No
guidance pass, no autograd. The weights have the same shapes in both modes, but only a network trained
with clean rows can read them: a checkpoint trained as "guidance" (every config.json from before the
mode existed) refuses "training_time" with `RTCModeError`; one trained as "training_time" can be
guided. Without a `row_t` the network is the one-embedding-per-sample network of before, op for op.

Invariants: every block is per-sample (LayerNorm, attention within a sample), so sample b of a
padded or micro-batched call equals the same sample alone up to matmul rounding; with `noise_seed`
set the output is a pure function of (observation, delay, prefix). A prefix of None gets the
unguided velocity exactly (in training_time: commits no row).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from server.policies.base import (
    STATE_KEY,
    ChunkPolicy,
    PolicyConfig,
    PolicyConfigError,
    image_key,
    register_policy,
)
from server.policies.flow_matching import (
    DEFAULTS as FLOW_MATCHING_DEFAULTS,
    PREFIX_SCHEDULES,
    check_rtc_hyper_params,
    check_rtc_mode,
    guidance_weight,
    initial_noise,
    prefix_mask,
    prefix_weights,
    rtc_flow_matching_loss,
    sample_committed,
)
from server.policies.layers import mlp, time_embedding

log = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    "d_model": 64,
    "num_heads": 4,
    "num_layers": 2,  # action expert blocks (self + cross attention + MLP)
    "obs_layers": 1,  # encoder blocks over the observation tokens
    "mlp_ratio": 2,
    "image_encoder": "conv",  # "conv": strided convs pooled to a grid; "vit": patches + positions
    "image_grid": 2,  # conv: grid x grid tokens per camera
    "patch_size": 16,  # vit: patch side in pixels (the image side must be a multiple)
    "num_steps": 10,
    "noise_seed": 0,  # None: fresh noise from torch's global RNG on every call
    "max_guidance_weight": 10.0,
    "guidance_jacobian": "network",  # or "identity" (LeRobot main's effective behaviour)
    "prefix_schedule": "linear",  # LeRobot's ramp; "exp": the RTC paper's soft mask (eq. 5)
    "autocast": "bf16",  # on CUDA only: "bf16" or "none"
    "batch_buckets": [],  # e.g. [1, 8, 16, 32, 64]: pad a batch to the next size (compile; none: COMPILE_BUCKETS)
    "compile": False,  # torch.compile the velocity network (CUDA: CUDA graphs; CPU: inductor's C++, needs g++)
    # "guidance" | "training_time" and its training prefix bound, as flow_matching's (module docstring)
    **{name: FLOW_MATCHING_DEFAULTS[name] for name in ("rtc_mode", "max_prefix_rows")},
}

PRESETS: dict[str, dict[str, Any]] = {
    # trains on the reacher demos on one CPU thread in minutes (bench/training/train.py)
    "tiny": {"d_model": 64, "num_heads": 4, "num_layers": 2, "obs_layers": 1, "mlp_ratio": 2},
    # a pi0-sized action expert (14 adaLN blocks of width 1024) over a ViT stem, for 2 x 224x224 cameras
    "vla_300m": {"d_model": 1024, "num_heads": 16, "num_layers": 14, "obs_layers": 2, "mlp_ratio": 4,
                 "image_encoder": "vit", "patch_size": 16, "batch_buckets": [1, 8, 16, 32, 64]},
}
# `compile` without `batch_buckets`: powers of two up to the largest batch P10's sweeps use (a larger batch compiles
# its own size); set `batch_buckets` to pad less (an eager pass gains nothing from padding)
COMPILE_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
IMAGE_ENCODERS = ("conv", "vit")
AUTOCASTS = ("bf16", "none")
GUIDANCE_JACOBIANS = ("network", "identity")


class Block(nn.Module):
    """Pre-LN transformer block: self-attention, optional cross-attention to a memory, MLP.

    An action block (`cross`) is conditioned by adaLN: each of its three norms is shifted and scaled
    by a projection of (flow time + pooled observation) (zero-initialised: a plain block at first).
    The velocity changes sharply with t, and a time feature added at the input alone fades. The
    condition is (B, d), one per sample, or (B, T, d), one per token (training-time RTC's per-row time).

    The attention is nn.MultiheadAttention's (its weights, so checkpoints load as before) written out with
    scaled_dot_product_attention, so an action block takes its cross-attention keys and values already
    projected (`memory_kv`): the memory is the same at every Euler step, its projection is done once per call.
    """

    def __init__(self, d: int, heads: int, mlp_ratio: int, cross: bool):
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.cross = cross
        if cross:
            self.norm2 = nn.LayerNorm(d)
            self.cross_attn = nn.MultiheadAttention(d, heads, batch_first=True)
            self.modulation = nn.Linear(d, 6 * d)
            nn.init.zeros_(self.modulation.weight)
            nn.init.zeros_(self.modulation.bias)
        self.norm3 = nn.LayerNorm(d)
        self.mlp = mlp(d, d * mlp_ratio, d, num_layers=2)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """The cross-attention's keys and values of `memory` (B, N, d), split into heads: 2 x (B, heads, N, d/heads),
        each contiguous (not views of one projection: a CUDA graph copies an input into a buffer of its strides)."""
        d = memory.shape[-1]
        k, v = F.linear(memory, self.cross_attn.in_proj_weight[d:], self.cross_attn.in_proj_bias[d:]).chunk(2, dim=-1)
        heads = self.cross_attn.num_heads
        return _split_heads(k, heads).contiguous(), _split_heads(v, heads).contiguous()

    def forward(self, x: Tensor, memory_kv: tuple[Tensor, Tensor] | None = None, time: Tensor | None = None) -> Tensor:
        if not self.cross:
            x = x + self._self_attention(self.norm1(x))
            return x + self.mlp(self.norm3(x))
        modulation = self.modulation(time)
        if modulation.dim() == 2:  # one condition per sample: broadcast over its tokens
            modulation = modulation[:, None, :]
        shift1, scale1, shift2, scale2, shift3, scale3 = modulation.chunk(6, dim=-1)
        x = x + self._self_attention(self.norm1(x) * (1 + scale1) + shift1)
        x = x + self._cross_attention(self.norm2(x) * (1 + scale2) + shift2, *memory_kv)
        return x + self.mlp(self.norm3(x) * (1 + scale3) + shift3)

    def _self_attention(self, h: Tensor) -> Tensor:
        attn = self.attn
        q, k, v = (_split_heads(part, attn.num_heads)
                   for part in F.linear(h, attn.in_proj_weight, attn.in_proj_bias).chunk(3, dim=-1))
        return attn.out_proj(_merge_heads(F.scaled_dot_product_attention(q, k, v)))

    def _cross_attention(self, h: Tensor, k: Tensor, v: Tensor) -> Tensor:
        attn, d = self.cross_attn, h.shape[-1]
        q = _split_heads(F.linear(h, attn.in_proj_weight[:d], attn.in_proj_bias[:d]), attn.num_heads)
        return attn.out_proj(_merge_heads(F.scaled_dot_product_attention(q, k, v)))


def _split_heads(x: Tensor, heads: int) -> Tensor:
    """(B, L, d) -> (B, heads, L, d / heads)"""
    return x.unflatten(-1, (heads, -1)).transpose(1, 2)


def _merge_heads(x: Tensor) -> Tensor:
    """(B, heads, L, d / heads) -> (B, L, d)"""
    return x.transpose(1, 2).flatten(2)


class ConvTokens(nn.Module):
    """(B, 3, H, W) -> (B, grid^2, d): two strided convs, average-pooled to a grid."""

    def __init__(self, d: int, grid: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=5, stride=2, padding=2), nn.SiLU(),
            nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1), nn.SiLU(),
            nn.AdaptiveAvgPool2d(grid),
        )
        self.proj = nn.Linear(32, d)

    def forward(self, image: Tensor) -> Tensor:
        return self.proj(self.net(image).flatten(2).transpose(1, 2))


class PatchTokens(nn.Module):
    """(B, 3, H, W) -> (B, (H/p)(W/p), d): ViT patch embedding plus learned positions."""

    def __init__(self, d: int, patch: int, height: int, width: int):
        super().__init__()
        self.proj = nn.Conv2d(3, d, kernel_size=patch, stride=patch)
        self.pos = nn.Parameter(torch.zeros(1, (height // patch) * (width // patch), d))
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, image: Tensor) -> Tensor:
        return self.proj(image).flatten(2).transpose(1, 2) + self.pos


@register_policy("flow_transformer")
class FlowTransformerPolicy(ChunkPolicy):
    supports_rtc = True
    chunk_stateless = True

    hyper_param_defaults = DEFAULTS
    compiled_shapes = 0  # the compiled velocity networks' specialisations in this process (`_maybe_compile`)

    @classmethod
    def normalize_hyper_params(cls, hp: dict[str, Any]) -> dict[str, Any]:
        return {**hp, "batch_buckets": sorted({int(b) for b in hp["batch_buckets"]})}

    @classmethod
    def check_hyper_params(cls, config: PolicyConfig, hp) -> None:
        _check_hyper_params(config, hp)
        check_rtc_hyper_params("flow_transformer", hp)

    def __init__(self, config: PolicyConfig):
        super().__init__(config)
        hp = self.hp
        # training_time RTC: trained with per-token flow times (clean committed rows); fixed at build, the
        # weights are the same shapes either way, but a network trained without clean rows cannot read them
        self.prefix_conditioned = hp["rtc_mode"] == "training_time"
        d, heads, ratio = int(hp["d_model"]), int(hp["num_heads"]), int(hp["mlp_ratio"])
        self.image_names = sorted(config.image_features)
        self.state_in = nn.Linear(config.state_dim, d)
        stems: dict[str, nn.Module] = {}
        for name in self.image_names:
            _, height, width = config.image_features[name]
            if hp["image_encoder"] == "vit":
                stems[name] = PatchTokens(d, int(hp["patch_size"]), height, width)
            else:
                stems[name] = ConvTokens(d, int(hp["image_grid"]))
        self.stems = nn.ModuleDict(stems)
        # which token is which: the state, then each camera
        self.source_embed = nn.Parameter(torch.zeros(1 + len(self.image_names), d))
        self.obs_blocks = nn.ModuleList(Block(d, heads, ratio, cross=False) for _ in range(int(hp["obs_layers"])))
        self.obs_norm = nn.LayerNorm(d)
        self.action_in = nn.Linear(config.action_dim, d)
        self.action_pos = nn.Parameter(torch.zeros(1, config.chunk_size, d))
        nn.init.normal_(self.action_pos, std=0.02)
        self.time_mlp = mlp(d, d, d, num_layers=2)
        # adaLN conditions on the time AND the pooled observation: cross-attention to a single state
        # token is a constant per sample (softmax over one key), the scales and shifts are not
        self.obs_cond = nn.Linear(d, d)
        self.blocks = nn.ModuleList(Block(d, heads, ratio, cross=True) for _ in range(int(hp["num_layers"])))
        self.out_norm = nn.LayerNorm(d)
        self.action_out = nn.Linear(d, config.action_dim)
        # a(t) * x_t, as flow_matching's: the exact velocity of a determined chunk is (x_t - x1) / t
        self.skip_gain = mlp(d, 64, 1, num_layers=2)
        self._velocity_fn = self.velocity
        self._compiled = False
        self._grad_path: CompiledPath | None = None  # the compiled network the guided VJP calls
        self._counted: tuple | None = None  # the (buckets, autocast) counted into Dynamo's recompile limit
        self.compile_fallbacks: list[str] = []  # why a compiled path runs eager (CompiledPath)

    # -- the network ---------------------------------------------------------------------------

    def encode(self, batch: dict[str, Tensor]) -> Tensor:
        """Observation tokens after the encoder blocks: (B, 1 + tokens per camera * cameras, d)."""
        tokens = [self.state_in(batch[STATE_KEY])[:, None, :] + self.source_embed[0]]
        for k, name in enumerate(self.image_names):
            tokens.append(self.stems[name](batch[image_key(name)]) + self.source_embed[1 + k])
        memory = torch.cat(tokens, dim=1)
        for block in self.obs_blocks:
            memory = block(memory)
        return self.obs_norm(memory)

    def context(self, memory: Tensor) -> tuple[Tensor, ...]:
        """What the velocity reads of the observation, the same at every Euler step, so computed once per call (as
        pi0's prefix KV cache): the pooled observation's condition (B, d), then every action block's cross-attention
        keys and values (B, heads, N, d/heads). Most of a step's work at VLA size: N (2 x 196 + 1 tokens) is ~13x T
        (30 action tokens); `python -m benchmarks.forward_cost` counts a call's FLOPs and ops. Under CUDA graphs
        the context is an input each replay copies into its graph (2 x num_layers tensors: ~1.4 GB a step at vla_300m
        batch 64 in bf16, against ~1.5 TFLOP of projection it saves; unmeasured on a GPU)."""
        return (self.obs_cond(memory.mean(dim=1)), *(kv for block in self.blocks for kv in block.memory_kv(memory)))

    def velocity(self, x_t: Tensor, t: Tensor, context: tuple[Tensor, ...], row_t: Tensor | None = None) -> Tensor:
        """v(x_t, t, obs): (B, T, A), (B,), `context(memory)` -> (B, T, A). `row_t` (B, T): each action token's own
        flow time (training-time RTC), embedded per token into its input, its adaLN condition and its skip gain;
        None: every token at t, one embedding per sample."""
        d = int(self.hp["d_model"])
        pooled, memory_kv = context[0], context[1:]
        per_token = row_t is not None
        t_emb = time_embedding(row_t.reshape(-1), d).reshape(*row_t.shape, d) if per_token else time_embedding(t, d)
        time = self.time_mlp(t_emb)  # (B, T, d) per token, else (B, d)
        if per_token:
            time_tokens, pooled, skip = time, pooled[:, None, :], self.skip_gain(t_emb)
        else:
            time_tokens, skip = time[:, None, :], self.skip_gain(t_emb)[:, :, None]
        h = self.action_in(x_t) + self.action_pos + time_tokens
        cond = F.silu(time + pooled)
        for i, block in enumerate(self.blocks):
            h = block(h, memory_kv[2 * i:2 * i + 2], cond)
        return self.action_out(self.out_norm(h)) + skip * x_t

    # -- serving -------------------------------------------------------------------------------

    def _autocast(self, device: torch.device):
        if device.type == "cuda" and self.hp["autocast"] == "bf16":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    def _maybe_compile(self, device: torch.device) -> None:
        """torch.compile the velocity network once. On CUDA: mode="reduce-overhead" (CUDA graphs per bucket) for the
        no-grad calls (plain, training-time) and a second compile without CUDA graphs for the guided sampler's VJP
        (autograd reads a step's output after the next step ran, which a replayed graph would have overwritten:
        graph_safe). On a CPU: inductor's default mode for both (C++ kernels; a host without a C++ compiler is
        refused here, not at the first compile's traceback). A compiled path that fails where the eager network
        does not runs eager from then on (CompiledPath), with a warning and the reason in `compile_fallbacks`:
        the replica keeps serving."""
        if not self.hp["compile"]:
            if self._compiled:  # turned off after it compiled, by an override: eager again
                self._velocity_fn, self._compiled, self._grad_path = self.velocity, False, None
            return
        self._count_shapes()
        if self._compiled:
            return
        if device.type == "cpu":
            check_cpu_compiler()
        self._compiled = True  # tried once: a compile that cannot even be set up is not tried at every call
        try:
            differentiable = CompiledPath(torch.compile(self.velocity, dynamic=False), self.velocity, "the network",
                                          self.compile_fallbacks)
            replayed = None
            if device.type == "cuda":
                replayed = CompiledPath(torch.compile(self.velocity, mode="reduce-overhead", dynamic=False),
                                        self.velocity, "the CUDA-graph network", self.compile_fallbacks)
        except Exception as exc:  # torch.compile itself refused (a platform or Python it does not support)
            CompiledPath.record(self.compile_fallbacks, "the network", exc)
            return
        self._grad_path = differentiable
        self._velocity_fn = graph_safe(replayed, self.velocity, differentiable) if replayed else differentiable

    def _count_shapes(self) -> None:
        """Dynamo's recompile limit, raised to cover this policy's specialisations: one per bucket and per call
        signature (plain, training-time's per-token times, the guided VJP's autograd), counted over every compiled
        policy of the process (the limit is per code object: the models of a process share `velocity`'s, and
        same-sized ones its graphs too, their weights being inputs), and again when an override changes the
        buckets or the autocast after a compile. Past the limit Dynamo would silently run the network eager. Set
        in the calling thread, at every call: torch's config overrides are per thread (a limit raised on the main
        thread left a replica's dispatch thread at 8, and its 9th graph eager: seen on the 2-core VM, torch 2.13)."""
        import torch._dynamo.config as dynamo_config

        key = (tuple(self.buckets()), self.hp["autocast"])
        if key != self._counted:
            self._counted = key
            FlowTransformerPolicy.compiled_shapes += 3 * len(self.buckets()) + 2
        if int(dynamo_config.recompile_limit) < FlowTransformerPolicy.compiled_shapes:
            dynamo_config.recompile_limit = FlowTransformerPolicy.compiled_shapes

    def prepare_serving(self) -> None:
        """`compile` set up where the weights are (the compile itself happens per bucket at the first calls)."""
        self._maybe_compile(self.param_device)

    def buckets(self) -> list[int]:
        """The batch sizes a micro-batch is padded to: `batch_buckets`; under `compile` without any, COMPILE_BUCKETS
        (else every batch size would compile a graph of its own, past Dynamo's limit silently eager)."""
        return list(self.hp["batch_buckets"]) or (list(COMPILE_BUCKETS) if self.hp["compile"] else [])

    def bucket(self, size: int) -> int:
        """The padded batch size for `size` samples: the smallest bucket >= size, else size itself."""
        return next((b for b in self.buckets() if b >= size), size)

    def _noise(self, size: int) -> Tensor:
        noise = initial_noise(size, (self.config.chunk_size, self.config.action_dim), self.hp["noise_seed"])
        return noise.to(device=self.param_device, dtype=self.param_dtype, non_blocking=True)

    def _guidance_targets(self, delays: list[int], prefixes: list[Tensor | None], size: int) -> tuple[Tensor, Tensor] | None:
        """(W (size, T, 1), padded prefix (size, T, A)): W from host ints, one copy; the prefix rows are
        copied where they already are (the runtime puts them on the device): no device-to-host read."""
        if all(p is None for p in prefixes):
            return None
        total, action_dim = self.config.chunk_size, self.config.action_dim
        kw = {"device": self.param_device, "dtype": self.param_dtype}
        weights = torch.zeros(size, total)
        target = torch.zeros(size, total, action_dim, **kw)
        for b, (delay, prefix) in enumerate(zip(delays, prefixes)):
            if prefix is None:
                continue  # W = 0 and target = 0: the correction is exactly zero
            rows = min(prefix.shape[0], total)
            horizon = rows  # the guided horizon is the prefix given: the server cuts or pads it to its execution_horizon
            weights[b] = prefix_weights(delay, horizon, total, self.hp["prefix_schedule"])
            target[b, :rows] = prefix[:rows].detach().to(**kw, non_blocking=True)
        return weights.unsqueeze(-1).to(**kw, non_blocking=True), target

    def sample(self, context: tuple[Tensor, ...], x_t: Tensor, guidance: tuple[Tensor, Tensor] | None) -> Tensor:
        """The Euler loop. Host-side values only (Python floats): nothing here waits for the device."""
        num_steps = int(self.hp["num_steps"])
        dt = -1.0 / num_steps
        times = [1.0 + step * dt for step in range(num_steps)]
        weights = [guidance_weight(t, float(self.hp["max_guidance_weight"])) for t in times]
        size = x_t.shape[0]
        velocity = self._velocity_fn
        for t, w in zip(times, weights):
            t_batch = torch.full((size,), t, device=x_t.device, dtype=x_t.dtype)
            if guidance is None:
                v_t = velocity(x_t, t_batch, context)
            else:
                v_t = self._guided_velocity(velocity, x_t, t, t_batch, context, w, *guidance)
            x_t = x_t + dt * v_t
        return x_t

    def _guided_velocity(self, velocity, x_t: Tensor, t: float, t_batch: Tensor, context: tuple[Tensor, ...], w: float,
                         weights: Tensor, target: Tensor) -> Tensor:
        if self.hp["guidance_jacobian"] == "identity":
            v_t = velocity(x_t, t_batch, context)
            return v_t - w * (target - (x_t - t * v_t)) * weights
        args = (x_t, t, t_batch, context, w, weights, target)
        try:  # a compiled backward is built at its first autograd.grad, outside the forward call CompiledPath guards
            return self._vjp_step(velocity, *args)
        except Exception as exc:
            path = self._grad_path
            if path is None or path.failed:
                raise
            out = self._vjp_step(self.velocity, *args)  # the eager step; if it fails too, its own error stands
            path.fall_back(exc)
            return out

    def _vjp_step(self, velocity, x_t: Tensor, t: float, t_batch: Tensor, context: tuple[Tensor, ...], w: float,
                  weights: Tensor, target: Tensor) -> Tensor:
        with torch.enable_grad():
            x = x_t.detach().requires_grad_(True)
            v_t = velocity(x, t_batch, context)
            x1_hat = x - t * v_t
            err = (target - x1_hat) * weights
            # VJP of x1_hat wrt x_t with err: (I - t J_v)^T err, the RTC paper's correction
            (correction,) = torch.autograd.grad(x1_hat, x, grad_outputs=err.detach())
        return v_t.detach() - w * correction

    @property
    def rtc_mode(self) -> str:
        return self.hp["rtc_mode"]

    def check_rtc_mode(self) -> None:
        """Refuse `rtc_mode: training_time` (set after loading) on a network not trained for it."""
        check_rtc_mode("flow_transformer", self.hp, self.prefix_conditioned)

    def predict_action_chunk(
        self,
        batch: dict[str, Tensor],
        inference_delay: Sequence[int],
        prefix: Sequence[Tensor | None],
    ) -> Tensor:
        size, delays, prefixes = self.check_chunk_args(batch, inference_delay, prefix)
        self.check_rtc_mode()
        device = self.param_device
        self._maybe_compile(device)
        padded = self.bucket(size)
        # the guidance VJP needs autograd, so an inference_mode caller is stepped out of (the inputs
        # are cloned into normal tensors by model_inputs)
        with torch.inference_mode(False), torch.no_grad():
            inputs = {k: _pad_rows(v, padded) for k, v in self.model_inputs(batch).items()}
            if self.hp["rtc_mode"] == "training_time":  # pad rows commit nothing
                pad = padded - size
                committed = prefix_mask(delays + [0] * pad, prefixes + [None] * pad, self.config.chunk_size,
                                        self.config.action_dim, device, self.param_dtype)
                with self._autocast(device):
                    context = self.context(self.encode(inputs))
                    x_t = sample_committed(self._velocity_fn, context, self._noise(padded), *committed,
                                           int(self.hp["num_steps"]))
                return x_t[:size].float()
            guidance = self._guidance_targets(delays, prefixes, padded)
            with self._autocast(device):
                x_t = self.sample(self.context(self.encode(inputs)), self._noise(padded), guidance)
            return x_t[:size].float()

    def training_loss(
        self, batch: dict[str, Tensor], action_chunk: Tensor, generator: torch.Generator | None = None,
        prefix_rows: Tensor | None = None,
    ) -> Tensor:
        """Flow matching: t ~ U(0, 1), x_t = t * noise + (1 - t) * x1, regress v onto noise - x1. With
        rtc_mode training_time the first `prefix_rows[b]` rows of sample b are clean conditioning (token flow
        time 0) and out of the loss; None draws them from U{0..max_prefix_rows}."""
        return rtc_flow_matching_loss(self.velocity, self.context(self.encode(batch)), action_chunk, generator,
                                      prefix_rows, self.prefix_conditioned, int(self.hp["max_prefix_rows"]),
                                      "flow_transformer")


def _pad_rows(tensor: Tensor, size: int) -> Tensor:
    """`tensor` with rows appended (copies of row 0) up to `size`; pad rows are computed and dropped."""
    missing = size - tensor.shape[0]
    if missing <= 0:
        return tensor
    return torch.cat([tensor, tensor[:1].expand(missing, *tensor.shape[1:])], dim=0)


def _check_hyper_params(config: PolicyConfig, hp: dict[str, Any]) -> None:
    for name in ("d_model", "num_heads", "num_layers", "mlp_ratio", "num_steps", "image_grid", "patch_size"):
        value = hp[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PolicyConfigError(f"flow_transformer {name}={value!r} must be a positive int")
    if isinstance(hp["obs_layers"], bool) or not isinstance(hp["obs_layers"], int) or hp["obs_layers"] < 0:
        raise PolicyConfigError(f"flow_transformer obs_layers={hp['obs_layers']!r} must be an int >= 0")
    if hp["d_model"] % hp["num_heads"] or hp["d_model"] % 2:
        raise PolicyConfigError(
            f"flow_transformer d_model={hp['d_model']} must be even and a multiple of num_heads={hp['num_heads']}"
        )
    for name, allowed in (("image_encoder", IMAGE_ENCODERS), ("autocast", AUTOCASTS),
                          ("guidance_jacobian", GUIDANCE_JACOBIANS), ("prefix_schedule", PREFIX_SCHEDULES)):
        if hp[name] not in allowed:
            raise PolicyConfigError(f"flow_transformer {name}={hp[name]!r}; use one of {allowed}")
    if any(b < 1 for b in hp["batch_buckets"]):
        raise PolicyConfigError(f"flow_transformer batch_buckets {hp['batch_buckets']} must be positive ints")
    if hp["image_encoder"] == "vit":
        patch = hp["patch_size"]
        for name, (_, height, width) in config.image_features.items():
            if height % patch or width % patch:
                raise PolicyConfigError(
                    f"flow_transformer vit: camera {name!r} is {height}x{width}, not a multiple of "
                    f"patch_size={patch}; declare another image size or patch size"
                )


class CompiledPath:
    """A compiled velocity network that falls back to the eager one: a call that fails compiled is run eager with
    the same inputs; if that succeeds the compile was at fault, so this path runs eager from then on, logged once
    with the reason (kept in `fallbacks`, the policy's `compile_fallbacks`); if eager fails too, the inputs were,
    and its error is raised with the compiled path kept. (Not only Dynamo's own errors: a first-run Triton or
    CUDA-graph error is the compile's too.)"""

    def __init__(self, compiled: Callable[..., Tensor], eager: Callable[..., Tensor], what: str, fallbacks: list[str]):
        self.compiled, self.eager, self.what, self.fallbacks = compiled, eager, what, fallbacks
        self.failed = False

    def __call__(self, *args: Tensor) -> Tensor:
        if self.failed:
            return self.eager(*args)
        try:
            return self.compiled(*args)
        except Exception as exc:
            out = self.eager(*args)
            self.fall_back(exc)
            return out

    def fall_back(self, exc: BaseException) -> None:
        """From now on eager: `exc` failed the compiled path where the eager network did not."""
        if not self.failed:
            self.failed = True
            self.record(self.fallbacks, self.what, exc)

    @staticmethod
    def record(fallbacks: list[str], what: str, exc: BaseException) -> None:
        reason = f"compiling {what} failed, it runs eager: {type(exc).__name__}: {str(exc)[:300]}"
        fallbacks.append(reason)
        log.warning("flow_transformer: %s", reason)


def graph_safe(compiled: Callable[..., Tensor], eager: Callable[..., Tensor],
               differentiable: Callable[..., Tensor] | None = None) -> Callable[..., Tensor]:
    """The velocity network as the sampler may call it when `compiled` replays CUDA graphs (reduce-overhead): a
    graph replays into the same output buffers, so a no-grad call marks a new step and takes a copy of its
    output before the next replay overwrites it; the guided sampler's VJP (autograd on) would read a graph's
    output after the next step's replay, so it runs `differentiable` (a compile without CUDA graphs), else
    `eager`. (On the H200 with the VJP on the replayed graph, the guided pass failed: "accessing tensor output
    of CUDAGraphs that has been overwritten by a subsequent run".)"""
    grad_fn = differentiable or eager

    def velocity(*args: Tensor) -> Tensor:
        if torch.is_grad_enabled():
            return grad_fn(*args)
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args).clone()

    return velocity


def check_cpu_compiler() -> None:
    """`compile` on a CPU: inductor writes C++ and builds it with the host's compiler ($CXX, else g++ on Linux);
    without one the first call would fail deep inside torch. PolicyConfigError says what to do."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as e:  # torch raises RuntimeError (none found) or an import error (a build without inductor)
        raise PolicyConfigError(
            f"flow_transformer compile on a CPU needs a C++ compiler for torch.compile's inductor ({e}); install g++ "
            "(apt install g++) or set model.hyper_params.compile: false"
        ) from None


def preset_hyper_params(name: str, **overrides: Any) -> dict[str, Any]:
    """A preset's hyper_params (with overrides): `PolicyConfig(type="flow_transformer", hyper_params=...)`."""
    if name not in PRESETS:
        raise PolicyConfigError(f"flow_transformer preset {name!r} unknown; presets: {sorted(PRESETS)}")
    return {**PRESETS[name], **overrides}


def count_parameters(config: PolicyConfig) -> int:
    """Parameters of the policy `config` describes, built on the meta device (no memory, any size)."""
    from server.policies.base import make_policy

    with torch.device("meta"):
        policy = make_policy(config)
    return sum(p.numel() for p in policy.parameters())


__all__ = ["FlowTransformerPolicy", "PRESETS", "preset_hyper_params", "count_parameters"]
