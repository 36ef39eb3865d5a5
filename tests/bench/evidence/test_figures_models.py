"""wrong_model_actions: chunk actions executed from a session serving another checkpoint than the
robot's first one, found by joining the ticks' session ids with the servers' audit lines."""

from __future__ import annotations

import numpy as np

from bench.evidence.figures import SCALARS, RunData, _Scope


def data(sessions: list[str], sources: list[str], hashes: dict[str, str]) -> RunData:
    n = len(sessions)
    ticks = {
        "robot": np.zeros(n, np.int32),
        "t": np.arange(n, dtype=float) / 30.0,
        "session_id": np.array(sessions, object),
        "source": np.array(sources, object),
        "is_none": np.array([s == "none" for s in sources]),
    }
    return RunData(
        robots={"robot": np.array([0], np.int32), "group": np.array(["g"], object)},
        ticks=ticks,
        requests={},
        transitions={},
        episodes={},
        loop={},
        duration_s=n / 30.0,
        session_checkpoints=hashes,
    )


def wrong(d: RunData) -> int:
    return SCALARS["wrong_model_actions"](_Scope(d, None))


def test_chunks_of_a_reconnected_session_on_another_checkpoint_count():
    d = data(["a", "a", "b", "b", "b"], ["chunk"] * 5, {"a": "h1", "b": "h2"})
    assert wrong(d) == 3


def test_a_reconnect_to_the_same_checkpoint_and_fallbacks_do_not_count():
    assert wrong(data(["a", "a", "b", "b"], ["chunk"] * 4, {"a": "h1", "b": "h1"})) == 0
    assert wrong(data(["a", "b", "b"], ["chunk", "zero", "repeat_last"], {"a": "h1", "b": "h2"})) == 0
