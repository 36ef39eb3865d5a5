"""Action's fast __init__ (edge.engine._fast_init) builds the same frozen Action the dataclass's own would."""

import dataclasses
import inspect

import numpy as np
import pytest

from edge.engine import Action
from edge.queue import ActionQueue


def test_fast_init_keeps_fields_defaults_and_frozenness():
    v = np.zeros(3, np.float32)
    a = Action(v, "chunk", "s", 1, 2, 3, 0.5)
    assert (a.values is v, a.source, a.session_id, a.seq_id, a.episode_id, a.chunk_index, a.age_s) == (
        True,
        "chunk",
        "s",
        1,
        2,
        3,
        0.5,
    )
    d = Action(v, age_s=0.1)
    assert (d.source, d.session_id, d.seq_id, d.episode_id, d.chunk_index) == ("chunk", "", None, None, None)
    params = list(inspect.signature(Action).parameters)
    assert params == [f.name for f in dataclasses.fields(Action)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.source = "zero"
    assert dataclasses.replace(a, source="zero").is_fallback and not a.is_fallback


def test_queue_index_is_a_plain_int():
    q = ActionQueue(rtc_enabled=False, action_dim=2)
    c = np.ones((3, 2), np.float32)
    q.merge(c, c, 0, meta="m")
    q.get()
    q.merge(c, c, 0, meta="n")
    out = [q.get_with_meta() for _ in range(5)]
    assert [(m, i) for _, m, i in out] == [("m", 1), ("m", 2), ("n", 0), ("n", 1), ("n", 2)]
    assert all(type(i) is int for _, _, i in out)
