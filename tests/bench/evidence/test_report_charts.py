"""The report's time charts draw only what was measured: a replica's series breaks across the seconds in which
it was not scraped (down, restarting), a per-shard share breaks where the shard had no ticks, and the fault
window is shaded beside it."""

from __future__ import annotations

import re

import numpy as np

from bench.evidence import svg
from bench.evidence.figures import RunData
from bench.evidence.report.charts import SCRAPE_GAP_S, _server_chart
from bench.evidence.report.fidelity import _shard_fidelity_chart


def _polylines(chart: str) -> list[list[tuple[float, float]]]:
    return [
        [tuple(map(float, p.split(","))) for p in m.split()]
        for m in re.findall(r'<polyline fill="none" stroke="[^"]+" stroke-width="1.4" points="([^"]*)"', chart)
    ]


def _run(server_samples=(), ticks=None, robots=None) -> RunData:
    return RunData(robots or {}, ticks or {}, {}, {}, {}, {}, 120.0, server_samples=list(server_samples))


def test_segments_break_at_gaps_and_missing_values_and_keep_breaks_when_thinned():
    x = np.array([0, 1, 2, 30, 31, 32, 33], float)
    y = np.array([5, 5, np.nan, 1, 2, 3, 4], float)
    segs = svg.segments(x, y, gap=2.5)
    assert [s[0].tolist() for s in segs] == [[0, 1], [30, 31, 32, 33]]
    assert [s[0].tolist() for s in svg.segments(x, y, gap=None)] == [[0, 1], [30, 31, 32, 33]]
    assert [s[0].tolist() for s in svg.segments(x[3:], y[3:], gap=None)] == [[30, 31, 32, 33]]
    big_x = np.concatenate([np.arange(0, 5000.0), np.arange(9000, 14000.0)])  # a 4000 s gap inside 10k points
    segs = svg.segments(big_x, np.ones(len(big_x)), gap=2.5, max_points=300)
    assert len(segs) == 2 and segs[0][0].max() < 5000 <= 9000 <= segs[1][0].min()
    assert sum(len(s[0]) for s in segs) <= 300


def test_a_restarted_replicas_series_breaks_across_the_seconds_it_was_not_scraped():
    samples = []
    for t in np.arange(0.0, 120.0, 1.0):
        samples.append({"t": t, "replica": "r0", "metric": "active_sessions", "value": 100.0})
        if t < 80 or t >= 104:  # r1 restarted at 80 s and was scraped again from 104 s
            samples.append({"t": t, "replica": "r1", "metric": "active_sessions", "value": 101.0 if t < 80 else 0.0})
    chart = _server_chart(
        _run(samples), "active_sessions", "Active sessions per replica", [(80.0, 104.0, "restart r1")]
    )
    lines = _polylines(chart)
    assert len(lines) == 3  # r0 whole, r1 before the restart and after it: nothing drawn across the gap
    r1_before, r1_after = lines[1], lines[2]
    assert max(x for x, _ in r1_before) < min(x for x, _ in r1_after)
    gap_px = min(x for x, _ in r1_after) - max(x for x, _ in r1_before)
    second_px = r1_before[1][0] - r1_before[0][0]
    assert gap_px > SCRAPE_GAP_S * second_px  # the break spans the unscraped 24 s, not one sampling step
    assert "restart r1" in chart  # the fault window is shaded and labelled


def test_a_shards_host_late_share_is_not_drawn_where_it_had_no_ticks():
    t = np.concatenate([np.arange(0, 40, 0.1), np.arange(60, 120, 0.1)])  # no ticks from 40 s to 60 s
    ticks = {"t": t, "robot": np.zeros(len(t), int), "tick_class": np.where(t > 100, 3, 0)}
    chart = _shard_fidelity_chart(_run(ticks=ticks, robots={"robot": np.array([0]), "shard": np.array([0])}), [])
    lines = _polylines(chart)
    assert len(lines) == 2  # before and after the silent 20 s, no line at 0 % between them
