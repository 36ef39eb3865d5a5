"""delay_eval: the simulated-delay comparison of chunking strategies agrees with the closed-loop
evaluation where they coincide, and each strategy executes what its docstring says."""

from __future__ import annotations

import pytest

from bench.training.delay_eval import REPO, run_strategy
from bench.training.demos import evaluate_closed_loop
from bench.training.train import CheckpointPolicy

CKPT = REPO / "bench" / "checkpoints" / "reacher"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_without_delay_sync_and_naive_are_the_closed_loop_evaluation():
    reference = evaluate_closed_loop("reacher", CheckpointPolicy(CKPT, 10), 4, 10_000, 10, fps=30.0)
    for strategy in ("sync", "naive"):
        r = run_strategy(CKPT, "reacher", strategy, 0, 10, 4, 10_000)
        assert r["success_rate"] == reference["success_rate"] and r["held_ticks"] == 0


def test_held_ticks_count_the_blocking_waits_and_only_the_first_chunks_elsewhere():
    episodes, d, s = 2, 3, 10
    sync = run_strategy(CKPT, "reacher", "sync", d, s, episodes, 10_000)
    naive = run_strategy(CKPT, "reacher", "naive", d, s, episodes, 10_000)
    assert naive["held_ticks"] == episodes * d  # the first request of each episode only
    assert sync["held_ticks"] >= episodes * d * (60 // (d + s))  # every request of a 60-tick episode


def test_d_above_s_is_refused():
    with pytest.raises(ValueError, match="d <= s"):
        run_strategy(CKPT, "reacher", "rtc", 5, 4, 1, 0)


def test_the_derived_s_is_the_remote_engines():
    from bench.training.delay_eval import plan_s
    from edge.remote import plan_execution

    for chunk in (10, 30, 31):
        for d in range(0, 20):
            assert plan_s(d, chunk) == plan_execution(d, chunk, 1 / 30, None).execution_steps


def test_a_delay_margin_tells_the_policy_more_rows_than_the_robot_waits(monkeypatch):
    """--delay-margin: the policy is given d + margin (its inference delay, and as many committed rows for
    training-time RTC) while the robot still switches to the new chunk at row d (held ticks are d's)."""
    from server.policies.flow_matching import FlowMatchingPolicy

    told = []
    original = FlowMatchingPolicy.predict_action_chunk

    def recording(self, obs, delays, prefixes):
        told.append((list(delays), [None if p is None else len(p) for p in prefixes]))
        return original(self, obs, delays, prefixes)

    monkeypatch.setattr(FlowMatchingPolicy, "predict_action_chunk", recording)
    ckpt = REPO / "bench" / "checkpoints" / "reacher_rtc_training_time"
    d, s = 2, 10
    r = run_strategy(ckpt, "reacher", "rtc_training_time", d, s, 1, 10_000, delay_margin=1)
    assert r["delay_margin"] == 1 and r["held_ticks"] == d  # the first chunk only: waits are d's
    assert told[0] == ([d + 1], [None])  # an episode's first request follows nothing
    assert told[1:] and all(t == ([d + 1], [d + 1]) for t in told[1:])
