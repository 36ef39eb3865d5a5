"""The plain client API against the real server: handshake, round trip, replicas, reset, refusals."""

from __future__ import annotations

import numpy as np
import pytest

from edge.client import Connection, Event, NoReplica, Result, SessionRefused
from tests.edge.conftest import ACTION_NAMES, S, T


def model(conn, **kw):
    args = dict(action_names=ACTION_NAMES, state_dim=S, fps=30.0, rtc_enabled=True, execution_horizon=5)
    args.update(kw)
    return conn.model("arm", **args)


def test_observe_and_get_result_round_trip(router, server_factory, ckpt):
    srv = server_factory(ckpt)
    conn = Connection(router, "robot-1", "test")
    try:
        m = model(conn)
        assert m.ack.checkpoint_hash == srv.info.checkpoint_hash and m.ack.rtc_enabled
        seq = m.observe(urgency=0.9, state=np.ones(S), inference_delay_steps=2,
                        prefix_model=np.zeros((5, 3), np.float32), episode_id=4, note="hello")
        r = m.get_result(10_000)
        assert isinstance(r, Result) and r.seq_id == seq and r.episode_id == 4 and r.session_epoch == m.epoch
        assert r.chunk_robot.shape == (T, 3) and 0 < r.rtt_s < 5 and r.rtc_applied
        assert m.reset(5)
    finally:
        conn.close()


def test_capacity_refusal_moves_to_the_next_replica(router, server_factory, ckpt):
    server_factory(ckpt, "r0", max_sessions=1)
    server_factory(ckpt, "r1", max_sessions=1)
    a, b, c = Connection(router, "robot-a"), Connection(router, "robot-b"), Connection(router, "robot-c")
    try:
        ma, mb = model(a), model(b)
        assert {ma.replica.replica_id, mb.replica.replica_id} == {"r0", "r1"}
        with pytest.raises(NoReplica, match="CAPACITY"):
            model(c)
    finally:
        for x in (a, b, c):
            x.close()


def test_hard_refusals_raise_with_the_servers_words(router, server_factory, ckpt):
    server_factory(ckpt)
    conn = Connection(router, "robot-1")
    try:
        with pytest.raises(SessionRefused, match="ACTION_MISMATCH") as e:
            model(conn, action_names=["grip", "x", "y"])
        assert e.value.details["action_names"] == ACTION_NAMES
        with pytest.raises(SessionRefused, match="WRONG_MODEL"):
            model(conn, expected_checkpoint_hash="0" * 64)
    finally:
        conn.close()


def test_no_server_is_a_clear_error(router):
    conn = Connection(router, "robot-1")
    try:
        with pytest.raises(NoReplica, match="is the server running"):
            model(conn)
    finally:
        conn.close()


def test_a_restarted_server_answers_unknown_session(router, server_factory, ckpt):
    srv = server_factory(ckpt)
    conn = Connection(router, "robot-1")
    try:
        m = model(conn)
        srv.stop()
        server_factory(ckpt)
        r = None
        for _ in range(20):  # the new server's subscription reaches the router asynchronously
            seq = m.observe(state=np.ones(S))
            r = m.get_result(500)
            if r is not None:
                break
        assert isinstance(r, Event) and r.code == "UNKNOWN_SESSION" and r.seq_id == seq
        m.open()  # the re-handshake
        seq = m.observe(state=np.ones(S))
        assert isinstance(m.get_result(10_000), Result)
    finally:
        conn.close()
