"""What the report phase holds per robot-tick: a scope masks a column when a figure reads it, and the seam inputs
of the measured window come from the unfiltered, sorted tick columns exactly as from a filtered copy."""

import numpy as np
import pytest

from bench.evidence.figures import RunData, ScopeRows, _Scope, compute, measured_seam_inputs, seam_inputs


def test_scope_rows_read_like_the_masked_columns():
    tab = {
        "robot": np.array([0, 0, 1, 1], np.int32),
        "t": np.array([-1.0, 0.5, 0.2, 9.0]),
        "source": np.array(["none", "chunk", "chunk", "zero"], object),
    }
    mask = np.array([False, True, True, False])
    rows = ScopeRows(tab, mask)
    assert "source" in rows and "seq" not in rows and len(rows) == 3 and bool(rows) and list(rows) == list(tab)
    assert rows.get("seq") is None and rows.get("seq", 7) == 7
    with pytest.raises(KeyError):
        rows["seq"]
    assert rows["source"].tolist() == ["chunk", "chunk"] and rows.get("t").tolist() == [0.5, 0.2]
    assert not np.shares_memory(rows["t"], tab["t"])  # a copy of the scope's rows, the table's left as it was
    assert dict(rows.items()).keys() == tab.keys() and rows["robot"].tolist() == [0, 1]
    everything = ScopeRows(tab, None)  # no robot filter, no window: the columns themselves, not copies
    assert everything["t"] is tab["t"]


def test_a_groups_scope_counts_its_own_robots_measured_ticks():
    ticks = {
        "robot": np.array([0, 0, 0, 1, 1, 2], np.int32),
        "t": np.array([-0.5, 0.1, 0.2, 0.1, 5.0, 0.3]),
        "is_none": np.array([1, 0, 1, 0, 0, 1], bool),
        "tick_class": np.zeros(6, np.int8),
        "source": np.array(["none", "chunk", "none", "chunk", "chunk", "none"], object),
        "engine_state": np.array(["STREAMING"] * 6, object),
        "action_age_s": np.full(6, 0.1, np.float32),
        "lateness_ms": np.ones(6, np.float32),
    }
    data = RunData(
        robots={"robot": np.array([0, 1, 2], np.int32), "group": np.array(["a", "a", "b"], object)},
        ticks=ticks,
        requests={},
        transitions={},
        episodes={},
        loop={},
        duration_s=1.0,
    )
    top, groups = compute(data)
    assert top.scalars["ticks"] == 4 and top.scalars["none_ticks"] == 2  # t = -0.5 and t = 5.0 are outside
    assert groups["a"].scalars["ticks"] == 3 and groups["a"].scalars["none_ticks"] == 1
    assert groups["b"].scalars["ticks"] == 1 and groups["b"].scalars["none_ticks"] == 1
    assert _Scope(data, np.array([1])).ticks["robot"].tolist() == [1]


def test_measured_seam_inputs_equal_those_of_the_filtered_ticks():
    rng = np.random.default_rng(3)
    robots = np.repeat(np.arange(4, dtype=np.int32), 60)
    t = np.concatenate([np.sort(rng.uniform(-2.0, 4.0, 60)) for _ in range(4)])  # sorted by (robot, t)
    t[59] = np.nan  # a robot's last row with no time: outside the window either way
    ticks = {
        "robot": robots,
        "t": t,
        "seq": np.arange(240) // 5,
        "robot_episode": np.arange(240) // 40,
        "is_none": rng.random(240) < 0.2,
    }
    actions = [rng.uniform(-1, 1, 2).astype(np.float32) for _ in range(240)]
    scale = {0: np.array([2.0, 4.0]), 2: np.array([1.0, 0.5])}
    keep = t >= 0
    want = seam_inputs(
        robots[keep],
        ticks["seq"][keep],
        ticks["robot_episode"][keep],
        ticks["is_none"][keep],
        [a for a, k in zip(actions, keep) if k],
        scale,
    )
    got = measured_seam_inputs(ticks, actions, scale)
    assert want and got.keys() == want.keys()
    for r in want:
        for x, y in zip(got[r], want[r]):
            assert x.dtype == y.dtype and np.array_equal(x, y)
    # warm-up rows are not executed actions of the window: marking them None is not the same as keeping them
    unwindowed = seam_inputs(robots, ticks["seq"], ticks["robot_episode"], ticks["is_none"], actions, scale)
    assert any(len(unwindowed[r][0]) != len(want[r][0]) for r in want)
