"""The plain client API over a real router against the test responder: handshake, round trip,
replicas, refusals, reset, UNKNOWN_SESSION and drain events."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge.client import Connection, Event, NoReplica, Result, SessionRefused
from tests.edge.responder import HASH_A, Responder, expected_chunk
from wire import SCHEMA_VERSION, ActionChunk, Error, ErrorCode, Header, MsgType

NAMES = ["x", "y", "grip"]
S, T = 4, 10


@pytest.fixture
def responders(router):
    started: list[Responder] = []

    def make(**kw) -> Responder:
        r = Responder(router, **kw).start()
        started.append(r)
        return r

    yield make
    for r in started:
        r.close()


def open_model(conn, timeout_s=5.0, **kw):
    """Open a session; a just-started responder reaches the router asynchronously, so retry NoReplica."""
    args = dict(action_names=NAMES, state_dim=S, fps=30.0, rtc_enabled=True, execution_horizon=5)
    args.update(kw)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return conn.model("arm", **args)
        except NoReplica:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def waited_s(exc: Exception) -> tuple[float, float]:
    """The wait and the timeout a NoReplica message reports ("waited 0.4 s, timeout 0.4 s"), to be judged with
    bounds, not as text: a loaded host adds tens of ms to any wait, and the message rounds to 0.1 s."""
    found = re.search(r"waited (\d+\.\d) s, timeout (\d+\.\d) s", str(exc))
    assert found, str(exc)
    return float(found.group(1)), float(found.group(2))


def round_trip(m, state, timeout_ms=3000, resend_after_s=1.0, **kw):
    """observe + the answer to that observation. The first put may race the subscription's propagation (lost), so
    an observation unanswered after `resend_after_s` is sent again; an answer to an earlier one (late, not lost, on
    a loaded host) is dropped here: answers come in order, so none is left for the test's next get_result."""
    deadline = time.monotonic() + timeout_ms / 1e3
    seq = None
    while time.monotonic() < deadline:
        seq = m.observe(state=state, **kw)
        resend_at = min(time.monotonic() + resend_after_s, deadline)
        while (left := resend_at - time.monotonic()) > 0:
            r = m.get_result(left * 1e3)
            if r is None:
                break
            if isinstance(r, Result) and r.seq_id != seq:
                continue  # an earlier observation's late answer
            return seq, r
    return seq, None


def test_handshake_acks_the_models_capabilities(router, responders):
    responders()
    with Connection(router, "robot-1", "test") as conn:
        m = open_model(conn)
        assert m.ack.checkpoint_hash == HASH_A and m.ack.action_names == NAMES and m.ack.state_dim == S
        assert m.ack.rtc_enabled and m.ack.session_id and m.replica.replica_id == "r0" and m.epoch == 1


def test_observe_and_get_result_round_trip(router, responders):
    r0 = responders()
    with Connection(router, "robot-1") as conn:
        m = open_model(conn)
        state = np.array([0.5, 0, 0, 0], np.float32)
        seq, r = round_trip(
            m,
            state,
            urgency=0.9,
            inference_delay_steps=2,
            prefix_model=np.zeros((5, 3), np.float32),
            images={"front": np.zeros((8, 8, 3), np.uint8)},
            note="hello",
            depth=np.ones((2, 2)),
        )
        assert isinstance(r, Result) and r.seq_id == seq and r.session_epoch == m.epoch and r.episode_id == 0
        np.testing.assert_allclose(r.chunk_robot, expected_chunk(state, T, 3))
        assert r.chunk_model.shape == (T, 3) and 0 < r.rtt_s < 3 and r.error is None
        _, h, obs = r0.obs_log[-1]
        assert h.seq_id == seq and h.session_epoch == m.epoch and obs.urgency == pytest.approx(0.9)
        assert obs.inference_delay_steps == 2 and obs.images["front"].codec == "jpeg"
        assert obs.metadata == {"note": "hello"} and obs.tensors["depth"].shape == (2, 2)


