"""The observation intake of one served model: a sample on `.../<client>/obs`, through a chain of admission
steps, into the model's mailbox.

    sample ──► key ─► identity ─► header ─► schema_version ─► size ─► rate ─► decode ─► draining
               ─► session ─► state_shape ─► sequence ──► accept: Request ──► Mailbox.deposit

Each step (`ADMISSION`) is a named function `(server, arrival) -> Refusal | None` that may fill in the
`Arrival` (the parsed key, header, observation, session); they run in order and the first refusal wins.
A `Refusal` says what is counted (`observation_errors{code}`), what the session guard records
(`security_denials` and its audit line), and whether the client is answered: always, throttled to one
answer per client and reason per second (`Guard.should_answer`), or at the session's own rate.

Invariants: this runs in the Zenoh callback, so it never runs inference and never waits on the worker;
bad input from one client becomes an Error event to THAT client plus a count, never an exception.
Identity comes first, from the header and two body fields only: nothing unauthenticated is answered on
the key of a client that holds a session (server.guard).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from server.guard import peek_identity
from server.replies import Replies
from server.scheduling import Request
from server.served import Pending, Served
from server.sessions import Session
from wire import (
    Error,
    ErrorCode,
    Header,
    MsgType,
    Observation,
    WireError,
    decode_message,
    parse_client_key,
    unpack_header,
)
from wire.transport import arrival_stamps

# how a refusal is answered
ALWAYS, THROTTLED, AT_SESSION_RATE = "always", "throttled", "at_session_rate"


@dataclass
class Arrival:
    """One observation sample as the admission steps learn it."""

    key: str
    raw: bytes
    attachment: bytes | None
    received_ns: int
    routed_ns: int | None
    client: str = ""  # the client uuid of the key
    owner: Session | None = None  # the session this client holds, if any
    sid: str | None = None  # the session id the body claims
    authed: bool = False  # the body proves `owner`
    header: Header | None = None
    obs: Observation | None = None
    session: Session | None = None  # the session it belongs to (the registry's lookup)

    @classmethod
    def of(cls, sample) -> Arrival:
        received_ns, routed_ns = arrival_stamps(sample)
        att = sample.attachment.to_bytes() if sample.attachment is not None else None
        return cls(str(sample.key_expr), sample.payload.to_bytes(), att, received_ns, routed_ns)

    @property
    def seq_id(self) -> int | None:
        return self.header.seq_id if self.header is not None else None


@dataclass
class Refusal:
    """Why an observation goes no further, and what follows from it."""

    code: str | None = None  # counted as observation_errors{code}; None: not counted
    error: Error | None = None  # the answer; None: dropped unanswered
    answer: str = ALWAYS  # ALWAYS | THROTTLED (one per client and reason per second) | AT_SESSION_RATE
    to: Session | None = None  # answered on this session's publisher (else a one-off put on the action key)
    deny: str | None = None  # a security denial: Guard.deny(reason) with `detail`
    detail: str = ""


@dataclass(frozen=True)
class Step:
    """One admission check: `check(server, arrival)` returns a Refusal or None (go on)."""

    name: str
    check: Callable[[Served, Arrival], Refusal | None]


def _refused(a: Arrival, exc: WireError) -> Refusal:
    """A wire-level refusal: counted, a denial when the body proved its session, answered throttled."""
    reason = {ErrorCode.TOO_LARGE: "too_large", ErrorCode.SCHEMA_VERSION: "schema_version"}.get(exc.code, "malformed")
    return Refusal(
        exc.code,
        Error(exc.code, f"observation refused: {exc}", seq_id=a.seq_id),
        THROTTLED,
        to=a.owner,
        deny=reason if a.authed else None,
        detail=f"{len(a.raw)} bytes: {str(exc)[:200]}",
    )


def check_key(srv: Served, a: Arrival) -> Refusal | None:
    try:
        a.client = parse_client_key(a.key, srv.keys.root).client_uuid
    except WireError:
        return Refusal(ErrorCode.BAD_KEY)
    return None


def check_identity(srv: Served, a: Arrival) -> Refusal | None:
    """A client holding a session is heard only with that session's proof (server.guard)."""
    a.owner = srv.sessions.by_client(a.client)
    a.sid, tag = peek_identity(a.raw)
    owner = a.owner
    a.authed = (
        owner is not None
        and a.sid == owner.session_id
        and a.attachment is not None
        and srv.guard.obs_ok(owner, a.sid, tag, a.attachment)
    )
    if owner is not None and not a.authed:
        return Refusal(deny="foreign_session" if a.sid != owner.session_id else "bad_auth")
    return None


