"""RTC guidance against the paper's Algorithm 1 (Black, Galliker, Levine 2025, arXiv 2506.07339).

Both flow policies' samplers (flow_matching: the written-out MLP VJP; flow_transformer: autograd) are
run as the server runs them (`predict_action_chunk`) and compared with a reference written here from
the paper, in its own convention (tau from 0 = noise to 1 = data, v points towards the data):

    A <- noise; for tau = 0, 1/n, ..., 1 - 1/n:
        v = v(A, tau); A1_hat = A + (1 - tau) v; e = (Y - A1_hat) * W; g = e^T dA1_hat/dA
        A <- A + (v + min(beta, (1 - tau) / (tau r^2)) g) / n,  r^2 = (1 - tau)^2 / (tau^2 + (1 - tau)^2)

with W the soft mask (eq. 5: 1 for i < d, c_i (e^c_i - 1) / (e - 1) up to H - s, 0 after).

1. The toy problem with a known answer: the networks are set to a linear field v = a x + b (the last
   layers' weights zeroed, biases set), so the Jacobian is a * I and Algorithm 1 runs in closed form
   in float64 numpy (no torch, no autograd): our samplers must match it to 1e-5, the W = 0 rows must
   equal the unguided chunk exactly, and the W = 1 rows must land on the prefix.
2. The real (random, nonlinear) networks against the reference through torch.autograd.
3. Each check fails on a deliberately broken guidance: sign flipped, mask shifted by one row, the
   identity Jacobian where the network's is asked for.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import server.policies.flow_matching as fm
import server.policies.flow_transformer as ft
from server.policies import PolicyConfig, make_policy

S, A, T, H = 5, 2, 12, 9  # H: execution_horizon, the end of the guided rows (the paper's H - s)
STEPS, BETA = 8, 5.0


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def make(kind: str, **hp):
    torch.manual_seed(3)
    base = {
        "flow_matching": {"hidden_dim": 32, "obs_embed_dim": 16},
        "flow_transformer": {"d_model": 32, "num_heads": 4, "num_layers": 1, "obs_layers": 1},
    }[kind]
    cfg = PolicyConfig(
        type=kind,
        state_dim=S,
        action_dim=A,
        chunk_size=T,
        fps=10,
        execution_horizon=H,
        hyper_params={**base, "num_steps": STEPS, "max_guidance_weight": BETA, **hp},
    )
    return make_policy(cfg).eval().requires_grad_(False)


def make_linear(kind: str, a: float, b: np.ndarray, **hp):
    """The policy with its velocity replaced, through its own weights, by v = a * x + b (b per action dim)."""
    policy = make(kind, **hp)
    with torch.no_grad():
        if kind == "flow_matching":
            last = policy.velocity_net[-1]
            last.weight.zero_()
            last.bias.copy_(torch.tensor(np.tile(b, T), dtype=torch.float32))
        else:
            policy.action_out.weight.zero_()
            policy.action_out.bias.copy_(torch.tensor(b, dtype=torch.float32))
        gain = policy.skip_gain[-1]
        gain.weight.zero_()
        gain.bias.fill_(a)
    return policy


def paper_mask(d: int, horizon: int, total: int) -> np.ndarray:
    """Eq. 5 of the paper, written from the paper (horizon = its H - s)."""
    w = np.zeros(total)
    for i in range(total):
        if i < min(d, horizon):
            w[i] = 1.0
        elif i < horizon:
            c = (horizon - i) / (horizon - d + 1)
            w[i] = c * (math.exp(c) - 1) / (math.e - 1)
    return w


def lerobot_linear_mask(d: int, horizon: int, total: int) -> np.ndarray:
    w = np.zeros(total)
    d = min(d, horizon)
    w[:d] = 1.0
    n = horizon - d
    w[d:horizon] = np.linspace(1, 0, n + 2)[1:-1]
    return w


def guidance_clip(tau: float) -> float:
    if tau == 0.0:
        return BETA  # (1 - tau) / (tau r^2) = inf
    r2 = (1 - tau) ** 2 / (tau**2 + (1 - tau) ** 2)
    return min(BETA, (1 - tau) / (tau * r2))


def algorithm1_linear(noise: np.ndarray, prefix: np.ndarray, w: np.ndarray, a: float, b: np.ndarray) -> np.ndarray:
    """Algorithm 1 on the field v_ours = a x + b, in the paper's convention: v_paper = -(a x + b)
    (our v points to the noise), so A1_hat = (1 - (1 - tau) a) A - (1 - tau) b and its Jacobian is
    (1 - (1 - tau) a) I."""
    x = noise.astype(np.float64)
    for k in range(STEPS):
        tau = k / STEPS
        v = -(a * x + b)
        a1_hat = x + (1 - tau) * v
        e = (prefix - a1_hat) * w[:, None]
        g = (1 - (1 - tau) * a) * e
        x = x + (v + guidance_clip(tau) * g) / STEPS
    return x


def algorithm1_autograd(velocity, noise: torch.Tensor, prefix: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Algorithm 1 with g through torch.autograd; velocity(x, t) is the policy's (t = 1 - tau)."""
    x = noise.double()
    for k in range(STEPS):
        tau = k / STEPS
        with torch.enable_grad():
            xr = x.detach().requires_grad_(True)
            v = -velocity(xr.float(), 1.0 - tau).double()
            a1_hat = xr + (1 - tau) * v
            e = (prefix.double() - a1_hat) * w[:, None]
            (g,) = torch.autograd.grad(a1_hat, xr, e.detach())
        x = (x + (v.detach() + guidance_clip(tau) * g) / STEPS).detach()
    return x.float()


