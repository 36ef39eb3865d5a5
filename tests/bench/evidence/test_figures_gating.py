"""Figures that mean what their names say (issue 23): gating is not a stall, goodput has a budget at H = 0."""

import numpy as np

from bench.evidence.figures import SCALARS, RunData, _Scope
from bench.run.runner import _rtc_budget_s


def _data(states, none, source):
    n = len(states)
    ticks = {
        "t": np.linspace(0, 1, n),
        "robot": np.zeros(n, np.int32),
        "engine_state": np.array(states, object),
        "is_none": np.array(none, bool),
        "source": np.array(source, object),
    }
    return RunData(
        robots={"robot": np.array([0], np.int32)},
        ticks=ticks,
        requests={},
        transitions={},
        episodes={},
        loop={},
        duration_s=1.0,
    )


def test_waiting_for_the_first_chunk_is_gating_not_a_stall_and_the_parts_add_up():
    # 2 ticks awaiting an episode's first chunk on a healthy link, 3 chunk ticks, 2 None ticks while STALLED,
    # 1 repeat_last: the old figures called the first two neither fallback nor anything but "none"
    s = _Scope(
        _data(
            ["STREAMING"] * 5 + ["STALLED"] * 3,
            [1, 1, 0, 0, 0, 1, 1, 0],
            ["none", "none", "chunk", "chunk", "chunk", "none", "none", "repeat_last"],
        ),
        None,
    )
    f = {k: SCALARS[k](s) for k in ("gating_ticks", "gating_tick_ratio", "hold_ticks", "none_ticks", "fallback_ticks")}
    assert f["gating_ticks"] == 2 and f["gating_tick_ratio"] == 2 / 8
    assert f["none_ticks"] == f["gating_ticks"] + f["hold_ticks"] == 4
    assert f["fallback_ticks"] == 3  # hold (2) + repeat_last (1): gating is not a fallback


def test_the_goodput_budget_is_positive_for_every_execution_horizon():
    assert _rtc_budget_s({"execution_horizon": 10}, 30.0) == 10 / 30 / 2
    assert _rtc_budget_s({"execution_horizon": 0, "buffer_time_s": 0.4}, 30.0) == 0.4  # was 0: no answer met it
    assert _rtc_budget_s({"execution_horizon": 10, "rtc_enabled": False}, 30.0) == 0.5  # append mode: buffer_time_s
