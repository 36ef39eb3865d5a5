"""Identity binding and per-session limits of the policy server (server.guard), on a router WITHOUT
access rules: whatever the router lets through, a client cannot open, reset or steer another client's
session, and one session's excess never reaches another session."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from server.guard import TokenBucket, peek_identity
from server.service import PolicyServer
from tests.server.scrape import scraped
from tests.server.test_service import S, ckpt, keys, manifest  # noqa: F401  (the module's checkpoint fixture)
from tests.server.zclient import RawClient
from wire import ActionChunk, Error, ErrorCode, Header, MsgType, Observation, ResetAck, SessionAck
from wire import auth as wauth
from wire.messages import Reset


@pytest.fixture
def guarded(ckpt, router, tmp_path):  # noqa: F811
    srv = PolicyServer(
        manifest(
            ckpt,
            router,
            tmp_path,
            security={
                "max_request_rate_hz": 5.0,
                "request_burst": 3,
                "max_observation_bytes": 16384,
                "reopen_idle_s": 1.0,
            },
        )
    ).start()
    yield srv
    srv.stop()


def client(router, uuid):
    return RawClient(router, keys(), uuid)


def audit_lines(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]


def denials(srv, reason) -> float:
    return scraped(srv.metrics, "policy_server_security_denials_total", reason=reason)


def test_the_ack_carries_a_session_key_and_observations_without_its_tag_are_never_served(guarded, router):
    with client(router, "victim") as v:
        ack = v.open()
        assert isinstance(ack, SessionAck) and len(ack.session_key) == 64
        seq = v.send(np.ones(S), sign=False)
        assert v.wait_for(lambda h, m: h.seq_id == seq, timeout=1.5) is None
        seq = v.send(np.ones(S), auth=wauth.obs_tag("00" * 32, v.session_id, b"x" * 27))
        assert v.wait_for(lambda h, m: h.seq_id == seq, timeout=1.5) is None
        assert denials(guarded, "bad_auth") == 2
        seq = v.send(np.ones(S))
        assert isinstance(v.chunk_for(seq, timeout=10)[1], ActionChunk)


def test_another_client_cannot_steer_a_session_even_knowing_its_id(guarded, router, tmp_path):
    v, rogue = client(router, "victim"), client(router, "rogue")
    try:
        v.open()
        # the rogue publishes on the victim's obs key with the victim's session id (sniffed): no tag, no service
        forged = rogue.z.declare_publisher(v.keys.obs)
        for guess in ("", "0" * 32):
            body = Observation(v.session_id, np.ones(S, np.float32), auth=guess or None).encode()
            forged.put(body, attachment=Header(1, MsgType.OBS, 1 << 40, 0, 0, 1).pack())
        forged.undeclare()
        assert v.wait_for(lambda h, m: h.seq_id == 1 << 40, timeout=1.5) is None  # never served, never answered
        seq = v.send(np.ones(S))
        assert isinstance(v.chunk_for(seq, timeout=10)[1], ActionChunk)
    finally:
        v.close()
        rogue.close()
    lines = [line for line in audit_lines(tmp_path) if line["outcome"].startswith("denied:")]
    assert any(line["client_uuid"] == "victim" and line["outcome"] == "denied:bad_auth" for line in lines)
    assert not any(line.get("seq_id") == 1 << 40 and line["outcome"] == "ok" for line in audit_lines(tmp_path))


def test_a_live_session_is_not_replaced_by_an_open_without_its_proof(guarded, router):
    v, rogue = client(router, "victim"), client(router, "rogue")
    try:
        first = v.open()
        v.send(np.ones(S))
        refused = rogue.query(v.keys.session, _open_body("victim"))
        assert isinstance(refused, Error) and refused.code == ErrorCode.SESSION_LIVE
        forged_proof = rogue.query(
            v.keys.session, _open_body("victim", previous_session_id=first.session_id, previous_auth="0" * 32)
        )
        assert isinstance(forged_proof, Error) and forged_proof.code == ErrorCode.SESSION_LIVE
        assert guarded.sessions.by_client("victim").session_id == first.session_id
        again = v.reopen()  # the owner's re-handshake proves the old session and replaces it
        assert isinstance(again, SessionAck) and again.session_id != first.session_id
    finally:
        v.close()
        rogue.close()


def test_an_open_on_another_clients_key_is_an_identity_mismatch(guarded, router):
    rogue, v = client(router, "rogue"), client(router, "victim")
    try:
        reply = rogue.query(v.keys.session, _open_body("rogue"))
        assert isinstance(reply, Error) and reply.code == ErrorCode.IDENTITY_MISMATCH
    finally:
        rogue.close()
        v.close()


def test_a_quiet_session_whose_client_is_gone_can_be_reopened_without_proof(guarded, router):
    v = client(router, "victim")
    v.open()
    v.close()  # the robot process died: its liveliness token goes away
    with client(router, "victim") as v2:
        deadline = time.monotonic() + 5
        reply = None
        while time.monotonic() < deadline:
            reply = v2.open()
            if isinstance(reply, SessionAck):
                break
            assert reply.code == ErrorCode.SESSION_LIVE
            time.sleep(0.2)  # waiting for the router to report the dead client's token gone
        assert isinstance(reply, SessionAck)


def test_a_reset_needs_the_sessions_tag(guarded, router):
    v, rogue = client(router, "victim"), client(router, "rogue")
    try:
        v.open()
        wrong = rogue.query(v.keys.reset, Reset(v.session_id, 9))  # the victim's reset key, its session id, no tag
        assert isinstance(wrong, Error) and wrong.code == ErrorCode.IDENTITY_MISMATCH
        assert guarded.sessions.by_client("victim").episode_id == 0
        ok = v.reset(3)
        assert isinstance(ok, ResetAck) and ok.episode_id == 3
    finally:
        v.close()
        rogue.close()


def test_oversized_and_flooding_observations_are_refused_to_that_session_only(guarded, router, tmp_path):
    a, b = client(router, "flooder"), client(router, "honest")
    try:
        a.open()
        b.open()
        seq = a.send(np.ones(S), tensors={"pad": np.zeros(8192, np.float32)})  # 32 KB > 16 KB
        h, err = a.wait_for(lambda h, m: h.seq_id == seq and isinstance(m, Error), timeout=3)
        assert err.code == ErrorCode.TOO_LARGE
        for _ in range(30):
            a.send(np.ones(S))
        assert a.wait_for(lambda h, m: isinstance(m, Error) and m.code == ErrorCode.RATE_LIMITED, timeout=3)
        deadline = time.monotonic() + 5
        while denials(guarded, "rate_limited") < 20 and time.monotonic() < deadline:
            time.sleep(0.05)  # the subscriber thread is still working through the burst
        assert denials(guarded, "rate_limited") >= 20
        seq = b.send(np.ones(S))  # the other session keeps its own budget
        assert isinstance(b.chunk_for(seq, timeout=10)[1], ActionChunk)
    finally:
        a.close()
        b.close()
    denied = [line for line in audit_lines(tmp_path) if line["outcome"].startswith("denied:")]
    assert {line["outcome"] for line in denied} >= {"denied:too_large", "denied:rate_limited"}
    assert all(line["client_uuid"] == "flooder" for line in denied)
    assert sum(line["denied_count"] for line in denied if line["outcome"] == "denied:rate_limited") <= 30


def test_token_bucket_allows_the_burst_then_the_rate():
    b = TokenBucket(rate_hz=2.0, burst=3)
    assert [b.take(now=0.0) for _ in range(4)] == [True, True, True, False]
    assert b.take(now=0.5) and not b.take(now=0.5)
    assert TokenBucket(rate_hz=0.0, burst=1).take(now=0.0)


def test_peek_identity_reads_two_fields_and_never_raises():
    from wire import Observation

    raw = Observation("sid-1", np.ones(3, np.float32), auth="ab" * 16).encode()
    assert peek_identity(raw) == ("sid-1", "ab" * 16)
    for junk in (b"", b"\x00\xff" * 50, b"\x91\x01", b"\xdf\xff\xff\xff\xff"):
        assert peek_identity(junk) == (None, None)


def _open_body(uuid, **kw):
    from wire import SCHEMA_VERSION, SessionOpen

    return SessionOpen(
        client_uuid=uuid,
        schema_version=SCHEMA_VERSION,
        fps=30.0,
        action_names=["x", "y", "grip"],
        state_dim=4,
        rtc_enabled=True,
        **kw,
    )


def test_a_token_drop_followed_by_observations_never_frees_a_session():
    """On a router without rules anyone can declare and drop a token on someone else's key."""
    from types import SimpleNamespace

    from server.guard import TOKEN_LOSS_CONFIRM_S, Guard

    g = Guard({"reopen_idle_s": 5.0}, metrics=None, audit=None, replica_id="r0", default_max_bytes=1 << 20)
    now = 100.0
    spoken_after_drop = SimpleNamespace(last_seen_mono=now - 0.1, alive_lost_mono=now - 3.0)
    assert g.session_live(spoken_after_drop, now)
    left = SimpleNamespace(last_seen_mono=now - 3.5, alive_lost_mono=now - 3.0)  # silent since its token went
    assert not g.session_live(left, now)
    just_dropped = SimpleNamespace(last_seen_mono=now - 0.5, alive_lost_mono=now - TOKEN_LOSS_CONFIRM_S / 2)
    assert g.session_live(just_dropped, now)  # too early to tell: the next observation decides
    quiet = SimpleNamespace(last_seen_mono=now - 6.0, alive_lost_mono=None)
    assert not g.session_live(quiet, now)