def test_seq_ids_increase_from_one_and_headers_carry_monotonic_time(router, responders):
    r0 = responders()
    with Connection(router, "robot-1") as conn:
        m = open_model(conn)
        round_trip(m, np.zeros(S))
        before = time.monotonic_ns()
        seqs = [m.observe(state=np.zeros(S)) for _ in range(3)]
        assert r0.wait_for(lambda r: len(r.obs_log) >= 4 and r.obs_log[-1][1].seq_id == seqs[-1], 3.0)
        logged = [h.seq_id for _, h, _ in r0.obs_log]
        assert logged == sorted(logged) and len(set(logged)) == len(logged) and logged[0] == 1
        assert before <= r0.obs_log[-1][1].client_mono_ns <= time.monotonic_ns()


def test_capacity_refusal_moves_to_the_next_replica(router, responders):
    responders(replica_id="r0", max_sessions=1)
    responders(replica_id="r1", max_sessions=1)
    a, b, c = Connection(router, "robot-a"), Connection(router, "robot-b"), Connection(router, "robot-c")
    try:
        ma = open_model(a)
        for _ in range(50):  # both replicas visible to discovery
            if len(ma.discover()) == 2:
                break
            time.sleep(0.05)
        mb = open_model(b)
        assert {ma.replica.replica_id, mb.replica.replica_id} == {"r0", "r1"}
        with pytest.raises(NoReplica, match="CAPACITY") as e:
            c.model("arm", action_names=NAMES, state_dim=S)
        assert not e.value.unanswered  # refused in words: an answer, the link is fast enough
    finally:
        for x in (a, b, c):
            x.close()


def test_a_replica_that_does_not_answer_is_skipped(router, responders):
    dead = responders(replica_id="r0")
    responders(replica_id="r1")
    with Connection(router, "robot-1") as conn:
        m = open_model(conn, replica_order=["r0", "r1"])
        for _ in range(50):
            if len(m.discover()) == 2:
                break
            time.sleep(0.05)
        dead._on_session = lambda q, gen: None  # alive, answers status, never answers a session query
        m.open()
        assert m.replica.replica_id == "r1"


def test_a_round_in_which_no_replica_answered_in_time_says_so_and_names_the_timeout(router, responders):
    r0 = responders(replica_id="r0")
    with Connection(router, "robot-1") as conn:
        m = open_model(conn)
        held = []  # a query dropped unanswered ends at once (Zenoh finalizes it); a hung replica holds it
        r0._on_session = lambda q, gen: held.append(q)  # answers status, never a session query (hung, or a slow link)
        with pytest.raises(NoReplica, match="timeout 0.4 s") as e:
            m.open(session_timeout_s=0.4)
        assert e.value.unanswered
        assert 0.3 <= waited_s(e.value)[0] < 3.0  # the whole timeout; a loaded host may add to it, never take from it
        t0 = time.monotonic()
        with pytest.raises(NoReplica) as e:  # a deadline cuts the timeout: the caller's budget
            m.open(session_timeout_s=5.0, deadline=time.monotonic() + 0.3)
        assert waited_s(e.value)[1] <= 0.3  # what was left of the 0.3 s after discovery, not the 5 s asked
        assert time.monotonic() - t0 < 3.0  # well under the 5 s the deadline cut


def test_a_discovery_nobody_answers_in_time_says_so_and_names_the_timeout(router):
    held = []
    r0 = Responder(router, replica_id="r0")
    r0._on_status = held.append  # declared at start(): holds every status query, answers none (a link too slow)
    r0.start()
    try:
        with Connection(router, "robot-1") as conn:
            m = conn.model("arm", action_names=NAMES, state_dim=S, open=False)
            deadline = time.monotonic() + 5.0
            while True:  # until the router knows the replica's queryable (before that, the answer is "none", at once)
                with pytest.raises(NoReplica) as e:
                    m.open(status_timeout_s=0.4)
                if e.value.unanswered or time.monotonic() > deadline:
                    break
            assert e.value.unanswered and held
            assert "timeout 0.4 s;" in str(e.value) and "round trip of the link" in str(e.value)
            assert 0.3 <= waited_s(e.value)[0] < 3.0
    finally:
        r0.close()