def check_header(srv: Served, a: Arrival) -> Refusal | None:
    try:
        a.header = unpack_header(a.attachment)
    except WireError as exc:
        return _refused(a, exc)
    if a.header.msg_type != MsgType.OBS:
        return _refused(
            a, WireError(ErrorCode.MALFORMED, f"msg_type {a.header.msg_type.name} on an obs key; expected OBS")
        )
    return None


def check_schema_version(srv: Served, a: Arrival) -> Refusal | None:
    """Both sides speak the version the open agreed (wire-protocol 8); a chunk never echoes another."""
    if a.authed and a.header.schema_version != a.owner.schema_version:
        return _refused(
            a,
            WireError(
                ErrorCode.SCHEMA_VERSION,
                f"observation header says wire schema "
                f"{a.header.schema_version}; this session speaks {a.owner.schema_version} "
                "(agreed at the session open)",
            ),
        )
    return None


def check_size(srv: Served, a: Arrival) -> Refusal | None:
    most = srv.guard.max_observation_bytes
    if a.authed and len(a.raw) > most:
        return _refused(
            a,
            WireError(
                ErrorCode.TOO_LARGE,
                f"observation is {len(a.raw)} bytes; this replica accepts "
                f"at most {most} (security.max_observation_bytes)",
            ),
        )
    return None


def check_rate(srv: Served, a: Arrival) -> Refusal | None:
    if a.authed and not a.owner.bucket.take():
        return Refusal(
            ErrorCode.RATE_LIMITED,
            Error(
                ErrorCode.RATE_LIMITED,
                f"over {srv.guard.max_request_rate_hz:g} observations/s "
                "(security.max_request_rate_hz); requests are being dropped",
                seq_id=a.seq_id,
            ),
            AT_SESSION_RATE,
            to=a.owner,
            deny="rate_limited",
        )
    return None


def check_decode(srv: Served, a: Arrival) -> Refusal | None:
    try:
        a.obs = decode_message(a.raw, expect=Observation, limits=srv.limits)
    except WireError as exc:
        return _refused(a, exc)
    return None


def check_draining(srv: Served, a: Arrival) -> Refusal | None:
    if srv.draining:
        return Refusal(
            error=Error(ErrorCode.DRAINING, "replica is draining; open a session on another replica", seq_id=a.seq_id)
        )
    return None


def check_session(srv: Served, a: Arrival) -> Refusal | None:
    a.session, err = srv.sessions.lookup(a.obs.session_id, a.client)
    if err is not None:
        err.seq_id = a.seq_id
        # no session on this key: the answer harms nobody, but stays rare
        return Refusal(err.code, err, THROTTLED)
    return None


def check_state_shape(srv: Served, a: Arrival) -> Refusal | None:
    """The open agreed the state's size: a state of another shape is refused as an open would be."""
    bad = state_shape_error(np.shape(a.obs.state), srv.info.state_dim)
    if bad:
        return Refusal(
            ErrorCode.STATE_DIM_MISMATCH,
            Error(ErrorCode.STATE_DIM_MISMATCH, bad, seq_id=a.seq_id),
            THROTTLED,
            to=a.session,
        )
    return None


def check_sequence(srv: Served, a: Arrival) -> Refusal | None:
    """A duplicate or reordered observation: the newer one is already queued or answered."""
    if a.header.seq_id <= a.session.last_seq and not a.obs.episode_start:
        return Refusal("STALE_SEQ")
    return None


ADMISSION: tuple[Step, ...] = (
    Step("key", check_key),
    Step("identity", check_identity),
    Step("header", check_header),
    Step("schema_version", check_schema_version),
    Step("size", check_size),
    Step("rate", check_rate),
    Step("decode", check_decode),
    Step("draining", check_draining),
    Step("session", check_session),
    Step("state_shape", check_state_shape),
    Step("sequence", check_sequence),
)


