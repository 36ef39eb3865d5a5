"""flow_matching: LeRobot-equivalent RTC guidance, per-sample delays under batching, determinism."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from server.policies import PolicyConfig, make_policy
from server.policies.flow_matching import FlowMatchingPolicy, guidance_weight, prefix_weights

S, A, T, H = 6, 4, 16, 8


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def policy(**hp) -> FlowMatchingPolicy:
    torch.manual_seed(0)
    cfg = PolicyConfig(
        type="flow_matching",
        state_dim=S,
        action_dim=A,
        chunk_size=T,
        fps=10,
        execution_horizon=H,
        hyper_params={"hidden_dim": 64, "obs_embed_dim": 32, **hp},
    )
    return make_policy(cfg).eval().requires_grad_(False)  # type: ignore[return-value]


def states(size: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(size, S, generator=torch.Generator().manual_seed(seed))


def rows(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, A, generator=torch.Generator().manual_seed(100 + seed))


def test_prefix_weights_follow_lerobot_linear_schedule():
    # LeRobot: ones for min(d, H), linspace(1, 0, n + 2)[1:-1] up to H, zeros after.
    torch.testing.assert_close(prefix_weights(2, 6, 8), torch.tensor([1, 1, 0.8, 0.6, 0.4, 0.2, 0, 0]))
    torch.testing.assert_close(prefix_weights(0, 3, 5), torch.tensor([0.75, 0.5, 0.25, 0, 0]))
    torch.testing.assert_close(prefix_weights(9, 3, 5), torch.tensor([1.0, 1, 1, 0, 0]))
    torch.testing.assert_close(prefix_weights(2, 10, 4), torch.tensor([1, 1, 2 / 3, 1 / 3]))


@given(
    delay=st.integers(-3, 40),
    horizon=st.integers(0, 40),
    total=st.integers(1, 40),
    schedule=st.sampled_from(["linear", "exp"]),
)
def test_prefix_weights_properties(delay, horizon, total, schedule):
    w = prefix_weights(delay, horizon, total, schedule)
    ones = min(max(delay, 0), horizon, total)
    assert w.shape == (total,)
    assert torch.all(w[:ones] == 1)
    assert torch.all(w[min(horizon, total) :] == 0)
    ramp = w[ones : min(horizon, total)]
    assert torch.all((ramp > 0) & (ramp < 1))
    assert torch.all(ramp[1:] < ramp[:-1])


def test_guidance_weight_is_lerobots_clipped_schedule():
    assert guidance_weight(1.0, 10.0) == 10.0  # tau = 0: c = inf -> clipped
    assert guidance_weight(0.0, 10.0) == 0.0  # tau = 1: 0 * inf = nan -> 0
    tau = 0.7
    expected = (1 - tau) / tau * ((1 - tau) ** 2 + tau**2) / (1 - tau) ** 2
    assert guidance_weight(1 - tau, 10.0) == pytest.approx(expected)
    assert guidance_weight(0.9, 2.0) == 2.0


@pytest.mark.parametrize("num_layers", [1, 2, 3, 4])
@pytest.mark.parametrize("t", [1.0, 0.7, 0.3, 0.1])
def test_the_written_out_vjp_equals_autograds(num_layers, t):
    """`network` guidance writes the VJP of x1_hat = x_t - t v(x_t) out for the MLP instead of running
    autograd; the reference here is torch.autograd.grad through `velocity`, as the RTC paper states it."""
    p = policy(num_layers=num_layers)
    size = 3
    gen = torch.Generator().manual_seed(num_layers)
    x_t = torch.randn(size, T, A, generator=gen)
    cond = torch.randn(size, 32, generator=gen)
    weights = torch.rand(size, T, 1, generator=gen)
    target = torch.randn(size, T, A, generator=gen)
    t_batch = torch.full((size,), t)
    with torch.enable_grad():
        x = x_t.clone().requires_grad_(True)
        v_ref = p.velocity(x, t_batch, cond)
        x1_hat = x - t * v_ref
        (correction_ref,) = torch.autograd.grad(x1_hat, x, ((target - x1_hat) * weights).detach())
    v, correction = p._velocity_and_vjp(x_t, t_batch, cond, weights, target, t)
    torch.testing.assert_close(v, v_ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(correction, correction_ref, rtol=1e-4, atol=1e-5)
    assert correction.abs().max() > 1e-3  # not trivially zero


def test_guided_sampling_runs_inside_a_callers_inference_mode():
    p = policy()
    obs = {"observation.state": states(2)}
    expected = p.predict_action_chunk(obs, [3, 3], [rows(H, 0), rows(H, 1)])
    with torch.inference_mode():
        got = p.predict_action_chunk(obs, [3, 3], [rows(H, 0), rows(H, 1)])
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("jacobian", ["network", "identity"])
@pytest.mark.parametrize("delay", [1, 3, 6])
def test_guidance_pulls_the_first_delay_actions_onto_the_prefix(jacobian, delay):
    p = policy(guidance_jacobian=jacobian)
    batch = {"observation.state": states(1)}
    prefix = rows(H, 0)
    free = p.predict_action_chunk(batch, [0], [None])[0]
    guided = p.predict_action_chunk(batch, [delay], [prefix])[0]
    free_err = (free[:delay] - prefix[:delay]).abs().max()
    guided_err = (guided[:delay] - prefix[:delay]).abs().max()
    assert guided_err < 0.05 * free_err
    assert guided_err < 0.05


def test_the_guided_horizon_is_the_prefix_given_not_the_checkpoints_execution_horizon():
    """The server cuts or pads every prefix to its execution_horizon (the manifest's, else the checkpoint's):
    the policy guides exactly the rows it is given, so a replica can guide more rows than the checkpoint says."""
    p = policy()
    batch = {"observation.state": states(1)}
    long_prefix = rows(T, 1)
    changed_tail = long_prefix.clone()
    changed_tail[H:] += 5.0
    # the rows given are the horizon: what follows them elsewhere does not matter
    assert torch.equal(
        p.predict_action_chunk(batch, [2], [long_prefix[:H]]), p.predict_action_chunk(batch, [2], [changed_tail[:H]])
    )
    # a longer prefix guides its rows beyond the checkpoint's execution_horizon too
    assert not torch.equal(
        p.predict_action_chunk(batch, [2], [long_prefix]), p.predict_action_chunk(batch, [2], [changed_tail])
    )


def test_batched_per_sample_delays_and_prefixes_equal_each_sample_run_alone():
    p = policy()
    obs = states(5, seed=3)
    delays = [0, 2, 5, 3, 9]
    prefixes = [rows(H, 0), rows(H, 1), None, rows(3, 3), rows(H + 4, 4)]
    batched = p.predict_action_chunk({"observation.state": obs}, delays, prefixes)
    for b in range(5):
        alone = p.predict_action_chunk({"observation.state": obs[b : b + 1]}, [delays[b]], [prefixes[b]])
        torch.testing.assert_close(batched[b : b + 1], alone, rtol=1e-5, atol=1e-5)


def test_a_sample_without_prefix_in_a_guided_batch_gets_the_unguided_chunk():
    p = policy()
    obs = states(2)
    guided_batch = p.predict_action_chunk({"observation.state": obs}, [3, 3], [rows(H, 0), None])
    unguided = p.predict_action_chunk({"observation.state": obs}, [3, 3], [None, None])
    torch.testing.assert_close(guided_batch[1], unguided[1], rtol=1e-6, atol=1e-6)


def test_same_inputs_give_byte_identical_outputs():
    p = policy()
    batch = {"observation.state": states(3)}
    args = ([1, 2, 0], [rows(H, 0), None, rows(5, 2)])
    first = p.predict_action_chunk(batch, *args).numpy().tobytes()
    assert all(p.predict_action_chunk(batch, *args).numpy().tobytes() == first for _ in range(3))
    assert policy().predict_action_chunk(batch, *args).numpy().tobytes() == first  # a fresh instance too


def test_unseeded_noise_differs_between_calls():
    p = policy(noise_seed=None)
    batch = {"observation.state": states(1)}
    assert not torch.equal(p.predict_action_chunk(batch, [0], [None]), p.predict_action_chunk(batch, [0], [None]))


def test_guidance_works_under_no_grad_and_inference_mode_callers():
    p = policy()
    p.requires_grad_(True)  # also with trainable parameters: no gradient may leak into them
    batch = {"observation.state": states(1)}
    reference = p.predict_action_chunk(batch, [2], [rows(H, 0)])
    with torch.no_grad():
        assert torch.equal(p.predict_action_chunk(batch, [2], [rows(H, 0)]), reference)
    with torch.inference_mode():
        inference_batch = {"observation.state": states(1)}
        out = p.predict_action_chunk(inference_batch, [2], [rows(H, 0)])
    assert torch.equal(out, reference)
    assert all(param.grad is None for param in p.parameters())
    assert not reference.requires_grad


def test_output_is_float32_model_space_even_for_a_bfloat16_policy():
    p = policy().to(torch.bfloat16)
    out = p.predict_action_chunk({"observation.state": states(2)}, [1, 0], [rows(H, 0), None])
    assert out.dtype == torch.float32 and out.shape == (2, T, A)
    assert torch.isfinite(out).all()
