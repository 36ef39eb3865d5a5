"""Training-time RTC's demonstrations: the expert plans after the committed rows from where they lead, the
labels start with the previous request's rows, and delay_eval's rtc_training_time runs (or refuses) as it says."""

from __future__ import annotations

import numpy as np
import pytest

from bench.training.delay_eval import REPO, run_strategy
from bench.training.demos import collect_on_policy_prefix_demos, collect_prefix_demos
from bench.training.experts import plan_chunks
from server.policies.flow_matching import RTCModeError

T = 30
CHECKPOINTS = REPO / "bench" / "checkpoints"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def demos():
    return collect_prefix_demos("reacher", 2, 5, T, 8, episode_s=2.0)  # d <= 8: s = 15 for every d


def test_a_prefix_that_is_the_experts_own_plan_leaves_the_plan_unchanged(demos):
    states = demos[0][[3, 40, 70]]
    plain = plan_chunks("reacher", states, T)
    rows = np.array([1, 5, 12])
    # the twin executes the committed rows, so committing to the expert's own rows changes nothing after them
    np.testing.assert_allclose(plan_chunks("reacher", states, T, prefixes=plain, prefix_rows=rows), plain, atol=1e-6)


def test_after_other_committed_rows_the_expert_corrects_from_where_they_lead(demos):
    states = demos[0][[3, 40]]
    plain = plan_chunks("reacher", states, T)
    kick = np.full((2, 4, 2), 0.8, np.float32)
    planned = plan_chunks("reacher", states, T, prefixes=kick, prefix_rows=np.array([4, 2]))
    assert np.array_equal(planned[0, :4], kick[0]) and np.array_equal(planned[1, :2], kick[1, :2])
    assert np.array_equal(planned[1, 2:4] == kick[1, 2:4], np.zeros((2, 2), bool))  # rows past n are the expert's
    assert np.abs(planned[:, 4:] - plain[:, 4:]).max() > 0.05  # and they answer the kick
    assert np.all(planned[:, 4] * 0.8 < 0)  # by braking against it


def test_labels_begin_with_the_previous_requests_rows_then_the_experts_plan_from_there(demos):
    states, chunks, rows = demos
    per_episode = len(states) // 2
    checked = 0
    for i in np.flatnonzero(rows > 0)[:: max(1, int((rows > 0).sum()) // 6)]:
        n, t = int(rows[i]), i % per_episode
        assert t >= 15  # the previous request was 15 ticks earlier in the same episode
        previous = plan_chunks("reacher", states[i - 15 : i - 14], T)[0]
        np.testing.assert_array_equal(chunks[i, :n], previous[15 : 15 + n])
        again = plan_chunks("reacher", states[i : i + 1], T, prefixes=chunks[i : i + 1], prefix_rows=np.array([n]))
        np.testing.assert_allclose(chunks[i], again[0], atol=1e-6)
        checked += 1
    assert checked >= 4
    assert np.all(rows[np.arange(len(states)) % per_episode < 15] == 0)  # no earlier request: the plain plan
    np.testing.assert_allclose(chunks[rows == 0], plan_chunks("reacher", states[rows == 0], T), atol=1e-6)


def test_a_checkpoint_trained_for_guidance_refuses_the_training_time_strategy():
    with pytest.raises(RTCModeError, match="--rtc-mode training_time"):
        run_strategy(CHECKPOINTS / "reacher", "reacher", "rtc_training_time", 2, 15, 1, 0)


def test_on_policy_requests_carry_the_rows_the_robot_executes_meanwhile():
    states, chunks, rows = collect_on_policy_prefix_demos(
        "reacher", CHECKPOINTS / "reacher_rtc_training_time", 1, 50_000, 3
    )
    assert sorted(set(rows.tolist())) == [0, 1, 2, 3]  # each episode's first request follows nothing
    assert len(states) == len(chunks) == len(rows) and np.isfinite(chunks).all()


def test_without_delay_rtc_training_time_is_naive_execution():
    ckpt = CHECKPOINTS / "reacher_rtc_training_time"
    a = run_strategy(ckpt, "reacher", "rtc_training_time", 0, 15, 2, 10_000)
    b = run_strategy(ckpt, "reacher", "naive", 0, 15, 2, 10_000)
    assert a["success_rate"] == b["success_rate"] and a["seam_jerk_p95"] == b["seam_jerk_p95"]
