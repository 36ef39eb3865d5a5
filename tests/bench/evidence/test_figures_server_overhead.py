"""server_overhead_ms: the replica's own time on a request outside its queue wait and forward pass (part of
network_ms), as a series over the answered requests, an assertion's figure and a row of the latency budget."""

from __future__ import annotations

import numpy as np
import pytest

from bench.evidence.figures import RunData, compute, json_figures
from bench.evidence.report import latency_budget
from bench.scenario.assertions import evaluate


def data() -> RunData:
    overhead = np.array([5.0, 7.0, 11.0, np.nan, 40.0], np.float32)  # NaN: no audit line; 40: an expired request
    requests = {
        "robot": np.array([0, 0, 1, 1, 1], np.int32),
        "t": np.arange(5, dtype=float),
        "outcome": np.array(["ok", "ok", "ok", "ok", "expired"], object),
        "server_overhead_ms": overhead,
    }
    return RunData(
        robots={"robot": np.array([0, 1], np.int32), "group": np.array(["a", "b"], object)},
        ticks={},
        requests=requests,
        transitions={},
        episodes={},
        loop={},
        duration_s=5.0,
    )


def test_server_overhead_is_a_series_of_the_answered_requests_with_an_audit_line():
    top, groups = compute(data())
    f = json_figures(top)["server_overhead_ms"]
    assert f["count"] == 3 and f["p50"] == pytest.approx(7.0) and f["max"] == pytest.approx(11.0)
    assert json_figures(groups["b"])["server_overhead_ms"]["count"] == 1  # robot 1's one answered, audited request
    r = evaluate("p50(server_overhead_ms) < 8", top)
    assert r.passed and r.value == pytest.approx(7.0)


def test_the_latency_budget_shows_the_server_overhead():
    figures = json_figures(compute(data())[0])
    (row,) = [r for r in latency_budget(figures) if r["figure"] == "server_overhead_ms"]
    assert row["p50_ms"] == pytest.approx(7.0) and row["count"] == 3