def state_shape_error(shape: tuple[int, ...], state_dim: int) -> str | None:
    """Why an observation's state of `shape` does not fit a session of `state_dim`, or None: (S,) or a batch of one,
    (1, S). A (2, 2) state for S = 4 has the right count but no agreed order of its values (was served flattened)."""
    if tuple(shape) in ((state_dim,), (1, state_dim)):
        return None
    size = int(np.prod(shape)) if len(shape) else 1
    return (
        f"state has shape {list(shape)} ({size} values); this policy takes a state of shape [{state_dim}] "
        f"(or [1, {state_dim}]; the session_ack's state_dim)"
    )


class Intake:
    """The observation subscriber of one PolicyServer: admission, then deposit (deposit only: no inference);
    refusals and what a deposit dropped are answered through `replies`."""

    def __init__(self, server: Served, replies: Replies, steps: tuple[Step, ...] = ADMISSION):
        self.srv = server
        self.replies = replies
        self.steps = steps

    def on_obs(self, sample) -> None:
        a = Arrival.of(sample)
        for step in self.steps:
            refusal = step.check(self.srv, a)
            if refusal is not None:
                return self.refuse(a, refusal)
        self.accept(a)

    def refuse(self, a: Arrival, r: Refusal) -> None:
        srv = self.srv
        if r.code is not None:
            srv.metrics.inc("observation_errors", model=srv.info.model_id, code=r.code)
        if r.deny is not None:
            srv.guard.deny(r.deny, a.client, session_id=a.sid, seq_id=a.seq_id, detail=r.detail)
        if r.error is None:
            return
        if r.answer == THROTTLED and not srv.guard.should_answer(a.client, r.error.code):
            return  # one answer per second and reason: a flood of bad input never becomes a flood of replies
        if r.answer == AT_SESSION_RATE and not (r.to.answer_bucket is None or r.to.answer_bucket.take()):
            return
        self.replies.event_error(a.key, a.header, r.error, session=r.to)

    def accept(self, a: Arrival) -> None:
        """Count it, queue it as its session's pending request, and answer what the deposit dropped."""
        srv, s, header, obs = self.srv, a.session, a.header, a.obs
        model = srv.info.model_id
        now = time.monotonic()
        s.touch(now, srv.m.response_tracking.cadence_alpha)
        s.last_seq = header.seq_id
        s.requests += 1
        srv.metrics.observe("payload_size_bytes", len(a.raw), model=model)
        srv.metrics.inc("requests", model=model)
        req = Request(
            session_id=s.session_id,
            client=s.client_uuid,
            model=model,
            seq_id=header.seq_id,
            arrived=now,
            urgency=obs.urgency,
            priority=obs.priority if s.priority is None else s.priority,
            steps_remaining=obs.steps_remaining,
            cadence_s=1.0 / s.fps if s.fps > 0 else s.cadence_s,
            latency_budget_ms=s.latency_budget_ms,
            batch_key=model,
            payload=Pending(
                s, header, obs, len(a.raw), a.raw if srv.capture is not None else None, a.received_ns, a.routed_ns
            ),
        )
        srv.start_dispatch()  # every loop running before the first request can be answered
        res = srv.mailbox.deposit(req)
        if res.superseded is not None:
            srv.metrics.inc("superseded_requests", model=model)
        if res.reason == "closed":
            return self.replies.event_error(
                a.key,
                header,
                Error(
                    ErrorCode.DRAINING, "replica is stopping; open a session on another replica", seq_id=header.seq_id
                ),
            )
        if res.dropped is not None:
            srv.metrics.inc("queue_full_drops", model=model)
            p: Pending = res.dropped.payload
            p.session.outcomes["dropped:queue_full"] += 1
            self.replies.audit(
                p.session, p.header, (now - res.dropped.arrived) * 1e3, 0.0, None, 0, "dropped:queue_full"
            )
            self.replies.event_error(
                p.session.keys.action,
                p.header,
                Error(
                    ErrorCode.OVERLOADED,
                    f"server queue full ({srv.mailbox.depth()} pending); request dropped by "
                    f"overflow policy {srv.mailbox.overflow_policy}",
                    seq_id=p.header.seq_id,
                ),
                session=p.session,
            )
