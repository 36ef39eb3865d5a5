"""RemoteEngine's reply handling (`_handle`) against arbitrary replies: a property test of the one class.

No network: the engine is never started; its session is a stand-in (epoch, ack) and its request in flight is
set as `_request` sets it. Whatever the replies, `_handle` raises nothing (the worker lives on), the queue
holds only finite rows of the robot's width, only a chunk that answers the request soundly is merged, and
only a final error of the current session makes the engine DEAD. The network-level attacks are in
test_remote_hostile.py.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from edge import RemoteEngineConfig
from edge.client import Event, Result
from edge.remote import RemoteEngine

A, H, EPOCH, SEQ, SENT_NS, SESSION = 3, 10, 4, 7, 123_456_789, "s-1"

finite = st.floats(-10, 10, allow_nan=False, width=32)
anything = st.floats(allow_nan=True, allow_infinity=True, width=64)
arrays = st.one_of(
    hnp.arrays(np.float32, st.just((H, A)), elements=finite),  # sound
    hnp.arrays(np.float64, st.just((H, A)), elements=anything),  # NaN, inf, beyond float32
    hnp.arrays(
        st.sampled_from([np.float32, np.float16, np.int32, np.uint8, np.bool_]),
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=12),
    ),
)
results = st.builds(
    lambda model, robot, seq, epoch, episode, session, sent: Result(
        seq, episode, epoch, model, robot, 0.05, 1.0, 2.0, t_recv=time.monotonic(), session_id=session, sent_ns=sent
    ),
    arrays,
    arrays,
    st.sampled_from([SEQ, SEQ - 1, SEQ + 1, 1]),
    st.sampled_from([EPOCH, EPOCH - 1, EPOCH + 1, 0]),
    st.sampled_from([0, 1, 2**32 - 1]),
    st.sampled_from([SESSION, "", "other"]),
    st.sampled_from([SENT_NS, 0, SENT_NS + 10**12, -1]),
)
events = st.builds(
    Event,
    st.sampled_from(["error", "drain", "bad_chunk"]),
    st.sampled_from(["INFERENCE_FAILED", "UNKNOWN_SESSION", "ACTION_MISMATCH", "WRONG_MODEL", "MALFORMED", "?"]),
    st.text(max_size=20),
    st.sampled_from([None, SEQ, SEQ + 1]),
    st.sampled_from([0, 1]),
    st.sampled_from([EPOCH, EPOCH - 1, 0]),
)


def engine() -> RemoteEngine:
    eng = RemoteEngine(RemoteEngineConfig(model_id="arm", action_names=["x", "y", "grip"], state_dim=4))
    eng._worker.session.model = SimpleNamespace(
        epoch=EPOCH, ack=SimpleNamespace(session_id=SESSION, chunk_size=H), replica=None
    )
    eng._handoff.episode = 0
    return eng


def sound(r) -> bool:
    arrays_ok = all(
        np.issubdtype(np.asarray(a).dtype, np.floating)
        and np.shape(a) == (H, A)
        and np.isfinite(np.asarray(a, np.float64)).all()
        and np.isfinite(np.asarray(a, np.float32)).all()
        for a in (r.chunk_model, r.chunk_robot)
    )
    return (
        arrays_ok
        and r.seq_id == SEQ
        and r.session_epoch == EPOCH
        and r.session_id == SESSION
        and r.sent_ns == SENT_NS
        and r.episode_id == 0
    )


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(results, events), min_size=1, max_size=6))
def test_no_reply_raises_and_only_a_sound_answer_to_the_request_is_merged(replies):
    eng = engine()
    eng._worker.replies.outstanding = (SEQ, EPOCH, 0, time.monotonic(), 0, 1, 0.5, 0.1, SENT_NS)
    merged_sound = False
    for r in replies:
        pending = eng._worker.replies.outstanding is not None
        chunks_before = eng.counters["chunks"]
        outcome = eng._worker.replies.handle(r)  # raises nothing, whatever r is
        if eng.counters["chunks"] > chunks_before:
            assert isinstance(r, Result) and pending and sound(r), r
            merged_sound = True
        if eng.failed:
            assert isinstance(r, Event) and r.session_epoch == EPOCH and r.code in ("ACTION_MISMATCH", "WRONG_MODEL")
            assert outcome == "error_final"
            break
        rows = eng.queue.get_processed_left_over()
        assert rows is None or (rows.shape[1] == A and np.isfinite(rows).all() and len(rows) > 0)
    if not merged_sound:
        assert eng.queue.qsize() == 0