def test_an_empty_discovery_that_comes_back_at_once_is_an_answer(router):
    """With no replica known to the router the query returns at once: waiting longer would not change it,
    so it must not count as a link slower than the timeout."""
    with Connection(router, "robot-1") as conn:
        with pytest.raises(NoReplica, match="timeout 2.0 s") as e:
            conn.model("arm", action_names=NAMES, state_dim=S)
        assert not e.value.unanswered
        assert waited_s(e.value)[0] < 1.0  # at once, give or take a loaded host: far from the 2 s timeout


@settings(max_examples=300, deadline=None)
@given(
    max_s=st.floats(2.0, 60.0),
    rtt_s=st.one_of(st.just(0.0), st.floats(0.0, 100.0)),
    rounds=st.lists(st.sampled_from(["grow", "settle"]), max_size=12),
)
def test_control_timeouts_stay_between_the_base_and_the_cap_and_settle_back_to_the_base(max_s, rtt_s, rounds):
    from edge.client import ControlTimeouts
    from wire.qos import CONTROL_TIMEOUTS_S

    ct = ControlTimeouts(max_s)
    ct.seed(rtt_s)
    seeded = min(2 * rtt_s + ct.MARGIN_S, max_s) if rtt_s > 0 else 0.0
    for step in rounds:
        before = ct.timeout_s("status")
        getattr(ct, step)()
        for name, base in CONTROL_TIMEOUTS_S.items():
            assert base <= ct.timeout_s(name) <= max(max_s, base)
        after = ct.timeout_s("session")
        assert after == ct.timeout_s("status")  # the handshake's two queries move together
        if step == "grow":  # doubles, up to the cap
            assert after == pytest.approx(min(2 * before, max_s))
        else:  # an answer: the base, or the measured round trip's seed
            assert after == pytest.approx(max(2.0, seeded))
    ct.settle()
    ct.seed(0.0)
    assert {n: ct.timeout_s(n) for n in CONTROL_TIMEOUTS_S} == CONTROL_TIMEOUTS_S  # no seed: exactly the base
    ct.seed(3.0)  # a 3 s round trip: 6.5 s for every control query, the reset too (never over the cap)
    assert ct.timeout_s("reset") == min(6.5, max_s) and ct.timeout_s("status") == min(6.5, max_s)


def test_hard_refusals_raise_with_the_servers_words(router, responders):
    responders()
    with Connection(router, "robot-1") as conn:
        with pytest.raises(SessionRefused, match="ACTION_MISMATCH") as e:
            open_model(conn, action_names=["grip", "x", "y"])
        assert e.value.code == "ACTION_MISMATCH" and e.value.details["action_names"] == NAMES
        with pytest.raises(SessionRefused, match="WRONG_MODEL"):
            open_model(conn, expected_checkpoint_hash="0" * 64)
        assert conn._models == []  # a refused handle is not kept


def test_no_server_of_the_model_is_a_clear_error_naming_what_to_check(router, responders):
    """A model id or revision no server serves used to read "no replica of arm@main answered ... (waited 0.0 s": as
    if a server were slow. The router knows none: the error says so and what to compare."""
    with Connection(router, "robot-1") as conn:
        with pytest.raises(NoReplica, match="no server serves model_id 'arm' revision 'main' under @fleet") as e:
            conn.model("arm", action_names=NAMES, state_dim=S)
        assert "check model_id and revision against the server's manifest" in str(e.value)
        assert "the server is running and connected to the same router" in str(e.value)
        responders()
        open_model(conn)  # a server of arm@main, known to the router
        with pytest.raises(NoReplica, match="no server serves model_id 'arm' revision 'v2'"):
            conn.model("arm", revision="v2", action_names=NAMES, state_dim=S)


