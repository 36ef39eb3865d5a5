"""rtc_mode training_time (training-time RTC, Black, Ren, Equi, Levine 2025, arXiv 2512.05964) of both flow
policies, flow_matching (an MLP: per-row flow-time inputs) and flow_transformer (per-token flow time): the
committed rows are the output's rows exactly, the loss never looks at them, a checkpoint not trained for it
refuses it, and a tiny training run learns to continue a prefix the observation does not predict."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from server.policies import PolicyConfig, make_policy
from server.policies.base import ChunkPolicy
from server.policies.checkpoint import load_checkpoint, save_checkpoint
from server.policies.flow_matching import RTCModeError, prefix_flow_matching_loss
from server.policies.stats import compute_stats
from server.policies.train import TrainingError, train_bc

S, A, T = 5, 2, 8
# tiny sizes per policy type
SIZES = {
    "flow_matching": {"hidden_dim": 64, "obs_embed_dim": 16, "num_steps": 6},
    "flow_transformer": {
        "d_model": 32,
        "num_heads": 4,
        "num_layers": 2,
        "obs_layers": 1,
        "mlp_ratio": 2,
        "num_steps": 6,
    },
}
TYPES = tuple(SIZES)
TINY_RUN = {
    "flow_matching": {"epochs": 150, "batch_size": 128},  # ~4 s on one thread
    "flow_transformer": {"epochs": 30, "batch_size": 64},
}  # ~7 s (max error 0.18 of 0.25 allowed)
TRAINING_COMMAND = {
    "flow_matching": "bench train --robot ROBOT_TYPE --rtc-mode training_time",
    "flow_transformer": "bench train --robot ROBOT_TYPE --policy-type flow_transformer --rtc-mode training_time",
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py
SHIPPED_TRANSFORMER = Path(__file__).resolve().parents[2] / "bench" / "checkpoints" / "reacher_transformer"


@pytest.fixture(params=TYPES)
def policy_type(request) -> str:
    return request.param


def config(policy_type: str, **hp) -> PolicyConfig:
    return PolicyConfig(
        type=policy_type,
        state_dim=S,
        action_dim=A,
        chunk_size=T,
        fps=10,
        execution_horizon=6,
        hyper_params={**SIZES[policy_type], **hp},
    )


def policy(policy_type: str, **hp) -> ChunkPolicy:
    torch.manual_seed(0)
    return make_policy(config(policy_type, **hp)).eval().requires_grad_(False)


def ignore_the_chunk_values(p: ChunkPolicy) -> None:
    """Zero the weights through which x_t's values reach the velocity (time and observation still do)."""
    if p.config.type == "flow_matching":
        p.velocity_net[0].weight[:, : T * A] = 0.0
    else:
        p.action_in.weight.zero_()
    p.skip_gain[-1].weight.zero_(), p.skip_gain[-1].bias.zero_()


def state(size: int = 1) -> dict[str, torch.Tensor]:
    return {"observation.state": torch.randn(size, S, generator=torch.Generator().manual_seed(1))}


def test_the_committed_rows_are_exactly_the_given_actions_and_only_d_of_them(policy_type):
    p = policy(policy_type, rtc_mode="training_time")
    prefix = torch.randn(6, A, generator=torch.Generator().manual_seed(2))  # RTC's horizon: longer than d
    chunk = p.predict_action_chunk(state(), [3], [prefix])[0]
    assert torch.equal(chunk[:3], prefix[:3])
    assert not torch.allclose(chunk[3:6], prefix[3:6], atol=1e-3)  # rows beyond d stay the model's
    assert torch.equal(p.predict_action_chunk(state(), [9], [prefix])[0][:6], prefix)  # d > len(prefix): all of it


def test_the_prefix_changes_the_rest_of_the_chunk_and_no_prefix_is_the_plain_sample(policy_type):
    p = policy(policy_type, rtc_mode="training_time")
    plain = p.predict_action_chunk(state(), [0], [None])[0]
    assert torch.equal(p.predict_action_chunk(state(), [3], [None])[0], plain)
    assert torch.equal(p.predict_action_chunk(state(), [0], [torch.ones(4, A)])[0], plain)  # d = 0 commits nothing
    conditioned = p.predict_action_chunk(state(), [2], [torch.full((4, A), 3.0)])[0]
    assert not torch.allclose(conditioned[2:], plain[2:], atol=1e-4)  # the network reads the clean rows


def test_batched_samples_keep_their_own_prefix_lengths(policy_type):
    """Sessions with and without a prefix in one batch: each sample is what it is alone."""
    p = policy(policy_type, rtc_mode="training_time")
    prefixes = [torch.randn(5, A, generator=torch.Generator().manual_seed(k)) for k in range(4)]
    prefixes[1] = None
    delays = [0, 3, 2, 5]
    batch = {"observation.state": state(4)["observation.state"]}
    together = p.predict_action_chunk(batch, delays, prefixes)
    for b in range(4):
        alone = p.predict_action_chunk(
            {"observation.state": batch["observation.state"][b : b + 1]}, [delays[b]], [prefixes[b]]
        )[0]
        torch.testing.assert_close(together[b], alone, rtol=1e-5, atol=1e-5)
        if prefixes[b] is not None:
            assert torch.equal(together[b, : delays[b]], prefixes[b][: delays[b]])


