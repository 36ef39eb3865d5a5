"""The policy server process: Zenoh control and data planes around the model runtime.

    zenoh callbacks (deposit only)                      dispatch thread(s) per model
    .../<task>/<client>/obs ──► header+body decode ──►  Mailbox (latest-only per session,
                                 session lookup          scheduler, TTL, overflow)
                                                        ──► take(max_batch) ──► ModelRuntime.infer
    status / session / reset queryables: validate,      ──► ActionChunk (header echoed) ──► .../action
      mutate the registry, reply                         ──► metrics, audit line, debug capture
    client liveliness ──► mark lost ──► housekeeping thread garbage-collects after the grace period

Owns: `PolicyServer` (start-up order, threads, drain) and the reply paths.

Invariants:
- Callbacks never run inference and never wait on the worker; bad input from one client becomes an
  Error event to THAT client plus an `observation_errors` count, never an exception in the server.
- Start-up order: load -> warm up -> declare queryables/subscribers -> declare the liveliness token
  and answer `ready`. A client that sees the token finds a warmed-up replica.
- Every chunk echoes seq_id, episode_id, client_mono_ns and session_epoch of the observation it
  answers (the client's only clock is its own).
- Drain (SIGTERM): refuse new sessions and observations, notify every client, finish the batch in
  flight, exit within `drain.timeout_s`. Nothing a client needs lives only here (statelessness, 7).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wire import (
    ActionChunk, DrainNotice, Error, ErrorCode, Header, MsgType, Observation, ReplicaKeys, Reset, ResetAck,
    SessionOpen, WireError, decode_message, parse_client_key, unpack_header,
)
from wire.auth import new_session_key
from wire.keys import ClientKeys
from wire.procs import raise_priority
from wire.qos import declare_publisher
from wire.tensors import Limits
from wire.transport import arrival_stamps
from server.audit import AuditLog
from server.guard import Guard, peek_identity
from server.health import HealthServer
from server.metrics import Metrics, WindowedSketch
from server.runtime import EmulatedLatency, InferItem, ModelRuntime, set_torch_threads
from server.sessions import ReplicaInfo, Session, SessionRegistry, make_ack, make_status, validate_open

log = logging.getLogger("policy_server")

READY_TEXT = "policy-server ready"


DISPATCH_FIFO_PRIORITY = 4  # below the bench's chaos proxy (5) and its control loops (10): see docs/bench.md
DISPATCH_PRIORITY_LOG_TEXT = "dispatch priority: "


@dataclass
class Pending:
    """What the dispatch thread needs of one accepted observation (the Request payload)."""

    session: Session
    header: Header
    obs: Observation
    payload_bytes: int
    raw: bytes | None = None  # kept only when debug capture is on
    received_ns: int = 0  # this server's monotonic clock when the observation reached it (audit: received_mono_ms)
    routed_ns: int | None = None  # the same clock when the first router routed it (audit: routed_mono_ms), if stamped


class OutputPathError(ValueError):
    """An output path of the manifest (`audit_path`, `debug.capture_dir`) this process cannot create: a user error
    whose message names the key, raised before any model loads."""


def create_output(key: str, path, make):
    """`make()` (which creates `path`), an OSError of it an OutputPathError naming `key`."""
    try:
        return make()
    except OSError as exc:
        above = next((p for p in Path(path).parents if p.exists()), None)
        why = f"{str(above)!r} is a file" if above is not None and not above.is_dir() else exc.strerror or exc
        raise OutputPathError(f"{key}: cannot create {str(path)!r}: {why}; give a path in a directory this process "
                              f"can write, or leave {key} unset") from None


@dataclass
class Shared:
    """What the served models of one process share: its Zenoh session, metrics and audit log (the process
    owns them; a model's `stop` leaves them open)."""

    z: Any
    metrics: Metrics
    audit: AuditLog


def state_shape_error(shape: tuple[int, ...], state_dim: int) -> str | None:
    """Why an observation's state of `shape` does not fit a session of `state_dim`, or None: (S,) or a batch of one,
    (1, S). A (2, 2) state for S = 4 has the right count but no agreed order of its values (was served flattened)."""
    if tuple(shape) in ((state_dim,), (1, state_dim)):
        return None
    size = int(np.prod(shape)) if len(shape) else 1
    return (f"state has shape {list(shape)} ({size} values); this policy takes a state of shape [{state_dim}] "
            f"(or [1, {state_dim}]; the session_ack's state_dim)")


class PolicyServer:
    """One served model: its sessions, mailbox, dispatch loop(s) and keys. Alone (the tests, a one-model
    manifest) it owns the Zenoh session, health server and audit log; inside `ServerProcess` it shares them."""

    def __init__(self, manifest, loaded=None, shared: Shared | None = None):
        """`manifest` is a server.manifest.Manifest; `loaded` an already loaded checkpoint (tests)."""
        self.m = manifest
        self._shared = shared
        self.metrics = shared.metrics if shared else Metrics()
        audit_path = _get(manifest, "audit_path", None)
        self.audit = shared.audit if shared else create_output("audit_path", audit_path, lambda: AuditLog(audit_path))
        self.sessions = SessionRegistry()
        self.recent_queue_wait_ms = WindowedSketch()  # the replica's last 1-2 minutes, for the status
        self.recent_inference_ms = WindowedSketch()
        self.ready = False
        self.warmed_up = False
        self.draining = False
        self.stopped = threading.Event()
        self.drain_requested = threading.Event()
        self._z = None
        self._router_link: RouterLink | None = None  # alone only; inside a ServerProcess the process watches
        self._decl: list[Any] = []
        self._threads: list[threading.Thread] = []
        self._inflight = 0
        self._inflight_cv = threading.Condition()
        self.limits = _limits(manifest)
        self.capture = None
        capture_dir = _get(manifest, "debug.capture_dir", None)
        if capture_dir:  # created here, before the model loads, so a path that cannot be is refused at once
            from server.capture import CaptureWriter

            self.capture = create_output("debug.capture_dir", capture_dir, lambda: CaptureWriter(
                capture_dir, int(_get(manifest, "debug.capture_max", 256)), self))
        self._loaded = loaded
        self._dispatch_lock = threading.Lock()
        self._dispatch_started = False  # dispatch loops start with this model's first request (design 003)
        self.health = None

    # --- start-up ----------------------------------------------------------------------------------

    def load(self) -> None:
        from server.policies.base import classify
        from server.policies.checkpoint import load_checkpoint

        m = self.m
        remote_forward = (_get(m, "dispatch.backend", "local") or "local") != "local"
        # forward passes on Ray Serve: the copy here only gives config, processors and stats, so it stays on the CPU
        device = "cpu" if remote_forward else _get(m, "model.device", "cpu")
        loaded = self._loaded or load_checkpoint(_get(m, "model.repo_or_path"), device=device,
                                                 dtype=_get(m, "model.dtype", "float32"))
        overrides = dict(_get(m, "model.hyper_params", None) or {})
        if overrides:  # the manifest's sampling hyper-parameters (before the runtime reads rtc_mode)
            loaded.policy.override_hyper_params(overrides)
        self.loaded = loaded
        emulated = EmulatedLatency.from_manifest(_get(m, "emulated_latency", None))
        horizon = _get(m, "execution_horizon", None) or loaded.config.execution_horizon
        self.runtime = ModelRuntime(loaded, emulated, horizon)
        if not remote_forward:  # refused here, with the reason, rather than as a failed warm-up pass
            loaded.policy.prepare_serving()
        if remote_forward:
            from server.dispatch import make_forward

            model_id = _get(m, "model_id", None) or Path(str(_get(m, "model.repo_or_path"))).name
            self.runtime.forward = make_forward(loaded.policy, lambda key, default: _get(m, key, default), model_id,
                                                _get(m, "replica_id", "r0"))
        cls = classify(loaded.policy)
        mode = _get(m, "serving_mode", "shared")
        if cls == "stateful" and mode != "exclusive":
            log.warning("policy type %r is chunk-stateful: serving_mode forced to exclusive (one session)", loaded.config.type)
            mode = "exclusive"
        revision = _get(m, "model.revision", None) or loaded.revision_info.get("revision") or "main"
        model_id = _get(m, "model_id", None) or Path(str(_get(m, "model.repo_or_path"))).name
        self.keys = ReplicaKeys(model_id, revision, _get(m, "replica_id", "r0"), _get(m, "root", "@fleet"))
        clients = _get(m, "clients", None)
        self.info = ReplicaInfo(
            replica_id=self.keys.replica_id, model_id=model_id, revision=revision,
            checkpoint_hash=loaded.checkpoint_hash, policy_type=loaded.config.type,
            action_names=list(loaded.config.action_names), state_dim=loaded.config.state_dim,
            cameras=self.runtime.cameras, chunk_size=loaded.config.chunk_size,
            trained_fps=float(_get(m, "trained_fps", None) or loaded.config.fps), supports_rtc=self.runtime.supports_rtc,
            serving_mode=mode, max_sessions=int(_get(m, "max_sessions", 8)), execution_horizon=int(horizon),
            default_task=_get(m, "default_task", "") or "", pin_task=bool(_get(m, "pin_task", False)),
            allow_resampling=bool(_get(m, "allow_resampling", False)), inference_emulated=emulated is not None,
            allowlist=tuple(_get(clients, "allowlist", ()) or ()) if clients is not None else (),
            known_clients={c.id if hasattr(c, "id") else c["id"]: c for c in (_get(clients, "known", ()) or ())},
            accept_unknown=bool(_get(clients, "accept_unknown", True)),
        )
        self.default_latency_budget_ms = float(_get(clients, "defaults.latency_budget_ms", 50.0))
        self.guard = Guard(_get(m, "security", None), self.metrics, self.audit, self.keys.replica_id,
                           self.limits.max_message_bytes)
        n = int(_get(m, "warmup_inferences", 2))
        ms = self.runtime.warmup(n)
        self.warmed_up = True
        log.info("loaded %s (%s, rtc_mode %s, hash %s...%s), %d warm-up passes, %.1f ms each", model_id,
                 loaded.config.type, self.runtime.rtc_mode, loaded.checkpoint_hash[:12],
                 f", hyper_params {json.dumps(overrides, sort_keys=True)}" if overrides else "", n, ms)
        if n > 0:
            max_batch = int(_get(_get(m, "scheduling", None), "max_batch", 1) or 1)
            # a compiling policy's every bucket and signature, built before the replica says it is ready
            t0 = time.perf_counter()
            warmed = self.runtime.warm_buckets(max_batch)
            if warmed:
                log.info("compiled buckets %s with and without an RTC prefix in %.1f s", warmed, time.perf_counter() - t0)
            # the replica's own unloaded forward time: the bench reads starvation against it
            sizes = self.runtime.unloaded_forward_ms(max_batch)
            log.info("unloaded forward ms by batch size: %s", json.dumps(sizes))

    def start(self) -> "PolicyServer":
        from server.mailbox import Mailbox
        from server.scheduling import DEFAULT_BATCH_WINDOW_MS, make_scheduler

        if not hasattr(self, "runtime"):
            self.load()
        m = self.m
        sched = _get(m, "scheduling", None)
        opts = {}
        scoring = _get(sched, "scoring", None)
        if scoring:
            opts["scoring"] = scoring
        name = _get(sched, "strategy", "round_robin")
        window_ms = float(_get(sched, "batch_window_ms", DEFAULT_BATCH_WINDOW_MS))
        if name == "batch_optimized":  # it holds partial batches itself: the window is its own
            opts["batch_window_ms"] = window_ms
        self.max_batch = max(1, int(_get(sched, "max_batch", 1)))
        self.mailbox = Mailbox(
            make_scheduler(name, **opts), model=self.info.model_id, max_queue_size=int(_get(sched, "max_queue_size", 500)),
            overflow_policy=_get(sched, "overflow_policy", "drop_oldest"),
            request_ttl_ms=_get(sched, "request_ttl_ms", 5000.0), max_retries=int(_get(sched, "max_retries", 0)),
            batch_window_ms=window_ms, senders=self.sessions.__len__,
        )
        if self._shared is None:
            self._z = open_manifest_session(m, stopped=self.stopped)
            self._router_link = RouterLink(self._z)
        else:
            self._z = self._shared.z
        k = self.keys
        z = self._z
        self._decl.append(z.declare_queryable(k.status, self._on_status))
        self._decl.append(z.declare_queryable(k.session, self._on_session_open))
        self._decl.append(z.declare_queryable(k.all_client_session, self._on_session_open))  # per-client open key
        self._decl.append(z.declare_queryable(k.all_reset, self._on_reset))
        self._decl.append(z.declare_subscriber(k.all_obs, self._on_obs))
        self._decl.append(z.liveliness().declare_subscriber(k.all_client_alive, self._on_client_alive, history=False))
        self._spawn(self._housekeeping, f"housekeeping-{self.info.model_id}")
        port = _get(m, "health_port", None)
        if self._shared is None and port is not None and int(port) >= 0:
            self.health = HealthServer(int(port), self.metrics, self._ready_reason, lambda: not self.stopped.is_set(),
                                       host=_get(m, "health_host", "127.0.0.1"),
                                       sessions_fn=lambda c: {"models": {self.info.model_id: self.session_report(c)}}
                                       ).start()
        self._token = z.liveliness().declare_token(k.alive)
        self.ready = True
        self._set_load()
        if self._shared is None:
            health = f" health http://127.0.0.1:{self.health.port}" if self.health else ""
            print(f"{READY_TEXT}: {self.describe()}{health}", flush=True)
        return self

    def describe(self) -> str:
        return (f"{self.info.model_id}@{self.info.revision} replica {self.keys.replica_id} ({self.info.policy_type}, "
                f"{self.info.serving_mode}, max_sessions {self.info.effective_max_sessions})")

    def _start_dispatch(self) -> None:
        """This model's dispatch loops, `max_inflight` of them (models.known.<id> or models.default_max_inflight)."""
        with self._dispatch_lock:
            if self._dispatch_started or self.stopped.is_set():
                return
            inflight = _get(self.m, "models.default_max_inflight", 1)
            known = _get(self.m, "models.known", None) or {}
            if isinstance(known, dict) and self.info.model_id in known:
                inflight = _get(known[self.info.model_id], "max_inflight", inflight)
            for i in range(max(1, int(inflight))):
                self._spawn(self._dispatch_loop, f"dispatch-{self.info.model_id}-{i}")
            self._dispatch_started = True
            log.info("dispatch of %s started (%d loops)", self.info.model_id, int(inflight))

    def _spawn(self, fn, name: str) -> None:
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _ready_reason(self):
        if self.draining:
            return False, "draining"
        if not self.ready:
            return False, "warming up"
        if self._router_link is not None and not self._router_link.connected():
            return False, "no router"
        return True, "ready"

    # --- control plane -----------------------------------------------------------------------------

    def _active(self) -> int:
        return len(self.sessions)

    def _on_status(self, query) -> None:
        try:
            st = make_status(self.info, self._active(), self.ready, self.warmed_up, self.draining)
            # On this replica's own key, never the query's: discovery asks `<model>/<rev>/*/status`, and
            # replies that all carry that one wildcard key are consolidated into ONE by the querier's get
            # (every robot of the headline saw a single replica and herded onto it).
            query.reply(self.keys.status, st.encode(), attachment=Header(1, MsgType.CONTROL).pack())
        except Exception:
            log.exception("status reply failed")

    def _reply(self, query, body, episode_id: int = 0) -> None:
        try:
            query.reply(query.key_expr, body.encode(), attachment=Header(1, MsgType.CONTROL, 0, episode_id).pack())
        except Exception:
            log.exception("control reply failed")

    def _on_session_open(self, query) -> None:
        try:
            _control_header(query)
            payload = query.payload.to_bytes() if query.payload is not None else b""
            req = decode_message(payload, expect=SessionOpen, limits=self.limits)
            keys = self.keys.client(req.task or self.info.default_task, req.client_uuid)
            qkey = str(query.key_expr)
            # on the per-client key the uuid in the key is the identity (router access rules bind it to the
            # robot's certificate); the replica-level key takes the body's word for it
            key_uuid = parse_client_key(qkey, self.keys.root).client_uuid if qkey != self.keys.session else req.client_uuid
        except WireError as exc:
            self.metrics.inc("sessions_rejected", model=self.info.model_id, reason="malformed")
            return self._reply(query, Error(exc.code, f"session open: {exc}"))
        except Exception as exc:
            self.metrics.inc("sessions_rejected", model=self.info.model_id, reason="malformed")
            return self._reply(query, Error(ErrorCode.MALFORMED, f"session open: {type(exc).__name__}: {exc}"))
        old = self.sessions.by_client(req.client_uuid)
        active = self._active() - (1 if old is not None else 0)  # a re-handshake replaces its own session
        d = validate_open(req, self.info, active=active, ready=self.ready, draining=self.draining,
                          client_uuid_from_key=key_uuid)
        if not d.ok:
            self.metrics.inc("sessions_rejected", model=self.info.model_id, reason=d.reason)
            if d.reason == "identity":
                self.guard.deny("identity", key_uuid, detail=f"session open for {req.client_uuid!r} on the key of {key_uuid!r}")
            log.info("session open refused for %s: %s", req.client_uuid, d.error.message)
            return self._reply(query, d.error)
        refusal = self._guard_open(req, old)
        if refusal is not None:
            return self._reply(query, refusal)
        try:
            publisher = declare_publisher(self._z, keys.action, "action")
        except Exception as exc:
            return self._reply(query, Error(ErrorCode.INTERNAL, f"cannot declare the action publisher: {exc}"))
        horizon = min(int(req.execution_horizon or self.info.execution_horizon), self.info.chunk_size)
        s = Session(SessionRegistry.new_id(), req.client_uuid, keys, d.task, d.rtc_enabled, horizon, req.fps,
                    schema_version=req.schema_version,
                    client_type=req.client_type, tags=dict(req.tags), pipeline=self.runtime.new_pipeline(),
                    publisher=publisher, session_key=new_session_key(), bucket=self.guard.new_bucket(),
                    answer_bucket=self.guard.new_bucket())
        known = self.info.known_clients.get(req.client_uuid)
        s.latency_budget_ms = (req.latency_budget_ms or _get(known, "latency_budget_ms", None)
                               or self.default_latency_budget_ms)
        s.priority = _get(known, "priority", None) if known is not None else None
        replaced = self.sessions.add(s)
        if replaced is not None:
            self._close_session(replaced, "replaced by a new handshake", count=False)
        s.reset_pending = True  # exclusive mode: the policy is reset before this session's first forward pass
        active = self._active()
        self.metrics.inc("sessions_opened", model=self.info.model_id)
        self._set_load()
        self._reply(query, make_ack(self.info, s, d, active, req.schema_version))
        log.info("session %s opened for %s (task %r, rtc %s)%s", s.session_id, s.client_uuid, s.task,
                 self.runtime.rtc_mode if s.rtc_enabled else False,
                 "; warnings: " + "; ".join(d.warnings) if d.warnings else "")

    def _guard_open(self, req: SessionOpen, old: Session | None) -> Error | None:
        """A live session is replaced only by its owner (previous_auth); identities hold a bounded number."""
        g = self.guard
        if old is not None and g.session_live(old) and not g.reopen_ok(old, req):
            self.metrics.inc("sessions_rejected", model=self.info.model_id, reason="session_live")
            g.deny("session_live", req.client_uuid, session_id=old.session_id,
                   detail="open without the previous session's proof while it is live")
            return Error(ErrorCode.SESSION_LIVE, f"client {req.client_uuid!r} has a live session on replica "
                         f"{self.info.replica_id}; a re-handshake must carry previous_session_id and previous_auth, "
                         f"or wait {g.reopen_idle_s:g} s after the old session went quiet", details={
                             "retry_after_s": g.reopen_idle_s})
        held = self.sessions.count_client(req.client_uuid) - (1 if old is not None else 0)
        if held >= g.max_sessions_per_client:
            self.metrics.inc("sessions_rejected", model=self.info.model_id, reason="sessions_per_client")
            g.deny("sessions_per_client", req.client_uuid, detail=f"holds {held}")
            return Error(ErrorCode.TOO_MANY_SESSIONS, f"client {req.client_uuid!r} already holds {held} sessions on "
                         f"this replica (security.max_sessions_per_client = {g.max_sessions_per_client}); close one")
        return None

    def _on_reset(self, query) -> None:
        try:
            parsed = parse_client_key(str(query.key_expr), self.keys.root)
            _control_header(query)
            payload = query.payload.to_bytes() if query.payload is not None else b""
            req = decode_message(payload, expect=Reset, limits=self.limits)
        except WireError as exc:
            return self._reply(query, Error(exc.code, f"reset: {exc}"))
        s, err = self.sessions.lookup(req.session_id, parsed.client_uuid)
        if err is not None:
            self.guard.deny("reset_" + err.code.lower(), parsed.client_uuid, session_id=req.session_id)
            return self._reply(query, err)  # a control reply reaches the querier only: safe to answer
        if not self.guard.reset_ok(s, req):
            self.guard.deny("bad_auth", parsed.client_uuid, session_id=s.session_id, detail="reset")
            return self._reply(query, Error(ErrorCode.IDENTITY_MISMATCH, "reset refused: its auth tag does not prove "
                                            "the session (wire.auth.reset_tag with the SessionAck's session_key)"))
        # The control plane never waits for a forward pass: the dispatch thread applies the reset under the
        # session's lock before this session's next preprocess (never between a preprocess and its postprocess).
        s.episode_id = req.episode_id
        s.reset_pending = True
        self._reply(query, ResetAck(s.session_id, req.episode_id), episode_id=req.episode_id)  # header echoes it

    def _on_client_alive(self, sample) -> None:
        import zenoh

        try:
            parsed = parse_client_key(str(sample.key_expr), self.keys.root)
        except WireError:
            return
        s = self.sessions.by_client(parsed.client_uuid)
        if s is None:
            return
        if sample.kind == zenoh.SampleKind.DELETE:
            s.alive_lost_mono = time.monotonic()
        else:
            s.alive_lost_mono = None

    def _close_session(self, s: Session, why: str, count: bool = True) -> None:
        self.sessions.remove(s.session_id)
        self.mailbox.remove_session(s.session_id)
        try:
            s.publisher.undeclare()
        except Exception:
            pass
        if count:
            self.metrics.inc("client_disconnected", model=self.info.model_id)
        self._set_load()
        log.info("session %s of %s closed: %s", s.session_id, s.client_uuid, why)

    def session_report(self, client: str | None = None) -> dict:
        """The per-robot detail that metrics never label: each session's counters and latency percentiles
        (fixed-size sketches), plus the replica's recent percentiles. `client` keeps that robot's only."""
        now = time.monotonic()
        rows = [{"session_id": s.session_id, "client_uuid": s.client_uuid, "task": s.task, "client_type": s.client_type,
                 "open_s": round(now - s.opened_mono, 3), "idle_s": round(now - s.last_seen_mono, 3),
                 "requests": s.requests, "outcomes": dict(s.outcomes), "queue_wait_ms": s.queue_wait_ms.summary(),
                 "inference_ms": s.inference_ms.summary()}
                for s in self.sessions.all() if client is None or s.client_uuid == client]
        return {"replica_id": self.info.replica_id, "active_sessions": self._active(),
                "max_sessions": self.info.effective_max_sessions,
                "recent": {"window_s": self.recent_queue_wait_ms.window_s,
                           "queue_wait_ms": self.recent_queue_wait_ms.recent().summary(),
                           "inference_ms": self.recent_inference_ms.recent().summary()},
                "sessions": sorted(rows, key=lambda r: r["client_uuid"])}

    def _set_load(self) -> None:
        active = self._active()
        cap = self.info.effective_max_sessions
        model = self.info.model_id
        self.metrics.set("active_sessions", active, model=model)
        self.metrics.set("active_clients", active, model=model)
        self.metrics.set("load", active / cap if cap else 1.0, model=model)

    # --- data plane: deposit -----------------------------------------------------------------------

    def _on_obs(self, sample) -> None:
        """Deposit only: decode, look up, hand to the mailbox. Any failure answers that client alone."""
        from server.scheduling import Request

        received_ns, routed_ns = arrival_stamps(sample)
        key = str(sample.key_expr)
        try:
            parsed = parse_client_key(key, self.keys.root)
        except WireError:
            self.metrics.inc("observation_errors", model=self.info.model_id, code=ErrorCode.BAD_KEY)
            return
        raw = sample.payload.to_bytes()
        att = sample.attachment.to_bytes() if sample.attachment is not None else None
        g, client = self.guard, parsed.client_uuid
        # Identity first, from the header and two body fields only: nothing unauthenticated is answered on the
        # key of a client that holds a session (server.guard invariant).
        owner = self.sessions.by_client(client)
        sid, tag = peek_identity(raw)
        authed = owner is not None and sid == owner.session_id and att is not None and g.obs_ok(owner, sid, tag, att)
        if owner is not None and not authed:
            g.deny("foreign_session" if sid != owner.session_id else "bad_auth", client, session_id=sid)
            return
        header = None
        try:
            header = unpack_header(att)
            if header.msg_type != MsgType.OBS:
                raise WireError(ErrorCode.MALFORMED, f"msg_type {header.msg_type.name} on an obs key; expected OBS")
            if authed and header.schema_version != owner.schema_version:
                # both sides speak the version the open agreed (wire-protocol 8); a chunk never echoes another
                raise WireError(ErrorCode.SCHEMA_VERSION, f"observation header says wire schema {header.schema_version}; "
                                f"this session speaks {owner.schema_version} (agreed at the session open)")
            if authed and len(raw) > g.max_observation_bytes:
                raise WireError(ErrorCode.TOO_LARGE, f"observation is {len(raw)} bytes; this replica accepts at most "
                                f"{g.max_observation_bytes} (security.max_observation_bytes)")
            if authed and not owner.bucket.take():
                g.deny("rate_limited", client, session_id=sid, seq_id=header.seq_id)
                self.metrics.inc("observation_errors", model=self.info.model_id, code=ErrorCode.RATE_LIMITED)
                if owner.answer_bucket is None or owner.answer_bucket.take():  # answered at up to the same rate
                    self._event_error(key, header, Error(ErrorCode.RATE_LIMITED, f"over {g.max_request_rate_hz:g} "
                                      "observations/s (security.max_request_rate_hz); requests are being dropped",
                                      seq_id=header.seq_id), session=owner)
                return
            obs = decode_message(raw, expect=Observation, limits=self.limits)
        except WireError as exc:
            self.metrics.inc("observation_errors", model=self.info.model_id, code=exc.code)
            reason = {ErrorCode.TOO_LARGE: "too_large", ErrorCode.SCHEMA_VERSION: "schema_version"}.get(exc.code,
                                                                                                        "malformed")
            if authed:
                g.deny(reason, client, session_id=sid, seq_id=header.seq_id if header else None,
                       detail=f"{len(raw)} bytes: {str(exc)[:200]}")
            if not g.should_answer(client, exc.code):
                return  # one answer per second and reason: a flood of bad input never becomes a flood of replies
            return self._event_error(key, header, Error(exc.code, f"observation refused: {exc}",
                                                        seq_id=header.seq_id if header else None), session=owner)
        if self.draining:
            return self._event_error(key, header, Error(ErrorCode.DRAINING, "replica is draining; open a session "
                                                        "on another replica", seq_id=header.seq_id))
        s, err = self.sessions.lookup(obs.session_id, parsed.client_uuid)
        if err is not None:
            self.metrics.inc("observation_errors", model=self.info.model_id, code=err.code)
            err.seq_id = header.seq_id
            if g.should_answer(client, err.code):  # no session on this key: the answer harms nobody, but stays rare
                self._event_error(key, header, err)
            return
        bad_state = state_shape_error(np.shape(obs.state), self.info.state_dim)  # the open agreed it: as a refused open
        if bad_state:
            self.metrics.inc("observation_errors", model=self.info.model_id, code=ErrorCode.STATE_DIM_MISMATCH)
            if g.should_answer(client, ErrorCode.STATE_DIM_MISMATCH):
                self._event_error(key, header, Error(ErrorCode.STATE_DIM_MISMATCH, bad_state, seq_id=header.seq_id),
                                  session=s)
            return
        if header.seq_id <= s.last_seq and not obs.episode_start:
            self.metrics.inc("observation_errors", model=self.info.model_id, code="STALE_SEQ")
            return  # a duplicate or reordered observation: the newer one is already queued or answered
        now = time.monotonic()
        s.touch(now, float(_get(self.m, "response_tracking.cadence_alpha", 0.3)))
        s.last_seq = header.seq_id
        s.requests += 1
        model = self.info.model_id
        self.metrics.observe("payload_size_bytes", len(raw), model=model)
        self.metrics.inc("requests", model=model)
        req = Request(session_id=s.session_id, client=s.client_uuid, model=self.info.model_id, seq_id=header.seq_id,
                      arrived=now, urgency=obs.urgency, priority=obs.priority if s.priority is None else s.priority,
                      steps_remaining=obs.steps_remaining, cadence_s=1.0 / s.fps if s.fps > 0 else s.cadence_s,
                      latency_budget_ms=s.latency_budget_ms,
                      batch_key=self.info.model_id,
                      payload=Pending(s, header, obs, len(raw), raw if self.capture is not None else None,
                                      received_ns, routed_ns))
        if not self._dispatch_started:  # every loop running before the first request can be answered
            self._start_dispatch()
        res = self.mailbox.deposit(req)
        if getattr(res, "superseded", None) is not None:
            self.metrics.inc("superseded_requests", model=model)
        dropped = res.dropped
        if res.reason == "closed":
            return self._event_error(key, header, Error(ErrorCode.DRAINING, "replica is stopping; open a session on "
                                                        "another replica", seq_id=header.seq_id))
        if dropped is not None:
            self.metrics.inc("queue_full_drops", model=model)
            dropped.payload.session.outcomes["dropped:queue_full"] += 1
            p: Pending = dropped.payload
            self._audit(p.session, p.header, (now - dropped.arrived) * 1e3, 0.0, None, 0, "dropped:queue_full")
            self._event_error(p.session.keys.action, p.header, Error(
                ErrorCode.OVERLOADED, f"server queue full ({self.mailbox.depth()} pending); request dropped by "
                f"overflow policy {_get(self.m, 'scheduling.overflow_policy', 'drop_oldest')}", seq_id=p.header.seq_id),
                session=p.session)

    def _event_error(self, key: str, header: Header | None, err: Error, session: Session | None = None) -> None:
        """An EVENT on the client's action key (derived from its obs key), echoing what we know of the header."""
        action_key = key[: -len("obs")] + "action" if key.endswith("/obs") else key
        h = Header(1, MsgType.EVENT, header.seq_id if header else 0, header.episode_id if header else 0,
                   header.client_mono_ns if header else 0, header.session_epoch if header else 0)
        try:
            if session is not None and session.publisher is not None:
                session.publisher.put(err.encode(), attachment=h.pack())
            else:
                self._z.put(action_key, err.encode(), attachment=h.pack(), **_event_qos())
        except Exception:
            self.metrics.inc("send_errors", model=self.info.model_id)

    # --- data plane: dispatch ----------------------------------------------------------------------

    def _dispatch_loop(self) -> None:
        set_torch_threads(_get(self.m, "torch_threads", 1) or 1)  # per thread: see server.runtime.set_torch_threads
        want = _get(self.m, "dispatch_priority", "normal") or "normal"
        log.info("%s%s (asked: %s)", DISPATCH_PRIORITY_LOG_TEXT,
                 raise_priority(want, DISPATCH_FIFO_PRIORITY, threading.get_native_id()), want)
        while not self.stopped.is_set():
            batch = self.mailbox.take(self.max_batch, 0.25)
            if batch.closed:
                return
            reqs = list(batch.requests)  # the micro-batch window is the mailbox's (or the scheduler's)
            for req in batch.expired:
                self.metrics.inc("requests_expired", model=self.info.model_id)
                p: Pending = req.payload
                p.session.outcomes["expired"] += 1
                self._audit(p.session, p.header, (time.monotonic() - req.arrived) * 1e3, 0.0, None, 0, "expired")
                self._event_error(p.session.keys.action, p.header, Error(
                    ErrorCode.EXPIRED, f"request waited over {_get(self.m, 'scheduling.request_ttl_ms', 5000)} ms in the "
                    "queue", seq_id=p.header.seq_id), session=p.session)
            if not reqs:
                continue
            with self._inflight_cv:
                self._inflight += 1
                self._inflight_cv.notify_all()  # a drain waits for none in flight; a test for one
            try:
                self._run_batch(reqs, batch.queue_depth)
            except Exception:
                log.exception("dispatch failed for a batch of %d", len(reqs))
                for req in reqs:
                    self.metrics.inc("dispatch_errors", model=self.info.model_id, error="internal")
            finally:
                with self._inflight_cv:
                    self._inflight -= 1
                    self._inflight_cv.notify_all()

    def _run_batch(self, reqs: list, queue_depth: int) -> None:
        t_pick = time.monotonic()
        model = self.info.model_id
        self.metrics.set("queue_depth", queue_depth, model=model)
        self.metrics.observe("batch_size", len(reqs), model=model)
        locked: list = []
        items: list[InferItem] = []
        for req in reqs:
            p: Pending = req.payload
            s = p.session
            if not s.lock.acquire(blocking=False):  # this session's previous request is still in flight
                if not self.mailbox.requeue(req).requeued:
                    self.metrics.inc("superseded_requests", model=model)
                continue
            locked.append(req)
            obs = p.obs
            if obs.episode_start or s.reset_pending:
                s.reset_pending = False
                s.pipeline.reset()
                if self.info.serving_mode == "exclusive":
                    with self.runtime.forward_lock:
                        self.runtime.reset_policy()
            images = {name: obs.images[name] for name in self.info.cameras if name in obs.images}
            items.append(InferItem(s.pipeline, obs.state, images, obs.inference_delay_steps, obs.prefix_model,
                                   obs.prefix_robot, rtc=s.rtc_enabled))
        try:
            if not items:
                return
            results = self.runtime.infer(items)
            captured, sent = [], []
            for req, res in zip(locked, results):  # every reply first: none waits for its neighbours' bookkeeping
                body = self._answer(req, res, t_pick, sent)
                if body is not None and self.capture is not None and req.payload.raw is not None:
                    p = req.payload
                    captured.append((p.session, p.header, p.raw, body))
            for args in sent:
                self._book_chunk(*args)
            if self.capture is not None:
                self.capture.record_batch(captured)
        finally:
            for req in locked:
                req.payload.session.lock.release()

    def _answer(self, req, res, t_pick: float, sent: list) -> bytes | None:
        """Publish the chunk (or the error event); returns the chunk body sent, if any. A chunk's metrics and audit
        line are left in `sent` for `_book_chunk`, after the batch's other replies went out: done here, each reply
        of a batch waited for every earlier one's (the replica's time outside its queue and pass, 5.5 / 11.0 ms p50
        at batches of 16 / 40 on the H100 host, most of it after the pass)."""
        p: Pending = req.payload
        s, h = p.session, p.header
        wait_ms = (t_pick - req.arrived) * 1e3
        superseded = self.mailbox.take_superseded(s.session_id)
        model = self.info.model_id
        if res.error:
            if res.error_code == "INTERNAL" and req.retries < self.mailbox.max_retries and self.mailbox.requeue(req).requeued:
                self.metrics.inc("dispatch_retries", model=model)
                return
            code = res.error_code or ErrorCode.INTERNAL
            if code == "INTERNAL":
                self.metrics.inc("dispatch_errors", model=model, error="forward")
            elif code == ErrorCode.NON_FINITE_ACTION:  # the policy's output, not the observation's form, failed
                self.metrics.inc("non_finite_actions", model=model)
            else:
                self.metrics.inc("observation_errors", model=model, code=code)
            s.outcomes[f"error:{code}"] += 1
            self._event_error(s.keys.action, h, Error(code, f"inference failed: {res.error}", seq_id=h.seq_id), session=s)
            self._audit(s, h, wait_ms, res.inference_ms, None, superseded, f"error:{code}")
            return
        chunk = ActionChunk(s.session_id, h.seq_id, h.client_mono_ns, res.chunk_model, res.chunk_robot,
                            queue_wait_ms=max(0.0, wait_ms), inference_ms=res.inference_ms, superseded_seqs=superseded,
                            server_load=self._active() / max(1, self.info.effective_max_sessions),
                            rtc_applied=res.rtc_applied, inference_emulated=res.emulated_ms > 0)
        body = chunk.encode()
        header = Header(h.schema_version, MsgType.CHUNK, h.seq_id, h.episode_id, h.client_mono_ns, h.session_epoch)
        handed_ns = time.monotonic_ns()  # the chunk is handed to Zenoh: the put may deliver it before it returns
        try:
            s.publisher.put(body, attachment=header.pack())
            sent_ns = handed_ns
            self.metrics.inc("chunks_sent", model=model)
            outcome = "ok"
        except Exception as exc:
            self.metrics.inc("send_errors", model=model)
            outcome, sent_ns = f"send_error:{type(exc).__name__}", None
        s.outcomes[outcome] += 1
        sent.append((req, res, wait_ms, superseded, outcome, t_pick, handed_ns, sent_ns))
        return body

    def _book_chunk(self, req, res, wait_ms: float, superseded, outcome: str, t_pick: float, handed_ns: int,
                    sent_ns: int | None) -> None:
        """A sent chunk's metrics, per-session percentiles and audit line (`_answer` left them for after the
        batch's replies)."""
        p: Pending = req.payload
        s, h = p.session, p.header
        model = self.info.model_id
        self.metrics.observe("queue_wait_ms", wait_ms, model=model)
        self.metrics.observe("inference_ms", res.inference_ms, model=model)
        self.metrics.observe("e2e_latency_ms", (handed_ns / 1e9 - req.arrived) * 1e3, model=model)
        # per-robot percentiles in fixed memory, for the /sessions status (never a metric label)
        s.queue_wait_ms.add(wait_ms)
        s.inference_ms.add(res.inference_ms)
        self.recent_queue_wait_ms.add(wait_ms)
        self.recent_inference_ms.add(res.inference_ms)
        self._audit(s, h, wait_ms, res.inference_ms, [0, int(res.chunk_robot.shape[0])], superseded, outcome,
                    emulated_ms=res.emulated_ms, rtc_applied=res.rtc_applied, forward_ms=round(res.forward_ms, 3),
                    batch=res.batch,
                    received_mono_ms=round(p.received_ns / 1e6, 3) if p.received_ns else None,
                    routed_mono_ms=round(p.routed_ns / 1e6, 3) if p.routed_ns else None,
                    picked_mono_ms=round(t_pick * 1e3, 3),
                    sent_mono_ms=round(sent_ns / 1e6, 3) if sent_ns else None)

    def _audit(self, s: Session, h: Header, wait_ms, inference_ms, chunk_range, superseded, outcome, **extra) -> None:
        self.audit.write({"session_id": s.session_id, "client_uuid": s.client_uuid, "seq_id": h.seq_id,
                          "episode_id": h.episode_id, "client_mono_ns": h.client_mono_ns, "queue_wait_ms": round(wait_ms, 3),
                          "inference_ms": round(inference_ms, 3), "chunk_range": chunk_range,
                          "superseded_seqs": superseded, "outcome": outcome, "model_id": self.info.model_id,
                          "replica_id": self.info.replica_id, "checkpoint_hash": self.info.checkpoint_hash, **extra})

    # --- housekeeping, drain, stop -----------------------------------------------------------------

    def _housekeeping(self) -> None:
        grace = float(_get(self.m, "session.gc_grace_s", 2.0))
        idle = float(_get(self.m, "response_tracking.disconnect_timeout_s", 0) or 0)
        while not self.stopped.wait(0.2):
            now = time.monotonic()
            for s in self.sessions.all():
                if s.alive_lost_mono is not None and s.last_seen_mono > s.alive_lost_mono:
                    s.alive_lost_mono = None  # it kept speaking: the token drop was not the client leaving (spoofed)
                elif s.alive_lost_mono is not None and now - s.alive_lost_mono >= grace:
                    self._close_session(s, f"client liveliness lost for {grace:g} s")
                elif idle > 0 and now - s.last_seen_mono > idle:
                    # a paused robot loses nothing: its next observation gets UNKNOWN_SESSION and it re-handshakes
                    self._close_session(s, f"no observation for {idle:g} s (response_tracking.disconnect_timeout_s)")
            self.metrics.set("queue_depth", self.mailbox.depth(), model=self.info.model_id)
            self.recent_queue_wait_ms.tick()
            self.recent_inference_ms.tick()

    def drain(self, reason: str = "SIGTERM") -> None:
        """Refuse new work, tell every client, wait for the batch in flight, then stop."""
        if self.draining:
            return
        timeout = float(_get(self.m, "drain.timeout_s", 10.0))
        self.draining = True
        self.ready = False
        deadline = time.monotonic() + timeout
        notice = DrainNotice(self.info.replica_id, reason, deadline_ms=timeout * 1e3)
        for s in self.sessions.all():
            try:
                s.publisher.put(notice.encode(), attachment=Header(1, MsgType.EVENT, 0, s.episode_id).pack())
            except Exception:
                self.metrics.inc("send_errors", model=self.info.model_id)
        with self._inflight_cv:
            while self._inflight and time.monotonic() < deadline:
                self._inflight_cv.wait(max(0.0, deadline - time.monotonic()))
        log.info("drained (%s): %d sessions notified", reason, len(self.sessions))
        self.stop()

    def stop(self) -> None:
        if self.stopped.is_set():
            return
        self.stopped.set()
        if hasattr(self, "mailbox"):
            self.mailbox.close()
        with self._dispatch_lock:  # no dispatch loop starts after this
            self._dispatch_started = True
            threads = list(self._threads)
        for t in threads:
            t.join(timeout=5)
        tok = getattr(self, "_token", None)
        for d in [tok, *reversed(self._decl)]:
            try:
                if d is not None:
                    d.undeclare()
            except Exception:
                pass
        for s in self.sessions.all():
            try:
                s.publisher.undeclare()
            except Exception:
                pass
        if getattr(self, "runtime", None) is not None:
            self.runtime.forward.close()  # a Ray Serve app of this replica goes with it
        if self._shared is not None:
            return  # the process closes its Zenoh session and audit log
        if self._router_link is not None:
            self._router_link.close()
        if self._z is not None:
            try:
                self._z.close()
            except Exception:
                pass
        if getattr(self, "health", None) is not None:
            self.health.stop()
        self.audit.close()


class RouterLink:
    """Whether the server's Zenoh session has a router now, and a log line each time it loses or regains one.

    A client-mode session reaches robots only through a router; while it has none, /readyz says not ready
    (reason `no router`) so nothing sends it sessions. Zenoh reconnects by itself: this only watches. The
    routers are counted from the transport events, not `routers_zid()`, which may still list a router when
    the event of its loss arrives.
    """

    def __init__(self, z):
        import zenoh

        self._router, self._put = zenoh.WhatAmI.ROUTER, zenoh.SampleKind.PUT
        self._lock = threading.Lock()
        self._routers = {str(zid) for zid in z.info.routers_zid()}  # history=True repeats them: no change, no line
        self._listener = z.info.declare_transport_events_listener(self._on_transport, history=True)

    def connected(self) -> bool:
        with self._lock:
            return bool(self._routers)

    def _on_transport(self, event) -> None:
        transport = event.transport
        if transport.whatami != self._router:
            return
        zid, put = str(transport.zid), event.kind == self._put
        with self._lock:
            changed = (zid in self._routers) != put
            if put:
                self._routers.add(zid)
            else:
                self._routers.discard(zid)
            left = len(self._routers)
        if not changed:
            return
        if put:
            log.info("Zenoh router %s connected (%d in all): ready for sessions", zid, left)
        elif left:
            log.info("Zenoh router %s lost, %d still connected", zid, left)
        else:
            log.warning("Zenoh router %s lost: not ready (no router) until one is back; reconnecting", zid)

    def close(self) -> None:
        try:
            self._listener.undeclare()
        except Exception:  # the session may be closed already
            pass


class StartCancelled(Exception):
    """stop() (SIGTERM, Ctrl-C) came while start() was still waiting for a Zenoh router: nothing to drain."""


def open_manifest_session(m, *, sleep=time.sleep, clock=time.monotonic, stopped: threading.Event | None = None):
    """The server's Zenoh session as the manifest's `zenoh` section says (endpoints, lease, TLS files).

    An unreachable router is retried with backoff (0.1 s doubling to 2 s) until `zenoh.connect_timeout_s`
    has passed: a replica restarted while its router is saturated or restarting must not exit on a refusal
    that would have cleared a second later. Missing or bad TLS files fail at once (no retry can fix them).
    `stopped` set ends the retries at once with StartCancelled (a SIGTERM must not wait out the timeout).
    """
    if stopped is not None:
        sleep = stopped.wait
    from wire.transport import TlsFiles, open_session

    tls = _get(m, "zenoh.tls", None)
    tls_files = None
    if tls is not None and _get(tls, "root_ca_certificate", None):
        tls_files = TlsFiles(_get(tls, "root_ca_certificate"), _get(tls, "connect_certificate", None),
                             _get(tls, "connect_private_key", None))
    connect = list(_get(m, "zenoh.connect_endpoints", []))
    deadline = clock() + float(_get(m, "zenoh.connect_timeout_s", 0.0) or 0.0)
    delay, attempts = 0.1, 0
    while True:
        attempts += 1
        try:
            return open_session(connect=connect, lease_ms=int(_get(m, "zenoh.lease_ms", 1000)), tls=tls_files,
                                what="policy-server")
        except ConnectionError as exc:
            left = deadline - clock()
            if left <= 0:
                if attempts > 1:
                    raise ConnectionError(f"{exc} (gave up after {attempts} attempts; zenoh.connect_timeout_s "
                                          f"{_get(m, 'zenoh.connect_timeout_s', 0.0)})") from None
                raise
            log.warning("router not reachable yet (attempt %d), retrying in %.1f s: %s", attempts, min(delay, left), exc)
            sleep(min(delay, left))
            if stopped is not None and stopped.is_set():
                raise StartCancelled(f"stopped while waiting for a Zenoh router (attempt {attempts})") from None
            delay = min(2.0, delay * 2)


def _event_qos() -> dict:
    """EVENT QoS for a one-off `session.put` (no publisher for a client without a session)."""
    from wire.qos import EVENT, publisher_kwargs

    kw = publisher_kwargs(EVENT)
    kw.pop("reliability", None)  # a publisher-only option in zenoh-python 1.x
    return kw


def _limits(m) -> Limits:
    lim = _get(m, "limits", None)
    if lim is None:
        return Limits()
    if isinstance(lim, Limits):
        return lim
    fields = {k: v for k, v in (lim.items() if isinstance(lim, dict) else vars(lim).items()) if v is not None}
    return Limits(**{k: v for k, v in fields.items() if k in Limits.__dataclass_fields__})


def _get(obj, dotted: str, default=...):
    """Read `a.b.c` from nested dataclasses or dicts; `default` when absent (KeyError if none given)."""
    cur = obj
    for part in dotted.split("."):
        if cur is None:
            break
        cur = cur.get(part, None) if isinstance(cur, dict) else getattr(cur, part, None)
    if cur is None:
        if default is ...:
            raise KeyError(dotted)
        return default
    return cur


def _control_header(query) -> Header:
    """The 27-byte CONTROL header a session open or reset carries (wire-protocol 1, 3); MALFORMED without it."""
    header = unpack_header(query.attachment.to_bytes() if query.attachment is not None else None)
    if header.msg_type != MsgType.CONTROL:
        raise WireError(ErrorCode.MALFORMED, f"msg_type {header.msg_type.name} on a control key; expected CONTROL")
    return header