def test_reset_is_acknowledged_and_moves_the_episode(router, responders):
    r0 = responders()
    with Connection(router, "robot-1") as conn:
        m = open_model(conn)
        assert m.reset(3)
        assert r0.resets == [(m.ack.session_id, 3)]
        seq, r = round_trip(m, np.zeros(S), episode_start=True)
        assert isinstance(r, Result) and r.episode_id == 3
        r0.reset_delay_s = 1.5
        assert not m.reset(4, timeout_s=0.3)  # unacknowledged: False, never an exception


def test_unknown_session_asks_for_a_new_handshake(router, responders):
    r0 = responders()
    with Connection(router, "robot-1") as conn:
        m = open_model(conn)
        round_trip(m, np.zeros(S))
        r0.forget_sessions()  # e.g. a restart that kept its token
        seq = m.observe(state=np.zeros(S))
        r = m.get_result(3000)
        assert isinstance(r, Event) and r.code == "UNKNOWN_SESSION" and r.seq_id == seq and r.error == "UNKNOWN_SESSION"
        assert m.needs_handshake
        epoch = m.epoch
        m.open()  # the re-handshake: a new session, a new epoch, seq from 1 again
        assert not m.needs_handshake and m.epoch == epoch + 1
        assert m.observe(state=np.zeros(S)) == 1
        # the first put may race the new session's subscription on a loaded host: round_trip resends (seq 2, ...)
        # and drops a late answer to an earlier seq; the answer must come from the new session
        seq, r = round_trip(m, np.zeros(S), timeout_ms=10_000)
        assert isinstance(r, Result) and r.seq_id == seq and r.session_epoch == m.epoch


def test_a_late_token_delete_does_not_forget_the_session_that_replaced_it(router, responders):
    """A re-handshake undeclares the old liveliness token and declares a new one; the DELETE can reach the replica
    after the new session's open query. As the server, the responder forgets a client's session only when its token
    stays gone for the grace period: a DELETE followed by the new token's PUT forgets nothing."""
    import types

    import zenoh

    r0 = responders(gc_grace_s=0.2)
    with Connection(router, "robot-1") as conn:
        m = open_model(conn)
        sid = m.ack.session_id
        token = types.SimpleNamespace(key_expr=m.keys.alive, kind=zenoh.SampleKind.DELETE)
        r0._on_client_alive(token, r0._gen)  # the old token's DELETE, late
        r0._on_client_alive(types.SimpleNamespace(key_expr=m.keys.alive, kind=zenoh.SampleKind.PUT), r0._gen)
        assert not r0.wait_for(lambda r: sid not in r.sessions, 0.6)  # three grace periods: still there
        seq, r = round_trip(m, np.zeros(S))
        assert isinstance(r, Result) and r.seq_id == seq
        r0._on_client_alive(token, r0._gen)  # gone for good: forgotten after the grace period
        assert r0.wait_for(lambda r: sid not in r.sessions, 5.0)


def test_server_loss_and_drain_are_flagged(router, responders):
    r0 = responders()
    with Connection(router, "robot-1") as conn:
        m = open_model(conn)
        round_trip(m, np.zeros(S))
        assert m.server_alive
        r0.drain()
        ev = m.get_result(3000)
        assert isinstance(ev, Event) and ev.kind == "drain" and m.draining
        r0.stop()
        assert m.server_lost.wait(3.0) and not m.server_alive


def test_the_latency_budget_travels_in_the_session_open(router, responders):
    r0 = responders()
    with Connection(router, "robot-1", "test") as conn:
        m = open_model(conn, latency_budget_ms=35.0)
        assert r0.sessions[m.ack.session_id]["latency_budget_ms"] == 35.0


