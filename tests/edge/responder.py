"""A small protocol-faithful policy server for edge tests: real Zenoh, no torch, deterministic chunks.

    robot session ──► router process ──► Responder session (this module, its own Zenoh session)
      obs put      ─────────────────►    obs subscriber ─► mailbox (latest per session) ─► worker ─► chunk put
      status/session/reset queries ──►   queryables (answered inline)
      alive token                  ──►   liveliness subscriber: token gone for `gc_grace_s` -> session forgotten
                                         own alive token (closing the session removes it)

Chunks are a pure function of the observed state (`expected_chunk`), so a test can tell exactly
which observation an executed action came from. Fault knobs (plain attributes, change them live):
`delay_s` (answer after), `hang` (never answer), `drop_every_n` (no answer for every n-th obs),
`duplicate` (every chunk twice), `late_chunk` (after each chunk, one more for the previous seq with
POISON values), `reset_delay_s`. A hostile or broken server: `tamper(chunk, header)` rewrites each answer
before it is sent (return a new `(ActionChunk, Header)`: other rows, dims, dtype, values, session, epoch,
seq, episode, echoes), `extra_replies(header, obs)` returns raw `(payload, attachment)` pairs put on the
robot's action key before each answer (garbage, bad attachments, floods, replays, chunks for a seq never
sent), `ack_changes` overrides SessionAck fields (capabilities that disagree with the request or the first
ack), `status_changes` overrides Status fields (what discovery reads), `session_reply` (bytes) is what every
session query gets instead of an ack, `drain_on_open` sends a DrainNotice right after every session it opens. `stop()` closes the session
like a killed process; `restart(**changes)` comes back (sessions forgotten), possibly as another model
(checkpoint_hash, action_names...).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict

import numpy as np

from wire import (
    DEFAULT_ROOT,
    SCHEMA_VERSION,
    ActionChunk,
    DrainNotice,
    Error,
    ErrorCode,
    Header,
    MsgType,
    Observation,
    ReplicaKeys,
    Reset,
    ResetAck,
    SessionAck,
    SessionOpen,
    Status,
    WireError,
    decode_message,
    parse_client_key,
    unpack_header,
)
from wire.qos import ACTION, publisher_kwargs
from wire.transport import open_session
from wire.version import MAX_SUPPORTED, MIN_SUPPORTED

POISON = 99.0  # values of a late chunk: an action with this value must never be executed
HASH_A = "a" * 64
HASH_B = "b" * 64


_PUT_QOS = {k: v for k, v in publisher_kwargs(ACTION).items() if k != "reliability"}  # publisher-only option


def expected_chunk(state: np.ndarray, chunk_size: int, action_dim: int) -> np.ndarray:
    """Robot-space chunk for `state`: row t, column a = state[0] + 0.001 * t + 0.0001 * a."""
    s0 = float(np.asarray(state, np.float32).reshape(-1)[0])
    t = np.arange(chunk_size, dtype=np.float32)[:, None]
    a = np.arange(action_dim, dtype=np.float32)[None, :]
    return (s0 + 0.001 * t + 0.0001 * a).astype(np.float32)


_CONTROL = Header(SCHEMA_VERSION, MsgType.CONTROL).pack()  # the attachment of every control reply


def _decode_or_reply(query, expect: type):
    """The query's message of type `expect`, or None after replying the WireError a real replica replies."""
    try:
        return decode_message(query.payload.to_bytes() if query.payload is not None else b"", expect=expect)
    except WireError as exc:
        query.reply(query.key_expr, Error(exc.code, str(exc)).encode(), attachment=_CONTROL)
        return None