def test_transformer_tokens_read_their_own_flow_time():
    """Every token at t is the one-time-per-sample network; a token at time 0 changes the velocity of the others."""
    p = policy("flow_transformer", rtc_mode="training_time")
    x_t = torch.randn(2, T, A, generator=torch.Generator().manual_seed(6))
    t = torch.tensor([0.7, 0.3])
    with torch.no_grad():
        context = p.context(p.encode(state(2)))
        per_sample = p.velocity(x_t, t, context)
        torch.testing.assert_close(
            p.velocity(x_t, t, context, t[:, None].expand(2, T)), per_sample, rtol=1e-5, atol=1e-6
        )
        row_t = t[:, None].expand(2, T).clone()
        row_t[:, :3] = 0.0
        moved = p.velocity(x_t, t, context, row_t)
    assert not torch.allclose(moved[:, 3:], per_sample[:, 3:], atol=1e-4)


def test_transformer_bucket_padding_commits_nothing_and_changes_no_sample():
    plain = policy("flow_transformer", rtc_mode="training_time")
    padded = policy("flow_transformer", rtc_mode="training_time", batch_buckets=[4, 8])
    prefixes = [torch.randn(5, A, generator=torch.Generator().manual_seed(k)) for k in range(3)]
    args = ([2, 0, 4], prefixes)
    out = padded.predict_action_chunk(state(3), *args)
    assert out.shape == (3, T, A)
    torch.testing.assert_close(out, plain.predict_action_chunk(state(3), *args), rtol=1e-5, atol=1e-5)
    assert torch.equal(out[2, :4], prefixes[2][:4])


def test_a_checkpoint_from_before_rtc_mode_loads_as_guidance_with_the_same_chunks(policy_type, tmp_path):
    p = policy(policy_type)
    rng = np.random.default_rng(0)
    stats = compute_stats(rng.normal(size=(16, S)).astype(np.float32), rng.normal(size=(16, T, A)).astype(np.float32))
    path = save_checkpoint(p, stats, tmp_path / "ckpt")
    config_file = Path(path) / "config.json"
    saved = json.loads(config_file.read_text())
    for name in ("rtc_mode", "max_prefix_rows"):  # as written before the hyper-parameters existed
        del saved["hyper_params"][name]
    config_file.write_text(json.dumps(saved))
    old = load_checkpoint(path).policy
    assert old.hp["rtc_mode"] == "guidance" and not old.prefix_conditioned
    args = (state(2), [2, 0], [torch.ones(6, A), None])
    assert torch.equal(old.predict_action_chunk(*args), p.predict_action_chunk(*args))
    old.hp["rtc_mode"] = "training_time"
    with pytest.raises(RTCModeError, match=f"`{TRAINING_COMMAND[policy_type]}`"):
        old.predict_action_chunk(*args)


def test_the_shipped_transformer_training_time_checkpoint_returns_its_committed_rows():
    p = load_checkpoint(SHIPPED_TRANSFORMER.with_name("reacher_transformer_rtc_training_time")).policy
    assert p.config.type == "flow_transformer" and p.prefix_conditioned and p.hp["rtc_mode"] == "training_time"
    prefix = torch.randn(10, 2, generator=torch.Generator().manual_seed(8))
    chunk = p.predict_action_chunk({"observation.state": torch.zeros(1, 10)}, [4], [prefix])[0]
    assert torch.equal(chunk[:4], prefix[:4]) and chunk.shape == (30, 2)


def test_the_shipped_transformer_checkpoint_is_guidance_and_refuses_training_time():
    assert "rtc_mode" not in json.loads((SHIPPED_TRANSFORMER / "config.json").read_text())["hyper_params"]
    p = load_checkpoint(SHIPPED_TRANSFORMER).policy
    assert p.hp["rtc_mode"] == "guidance"
    p.hp["rtc_mode"] = "training_time"
    with pytest.raises(RTCModeError, match=f"`{TRAINING_COMMAND['flow_transformer']}`"):
        p.predict_action_chunk({"observation.state": torch.zeros(1, 10)}, [2], [torch.zeros(4, 2)])


