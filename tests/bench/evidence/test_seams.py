"""bench.evidence.seams on synthetic action sequences with known seams."""

from __future__ import annotations

import numpy as np
import pytest

from bench.evidence.seams import seam_metrics


def _ramp_with_jumps(n=120, chunk=10, jump=0.5):
    t = np.arange(n, dtype=float)
    actions = 0.01 * t
    seams = np.arange(0, n, chunk)
    for s in seams[1:]:
        actions[s:] += jump  # each new chunk starts off the old chunk's line
    return actions[:, None], seams


def test_jumps_at_seams_show_up_as_seam_steps_not_within_steps():
    actions, seams = _ramp_with_jumps()
    m = seam_metrics(actions, seams)
    assert m["seams"] == 11
    assert m["seam_step_median"] == pytest.approx(0.51)
    assert m["within_step_median"] == pytest.approx(0.01)
    assert m["step_ratio"] == pytest.approx(51)
    assert m["seam_jerk_median"] > 0.4 and m["within_jerk_median"] == pytest.approx(0, abs=1e-12)
    assert m["jerk_ratio"] > 1e6  # within-chunk jerk is rounding noise


def test_continuous_chunks_have_invisible_seams():
    t = np.arange(200, dtype=float)
    actions = np.stack([np.sin(0.05 * t), np.cos(0.05 * t)], axis=1)
    m = seam_metrics(actions, np.arange(0, 200, 25))
    assert m["step_ratio"] == pytest.approx(1.0, rel=0.05)
    assert m["seam_step_p95"] <= m["within_step_p95"] * 1.05


def test_differences_never_span_an_episode_start():
    actions, seams = _ramp_with_jumps(n=40, chunk=10, jump=0.0)
    actions[20:] += 100.0  # a reset between two episodes, not a seam
    m = seam_metrics(actions, seams, episode_starts=[0, 20])
    assert m["seams"] == 2  # ticks 10 and 30; 20 opens the second episode
    assert m["seam_step_median"] == pytest.approx(0.01)
    assert m["within_step_p95"] == pytest.approx(0.01)
    assert m["within_jerk_p95"] == pytest.approx(0.0, abs=1e-9)


def test_scale_weighs_dimensions_by_their_range():
    actions = np.zeros((30, 2))
    actions[15:, 0] = 2.0
    actions[15:, 1] = 0.2
    m = seam_metrics(actions, [0, 15], scale=np.array([4.0, 0.4]))
    assert m["seam_step_median"] == pytest.approx(np.hypot(0.5, 0.5))


def test_empty_sides_report_nan_not_errors():
    m = seam_metrics(np.zeros((5, 3)), [])
    assert m["seams"] == 0 and np.isnan(m["seam_step_median"]) and np.isnan(m["step_ratio"])
    assert m["within_step_count"] == 4


def test_row_norms_are_numpys_norm_bit_for_bit_and_square_the_differences_in_place():
    from bench.evidence.seams import row_norms

    rng = np.random.default_rng(5)
    for width in (1, 2, 7):
        d = rng.normal(0, 10.0 ** rng.integers(-8, 8, (1000, 1)), (1000, width))
        d[3, 0], d[5, -1] = np.nan, np.inf
        want = np.linalg.norm(d, axis=1)
        before = d.copy()
        got = row_norms(d)
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)
        assert np.array_equal(d, before * before, equal_nan=True)  # overwritten: the caller's differences are spent
