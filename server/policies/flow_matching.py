"""`flow_matching`: a small MLP flow-matching chunk policy with real-time chunking (RTC), two ways.

    noise x(t=1) --Euler, num_steps--> x(t=0) = action chunk      (model space, (B, T, A))
                   v(x_t, t, obs) - w(t) * VJP(x1_hat, x_t; (prefix - x1_hat) * W[b])

Owns the sampler and the guidance, which mirror LeRobot's RTCProcessor (flow time runs from 1 at
noise to 0 at data; the target velocity is noise - data):
- prefix weights W over H = len(prefix[b]) (the server cuts or pads every prefix to its execution_horizon: the
  manifest's, else the checkpoint's, so a replica can guide more rows than the checkpoint was saved with): ones for the first
  min(d[b], H) steps, then a ramp up to H, zeros after. `prefix_schedule: linear` (default) is LeRobot's
  `linspace(1, 0, n + 2)[1:-1]` (1 and 0 excluded); `exp` is the RTC paper's soft mask (arXiv
  2506.07339 eq. 5, with its H - s as our H): c_i * (e^c_i - 1) / (e - 1), c_i = (H - i) / (H - d + 1). A prefix shorter than the chunk is zero-padded; the padding never matters
  because W is zero beyond H <= len(prefix).
- per Euler step: x1_hat = x_t - t * v_t; err = (prefix - x1_hat) * W; correction = VJP of x1_hat
  wrt x_t with err; w = min(max_guidance_weight, c * r^-2) with tau = 1 - t, c = (1 - tau) / tau,
  r^-2 = ((1 - tau)^2 + tau^2) / (1 - tau)^2; the step uses v_t - w * correction.
- Euler steps at t = 1, 1 - 1/n, ..., 1/n with dt = -1/n (n = num_steps), as LeRobot's pi0/smolvla.
- `guidance_jacobian`: "network" (default) backpropagates the VJP through the velocity network, as
  the RTC paper and the formula above say (written out for the MLP, not through autograd: see
  `_velocity_and_vjp`). "identity" is what LeRobot main actually computes: its
  RTCProcessor calls the denoiser before x_t requires grad, so d x1_hat / d x_t = I and
  correction == err (cheaper: no backward pass; pick it for numerical parity with LeRobot).

`rtc_mode` (recorded in config.json) says how a prefix is used:
- "guidance" (default): inference-time RTC, as above (Black, Galliker, Levine 2025, arXiv 2506.07339).
- "training_time": training-time RTC (Black, Ren, Equi, Levine 2025, arXiv 2512.05964). The network also
  takes each row's own flow time; it is trained with the first n rows of the label clean (flow time 0,
  n per sample: the demonstrations' `prefix_rows`, else n ~ U{0..max_prefix_rows}) and the loss on the
  other rows only. At inference the first min(d, len(prefix)) rows are the committed actions, clean, at
  every Euler step (so the output's prefix rows are exactly the given actions) and the model fills the
  rest: no guidance pass, no VJP. The mode changes the network's input, so it is fixed at training: a
  checkpoint trained as "guidance" refuses "training_time" (`RTCModeError`); one trained as
  "training_time" can still be sampled with guidance (every row at the global flow time). The pieces that
  are not the MLP's (`check_rtc_hyper_params`, `check_rtc_mode`, `prefix_mask`, `sample_committed`,
  `rtc_flow_matching_loss`, `prefix_flow_matching_loss`) serve flow_transformer's per-token flow time too.

The network: v = MLP([x_t, obs_embedding, time_embedding(, per-row flow times)]) + a(t) * x_t, where
a(t) is a tiny MLP of the time embedding. The skip matters: for a chunk determined by the observation the
exact velocity is (x_t - x1) / t, and a hidden layer narrower than T*A cannot carry x_t through (without it the
training loss plateaus several times higher).

Invariants: with `noise_seed` set (default 0) every sample of every call starts from the same noise,
so the output is a pure function of (observation, delay, prefix): byte-identical on repeat, and
sample b of a batch equals the same sample run alone (up to matmul rounding). A sample whose prefix
is None gets exactly the unguided velocity. Works under torch.no_grad() and torch.inference_mode()
callers (the VJP needs no autograd).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from server.policies.base import (
    ChunkPolicy,
    PolicyConfig,
    PolicyConfigError,
    register_policy,
)
from server.policies.layers import ObservationEncoder, mlp, time_embedding

DEFAULTS = {
    "hidden_dim": 256,
    "num_layers": 3,
    "obs_embed_dim": 128,
    "time_embed_dim": 32,
    "num_steps": 10,
    "noise_seed": 0,  # None: draw fresh noise from torch's global RNG on every call
    "max_guidance_weight": 10.0,
    "guidance_jacobian": "network",  # or "identity" (LeRobot main's effective behaviour)
    "prefix_schedule": "linear",  # LeRobot's ramp; "exp": the RTC paper's soft mask (eq. 5)
    "rtc_mode": "guidance",  # or "training_time": the prefix as clean conditioning rows (arXiv 2512.05964)
    "max_prefix_rows": 15,  # training_time: n ~ U{0..min(this, chunk_size - 1)} when the data gives none
}
GUIDANCE_JACOBIANS = ("network", "identity")
PREFIX_SCHEDULES = ("linear", "exp")
RTC_MODES = ("guidance", "training_time")


class RTCModeError(PolicyConfigError):
    """`rtc_mode: training_time` asked of a checkpoint whose network was not trained for it."""


def untrained_for_training_time(where: str = "this checkpoint", policy_type: str = "flow_matching") -> RTCModeError:
    policy_flag = "" if policy_type == "flow_matching" else f" --policy-type {policy_type}"
    return RTCModeError(
        f"{where} was not trained for rtc_mode 'training_time' (its config.json records rtc_mode 'guidance'): "
        f"its network has no per-row flow-time input. Serve it with inference-time RTC (rtc_mode 'guidance'), "
        f"or train one for it: `bench train --robot ROBOT_TYPE{policy_flag} --rtc-mode training_time` with the "
        f"checkpoint's robot type (reacher and arm have recipes; hyper_params rtc_mode: training_time)"
    )


def check_rtc_hyper_params(policy_type: str, hp) -> None:
    """`rtc_mode` and `max_prefix_rows`, the hyper-parameters of every policy with training-time RTC."""
    if hp["rtc_mode"] not in RTC_MODES:
        raise PolicyConfigError(f"{policy_type} rtc_mode={hp['rtc_mode']!r}; use one of {RTC_MODES}")
    if int(hp["max_prefix_rows"]) < 0:
        raise PolicyConfigError(f"{policy_type} max_prefix_rows={hp['max_prefix_rows']!r}; needs >= 0")


def check_rtc_mode(policy_type: str, hp, prefix_conditioned: bool) -> None:
    """Refuse `rtc_mode: training_time` (set after loading) on a network not built and trained for it."""
    check_rtc_hyper_params(policy_type, hp)
    if hp["rtc_mode"] == "training_time" and not prefix_conditioned:
        raise untrained_for_training_time(policy_type=policy_type)


def prefix_weights(inference_delay: int, horizon: int, total: int, schedule: str = "linear") -> Tensor:
    """(total,) RTC prefix weights: ones for the first min(d, horizon) rows, the schedule's ramp (strictly
    between 1 and 0) up to `horizon`, zeros after (see module docstring)."""
    start = min(max(inference_delay, 0), horizon)
    weights = torch.zeros(total)
    weights[: min(start, total)] = 1.0
    ramp = min(horizon, total) - start
    if ramp <= 0:
        return weights
    if schedule == "linear":
        weights[start : start + ramp] = torch.linspace(1.0, 0.0, ramp + 2)[1:-1]
    elif schedule == "exp":  # the paper's c_i (e^c_i - 1) / (e - 1), c_i = (H - i) / (H - d + 1)
        end = start + ramp
        c = (end - torch.arange(start, end, dtype=torch.float64)) / (end - start + 1)
        weights[start : start + ramp] = (c * torch.expm1(c) / (torch.e - 1.0)).float()
    else:
        raise ValueError(f"prefix schedule {schedule!r}; use one of {PREFIX_SCHEDULES}")
    return weights


def guidance_weight(t: float, max_guidance_weight: float) -> float:
    """min(max_w, c * r^-2) at flow time t (tau = 1 - t); inf -> max_w and nan -> 0 as LeRobot."""
    tau = 1.0 - t
    if tau <= 0.0:  # c = inf
        return max_guidance_weight
    if tau >= 1.0:  # c * r^-2 = 0 * inf = nan -> 0
        return 0.0
    c = (1.0 - tau) / tau
    inv_r2 = ((1.0 - tau) ** 2 + tau**2) / (1.0 - tau) ** 2
    return min(max_guidance_weight, c * inv_r2)


@register_policy("flow_matching")
class FlowMatchingPolicy(ChunkPolicy):
    supports_rtc = True
    chunk_stateless = True

    hyper_param_defaults = DEFAULTS

    @classmethod
    def check_hyper_params(cls, config: PolicyConfig, hp) -> None:
        if hp["guidance_jacobian"] not in GUIDANCE_JACOBIANS:
            raise PolicyConfigError(
                f"flow_matching guidance_jacobian={hp['guidance_jacobian']!r}; use one of {GUIDANCE_JACOBIANS}"
            )
        if hp["prefix_schedule"] not in PREFIX_SCHEDULES:
            raise PolicyConfigError(
                f"flow_matching prefix_schedule={hp['prefix_schedule']!r}; use one of {PREFIX_SCHEDULES}"
            )
        if int(hp["num_steps"]) < 1 or int(hp["time_embed_dim"]) % 2:
            raise PolicyConfigError("flow_matching needs num_steps >= 1 and an even time_embed_dim")
        check_rtc_hyper_params("flow_matching", hp)

    def __init__(self, config: PolicyConfig):
        super().__init__(config)
        hp = self.hp
        flat = config.chunk_size * config.action_dim
        # training_time RTC: the network reads each row's flow time (0 = a clean, committed row); fixed at build
        self.prefix_conditioned = hp["rtc_mode"] == "training_time"
        row_times = config.chunk_size if self.prefix_conditioned else 0
        self.encoder = ObservationEncoder(config, hp["obs_embed_dim"], hp["hidden_dim"])
        self.velocity_net = mlp(
            flat + hp["obs_embed_dim"] + hp["time_embed_dim"] + row_times, hp["hidden_dim"], flat, hp["num_layers"]
        )
        # a(t) in v = a(t) * x_t + MLP(x_t, t, obs): the exact velocity of a chunk determined by the
        # observation is (x_t - x1) / t, and a hidden layer narrower than T*A cannot pass x_t through.
        self.skip_gain = mlp(hp["time_embed_dim"], 64, 1, num_layers=2)
        # _velocity_and_vjp walks these; it assumes mlp()'s shape: Linear, then (SiLU, Linear) pairs
        self._linears = [m for m in self.velocity_net if isinstance(m, torch.nn.Linear)]
        assert len(self.velocity_net) == 2 * len(self._linears) - 1

    def velocity(self, x_t: Tensor, t: Tensor, cond: Tensor, row_t: Tensor | None = None) -> Tensor:
        """v(x_t, t, obs): (B, T, A), (B,), (B, E) -> (B, T, A). `row_t` (B, T): each row's flow time, read by
        a prefix-conditioned network only (None: every row at t)."""
        size = x_t.shape[0]
        t_emb = time_embedding(t, self.hp["time_embed_dim"])
        flat = x_t.reshape(size, -1)
        v = self.velocity_net(self._net_input(flat, cond, t_emb, t, row_t)) + self.skip_gain(t_emb) * flat
        return v.reshape(x_t.shape)

    def _net_input(self, flat: Tensor, cond: Tensor, t_emb: Tensor, t: Tensor, row_t: Tensor | None) -> Tensor:
        parts = [flat, cond, t_emb]
        if self.prefix_conditioned:  # the x_t columns stay first: _velocity_and_vjp slices them
            parts.append(t[:, None].expand(-1, self.config.chunk_size) if row_t is None else row_t)
        return torch.cat(parts, dim=-1)

    @property
    def rtc_mode(self) -> str:
        return self.hp["rtc_mode"]

    def check_rtc_mode(self) -> None:
        """Refuse `rtc_mode: training_time` (set after loading) on a network not trained for it."""
        check_rtc_mode("flow_matching", self.hp, self.prefix_conditioned)

    def _noise(self, size: int) -> Tensor:
        noise = initial_noise(size, (self.config.chunk_size, self.config.action_dim), self.hp["noise_seed"])
        return noise.to(device=self.param_device, dtype=self.param_dtype)

    def _guidance_targets(self, delays: list[int], prefixes: list[Tensor | None]) -> tuple[Tensor, Tensor] | None:
        """(W (B, T, 1), padded prefix (B, T, A)) or None when no sample has a prefix."""
        if all(p is None for p in prefixes):
            return None
        total, action_dim = self.config.chunk_size, self.config.action_dim
        weights = torch.zeros(len(prefixes), total)
        target = torch.zeros(len(prefixes), total, action_dim)
        for b, (delay, prefix) in enumerate(zip(delays, prefixes)):
            if prefix is None:
                continue  # W = 0 and target = 0: err is exactly zero, so is the correction
            rows = min(prefix.shape[0], total)
            horizon = (
                rows  # the guided horizon is the prefix given: the server cuts or pads it to its execution_horizon
            )
            weights[b] = prefix_weights(delay, horizon, total, self.hp["prefix_schedule"])
            target[b, :rows] = prefix[:rows].detach().to(device="cpu", dtype=torch.float32)
        kw = {"device": self.param_device, "dtype": self.param_dtype}
        return weights.unsqueeze(-1).to(**kw), target.to(**kw)

    def _guided_velocity(self, x_t: Tensor, t: float, cond: Tensor, weights: Tensor, target: Tensor) -> Tensor:
        t_batch = torch.full((x_t.shape[0],), t, device=x_t.device, dtype=x_t.dtype)
        if self.hp["guidance_jacobian"] == "identity":
            v_t = self.velocity(x_t, t_batch, cond)
            correction = (target - (x_t - t * v_t)) * weights
        else:
            v_t, correction = self._velocity_and_vjp(x_t, t_batch, cond, weights, target, t)
        return v_t - guidance_weight(t, float(self.hp["max_guidance_weight"])) * correction

    @torch.no_grad()
    def _velocity_and_vjp(
        self, x_t: Tensor, t_batch: Tensor, cond: Tensor, weights: Tensor, target: Tensor, t: float
    ) -> tuple[Tensor, Tensor]:
        """v(x_t) and the VJP of x1_hat = x_t - t * v(x_t) wrt x_t with err = (target - x1_hat) * W.

        The network is an MLP (Linear, SiLU, ..., Linear) plus a(t) * x_t, so the VJP is written out:
        J_v^T g = (back through the MLP)[:, :T*A] + a(t) * g, with SiLU'(h) = s(h) * (1 + h * (1 - s(h))).
        Equal to torch.autograd.grad through `velocity` up to float rounding (tested), at ~3/4 of its
        CPU time: autograd's graph and engine cost more than the matmuls of a network this small.
        """
        size = x_t.shape[0]
        t_emb = time_embedding(t_batch, self.hp["time_embed_dim"])
        flat = x_t.reshape(size, -1)
        linears = self._linears
        h = self._net_input(flat, cond, t_emb, t_batch, None)
        pre: list[Tensor] = []
        for k, layer in enumerate(linears):
            h = torch.nn.functional.linear(h, layer.weight, layer.bias)
            if k < len(linears) - 1:
                pre.append(h)
                h = torch.nn.functional.silu(h)
        gain = self.skip_gain(t_emb)
        v = h + gain * flat
        err = (target.reshape(size, -1) - (flat - t * v)) * weights.expand_as(target).reshape(size, -1)
        g = err
        for k in range(len(linears) - 1, 0, -1):
            g = g @ linears[k].weight
            s = torch.sigmoid(pre[k - 1])
            g = g * (s * (1.0 + pre[k - 1] * (1.0 - s)))
        jtv = g @ linears[0].weight[:, : flat.shape[1]] + gain * err
        return v.reshape(x_t.shape), (err - t * jtv).reshape(x_t.shape)

    def predict_action_chunk(
        self,
        batch: dict[str, Tensor],
        inference_delay: Sequence[int],
        prefix: Sequence[Tensor | None],
    ) -> Tensor:
        size, delays, prefixes = self.check_chunk_args(batch, inference_delay, prefix)
        self.check_rtc_mode()
        if self.hp["rtc_mode"] == "training_time":
            return self._predict_conditioned(batch, size, delays, prefixes)
        with torch.no_grad():  # no autograd anywhere, the VJP included (_velocity_and_vjp)
            inputs = self.model_inputs(batch)
            guidance = self._guidance_targets(delays, prefixes)
            cond = self.encoder(inputs)
            x_t = self._noise(size)
            num_steps = int(self.hp["num_steps"])
            dt = -1.0 / num_steps
            for step in range(num_steps):
                t = 1.0 + step * dt
                if guidance is None:
                    t_batch = torch.full((size,), t, device=x_t.device, dtype=x_t.dtype)
                    v_t = self.velocity(x_t, t_batch, cond)
                else:
                    v_t = self._guided_velocity(x_t, t, cond, *guidance)
                x_t = x_t + dt * v_t
            return x_t.float()

    def prefix_mask(self, delays: list[int], prefixes: list[Tensor | None]) -> tuple[Tensor, Tensor]:
        """training_time RTC: `prefix_mask` (the module function) on this policy's chunk and device."""
        return prefix_mask(
            delays, prefixes, self.config.chunk_size, self.config.action_dim, self.param_device, self.param_dtype
        )

    def _predict_conditioned(
        self, batch: dict[str, Tensor], size: int, delays: list[int], prefixes: list[Tensor | None]
    ) -> Tensor:
        """training_time RTC: the committed rows held clean (flow time 0) at every Euler step."""
        with torch.no_grad():
            cond = self.encoder(self.model_inputs(batch))
            mask, target = self.prefix_mask(delays, prefixes)
            x_t = sample_committed(self.velocity, cond, self._noise(size), mask, target, int(self.hp["num_steps"]))
            return x_t.float()

    def training_loss(
        self,
        batch: dict[str, Tensor],
        action_chunk: Tensor,
        generator: torch.Generator | None = None,
        prefix_rows: Tensor | None = None,
    ) -> Tensor:
        """Flow matching: t ~ U(0, 1), x_t = t * noise + (1 - t) * x1, regress v onto noise - x1. With
        rtc_mode training_time the first `prefix_rows[b]` rows of sample b are clean conditioning (row flow
        time 0) and out of the loss; None draws them from U{0..max_prefix_rows}."""
        return rtc_flow_matching_loss(
            self.velocity,
            self.encoder(batch),
            action_chunk,
            generator,
            prefix_rows,
            self.prefix_conditioned,
            int(self.hp["max_prefix_rows"]),
            "flow_matching",
        )


