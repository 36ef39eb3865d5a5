"""Tick classification (ros2-performance thresholds) and the attribution of host lateness."""

from __future__ import annotations

import numpy as np
import pytest

from bench.fleet.ticks import (
    HOST_LATE,
    LATE,
    ON_TIME,
    TOO_LATE,
    TickSchedule,
    classify_tick,
    classify_ticks,
    slot_starved,
)

P = 1 / 30  # 33.3 ms


@pytest.mark.parametrize(
    "lateness_ms, host_ms, expected",
    [
        (0.0, 0.0, ON_TIME),
        (6.0, 5.9, ON_TIME),  # 6 ms <= 20 % of 33.3 ms
        (8.0, 0.5, LATE),  # the engine made it late
        (40.0, 1.0, TOO_LATE),  # more than a period, engine's fault
        (40.0, 30.0, HOST_LATE),  # the loop reached the robot 30 ms late: the bench's fault
        (10.0, 7.0, HOST_LATE),  # host delay alone is past the late threshold
    ],
)
def test_classify_tick(lateness_ms, host_ms, expected):
    assert classify_tick(lateness_ms / 1000, host_ms / 1000, P) == expected


def test_starved_slot_makes_late_ticks_host_late():
    assert classify_tick(0.010, 0.0, P, starved=True) == HOST_LATE
    assert classify_tick(0.001, 0.0, P, starved=True) == ON_TIME


def test_vectorised_matches_scalar():
    rng = np.random.default_rng(0)
    late = rng.uniform(0, 0.08, 500)
    host = late * rng.uniform(0, 1, 500)
    starved = rng.uniform(size=500) < 0.1
    vec = classify_ticks(late, host, P, starved)
    assert vec.tolist() == [classify_tick(a, b, P, c) for a, b, c in zip(late, host, starved)]


def test_each_tick_in_exactly_one_class():
    late = np.linspace(0, 0.1, 101)
    classes = classify_ticks(late, late / 2, P)
    assert set(np.unique(classes)) <= {ON_TIME, LATE, TOO_LATE, HOST_LATE}
    assert len(classes) == 101


def test_slot_starved_threshold():
    assert slot_starved(0.010, 0.002, P) is True
    assert slot_starved(0.004, 0.002, P) is False


def test_schedule_spreads_robots_over_phase_slots_and_skips_missed_ticks():
    sched = TickSchedule(100.0, [P] * 12 + [0.1] * 2, slots_per_period=4)
    assert len(sched.slots) == 4 + 2
    assert sorted(len(m) for m in sched.members) == [1, 1, 3, 3, 3, 3]
    sid, t = sched.next_due()
    assert t == 100.0
    # a loop that comes back 3 periods late skips the ticks already gone instead of bunching them
    skipped = sched.advance(sid, now=100.0 + 3.5 * sched.slots[sid][0])
    assert skipped >= 2
