"""bench.training.experts and bench.training.demos: experts solve their tasks; demos and closed-loop checks are usable for BC."""

from __future__ import annotations

import numpy as np
import pytest

from bench.robots import ROBOT_TYPES, make_robot
from bench.training.demos import collect_demos, evaluate_closed_loop
from bench.training.experts import EXPERTS, expert_for

TYPES = sorted(ROBOT_TYPES)


def test_every_robot_type_has_an_expert():
    # the shipped types: a gym group's type (bench.robots.gymenv) or a user's plugin, registered when some scenario
    # is loaded in this process, brings its own policy, not one of ours
    shipped = {
        name
        for name, cls in ROBOT_TYPES.items()
        if cls.__module__.startswith("bench.robots.") and cls.__module__ not in ("bench.robots.gymenv",)
    }
    assert set(EXPERTS) == shipped
    with pytest.raises(ValueError, match="no expert"):
        expert_for("hexapod")


@pytest.mark.parametrize("name", TYPES)
def test_the_expert_succeeds_on_more_than_80_percent_of_episodes(name):
    expert = expert_for(name)
    env = make_robot(name, seed=0)
    successes = []
    for episode in range(10):
        state, _ = env.reset(seed=500 + episode)
        while True:
            state, _, terminated, truncated, info = env.step(expert(state))
            if terminated or truncated:
                break
        successes.append(info["is_success"])
    assert np.mean(successes) > 0.8, successes


@pytest.mark.parametrize("name", TYPES)
def test_doing_nothing_does_not_solve_the_task(name):
    # The task must need the expert: a robot that only holds fails (base keeps still, arm freezes).
    env = make_robot(name, seed=0)
    failures = 0
    for episode in range(5):
        env.reset(seed=900 + episode)
        while True:
            _, _, terminated, truncated, info = env.step(env.zero_action() if name != "arm" else None)
            if terminated or truncated:
                break
        failures += not info["is_success"]
    assert failures >= 4


@pytest.mark.parametrize("name", TYPES)
def test_collect_demos_returns_float32_states_and_action_chunks(name):
    env = make_robot(name, seed=0)
    states, chunks = collect_demos(name, episodes=2, seed=0, chunk_size=8, episode_s=1.0)
    assert states.dtype == chunks.dtype == np.float32
    assert states.shape == (60, len(env.state_names))
    assert chunks.shape == (60, 8, len(env.action_names))
    assert np.isfinite(states).all() and np.isfinite(chunks).all()


def test_demo_chunks_are_the_next_clean_expert_labels_padded_with_the_last():
    states, chunks = collect_demos("reacher", episodes=1, seed=4, chunk_size=5, episode_s=0.5)
    expert = expert_for("reacher")
    labels = np.stack([expert(s) for s in states])  # clean labels at the visited states
    np.testing.assert_allclose(chunks[:, 0], labels, atol=1e-6)
    np.testing.assert_allclose(chunks[3, :], labels[3:8], atol=1e-6)
    np.testing.assert_allclose(chunks[-1], np.repeat(labels[-1:], 5, axis=0), atol=1e-6)


def test_demos_are_deterministic_given_the_seed_and_noise_moves_the_states():
    a = collect_demos("base", episodes=1, seed=7, chunk_size=4, episode_s=1.0)
    b = collect_demos("base", episodes=1, seed=7, chunk_size=4, episode_s=1.0)
    clean = collect_demos("base", episodes=1, seed=7, chunk_size=4, episode_s=1.0, noise=0.0)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], clean[0])


def test_evaluate_closed_loop_scores_an_expert_chunk_policy_and_its_seams():
    expert = expert_for("arm")
    every_tick = evaluate_closed_loop("arm", lambda s: expert(s)[None], episodes=2, seed=3, replan_every=1)
    assert every_tick["success_rate"] == 1.0
    # Ten ticks of one repeated target: the arm lags the moving target and its command jumps at seams.
    stale = evaluate_closed_loop("arm", lambda s: np.tile(expert(s), (10, 1)), episodes=2, seed=3, replan_every=10)
    assert stale["mean_tracking_error"] > every_tick["mean_tracking_error"]
    assert stale["seam"]["seams"] > 0 and stale["seam"]["step_ratio"] > 1.0
    assert stale["held_ticks"] == 0


def test_a_chunk_that_runs_out_sends_no_command_until_the_next_call():
    result = evaluate_closed_loop(
        "base", lambda s: np.array([[0.3, 0.0]] * 3), episodes=1, seed=0, replan_every=10, episode_s=1.0
    )
    assert result["held_ticks"] == 30 - 3 * 3