def run(policy, state: torch.Tensor, delay: int, prefix: torch.Tensor | None) -> torch.Tensor:
    return policy.predict_action_chunk({"observation.state": state[None]}, [delay], [prefix])[0]


def noise_of(policy) -> torch.Tensor:
    return policy._noise(1)[0]


KINDS = ["flow_matching", "flow_transformer"]
STATE = torch.linspace(-1, 1, S)
# the guided rows are the prefix given (PREFIX[:H]: the server cuts it to its execution_horizon)
PREFIX = torch.tensor(np.stack([np.sin(np.arange(T) / 3.0), np.cos(np.arange(T) / 4.0)], -1), dtype=torch.float32)


def check_linear_toy(kind: str, schedule: str, delay: int) -> None:
    a, b = -0.7, np.array([0.3, -0.2])
    policy = make_linear(kind, a, b, prefix_schedule=schedule)
    mask = (paper_mask if schedule == "exp" else lerobot_linear_mask)(delay, H, T)
    noise = noise_of(policy).double().numpy()
    expected = algorithm1_linear(noise, PREFIX.double().numpy(), mask, a, b)
    unguided_expected = algorithm1_linear(noise, PREFIX.double().numpy(), np.zeros(T), a, b)
    guided = run(policy, STATE, delay, PREFIX[:H]).double().numpy()
    unguided = run(policy, STATE, delay, None).double().numpy()
    np.testing.assert_allclose(unguided, unguided_expected, atol=1e-5)
    np.testing.assert_allclose(guided, expected, atol=1e-5)
    # the known answer's structure: with J = a I each row is guided on its own, so the W = 0 rows are
    # the unguided chunk, and the frozen (W = 1) rows land on the prefix
    np.testing.assert_allclose(guided[H:], unguided[H:], atol=1e-6)
    frozen = guided[:delay] - PREFIX.numpy()[:delay]
    assert np.abs(frozen).max(initial=0.0) < 0.05 * np.abs(unguided[:delay] - PREFIX.numpy()[:delay]).max(initial=1.0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("schedule", ["exp", "linear"])
@pytest.mark.parametrize("delay", [0, 3])
def test_linear_field_toy_problem_matches_algorithm1_in_closed_form(kind, schedule, delay):
    check_linear_toy(kind, schedule, delay)


def check_network(kind: str, schedule: str, **hp) -> None:
    policy = make(kind, prefix_schedule=schedule, **hp)
    delay = 2
    mask = torch.tensor((paper_mask if schedule == "exp" else lerobot_linear_mask)(delay, H, T))
    inputs = policy.model_inputs({"observation.state": STATE[None]})
    cond = policy.encoder(inputs) if kind == "flow_matching" else policy.context(policy.encode(inputs))

    def velocity(x, t):
        return policy.velocity(x[None], torch.full((1,), t), cond)[0]

    expected = algorithm1_autograd(velocity, noise_of(policy), PREFIX, mask)
    guided = run(policy, STATE, delay, PREFIX[:H])
    torch.testing.assert_close(guided, expected, atol=2e-4, rtol=1e-4)
    assert (guided - run(policy, STATE, delay, None)).abs().max() > 0.05  # the guidance did something


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("schedule", ["exp", "linear"])
def test_nonlinear_network_matches_algorithm1_through_autograd(kind, schedule):
    check_network(kind, schedule)


def test_exp_schedule_is_the_papers_eq5():
    for d, horizon, total in [(0, 9, 12), (3, 9, 12), (9, 9, 12), (2, 20, 12), (12, 5, 12)]:
        np.testing.assert_allclose(
            fm.prefix_weights(d, horizon, total, "exp").numpy(), paper_mask(d, min(horizon, total), total), atol=1e-7
        )


# -- the checks above must fail on a wrong guidance ---------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("broken", ["sign", "mask"])
def test_the_checks_fail_on_a_broken_guidance(kind, broken, monkeypatch):
    if broken == "sign":
        original = fm.guidance_weight
        fake = lambda t, max_w: -original(t, max_w)  # noqa: E731
        monkeypatch.setattr(fm, "guidance_weight", fake)
        monkeypatch.setattr(ft, "guidance_weight", fake)
    else:
        original = fm.prefix_weights
        fake = lambda d, h, n, s="linear": torch.roll(original(d, h, n, s), 1)  # noqa: E731
        monkeypatch.setattr(fm, "prefix_weights", fake)
        monkeypatch.setattr(ft, "prefix_weights", fake)
    with pytest.raises(AssertionError):
        check_linear_toy(kind, "exp", 3)
    with pytest.raises(AssertionError):
        check_network(kind, "exp")


@pytest.mark.parametrize("kind", KINDS)
def test_the_network_check_fails_with_the_identity_jacobian(kind):
    """LeRobot main's effective guidance (dA1_hat/dA = I) is not Algorithm 1 on a nonlinear network."""
    with pytest.raises(AssertionError):
        check_network(kind, "exp", guidance_jacobian="identity")
