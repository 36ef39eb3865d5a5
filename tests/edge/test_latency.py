"""LatencyTracker: LeRobot's sticky all-time max by default; window modes forget a warm-up spike."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge.latency import LatencyTracker

samples = st.lists(st.one_of(st.floats(-1, 5, allow_nan=False), st.just(math.nan), st.just(math.inf)), max_size=60)


@given(samples)
def test_negative_and_non_finite_samples_are_ignored(xs):
    t = LatencyTracker(maxlen=10)
    for x in xs:
        t.add(x)
    good = [x for x in xs if math.isfinite(x) and x >= 0]
    assert len(t) == min(len(good), 10)
    assert t.max() == (max(good) if good else 0.0)


@given(st.lists(st.floats(0, 1), min_size=1, max_size=50), st.integers(1, 10))
def test_all_time_max_survives_window_eviction(xs, n):
    t = LatencyTracker(maxlen=n)
    t.add(9.0)  # warm-up spike
    for x in xs:
        t.add(x)
    assert t.max() == 9.0


def test_window_max_and_percentile_forget_a_warm_up_spike():
    w = LatencyTracker(maxlen=5, mode="window_max")
    p = LatencyTracker(maxlen=5, mode="percentile", percentile=50)
    for t in (w, p):
        t.add(2.0)
        for _ in range(5):
            t.add(0.1)
    assert w.max() == pytest.approx(0.1) and p.max() == pytest.approx(0.1)


@given(st.lists(st.floats(0, 10), min_size=1, max_size=40), st.floats(0, 100))
def test_percentile_lies_within_the_window(xs, q):
    t = LatencyTracker(maxlen=100)
    for x in xs:
        t.add(x)
    assert min(xs) - 1e-9 <= t.percentile(q) <= max(xs) + 1e-9


def test_reset_forgets_everything_and_bad_options_are_refused():
    t = LatencyTracker()
    t.add(1.0)
    t.reset()
    assert t.max() == 0.0 and len(t) == 0
    with pytest.raises(ValueError, match="latency mode"):
        LatencyTracker(mode="median")


@given(st.lists(st.floats(0, 10), min_size=1, max_size=40), st.sampled_from([50.0, 95.0, 99.0]))
def test_the_estimates_percentile_is_the_one_add_computed(xs, q):
    """In percentile mode, percentile(q) at the estimate's own q reads add()'s value: the same number."""
    import numpy as np

    t = LatencyTracker(maxlen=100, mode="percentile", percentile=q)
    for x in xs:
        t.add(x)
    assert t.percentile(q) == t.max() == pytest.approx(float(np.percentile(xs, q)))
    assert t.percentile(q / 2) == pytest.approx(float(np.percentile(xs, q / 2)))  # any other q: computed


@given(st.lists(st.floats(0, 10), min_size=1, max_size=80), st.integers(1, 20), st.floats(0, 100))
def test_the_sorted_window_follows_evictions_exactly_as_numpy(xs, maxlen, q):
    """After any run of adds past the window's length, every estimate is numpy's over the last `maxlen`."""
    import numpy as np

    last = xs[-maxlen:]
    p = LatencyTracker(maxlen=maxlen, mode="percentile", percentile=q)
    w = LatencyTracker(maxlen=maxlen, mode="window_max")
    for x in xs:
        p.add(x)
        w.add(x)
    assert p.max() == pytest.approx(float(np.percentile(last, q)), abs=1e-12)
    assert p.percentile(100 - q) == pytest.approx(float(np.percentile(last, 100 - q)), abs=1e-12)
    assert w.max() == max(last) and len(p) == len(last)


@pytest.mark.parametrize("q", [-50.0, -0.1, 100.5, 150.0, math.nan])
def test_a_percentile_outside_0_to_100_is_refused_not_read_from_a_wrapped_index(q):
    t = LatencyTracker(maxlen=10, mode="percentile")
    for x in range(10):
        t.add(x / 10)
    with pytest.raises(ValueError, match=r"percentile must be in \[0, 100\]"):
        t.percentile(q)
