"""The control plane of one served model: Zenoh queryables and the client liveliness subscriber.

    <model>/<rev>/<replica>/status ──► status (on the replica's own key)
    .../session, .../<client>/session ──► decode, validate_open (server.sessions), guard ──► Session + SessionAck
    .../<client>/reset ──► proof of the session ──► episode_id, reset_pending (applied by the dispatch thread)
    .../<client>/alive (liveliness) ──► alive_lost_mono (housekeeping closes the session after the grace period)

Owns: `ControlPlane`. Invariants: a control reply reaches the querier only; the control plane never waits
for a forward pass; a live session is replaced only by its owner (previous_auth, server.guard).
"""

from __future__ import annotations

import logging
import time

from server.served import Served
from server.sessions import Session, SessionRegistry, make_ack, make_status, validate_open
from wire import (
    Error,
    ErrorCode,
    Header,
    MsgType,
    Reset,
    ResetAck,
    SessionOpen,
    WireError,
    decode_message,
    parse_client_key,
    unpack_header,
)
from wire.auth import new_session_key
from wire.qos import declare_publisher

log = logging.getLogger("policy_server")


class ControlPlane:
    """The status, session-open and reset queryables and the liveliness callback of one PolicyServer."""

    def __init__(self, server: Served):
        self.srv = server

    def on_status(self, query) -> None:
        srv = self.srv
        try:
            st = make_status(srv.info, srv.active_sessions(), srv.ready, srv.warmed_up, srv.draining)
            # On this replica's own key, never the query's: discovery asks `<model>/<rev>/*/status`, and
            # replies that all carry that one wildcard key are consolidated into ONE by the querier's get
            # (every robot of the headline saw a single replica and herded onto it).
            query.reply(srv.keys.status, st.encode(), attachment=Header(1, MsgType.CONTROL).pack())
        except Exception:
            log.exception("status reply failed")

    def _reply(self, query, body, episode_id: int = 0) -> None:
        try:
            query.reply(query.key_expr, body.encode(), attachment=Header(1, MsgType.CONTROL, 0, episode_id).pack())
        except Exception:
            log.exception("control reply failed")

    def on_session_open(self, query) -> None:
        srv = self.srv
        try:
            _control_header(query)
            payload = query.payload.to_bytes() if query.payload is not None else b""
            req = decode_message(payload, expect=SessionOpen, limits=srv.limits)
            keys = srv.keys.client(req.task or srv.info.default_task, req.client_uuid)
            qkey = str(query.key_expr)
            # on the per-client key the uuid in the key is the identity (router access rules bind it to the
            # robot's certificate); the replica-level key takes the body's word for it
            key_uuid = (
                parse_client_key(qkey, srv.keys.root).client_uuid if qkey != srv.keys.session else req.client_uuid
            )
        except WireError as exc:
            srv.metrics.inc("sessions_rejected", model=srv.info.model_id, reason="malformed")
            return self._reply(query, Error(exc.code, f"session open: {exc}"))
        except Exception as exc:
            srv.metrics.inc("sessions_rejected", model=srv.info.model_id, reason="malformed")
            return self._reply(query, Error(ErrorCode.MALFORMED, f"session open: {type(exc).__name__}: {exc}"))
        old = srv.sessions.by_client(req.client_uuid)
        active = srv.active_sessions() - (1 if old is not None else 0)  # a re-handshake replaces its own session
        d = validate_open(
            req, srv.info, active=active, ready=srv.ready, draining=srv.draining, client_uuid_from_key=key_uuid
        )
        if not d.ok:
            srv.metrics.inc("sessions_rejected", model=srv.info.model_id, reason=d.reason)
            if d.reason == "identity":
                srv.guard.deny(
                    "identity", key_uuid, detail=f"session open for {req.client_uuid!r} on the key of {key_uuid!r}"
                )
            log.info("session open refused for %s: %s", req.client_uuid, d.error.message)
            return self._reply(query, d.error)
        refusal = self._guard_open(req, old)
        if refusal is not None:
            return self._reply(query, refusal)
        try:
            publisher = declare_publisher(srv.z, keys.action, "action")
        except Exception as exc:
            return self._reply(query, Error(ErrorCode.INTERNAL, f"cannot declare the action publisher: {exc}"))
        horizon = min(int(req.execution_horizon or srv.info.execution_horizon), srv.info.chunk_size)
        s = Session(
            SessionRegistry.new_id(),
            req.client_uuid,
            keys,
            d.task,
            d.rtc_enabled,
            horizon,
            req.fps,
            schema_version=req.schema_version,
            client_type=req.client_type,
            tags=dict(req.tags),
            pipeline=srv.runtime.new_pipeline(),
            publisher=publisher,
            session_key=new_session_key(),
            bucket=srv.guard.new_bucket(),
            answer_bucket=srv.guard.new_bucket(),
        )
        known = srv.info.known_clients.get(req.client_uuid)
        s.latency_budget_ms = (
            req.latency_budget_ms
            or (known.latency_budget_ms if known is not None else None)
            or srv.default_latency_budget_ms
        )
        s.priority = known.priority if known is not None else None
        replaced = srv.sessions.add(s)
        if replaced is not None:
            srv.close_session(replaced, "replaced by a new handshake", count=False)
        s.reset_pending = True  # exclusive mode: the policy is reset before this session's first forward pass
        active = srv.active_sessions()
        srv.metrics.inc("sessions_opened", model=srv.info.model_id)
        srv.set_load()
        self._reply(query, make_ack(srv.info, s, d, active, req.schema_version))
        log.info(
            "session %s opened for %s (task %r, rtc %s)%s",
            s.session_id,
            s.client_uuid,
            s.task,
            srv.runtime.rtc_mode if s.rtc_enabled else False,
            "; warnings: " + "; ".join(d.warnings) if d.warnings else "",
        )

    def _guard_open(self, req: SessionOpen, old: Session | None) -> Error | None:
        """A live session is replaced only by its owner (previous_auth); identities hold a bounded number."""
        srv = self.srv
        g = srv.guard
        if old is not None and g.session_live(old) and not g.reopen_ok(old, req):
            srv.metrics.inc("sessions_rejected", model=srv.info.model_id, reason="session_live")
            g.deny(
                "session_live",
                req.client_uuid,
                session_id=old.session_id,
                detail="open without the previous session's proof while it is live",
            )
            return Error(
                ErrorCode.SESSION_LIVE,
                f"client {req.client_uuid!r} has a live session on replica "
                f"{srv.info.replica_id}; a re-handshake must carry previous_session_id and previous_auth, "
                f"or wait {g.reopen_idle_s:g} s after the old session went quiet",
                details={"retry_after_s": g.reopen_idle_s},
            )
        held = srv.sessions.count_client(req.client_uuid) - (1 if old is not None else 0)
        if held >= g.max_sessions_per_client:
            srv.metrics.inc("sessions_rejected", model=srv.info.model_id, reason="sessions_per_client")
            g.deny("sessions_per_client", req.client_uuid, detail=f"holds {held}")
            return Error(
                ErrorCode.TOO_MANY_SESSIONS,
                f"client {req.client_uuid!r} already holds {held} sessions on "
                f"this replica (security.max_sessions_per_client = {g.max_sessions_per_client}); close one",
            )
        return None

    def on_reset(self, query) -> None:
        srv = self.srv
        try:
            parsed = parse_client_key(str(query.key_expr), srv.keys.root)
            _control_header(query)
            payload = query.payload.to_bytes() if query.payload is not None else b""
            req = decode_message(payload, expect=Reset, limits=srv.limits)
        except WireError as exc:
            return self._reply(query, Error(exc.code, f"reset: {exc}"))
        s, err = srv.sessions.lookup(req.session_id, parsed.client_uuid)
        if err is not None:
            srv.guard.deny("reset_" + err.code.lower(), parsed.client_uuid, session_id=req.session_id)
            return self._reply(query, err)  # a control reply reaches the querier only: safe to answer
        if not srv.guard.reset_ok(s, req):
            srv.guard.deny("bad_auth", parsed.client_uuid, session_id=s.session_id, detail="reset")
            return self._reply(
                query,
                Error(
                    ErrorCode.IDENTITY_MISMATCH,
                    "reset refused: its auth tag does not prove "
                    "the session (wire.auth.reset_tag with the SessionAck's session_key)",
                ),
            )
        # The control plane never waits for a forward pass: the dispatch thread applies the reset under the
        # session's lock before this session's next preprocess (never between a preprocess and its postprocess).
        s.episode_id = req.episode_id
        s.reset_pending = True
        self._reply(query, ResetAck(s.session_id, req.episode_id), episode_id=req.episode_id)  # header echoes it

    def on_client_alive(self, sample) -> None:
        srv = self.srv
        import zenoh

        try:
            parsed = parse_client_key(str(sample.key_expr), srv.keys.root)
        except WireError:
            return
        s = srv.sessions.by_client(parsed.client_uuid)
        if s is None:
            return
        if sample.kind == zenoh.SampleKind.DELETE:
            s.alive_lost_mono = time.monotonic()
        else:
            s.alive_lost_mono = None


def _control_header(query) -> Header:
    """The 27-byte CONTROL header a session open or reset carries (wire-protocol 1, 3); MALFORMED without it."""
    header = unpack_header(query.attachment.to_bytes() if query.attachment is not None else None)
    if header.msg_type != MsgType.CONTROL:
        raise WireError(ErrorCode.MALFORMED, f"msg_type {header.msg_type.name} on a control key; expected CONTROL")
    return header