def test_discovery_spreads_a_herd_by_free_capacity():
    """Robots reading the same Status at once must not all pick one replica: with equal loads each
    replica comes first about equally often; a fuller replica comes first in proportion to its room;
    a full one comes last."""
    import random

    from edge.client import spread_key

    rng = random.Random(3)

    def first(loads: dict[str, float], n: int = 6000) -> dict[str, float]:
        wins = {r: 0 for r in loads}
        for _ in range(n):
            wins[max(loads, key=lambda r: spread_key(loads[r], rng))] += 1
        return {r: w / n for r, w in wins.items()}

    even = first({"r0": 0.0, "r1": 0.0, "r2": 0.0})
    assert all(abs(share - 1 / 3) < 0.03 for share in even.values()), even
    skewed = first({"r0": 0.5, "r1": 0.0})  # weights 0.5 : 1 -> first 1/3 : 2/3
    assert abs(skewed["r1"] - 2 / 3) < 0.03, skewed
    assert first({"r0": 1.0, "r1": 0.9})["r1"] == 1.0


def _inbox_model():
    from edge.client import Model

    return Model(None, "arm")


def _event_item(seq: int, size: int = 0):
    body = Error(ErrorCode.BAD_TENSOR, "x" * size, seq_id=seq).encode()
    return (time.monotonic_ns(), body, Header(SCHEMA_VERSION, MsgType.EVENT, seq, 0, 0, 0).pack(), None)


def test_a_flood_of_events_after_a_chunk_does_not_push_the_chunk_out_of_the_inbox():
    """A hostile server's 200 events after each chunk pushed the chunk out of a 64-message inbox (its request then
    timed out: 1 in 51). The oldest event goes first now; the chunk is still there, and first out."""
    from edge.client import INBOX_MAX, Result

    m = _inbox_model()
    chunk = ActionChunk("s", 7, 123, np.zeros((4, 2), np.float32), np.zeros((4, 2), np.float32)).encode()
    m._inbox.deposit((time.monotonic_ns(), chunk, Header(SCHEMA_VERSION, MsgType.CHUNK, 7, 0, 123, 0).pack(), None))
    for seq in range(200):
        m._inbox.deposit(_event_item(1000 + seq))
    assert len(m._inbox) == INBOX_MAX
    first = m.poll()
    assert isinstance(first, Result) and first.seq_id == 7
    rest = [m.poll() for _ in range(INBOX_MAX - 1)]
    assert [r.seq_id for r in rest] == list(range(1200 - (INBOX_MAX - 1), 1200))  # the newest events, in order
    assert m.poll() is None and m._inbox.nbytes == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3 << 20)), max_size=150))
def test_the_inbox_stays_bounded_keeps_arrival_order_and_drops_events_before_chunks(arrivals):
    """Any stream of chunks and events of any size: at most INBOX_MAX messages and INBOX_MAX_BYTES (unless one
    message alone is larger), its byte count exact, what it holds in arrival order, and no chunk dropped while an
    event older or newer is held."""
    from edge.client import INBOX_MAX, INBOX_MAX_BYTES

    m = _inbox_model()
    order: list[int] = []
    for i, (is_chunk, size) in enumerate(arrivals):
        kind = MsgType.CHUNK if is_chunk else MsgType.EVENT
        before = set(order) | {i}
        m._inbox.deposit((i, b"\0" * size, Header(SCHEMA_VERSION, kind, i + 1, 0, 0, 0).pack(), None))
        held = list(m._inbox)
        assert len(held) <= INBOX_MAX and (len(held) == 1 or m._inbox.nbytes <= INBOX_MAX_BYTES)
        assert m._inbox.nbytes == sum(len(p) + len(a) for _, p, a, _ in held)
        order = [t for t, _, _, _ in held]
        assert order == sorted(order) and order[-1] == i  # arrival order; the newest is always kept
        if any(arrivals[j][0] for j in before - set(order)):  # a chunk went only when no older event was left
            assert all(arrivals[j][0] for j in order[:-1]), order