def flow_matching_loss(velocity, cond, x1: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """The flow-matching objective of every flow policy here: t ~ U(0, 1), x_t = t * noise + (1 - t) * x1,
    regress `velocity(x_t, t, cond)` onto noise - x1."""
    noise = torch.randn(x1.shape, generator=generator, device=x1.device, dtype=x1.dtype)
    t = torch.rand((x1.shape[0],), generator=generator, device=x1.device, dtype=x1.dtype)
    x_t = t[:, None, None] * noise + (1.0 - t[:, None, None]) * x1
    return torch.nn.functional.mse_loss(velocity(x_t, t, cond), noise - x1)


def prefix_flow_matching_loss(
    velocity, cond, x1: Tensor, prefix_rows: Tensor, generator: torch.Generator | None = None
) -> Tensor:
    """Training-time RTC's objective (arXiv 2512.05964): per-row flow time, 0 (clean: x_t = x1) on the first
    `prefix_rows[b]` rows of sample b, t ~ U(0, 1) on the rest; the squared error averaged over the rest only,
    so the committed rows are conditioning, never targets. `velocity(x_t, t, cond, row_t)`."""
    noise = torch.randn(x1.shape, generator=generator, device=x1.device, dtype=x1.dtype)
    t = torch.rand((x1.shape[0],), generator=generator, device=x1.device, dtype=x1.dtype)
    rows = torch.arange(x1.shape[1], device=x1.device)
    committed = rows[None, :] < prefix_rows[:, None]  # (B, T)
    row_t = torch.where(committed, torch.zeros((), dtype=x1.dtype, device=x1.device), t[:, None])
    x_t = row_t[..., None] * noise + (1.0 - row_t[..., None]) * x1
    free = (~committed).to(x1.dtype)[..., None]  # (B, T, 1)
    error = (velocity(x_t, t, cond, row_t) - (noise - x1)) ** 2 * free
    return error.sum() / (free.sum() * x1.shape[2]).clamp_min(1.0)


def rtc_flow_matching_loss(
    velocity,
    cond,
    x1: Tensor,
    generator: torch.Generator | None,
    prefix_rows: Tensor | None,
    prefix_conditioned: bool,
    max_prefix_rows: int,
    policy_type: str,
) -> Tensor:
    """A flow policy's training loss in either rtc_mode: the plain objective for a network without per-row flow
    time (which refuses `prefix_rows`), else `prefix_flow_matching_loss` with `prefix_rows` (B,), or n ~
    U{0..min(max_prefix_rows, T - 1)} per sample when None."""
    if not prefix_conditioned:
        if prefix_rows is not None:
            raise untrained_for_training_time("a policy built with rtc_mode 'guidance'", policy_type)
        return flow_matching_loss(velocity, cond, x1, generator)
    if prefix_rows is None:
        top = min(max_prefix_rows, x1.shape[1] - 1)
        prefix_rows = torch.randint(0, top + 1, (x1.shape[0],), generator=generator)
    return prefix_flow_matching_loss(velocity, cond, x1, prefix_rows.to(x1.device), generator)


def prefix_mask(
    delays: list[int],
    prefixes: list[Tensor | None],
    total: int,
    action_dim: int,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """training_time RTC: (mask (B, T, 1), padded prefix (B, T, A)) on `device`; row i of sample b is committed
    (mask 1) when i < min(d[b], len(prefix[b])). The rest of a longer prefix (RTC's guided horizon) is not
    used: those rows are still the model's to choose. The mask is built on the host from ints and copied once;
    the prefix rows are copied where they are (the runtime puts them on the device): no device-to-host read."""
    mask = torch.zeros(len(prefixes), total, 1)
    target = torch.zeros(len(prefixes), total, action_dim, device=device, dtype=dtype)
    for b, (delay, prefix) in enumerate(zip(delays, prefixes)):
        rows = 0 if prefix is None else min(delay, prefix.shape[0], total)
        mask[b, :rows] = 1.0
        if rows:
            target[b, :rows] = prefix[:rows].detach().to(device=device, dtype=dtype, non_blocking=True)
    return mask.to(device=device, dtype=dtype, non_blocking=True), target


def sample_committed(velocity, cond, noise: Tensor, mask: Tensor, target: Tensor, num_steps: int) -> Tensor:
    """training_time RTC's Euler loop (the guided loop's times): the committed rows (mask 1) are `target`, clean
    (row flow time 0), at every step; the others start at `noise` and move at the sample's flow time.
    `velocity(x_t, t, cond, row_t)`. Host-side times only: nothing here reads a device value back."""
    size = noise.shape[0]
    committed = mask.squeeze(-1) > 0
    x_t = torch.where(mask > 0, target, noise)
    dt = -1.0 / num_steps
    for step in range(num_steps):
        t = 1.0 + step * dt
        t_batch = torch.full((size,), t, device=x_t.device, dtype=x_t.dtype)
        row_t = torch.where(committed, torch.zeros_like(committed, dtype=x_t.dtype), t)
        x_t = x_t + dt * velocity(x_t, t_batch, cond, row_t)
        x_t = torch.where(mask > 0, target, x_t)
    return x_t


def initial_noise(size: int, shape: tuple[int, int], seed: int | None) -> Tensor:
    """The sampler's starting noise for `size` samples, on the CPU: with a seed every sample of every call
    starts from the same draw (a sample's actions do not depend on its batch), else fresh global-RNG noise."""
    if seed is None:
        return torch.randn((size, *shape))
    generator = torch.Generator().manual_seed(int(seed))
    return torch.randn(shape, generator=generator).expand(size, *shape).clone()