class Responder:
    def __init__(
        self,
        endpoint: str,
        *,
        model_id: str = "arm",
        revision: str = "main",
        replica_id: str = "r0",
        root: str = DEFAULT_ROOT,
        action_names=("x", "y", "grip"),
        state_dim: int = 4,
        chunk_size: int = 10,
        checkpoint_hash: str = HASH_A,
        policy_type: str = "flow_matching",
        max_sessions: int = 8,
        fps: float = 30.0,
        supports_rtc: bool = True,
        delay_s: float = 0.0,
        hang: bool = False,
        drop_every_n: int = 0,
        duplicate: bool = False,
        late_chunk: bool = False,
        reset_delay_s: float = 0.0,
        lease_ms: int = 500,
        gc_grace_s: float = 0.3,
        tamper=None,
        extra_replies=None,
        ack_changes: dict | None = None,
        status_changes: dict | None = None,
        session_reply: bytes | None = None,
        drain_on_open: bool = False,
    ):
        self.endpoint, self.lease_ms, self.gc_grace_s = endpoint, lease_ms, gc_grace_s
        self.model_id, self.revision, self.replica_id, self.root = model_id, revision, replica_id, root
        self.action_names, self.state_dim, self.chunk_size = list(action_names), state_dim, chunk_size
        self.checkpoint_hash, self.policy_type, self.max_sessions = checkpoint_hash, policy_type, max_sessions
        self.fps, self.supports_rtc = fps, supports_rtc
        self.delay_s, self.hang, self.drop_every_n = delay_s, hang, drop_every_n
        self.duplicate, self.late_chunk, self.reset_delay_s = duplicate, late_chunk, reset_delay_s
        self.tamper, self.extra_replies = tamper, extra_replies
        self.ack_changes, self.drain_on_open = dict(ack_changes or {}), drain_on_open
        self.status_changes, self.session_reply = dict(status_changes or {}), session_reply
        self.draining = False
        self.cv = threading.Condition()  # guards everything below; notified on every change
        self.sessions: dict[str, dict] = {}  # session_id -> {client, prefix, last_seq, episode}
        self.mailbox: OrderedDict[str, tuple] = OrderedDict()  # session_id -> (t_arrival, key, header, obs)
        self.superseded: dict[str, int] = {}
        self.obs_count = 0
        self.chunks_sent = 0
        self.opens = 0
        self.resets: list[tuple[str, int]] = []  # (session_id, episode_id) acknowledged
        self.obs_log: list[tuple[str, Header, Observation]] = []  # every observation accepted
        self.z = None
        self._gen = 0
        self._decl: list = []
        self._stop = threading.Event()
        self._worker: threading.Thread | None = None

    @property
    def keys(self) -> ReplicaKeys:
        return ReplicaKeys(self.model_id, self.revision, self.replica_id, self.root)

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> Responder:
        import zenoh

        with self.cv:
            self._gen += 1
            gen = self._gen
            self.sessions.clear()
            self.mailbox.clear()
            self.draining = False
        self.z = open_session(connect=[self.endpoint], lease_ms=self.lease_ms, what=f"responder {self.replica_id}")
        k = self.keys
        z = self.z
        self._decl = [
            z.declare_subscriber(k.all_obs, lambda s: self._on_obs(s, gen)),
            z.declare_queryable(k.all_reset, lambda q: self._on_reset(q, gen)),
            z.liveliness().declare_subscriber(k.all_client_alive, lambda s: self._on_client_alive(s, gen)),
            z.declare_queryable(k.status, self._on_status),
            z.declare_queryable(k.session, lambda q: self._on_session(q, gen)),
            z.declare_queryable(k.all_client_session, lambda q: self._on_session(q, gen)),
            z.liveliness().declare_token(k.alive),
        ]
        if self._worker is None:
            self._stop.clear()
            self._worker = threading.Thread(target=self._work, name=f"responder {self.replica_id}", daemon=True)
            self._worker.start()
        return self

    def stop(self) -> None:
        """Like a killed server: its session (and liveliness token) goes away, pending work is lost."""
        with self.cv:
            self._gen += 1
            self.mailbox.clear()
            self.cv.notify_all()
        if self.z is not None:
            try:
                self.z.close()
            except Exception:
                pass
            self.z = None

    def restart(self, **changes) -> Responder:
        """Stop, apply `changes` (e.g. checkpoint_hash=HASH_B), start again with no sessions."""
        self.stop()
        for name, value in changes.items():
            if not hasattr(self, name):
                raise AttributeError(f"Responder has no knob {name!r}")
            setattr(self, name, value)
        return self.start()

    def close(self) -> None:
        self.stop()
        self._stop.set()
        with self.cv:
            self.cv.notify_all()
        if self._worker is not None:
            self._worker.join(timeout=5)
            self._worker = None

    def forget_sessions(self) -> None:
        """A server that lost its state but kept its token: the next observation gets UNKNOWN_SESSION."""
        with self.cv:
            self.sessions.clear()
            self.mailbox.clear()
            self.cv.notify_all()

    def drain(self, reason: str = "test drain") -> None:
        with self.cv:
            self.draining = True
            targets = [(sid, s["prefix"], s["episode"]) for sid, s in self.sessions.items()]
        for _sid, prefix, episode in targets:
            self._put(
                prefix + "/action",
                DrainNotice(self.replica_id, reason, 1000.0).encode(),
                Header(SCHEMA_VERSION, MsgType.EVENT, 0, episode),
            )

    def wait_for(self, pred, timeout: float = 5.0) -> bool:
        """Wait (on the condition every change notifies) until `pred(self)` is true."""
        with self.cv:
            return self.cv.wait_for(lambda: pred(self), timeout)

    # --- control plane -----------------------------------------------------------------------------

    def _model_fields(self) -> dict:
        active = len(self.sessions)
        return dict(
            replica_id=self.replica_id,
            model_id=self.model_id,
            revision=self.revision,
            checkpoint_hash=self.checkpoint_hash,
            policy_type=self.policy_type,
            action_names=list(self.action_names),
            state_dim=self.state_dim,
            chunk_size=self.chunk_size,
            trained_fps=self.fps,
            supports_rtc=self.supports_rtc,
            serving_mode="shared",
            warmed_up=True,
            active_sessions=active,
            max_sessions=self.max_sessions,
            load=active / self.max_sessions,
        )

    def _on_status(self, query) -> None:
        with self.cv:
            fields = dict(
                **self._model_fields(),
                ready=not self.draining,
                draining=self.draining,
                schema_min=MIN_SUPPORTED,
                schema_max=MAX_SUPPORTED,
            )
            st = Status(**{**fields, **self.status_changes})
        query.reply(self.keys.status, st.encode(), attachment=_CONTROL)

    def _on_session(self, query, gen: int) -> None:
        if self.session_reply is not None:
            query.reply(query.key_expr, self.session_reply, attachment=_CONTROL)
            return
        req = _decode_or_reply(query, SessionOpen)
        if req is None:
            return
        with self.cv:
            if gen != self._gen:
                return
            err = self._validate(req)
            if err is None:
                for sid in [sid for sid, s in self.sessions.items() if s["client"] == req.client_uuid]:
                    del self.sessions[sid]  # the client's new session replaces its old one
                    self.mailbox.pop(sid, None)
                sid = uuid.uuid4().hex[:16]
                prefix = self.keys.client(req.task, req.client_uuid).prefix
                self.sessions[sid] = {
                    "client": req.client_uuid,
                    "prefix": prefix,
                    "last_seq": 0,
                    "episode": 0,
                    "latency_budget_ms": req.latency_budget_ms,
                }
                self.opens += 1
                fields = dict(
                    **self._model_fields(),
                    session_id=sid,
                    schema_version=req.schema_version,
                    rtc_enabled=req.rtc_enabled and self.supports_rtc,
                    execution_horizon=req.execution_horizon,
                    task=req.task,
                )
                body = SessionAck(**{**fields, **self.ack_changes})
                self.cv.notify_all()
            else:
                body = err
        query.reply(query.key_expr, body.encode(), attachment=_CONTROL)
        if err is None and self.drain_on_open:
            self._put(
                prefix + "/action",
                DrainNotice(self.replica_id, "drain on open", 1000.0).encode(),
                Header(SCHEMA_VERSION, MsgType.EVENT, 0, 0),
            )

    def _validate(self, req: SessionOpen) -> Error | None:
        if self.draining:
            return Error(ErrorCode.DRAINING, f"replica {self.replica_id} is draining")
        if not MIN_SUPPORTED <= req.schema_version <= MAX_SUPPORTED:
            return Error(ErrorCode.SCHEMA_VERSION, f"schema {req.schema_version} unsupported")
        if req.expected_checkpoint_hash and req.expected_checkpoint_hash != self.checkpoint_hash:
            return Error(
                ErrorCode.WRONG_MODEL, "client pinned another checkpoint", {"checkpoint_hash": self.checkpoint_hash}
            )
        if req.policy_type and req.policy_type != self.policy_type:
            return Error(ErrorCode.WRONG_MODEL, f"this replica serves {self.policy_type!r}")
        if list(req.action_names) != self.action_names:
            return Error(
                ErrorCode.ACTION_MISMATCH,
                f"action names must be {self.action_names}",
                {"action_names": self.action_names},
            )
        if req.state_dim != self.state_dim:
            return Error(ErrorCode.STATE_DIM_MISMATCH, f"state_dim must be {self.state_dim}")
        others = sum(1 for s in self.sessions.values() if s["client"] != req.client_uuid)
        if others >= self.max_sessions:
            return Error(
                ErrorCode.CAPACITY,
                f"replica {self.replica_id} is full",
                {"active_sessions": others, "max_sessions": self.max_sessions},
            )
        return None

    def _on_reset(self, query, gen: int) -> None:
        req = _decode_or_reply(query, Reset)
        if req is None:
            return
        if self.reset_delay_s:
            time.sleep(self.reset_delay_s)  # a slow server: only this queryable's thread waits
        with self.cv:
            s = self.sessions.get(req.session_id) if gen == self._gen else None
            if s is None:
                body = Error(ErrorCode.UNKNOWN_SESSION, "no such session; open a new one")
            else:
                s["episode"] = req.episode_id
                self.mailbox.pop(req.session_id, None)
                self.resets.append((req.session_id, req.episode_id))
                body = ResetAck(req.session_id, req.episode_id)
                self.cv.notify_all()
        query.reply(query.key_expr, body.encode(), attachment=_CONTROL)

    def _on_client_alive(self, sample, gen: int) -> None:
        """As the server: a token's DELETE marks the client's sessions lost, its PUT clears the mark, and a session
        still lost after `gc_grace_s` is forgotten. A re-handshake undeclares the old token and declares the new one;
        the DELETE may reach this subscriber after the new session's open query, which must not forget it."""
        import zenoh

        try:
            client = parse_client_key(str(sample.key_expr), self.root).client_uuid
        except WireError:
            return
        lost = sample.kind == zenoh.SampleKind.DELETE
        with self.cv:
            if gen != self._gen:
                return
            for s in self.sessions.values():
                if s["client"] == client:
                    s["lost_at"] = time.monotonic() if lost else None
        if lost:
            timer = threading.Timer(self.gc_grace_s, self._forget_lost, (client, gen))
            timer.daemon = True
            timer.start()

    def _forget_lost(self, client: str, gen: int) -> None:
        with self.cv:
            if gen != self._gen:
                return
            now = time.monotonic()
            for sid in [
                sid
                for sid, s in self.sessions.items()
                if s["client"] == client
                and s.get("lost_at") is not None
                and now - s["lost_at"] >= self.gc_grace_s - 1e-3
            ]:
                del self.sessions[sid]
                self.mailbox.pop(sid, None)
            self.cv.notify_all()

    # --- data plane --------------------------------------------------------------------------------

    def _on_obs(self, sample, gen: int) -> None:
        key = str(sample.key_expr)
        try:
            h = unpack_header(sample.attachment.to_bytes() if sample.attachment is not None else None)
            obs = decode_message(sample.payload.to_bytes(), expect=Observation)
        except WireError:
            return
        action_key = key[: -len("obs")] + "action"
        with self.cv:
            if gen != self._gen:
                return
            self.obs_count += 1
            n = self.obs_count
            s = self.sessions.get(obs.session_id)
            known = s is not None and action_key.startswith(s["prefix"] + "/")
            if known and h.seq_id <= s["last_seq"] and not obs.episode_start:
                return  # stale or duplicate observation
            if known:
                s["last_seq"] = h.seq_id
                self.obs_log.append((obs.session_id, h, obs))
                drop = self.hang or (self.drop_every_n and n % self.drop_every_n == 0)
                if not drop:
                    if obs.session_id in self.mailbox:
                        self.superseded[obs.session_id] = self.superseded.get(obs.session_id, 0) + 1
                        del self.mailbox[obs.session_id]
                    self.mailbox[obs.session_id] = (time.monotonic(), action_key, h, obs)
            self.cv.notify_all()
        if not known:
            self._put(
                action_key,
                Error(ErrorCode.UNKNOWN_SESSION, "no such session; open a new one", seq_id=h.seq_id).encode(),
                Header(SCHEMA_VERSION, MsgType.EVENT, h.seq_id, h.episode_id, h.client_mono_ns, h.session_epoch),
            )

    def _work(self) -> None:
        while not self._stop.is_set():
            with self.cv:
                while not self.mailbox and not self._stop.is_set():
                    self.cv.wait()
                if self._stop.is_set():
                    return
                sid, (t_arr, key, h, obs) = next(iter(self.mailbox.items()))
                due = t_arr + self.delay_s
                left = due - time.monotonic()
                if left > 0:
                    self.cv.wait(left)  # a newer observation or a reset may replace it meanwhile
                    continue
                del self.mailbox[sid]
                superseded = self.superseded.pop(sid, 0)
                z = self.z
            self._answer(z, key, h, obs, superseded)

    def _answer(self, z, key: str, h: Header, obs: Observation, superseded: int) -> None:
        robot = expected_chunk(obs.state, self.chunk_size, len(self.action_names))
        model = robot * 0.5
        chunk = ActionChunk(
            obs.session_id,
            h.seq_id,
            h.client_mono_ns,
            model,
            robot,
            queue_wait_ms=self.delay_s * 1e3,
            inference_ms=0.1,
            superseded_seqs=superseded,
            server_load=0.0,
            rtc_applied=obs.prefix_model is not None,
        )
        header = Header(SCHEMA_VERSION, MsgType.CHUNK, h.seq_id, h.episode_id, h.client_mono_ns, h.session_epoch)
        for payload, attachment in self.extra_replies(h, obs) if self.extra_replies is not None else ():
            self._put_raw(key, payload, attachment, z)
        if self.tamper is not None:
            chunk, header = self.tamper(chunk, header)
        body = chunk.encode()
        for _ in range(2 if self.duplicate else 1):
            self._put(key, body, header, z)
        if self.late_chunk and h.seq_id > 1:
            poison = np.full_like(robot, POISON)
            late = ActionChunk(obs.session_id, h.seq_id - 1, h.client_mono_ns, poison, poison).encode()
            self._put(
                key,
                late,
                Header(SCHEMA_VERSION, MsgType.CHUNK, h.seq_id - 1, h.episode_id, h.client_mono_ns, h.session_epoch),
                z,
            )
        with self.cv:
            self.chunks_sent += 1
            self.cv.notify_all()

    def _put(self, key: str, body: bytes, header: Header, z=None) -> None:
        self._put_raw(key, body, header.pack(), z)

    def _put_raw(self, key: str, body: bytes, attachment: bytes | None, z=None) -> None:
        z = z or self.z
        if z is None:
            return
        try:
            z.put(key, body, attachment=attachment, **_PUT_QOS)
        except Exception:
            pass  # a closed session while restarting: the chunk is lost, as on a real network
