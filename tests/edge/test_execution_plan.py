"""When the remote engine asks again: RTC's d <= s <= H - d derived from the delay the engine measures.

Unit tests of `plan_execution` and of `RemoteEngine.execution_plan` with its latency tracker fed known
round trips (no network: the engine is never started; its session's chunk size is a stand-in ack).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge import RemoteEngineConfig
from edge.engine import ConfigError
from edge.remote import RemoteEngine, plan_execution

FPS = 30.0
DT = 1.0 / FPS


def engine(chunk_size: int = 30, **kw) -> RemoteEngine:
    cfg = dict(model_id="arm", fps=FPS, action_names=["a", "b"], state_dim=3)
    cfg.update(kw)
    eng = RemoteEngine(RemoteEngineConfig(**cfg))
    eng._worker.session.first_ack = SimpleNamespace(chunk_size=chunk_size)  # what the session's handshake would say
    return eng


@given(d=st.integers(0, 60), big_h=st.integers(1, 60))
def test_the_derived_plan_holds_d_le_s_le_h_minus_d_whenever_a_chunk_allows_it(d, big_h):
    plan = plan_execution(d, big_h, DT, None)
    assert plan.execution_steps + plan.buffer_steps == big_h
    if 2 * d <= big_h:
        assert d <= plan.execution_steps <= big_h - d and not plan.violation
    else:  # no s fits: ask as soon as the request in flight can be answered, and say why
        assert plan.execution_steps == d
        assert f"d={d}" in plan.violation and f"H={big_h}" in plan.violation


@pytest.mark.parametrize("d,s", [(0, 15), (4, 15), (8, 15), (15, 15), (16, 16)])
def test_the_derived_plan_keeps_half_the_chunk_until_the_delay_needs_more(d, s):
    assert plan_execution(d, 30, DT, None).execution_steps == s


@pytest.mark.parametrize("rtt_s,d,s", [(0.0, 0, 15), (0.1, 3, 15), (0.45, 14, 15), (0.6, 18, 18)])
def test_the_engine_plans_from_the_delay_its_tracker_measured(rtt_s, d, s):
    eng = engine(chunk_size=30, latency_mode="all_time_max")
    for value in (rtt_s / 2, rtt_s, rtt_s / 3):  # all_time_max: the largest round trip counts
        eng.tracker.add(value)
    plan = eng.execution_plan()
    assert (plan.delay_steps, plan.execution_steps, plan.chunk_size) == (d, s, 30)
    assert plan.buffer_s == pytest.approx((30 - s) * DT, abs=1e-6)


def test_a_longer_delay_makes_the_engine_ask_earlier_not_at_a_fixed_buffer():
    eng = engine(chunk_size=20)
    eng.tracker.add(0.05)  # d = 2
    early = eng.execution_plan()
    eng.tracker.add(0.4)  # d = 12 > H / 2: s = d, the violation is named
    late = eng.execution_plan()
    assert early.execution_steps == 10 and late.execution_steps == 12
    assert late.buffer_s < early.buffer_s


def test_an_explicit_buffer_wins_and_a_violation_is_warned_once_naming_d_s_h(caplog):
    eng = engine(chunk_size=30, buffer_time_s=0.9)  # asks again after s = 3 of 30 steps
    eng.tracker.add(0.25)  # d = 8
    with caplog.at_level(logging.WARNING, logger="edge.remote"):
        first = eng.execution_plan()
        again = eng.execution_plan()
    assert first.buffer_s == 0.9 and first.execution_steps == 3 and again == first
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and eng.counters["plan_warnings"] == 1
    assert "d=8, s=3, H=30" in warnings[0] and "buffer_time_s=0.9" in warnings[0]
    assert "0.267 and 0.733 s" in warnings[0]  # the buffers that would fit: 8 to 22 steps


def test_an_explicit_buffer_inside_the_constraint_is_silent(caplog):
    eng = engine(chunk_size=30, buffer_time_s=0.5)
    eng.tracker.add(0.2)  # d = 6 <= s = 15 <= 24
    with caplog.at_level(logging.WARNING, logger="edge.remote"):
        plan = eng.execution_plan()
    assert plan.execution_steps == 15 and not plan.violation and not caplog.records


def test_append_mode_asks_when_the_delay_plus_two_actions_are_left():
    eng = engine(chunk_size=30, rtc_enabled=False)
    eng.tracker.add(0.2)  # d = 6
    plan = eng.execution_plan()
    assert plan.buffer_steps == 8 and plan.execution_steps == 30 and not plan.violation


@pytest.mark.parametrize("value", [0, -0.1, "0.5", True])
def test_a_bad_buffer_is_refused_naming_the_field(value):
    with pytest.raises(ConfigError, match="buffer_time_s"):
        RemoteEngineConfig(model_id="arm", action_names=["a"], state_dim=1, buffer_time_s=value)


def test_by_default_one_slow_round_trip_does_not_set_the_delay_for_the_rest_of_the_session():
    """The default estimate is the p95 of the window: a retransmission (or a slow first request) lifts d while it is
    in the window's top 5 %, not for good as LeRobot's all_time_max does (docs/edge.md)."""
    eng = engine(chunk_size=30)
    assert eng.cfg.latency_mode == "percentile"
    eng.tracker.add(0.300)  # one 300 ms round trip: 9 steps at 30 Hz
    assert eng.delay_steps() == 9
    for _ in range(99):
        eng.tracker.add(0.060)  # then the link's usual 60 ms
    assert eng.delay_steps() == 2  # ceil(0.06 * 30)
    held = engine(chunk_size=30, latency_mode="all_time_max")
    for value in [0.300] + [0.060] * 99:
        held.tracker.add(value)
    assert held.delay_steps() == 9
