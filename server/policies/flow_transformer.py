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

This module owns the policy (`FlowTransformerPolicy`: the network's wiring, its sampler, guidance and
compile); its blocks are server.policies.transformer_blocks, its hyper_params and presets
server.policies.flow_transformer_config, its compiled paths server.policies.flow_transformer_compile.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from server.policies.base import (
    STATE_KEY,
    ChunkPolicy,
    PolicyConfig,
    image_key,
    register_policy,
)
from server.policies.flow_matching import (
    check_rtc_hyper_params,
    check_rtc_mode,
    guidance_weight,
    initial_noise,
    prefix_mask,
    prefix_weights,
    rtc_flow_matching_loss,
    sample_committed,
)
from server.policies.flow_transformer_compile import CompiledPath, _pad_rows, check_cpu_compiler, graph_safe
from server.policies.flow_transformer_config import (
    AUTOCASTS,
    COMPILE_BUCKETS,
    DEFAULTS,
    GUIDANCE_JACOBIANS,
    IMAGE_ENCODERS,
    PRESETS,
    _check_hyper_params,
    preset_hyper_params,
)
from server.policies.layers import mlp, time_embedding
from server.policies.transformer_blocks import Block, ConvTokens, PatchTokens

log = logging.getLogger(__name__)


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
            h = block(h, memory_kv[2 * i : 2 * i + 2], cond)
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
            differentiable = CompiledPath(
                torch.compile(self.velocity, dynamic=False), self.velocity, "the network", self.compile_fallbacks
            )
            replayed = None
            if device.type == "cuda":
                replayed = CompiledPath(
                    torch.compile(self.velocity, mode="reduce-overhead", dynamic=False),
                    self.velocity,
                    "the CUDA-graph network",
                    self.compile_fallbacks,
                )
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

    def _guidance_targets(
        self, delays: list[int], prefixes: list[Tensor | None], size: int
    ) -> tuple[Tensor, Tensor] | None:
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
            horizon = (
                rows  # the guided horizon is the prefix given: the server cuts or pads it to its execution_horizon
            )
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

    def _guided_velocity(
        self,
        velocity,
        x_t: Tensor,
        t: float,
        t_batch: Tensor,
        context: tuple[Tensor, ...],
        w: float,
        weights: Tensor,
        target: Tensor,
    ) -> Tensor:
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

    def _vjp_step(
        self,
        velocity,
        x_t: Tensor,
        t: float,
        t_batch: Tensor,
        context: tuple[Tensor, ...],
        w: float,
        weights: Tensor,
        target: Tensor,
    ) -> Tensor:
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
                committed = prefix_mask(
                    delays + [0] * pad,
                    prefixes + [None] * pad,
                    self.config.chunk_size,
                    self.config.action_dim,
                    device,
                    self.param_dtype,
                )
                with self._autocast(device):
                    context = self.context(self.encode(inputs))
                    x_t = sample_committed(
                        self._velocity_fn, context, self._noise(padded), *committed, int(self.hp["num_steps"])
                    )
                return x_t[:size].float()
            guidance = self._guidance_targets(delays, prefixes, padded)
            with self._autocast(device):
                x_t = self.sample(self.context(self.encode(inputs)), self._noise(padded), guidance)
            return x_t[:size].float()

    def training_loss(
        self,
        batch: dict[str, Tensor],
        action_chunk: Tensor,
        generator: torch.Generator | None = None,
        prefix_rows: Tensor | None = None,
    ) -> Tensor:
        """Flow matching: t ~ U(0, 1), x_t = t * noise + (1 - t) * x1, regress v onto noise - x1. With
        rtc_mode training_time the first `prefix_rows[b]` rows of sample b are clean conditioning (token flow
        time 0) and out of the loss; None draws them from U{0..max_prefix_rows}."""
        return rtc_flow_matching_loss(
            self.velocity,
            self.context(self.encode(batch)),
            action_chunk,
            generator,
            prefix_rows,
            self.prefix_conditioned,
            int(self.hp["max_prefix_rows"]),
            "flow_transformer",
        )


def count_parameters(config: PolicyConfig) -> int:
    """Parameters of the policy `config` describes, built on the meta device (no memory, any size)."""
    from server.policies.base import make_policy

    with torch.device("meta"):
        policy = make_policy(config)
    return sum(p.numel() for p in policy.parameters())


__all__ = [
    "AUTOCASTS",
    "COMPILE_BUCKETS",
    "DEFAULTS",
    "GUIDANCE_JACOBIANS",
    "IMAGE_ENCODERS",
    "PRESETS",
    "Block",
    "CompiledPath",
    "ConvTokens",
    "FlowTransformerPolicy",
    "PatchTokens",
    "check_cpu_compiler",
    "count_parameters",
    "graph_safe",
    "preset_hyper_params",
]