def test_the_loss_ignores_the_prefix_rows(policy_type):
    p = policy(policy_type, rtc_mode="training_time").train()
    x1 = torch.randn(4, T, A, generator=torch.Generator().manual_seed(3))
    rows = torch.tensor([0, 2, 3, 7])
    changed = x1.clone()
    for b, n in enumerate(rows.tolist()):
        changed[b, :n] += 100.0  # the committed rows move; the loss's targets (rows >= n) do not

    def loss(chunk):  # x_t of a committed row is the row itself, so the network input moves too: compare the
        # targets only, through a velocity that ignores its input
        return prefix_flow_matching_loss(
            lambda x_t, t, c, row_t: torch.zeros_like(x_t), None, chunk, rows, torch.Generator().manual_seed(4)
        )

    torch.testing.assert_close(loss(changed), loss(x1))
    free = torch.arange(T)[None, :] >= rows[:, None]
    changed[free] += 1.0  # now the free rows move
    assert not torch.allclose(loss(changed), loss(x1))
    # and the policy's own training_loss passes prefix_rows through: all-but-one-row prefixes give a loss over
    # the last row only, so moving the others changes nothing
    gen = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    last_only = torch.full((4,), T - 1)
    moved = x1.clone()
    moved[:, : T - 1] -= 5.0
    with torch.no_grad():
        base = p.training_loss(state(4), x1, gen(), prefix_rows=last_only)
        # the committed rows are network inputs, so the loss can change through them, but not their targets:
        # with the network's output independent of them (zeroed first layer weights for x_t) it must not change
        ignore_the_chunk_values(p)
        assert torch.equal(
            p.training_loss(state(4), moved, gen(), prefix_rows=last_only),
            p.training_loss(state(4), x1, gen(), prefix_rows=last_only),
        )
    assert base.item() > 0


def test_a_checkpoint_not_trained_for_it_refuses_training_time_with_what_to_do(policy_type):
    p = policy(policy_type)  # rtc_mode guidance: no per-row flow-time input
    p.hp["rtc_mode"] = "training_time"  # as a run-time override (bench.training.delay_eval) would
    with pytest.raises(
        RTCModeError, match=f"not trained for rtc_mode 'training_time'.*`{TRAINING_COMMAND[policy_type]}`"
    ):
        p.predict_action_chunk(state(), [2], [torch.zeros(3, A)])
    with pytest.raises(RTCModeError, match="not trained"):
        policy(policy_type).training_loss(state(2), torch.zeros(2, T, A), prefix_rows=torch.tensor([1, 2]))


def test_a_training_time_checkpoint_can_still_be_guided(policy_type):
    p = policy(policy_type, rtc_mode="training_time")
    p.hp["rtc_mode"] = "guidance"
    prefix = torch.full((6, A), 0.5)
    chunk = p.predict_action_chunk(state(), [3], [prefix])[0]
    plain = p.predict_action_chunk(state(), [0], [None])[0]
    assert (chunk[:3] - 0.5).abs().max() < (plain[:3] - 0.5).abs().max()  # pulled towards the prefix
    assert not torch.equal(chunk[:3], prefix[:3])  # guided, not clamped


def test_train_bc_refuses_prefix_rows_for_a_policy_not_built_for_them(policy_type, tmp_path):
    states = np.zeros((4, S), np.float32)
    chunks = np.zeros((4, T, A), np.float32)
    with pytest.raises(TrainingError, match="rtc_mode: training_time"):
        train_bc(
            policy_type, states, chunks, config(policy_type), tmp_path, epochs=1, seed=0, prefix_rows=np.ones(4, int)
        )
    with pytest.raises(TrainingError, match="prefix_rows"):
        train_bc(
            policy_type,
            states,
            chunks,
            config(policy_type, rtc_mode="training_time"),
            tmp_path,
            epochs=1,
            seed=0,
            prefix_rows=np.full(4, T),
        )


def test_a_tiny_training_run_learns_to_continue_a_prefix_the_state_does_not_predict(policy_type, tmp_path):
    """Chunks are constant rows at a level c ~ U(-1, 1) drawn independently of the state: from the state alone a
    policy can only guess, with the first rows given it must hold their level."""
    rng = np.random.default_rng(0)
    n = 1024
    levels = rng.uniform(-1, 1, (n, 1, A)).astype(np.float32)
    chunks = np.repeat(levels, T, axis=1)
    states = rng.normal(size=(n, S)).astype(np.float32)
    prefix_rows = rng.integers(0, T // 2 + 1, n)
    from server.policies.checkpoint import load_checkpoint
    from server.policies.stats import ACTION_KEY

    path = train_bc(
        policy_type,
        states,
        chunks,
        config(policy_type, rtc_mode="training_time", max_prefix_rows=T // 2),
        tmp_path / "ckpt",
        seed=0,
        prefix_rows=prefix_rows,
        **TINY_RUN[policy_type],
    )
    loaded = load_checkpoint(path)
    p, stats = loaded.policy, loaded.stats[ACTION_KEY]
    mean, std = stats["mean"], stats["std"]
    x = {"observation.state": torch.zeros(1, S)}
    errors = []
    for level in (-0.7, 0.2, 0.8):
        target = (torch.full((T, A), level) - mean) / std  # model space
        chunk = p.predict_action_chunk(x, [2], [target[:2]])[0] * std + mean
        errors.append(float((chunk[2:] - level).abs().max()))  # from the state alone: 0.3 to 1.2 mean
    assert max(errors) < 0.25, errors
