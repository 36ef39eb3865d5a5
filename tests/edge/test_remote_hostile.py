"""The remote engine against a broken or hostile server, over a real router (tests/edge/responder.py's fault knobs).

What a robot may never get, whatever the server sends: a non-finite action, an action of another width, an
action of a chunk that does not answer its request. What it must get: its fallback, a state that says why
(DEGRADED, STALLED), the reply counted (`bad_chunks`, `errors`), the fallback ladder (a streak of bad chunks
reconnects, a session that gives nothing backs off), and a worker that lives on.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from edge import EngineState, RemoteEngineConfig, make_engine
from tests.edge.conftest import ACTION_NAMES, S
from tests.edge.responder import Responder
from wire import ActionChunk, Error, ErrorCode, MsgType, ResetAck

FPS = 30.0
GOOD = 2  # chunks answered soundly before the fault starts


def engine(router, **kw):
    cfg = dict(
        connect_endpoints=[router],
        model_id="arm",
        fps=FPS,
        action_names=ACTION_NAMES,
        state_dim=S,
        request_timeout_s=1.0,
        reconnect_initial_backoff_s=0.1,
        reconnect_max_backoff_s=0.3,
        max_offline_s=30.0,
        lease_ms=500,
        execution_horizon=5,
        buffer_time_s=0.2,
        fallback="zero",
    )
    cfg.update(kw)
    return make_engine(RemoteEngineConfig(**cfg))


def loop(eng, seconds, until=None):
    """A 30 Hz control loop; returns every action it got (None included)."""
    out, t0, k = [], time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        eng.notify_observation({"state": np.full(S, 0.01 * k, np.float32)})
        out.append(eng.get_action())
        if until is not None and until():
            break
        k += 1
        time.sleep(max(0.0, t0 + k / FPS - time.monotonic()))  # the robot's own clock: this IS the control loop
    return out


def after_good(fault):
    """A tamper knob: the first GOOD answers sound, every later one through `fault(chunk, header)`."""
    answered = [0]

    def tamper(chunk, header):
        answered[0] += 1
        return (chunk, header) if answered[0] <= GOOD else fault(chunk, header)

    return tamper


def both(f):
    """The chunk with `f` applied to both spaces."""
    return lambda c, h: (dataclasses.replace(c, chunk_model=f(c.chunk_model), chunk_robot=f(c.chunk_robot)), h)


def poke(value):
    def f(a):
        a = np.array(a, np.float32)
        a[3, 1] = value
        return a

    return f


FAULTS = {
    "nan": (both(poke(np.nan)), "non-finite"),
    "inf": (both(poke(-np.inf)), "non-finite"),
    "nan_in_model_space_only": (
        lambda c, h: (dataclasses.replace(c, chunk_model=poke(np.nan)(c.chunk_model)), h),
        "non-finite",
    ),
    "float64_beyond_float32": (both(lambda a: np.full(a.shape, 1e300)), "non-finite"),
    "no_rows": (both(lambda a: a[:0]), "10 rows"),
    "too_few_rows": (both(lambda a: a[:3]), "10 rows"),
    "huge": (both(lambda a: np.resize(a, (200_000, a.shape[1]))), "10 rows"),
    "too_wide": (both(lambda a: np.zeros((a.shape[0], 5), np.float32)), "5 action dims"),
    "too_narrow": (both(lambda a: a[:, :1].copy()), "1 action dims"),
    "int32": (both(lambda a: (a * 1000).astype(np.int32)), "floating point"),
    "bool": (both(lambda a: a > 0), "floating point"),
    "another_session": (lambda c, h: (dataclasses.replace(c, session_id="not-yours"), h), "names session"),
    "another_episode": (lambda c, h: (c, dataclasses.replace(h, episode_id=h.episode_id + 7)), "echoes episode"),
    "client_mono_ns_of_0": (
        lambda c, h: (dataclasses.replace(c, client_mono_ns_echo=0), dataclasses.replace(h, client_mono_ns=0)),
        "echoes client_mono_ns",
    ),
    "client_mono_ns_from_the_future": (
        lambda c, h: (dataclasses.replace(c, client_mono_ns_echo=c.client_mono_ns_echo + 10**12), h),
        "echoes client_mono_ns",
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_bad_chunk_is_refused_counted_and_degrades_the_engine_never_reaching_the_robot(router, fault):
    tamper, words = FAULTS[fault]
    resp = Responder(router, state_dim=S, chunk_size=10, tamper=after_good(tamper)).start()
    eng = engine(router)
    eng.start()
    try:
        actions = loop(eng, 6.0, until=lambda: eng.stats.get("bad_chunks", 0) >= 4 and eng.state == EngineState.STALLED)
        got = [a for a in actions if a is not None]
        # what the robot got first: never a non-finite action nor one of another width; the sound chunks' rows
        # (state[0] + a ramp of at most 0.0092, from the first GOOD requests), then the zero fallback
        assert all(a.values.shape == (3,) and np.isfinite(a.values).all() for a in got)
        assert all(a.source == "zero" or (a.seq_id <= GOOD + 1 and abs(float(a.values[0])) < 1.0) for a in got), got
        assert any(a.source == "chunk" for a in got) and got[-1].source == "zero"
        st = eng.stats
        assert st["chunks"] == GOOD and st.get("bad_chunks", 0) >= 4, st
        assert words in st["last_error"] and st["last_error"].startswith("bad chunk: "), st["last_error"]
        # the state said why: the request failed (DEGRADED), nothing fresh (STALLED); a streak of them reconnects
        reasons = [(new, why) for _, _, new, why in eng.drain_transitions()]
        assert any(new == "DEGRADED" and why.startswith("bad chunk: ") for new, why in reasons), reasons
        assert eng.state == EngineState.STALLED and not eng.failed
        assert st["reconnects"] >= 1
        assert "bad_chunk" in {r["outcome"] for r in eng.drain_records()}
    finally:
        eng.stop()
        resp.close()


@pytest.mark.parametrize(
    "changes,code",
    [
        ({"action_names": ["a", "b"]}, "ACTION_MISMATCH"),
        ({"state_dim": S + 1}, "STATE_DIM_MISMATCH"),
        ({"model_id": "another"}, "WRONG_MODEL"),
        ({"chunk_size": 0}, "MALFORMED"),
    ],
)
def test_a_session_ack_that_disagrees_with_the_request_is_refused_and_nothing_is_executed(router, changes, code):
    """The responder acknowledges a model other than the one asked for (and answers with chunks of its width):
    before, the engine streamed from it (a 2-wide action on a 3-action robot)."""
    width = len(changes.get("action_names", ACTION_NAMES))
    resp = Responder(
        router,
        state_dim=S,
        chunk_size=10,
        ack_changes=changes,
        tamper=lambda c, h: (
            dataclasses.replace(c, chunk_model=c.chunk_model[:, :width], chunk_robot=c.chunk_robot[:, :width]),
            h,
        ),
    ).start()
    eng = engine(router)
    eng.start()
    try:
        actions = loop(eng, 5.0, until=lambda: eng.failed)
        assert eng.failed and eng.state == EngineState.DEAD
        assert eng.stats["dead_reason"].startswith(f"session refused: {code}: "), eng.stats["dead_reason"]
        assert eng.stats["chunks"] == 0 and all(a is None or a.source == "zero" for a in actions)
    finally:
        eng.stop()
        resp.close()


@pytest.mark.parametrize(
    "changes,words",
    [
        ({"chunk_size": 20}, "chunk_size 10 -> 20"),
        # pinned on reconnect: a sound replica refuses in words; this one acknowledges another hash (the client refuses)
        ({"checkpoint_hash": "b" * 64}, "WRONG_MODEL: replica r0 acknowledged checkpoint"),
        ({"policy_type": "act"}, "policy_type 'flow_matching' -> 'act'"),
    ],
)
def test_a_reconnect_whose_ack_disagrees_with_the_first_is_dead_and_executes_nothing_of_it(router, changes, words):
    resp = Responder(router, state_dim=S, chunk_size=10).start()
    eng = engine(router, max_action_age_s=0.5)
    eng.start()
    try:
        loop(eng, 5.0, until=lambda: eng.stats["chunks"] >= 3)
        resp.restart(ack_changes=changes)  # the same model's keys, another model in the ack
        actions = loop(eng, 8.0, until=lambda: eng.failed)
        assert eng.failed and words in eng.stats["dead_reason"], eng.stats["dead_reason"]
        assert all(
            a is None or a.source == "zero" or a.session_id != eng.stats["session_id"] or a.seq_id <= 4 for a in actions
        )
        assert eng.get_action().source == "zero"
    finally:
        eng.stop()
        resp.close()


def test_events_about_an_older_session_neither_kill_the_robot_nor_fail_its_request(router):
    """Before each chunk the server replays an ACTION_MISMATCH and an error for the same seq, both from a session
    epoch this robot left: seq ids restart at 1 in each session, and a final code went DEAD whatever its epoch."""

    def stale(h, obs):
        old = dataclasses.replace(h, msg_type=MsgType.EVENT, session_epoch=h.session_epoch - 1)
        return [
            (Error(ErrorCode.ACTION_MISMATCH, "stale").encode(), old.pack()),
            (Error("INFERENCE_FAILED", "stale", seq_id=h.seq_id).encode(), old.pack()),
        ]

    resp = Responder(router, state_dim=S, chunk_size=10, extra_replies=stale).start()
    eng = engine(router)
    eng.start()
    try:
        loop(eng, 6.0, until=lambda: eng.stats["chunks"] >= 5)
        st = eng.stats
        assert not eng.failed and st["chunks"] >= 5 and st["errors"] == 0, st
    finally:
        eng.stop()
        resp.close()


def test_garbage_on_the_reply_key_is_counted_and_the_stream_goes_on(router):
    def garbage(h, obs):
        chunk = dataclasses.replace(h, msg_type=MsgType.CHUNK)
        return [
            (b"\x00 not msgpack", chunk.pack()),  # undecodable body
            (b"\x81\xa4kind\xa5error", b"short attachment"),  # a header of the wrong size
            (b"", None),  # no attachment at all
            (
                ActionChunk(
                    obs.session_id,
                    h.seq_id + 1,
                    h.client_mono_ns,
                    np.full((10, 3), 99.0, np.float32),
                    np.full((10, 3), 99.0, np.float32),
                ).encode(),
                chunk.pack(),
            ),  # header and body disagree
            (
                ActionChunk(
                    obs.session_id,
                    h.seq_id + 1,
                    h.client_mono_ns,
                    np.full((10, 3), 99.0, np.float32),
                    np.full((10, 3), 99.0, np.float32),
                ).encode(),  # a sound chunk for a seq never sent
                dataclasses.replace(chunk, seq_id=h.seq_id + 1).pack(),
            ),
        ]

    resp = Responder(router, state_dim=S, chunk_size=10, extra_replies=garbage).start()
    eng = engine(router)
    eng.start()
    try:
        actions = loop(eng, 6.0, until=lambda: eng.stats["chunks"] >= 5)
        st = eng.stats
        assert all(a is None or float(a.values[0]) < 50 for a in actions)
        assert st["chunks"] >= 5 and st.get("bad_chunks") >= 4 * 5 and st["errors"] == 0 and not eng.failed, st
        assert st["late_chunks"] >= 5  # the chunks for seqs never sent: answering nothing, never merged
    finally:
        eng.stop()
        resp.close()


def test_an_error_for_the_request_degrades_the_engine_and_its_state_says_so(router):
    """Every request is answered INFERENCE_FAILED (its chunk follows, too late to count): before, the state stayed
    STREAMING while the robot got nothing but its fallback."""

    def fail(h, obs):
        return [
            (
                Error("INFERENCE_FAILED", "no GPU", seq_id=h.seq_id).encode(),
                dataclasses.replace(h, msg_type=MsgType.EVENT).pack(),
            )
        ]

    resp = Responder(router, state_dim=S, chunk_size=10, extra_replies=fail).start()
    eng = engine(router)
    eng.start()
    try:
        loop(eng, 6.0, until=lambda: eng.stats["errors"] >= 5 and eng.state == EngineState.STALLED)
        assert eng.state == EngineState.STALLED and eng.stats["chunks"] == 0
        reasons = [(new, why) for _, _, new, why in eng.drain_transitions()]
        assert ("DEGRADED", "server error INFERENCE_FAILED") in reasons, reasons
        assert "error:INFERENCE_FAILED" in {r["outcome"] for r in eng.drain_records()}
    finally:
        eng.stop()
        resp.close()


@pytest.mark.parametrize("fault", ["drain_on_open", "unknown_session_on_every_request"])
def test_a_replica_that_ends_every_session_before_a_chunk_is_asked_again_with_a_growing_backoff(router, fault):
    """It acknowledges, then drains (or forgets) the session at once. The backoff used to start over at every ack,
    so the robot reopened every reconnect_initial_backoff_s or sooner (51 reconnects in 4 s); now it grows until a
    session gives a chunk."""

    def forget(h, obs):
        return [
            (
                Error(ErrorCode.UNKNOWN_SESSION, "forgot", seq_id=h.seq_id).encode(),
                dataclasses.replace(h, msg_type=MsgType.EVENT).pack(),
            )
        ]

    kw = {"drain_on_open": True} if fault == "drain_on_open" else {"extra_replies": forget, "hang": False}
    resp = Responder(router, state_dim=S, chunk_size=10, **kw).start()
    eng = engine(router, reconnect_initial_backoff_s=0.05, reconnect_max_backoff_s=1.0)
    eng.start()
    try:
        loop(eng, 4.0)
        # 0.05 s doubling to 1 s, jittered: at most ~10 opens in 4 s (before: 50 and more)
        assert 2 <= resp.opens <= 15, resp.opens
        assert eng.stats["chunks"] == 0 and not eng.failed
    finally:
        eng.stop()
        resp.close()


def test_a_drain_notice_after_chunks_still_reconnects_at_once_elsewhere(router):
    """The growing backoff is for sessions that give nothing: one that streamed and then drains is left at once."""
    a = Responder(router, state_dim=S, chunk_size=10, replica_id="r0").start()
    b = Responder(router, state_dim=S, chunk_size=10, replica_id="r1").start()
    eng = engine(router, reconnect_initial_backoff_s=2.0, reconnect_max_backoff_s=4.0, replica_order=["r0", "r1"])
    eng.start()
    try:
        loop(eng, 5.0, until=lambda: eng.stats["chunks"] >= 3)
        a.drain()
        t0 = time.monotonic()
        loop(eng, 5.0, until=lambda: eng.stats["replica_id"] == "r1" and eng.state == EngineState.STREAMING)
        assert eng.stats["replica_id"] == "r1" and time.monotonic() - t0 < 1.5  # no 1-2 s backoff first
    finally:
        eng.stop()
        a.close()
        b.close()


@pytest.mark.parametrize("changes", [{"replica_id": "r9/../*"}, {"replica_id": ""}, {"model_id": "another"}])
def test_a_status_naming_an_impossible_or_other_replica_is_skipped_and_the_sound_one_opens(router, changes):
    """Discovery reads every Status on the model's key. One whose replica_id is no key chunk made the open raise
    (WireError from its keys) before the sound replica was tried: every round, when it sorted first (here always:
    the sound one reports itself full, load 1, so discovery's draw puts it last)."""
    sound = Responder(router, state_dim=S, chunk_size=10, replica_id="r0", status_changes={"load": 1.0}).start()
    liar = Responder(
        router, state_dim=S, chunk_size=10, replica_id="r1", status_changes={"load": 0.0, **changes}
    ).start()
    eng = engine(router)
    eng.start()
    try:
        loop(eng, 6.0, until=lambda: eng.stats["chunks"] >= 2)
        assert eng.stats["chunks"] >= 2 and eng.stats["replica_id"] == "r0", eng.stats
    finally:
        eng.stop()
        sound.close()
        liar.close()


@pytest.mark.parametrize("reply", [b"\x00 not msgpack", b"\x81\xa4kind\xa9no_such_kind", ResetAck("s", 1).encode()])
def test_a_replica_answering_the_session_open_with_garbage_is_passed_over_not_fatal(router, reply):
    """A reply that does not decode (or is not an ack) is a broken replica, not a refusal in words: the robot
    went DEAD (`session refused: MALFORMED`) although a sound replica served the same model."""
    sound = Responder(router, state_dim=S, chunk_size=10, replica_id="r0", status_changes={"load": 1.0}).start()
    broken = Responder(
        router, state_dim=S, chunk_size=10, replica_id="r1", status_changes={"load": 0.0}, session_reply=reply
    ).start()
    eng = engine(router)
    eng.start()
    try:
        loop(eng, 6.0, until=lambda: eng.stats["chunks"] >= 2 or eng.failed)
        assert not eng.failed, eng.stats["dead_reason"]
        assert eng.stats["chunks"] >= 2 and eng.stats["replica_id"] == "r0", eng.stats
    finally:
        eng.stop()
        sound.close()
        broken.close()
