"""The plain client API (003's SDK shape) over the wire protocol; the remote engine is built on it.

    conn = Connection(["tcp/127.0.0.1:7447"], client_id="station-01", client_type="so100")
    arm = conn.model("arm", action_names=[...], state_dim=6, fps=30)    # discovery + session open
    seq = arm.observe(urgency=0.8, state=q, images={"front": rgb})      # non-blocking put
    r = arm.get_result(timeout_ms=200)                                  # Result | Event | None
    conn.close()

`Model` is one session of a client on one replica, a facade over three parts: edge.discovery (which
replicas answer, best first), edge.handshake (the session-open ladder, its refusals and timeouts) and
edge.inbox (the bounded inbox and the decode into Result / Event). It owns the session's state: the
observation publisher, the reset queries and the flags below. Every observation and reset carries the
session's auth tag (wire.auth, keyed by SessionAck.session_key).

Events: an Error EVENT with UNKNOWN_SESSION sets `model.needs_handshake` (the server forgot the session:
call `open()` again); a DrainNotice (or a DRAINING error) sets `model.draining` (open elsewhere).

Invariants: Zenoh callbacks only deposit (raw bytes into a bounded inbox, flags for liveliness) and
run on Zenoh's own threads (no Python thread per subscriber); only monotonic clocks; `seq_id`
strictly increases per session and `session_epoch` counts (re)opens.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from edge.discovery import discover, spread_key, watch_replicas
from edge.handshake import (
    RETRY_ELSEWHERE,
    BrokenReplica,
    ControlTimeouts,
    NoReplica,
    SessionRefused,
    accept,
    camera_shapes,
    control_query,
    declare,
    open_body,
    open_ladder,
    reset_body,
)
from edge.inbox import INBOX_MAX, INBOX_MAX_BYTES, Event, Inbox, Result, decode
from wire import (
    DEFAULT_ROOT,
    SCHEMA_VERSION,
    Error,
    ErrorCode,
    Header,
    MsgType,
    Observation,
    ReplicaKeys,
    ResetAck,
    SessionAck,
    Status,
    WireError,
    decode_message,
    encode_image,
)
from wire import auth as wauth
from wire.qos import CONTROL_TIMEOUTS_S
from wire.transport import arrival_stamps

__all__ = [  # the names other modules import from here (edge.remote, tests, benchmarks)
    "BrokenReplica",
    "Connection",
    "ControlTimeouts",
    "Event",
    "INBOX_MAX",
    "INBOX_MAX_BYTES",
    "Model",
    "NoReplica",
    "RETRY_ELSEWHERE",
    "Result",
    "SessionRefused",
    "camera_shapes",
    "spread_key",
]


class Connection:
    """One Zenoh session to the router(s) for one client id; `model()` opens sessions on it.
    `session`: share an already open Zenoh session (it is then not closed here)."""

    def __init__(
        self,
        server: str | list[str],
        client_id: str,
        client_type: str = "",
        root: str = DEFAULT_ROOT,
        lease_ms: int = 1000,
        tls=None,
        session=None,
    ):
        from wire.keys import sanitize
        from wire.transport import open_session

        self.client_id = sanitize(client_id, "client_id")
        self.client_type = client_type
        self.root = root
        self.endpoints = [server] if isinstance(server, str) else list(server)
        self._own = session is None
        self.z = session or open_session(connect=self.endpoints, lease_ms=lease_ms, tls=tls, what=f"client {client_id}")
        self._models: list[Model] = []

    def model(
        self,
        model_id: str,
        revision: str = "main",
        *,
        latency_budget_ms: float | None = None,
        priority: int = 0,
        task: str = "",
        fps: float = 30.0,
        action_names: list[str] | None = None,
        state_dim: int = 0,
        cameras: dict[str, list[int]] | list[str] | None = None,
        rtc_enabled: bool = False,
        execution_horizon: int = 0,
        expected_checkpoint_hash: str = "",
        replica_order: list[str] | None = None,
        open: bool = True,
        **extra,
    ) -> Model:
        """A handle on `model_id`; with `open` (default) discovery and the session handshake run now.
        `extra`: policy_type, tags, jpeg_quality (see `Model`)."""
        m = Model(
            self,
            model_id,
            revision,
            latency_budget_ms=latency_budget_ms,
            priority=priority,
            task=task,
            fps=fps,
            action_names=action_names,
            state_dim=state_dim,
            cameras=cameras,
            rtc_enabled=rtc_enabled,
            execution_horizon=execution_horizon,
            expected_checkpoint_hash=expected_checkpoint_hash,
            replica_order=replica_order,
            **extra,
        )
        self._models.append(m)
        if open:
            try:
                m.open()
            except BaseException:
                m.close()
                self._models.remove(m)
                raise
        return m

    def close(self) -> None:
        for m in self._models:
            m.close()
        self._models.clear()
        if self._own:
            try:
                self.z.close()
            except Exception:
                pass

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Model:
    """One session of this client with one replica of a model.

    Flags the caller reads (set by `get_result` while decoding, or by Zenoh's liveliness callback):
    `server_lost` (Event: the replica's token went away), `draining` (DrainNotice or a DRAINING error),
    `needs_handshake` (UNKNOWN_SESSION: the server forgot this session; call `open()` again).
    """

    def __init__(
        self,
        conn: Connection,
        model_id: str,
        revision: str = "main",
        *,
        latency_budget_ms: float | None = None,
        priority: int = 0,
        task: str = "",
        fps: float = 30.0,
        action_names: list[str] | None = None,
        state_dim: int = 0,
        cameras: dict[str, list[int]] | list[str] | None = None,
        rtc_enabled: bool = False,
        execution_horizon: int = 0,
        expected_checkpoint_hash: str = "",
        policy_type: str = "",
        replica_order: list[str] | None = None,
        tags: dict[str, str] | None = None,
        jpeg_quality: int = 90,
    ):
        self.conn = conn
        self.model_id, self.revision = model_id, revision
        self.latency_budget_ms, self.priority = latency_budget_ms, priority
        self.open_args = dict(
            task=task,
            fps=float(fps),
            action_names=list(action_names or []),
            state_dim=int(state_dim),
            cameras=camera_shapes(cameras),
            rtc_enabled=bool(rtc_enabled),
            execution_horizon=int(execution_horizon),
            expected_checkpoint_hash=expected_checkpoint_hash,
            policy_type=policy_type,
            tags=dict(tags or {}),
            latency_budget_ms=float(latency_budget_ms or 0.0),
        )
        self.replica_order = list(replica_order or [])
        self._rng = random.Random()  # discovery's weighted draw (spread_key); seeded from the OS per robot
        self.jpeg_quality = int(jpeg_quality)
        self.ack: SessionAck | None = None
        self.replica: ReplicaKeys | None = None
        self.keys = None
        self.epoch = 0  # session_epoch: bumped by every open attempt, so a chunk of an older session never matches
        self.episode_id = 0  # header episode of the next observation; `reset()` moves it
        self._seq = itertools.count(1)
        self.last_seq = 0
        self.last_sent_ns = 0  # the header client_mono_ns of observation last_seq: its chunk must echo it
        self._inbox = Inbox()  # bounded: Zenoh's thread never waits
        self._decl: list[Any] = []
        self._pub = None
        self._gen = 0  # callbacks of an undeclared session check it and fall silent
        self._prev_ack: SessionAck | None = None  # the last session opened: a re-handshake proves it owned it
        self.server_alive = False
        self.server_lost = threading.Event()
        self.draining = False
        self.needs_handshake = False
        self.wake: threading.Event | None = None  # optional: set on every deposit (the engine's worker waits on it)
        # optional: set when any replica's liveliness token of this model appears (a server started, or the link
        # to the router healed), so a reconnect loop waiting out its backoff can come back now
        self.nudge: threading.Event | None = None
        # optional: called (on Zenoh's thread, deposit only) when a replica token of this model appears
        self.on_token: Callable[[], None] | None = None
        self._watch = None

    # --- discovery and handshake (edge.discovery, edge.handshake) ------------------------------------

    def discover(self, timeout_s: float = CONTROL_TIMEOUTS_S["status"]) -> list[Status]:
        """Every replica's Status, best first (edge.discovery.discover)."""
        return discover(
            self.conn.z, self.model_id, self.revision, self.conn.root, timeout_s, self.replica_order, self._rng
        )

    def open(
        self,
        exclude: set[str] | frozenset = frozenset(),
        task: str | None = None,
        *,
        status_timeout_s: float = CONTROL_TIMEOUTS_S["status"],
        session_timeout_s: float = CONTROL_TIMEOUTS_S["session"],
        deadline: float | None = None,
        candidates: list[Status] | None = None,
    ) -> SessionAck:
        """Discover and open a session on the best replica not in `exclude` (edge.handshake.open_ladder);
        with `candidates`, try those Status in their order instead of discovering (a rebalancing move).

        CAPACITY, EXCLUSIVE_BUSY, DRAINING, NOT_READY and a replica that does not answer move on to the
        next replica; any other refusal raises `SessionRefused`; nothing left raises `NoReplica`.
        `deadline` (monotonic s): no query waits past it (the caller's offline budget)."""
        if self._watch is None:  # declared once, kept across sessions
            self._watch = watch_replicas(
                self.conn.z, self.model_id, self.revision, self.conn.root, self._on_replica_token
            )
        return open_ladder(
            self.discover if candidates is None else (lambda _timeout_s: list(candidates)),
            lambda st, waited: self._open_on(st, task, waited),
            model_id=self.model_id,
            revision=self.revision,
            root=self.conn.root,
            exclude=exclude,
            replica_order=self.replica_order if candidates is None else [],
            status_timeout_s=status_timeout_s,
            session_timeout_s=session_timeout_s,
            deadline=deadline,
        )

    def _on_replica_token(self) -> None:  # deposit only, on Zenoh's thread
        if self.nudge is not None:
            self.nudge.set()
        if self.on_token is not None:
            self.on_token()

    def _open_on(self, st: Status, task: str | None, timeout_s: float = CONTROL_TIMEOUTS_S["session"]) -> SessionAck:
        prev = self.ack if self.ack is not None and self.ack.replica_id == st.replica_id else self._prev_ack
        self._undeclare()
        rk = ReplicaKeys(self.model_id, self.revision, st.replica_id, self.conn.root)
        eff_task = (task if task is not None else self.open_args["task"]) or st.default_task
        keys = rk.client(eff_task, self.conn.client_id)
        self._gen += 1
        gen = self._gen
        self.server_lost.clear()
        self.server_alive = False
        self.draining = False
        self.needs_handshake = False
        self.epoch += 1
        self._seq = itertools.count(1)  # seq_id restarts at 1 in every session
        self.last_seq = 0
        self._inbox.clear()
        self._pub = declare(
            self.conn.z,
            keys,
            rk,
            lambda s: self._on_action(s, gen),
            lambda s: self._on_server_alive(s, gen),
            self._decl,
        )
        body = open_body(self.conn.client_id, self.conn.client_type, self.open_args, eff_task, st.replica_id, prev)
        try:
            reply = control_query(self.conn.z, keys.session, body, timeout_s)
            ack = accept(reply, st.replica_id, self.model_id, self.revision, self.open_args)
        except BaseException:
            self._undeclare()  # its token goes: the replica forgets the session after its grace period
            raise
        self.replica, self.keys, self.ack = rk, keys, ack
        self._prev_ack = ack
        return ack

    # --- data plane ----------------------------------------------------------------------------------

    def observe(
        self,
        urgency: float = 0.5,
        priority: int | None = None,
        *,
        state,
        images: dict | None = None,
        episode_id: int | None = None,
        **fields,
    ) -> int:
        """Publish one observation (non-blocking); returns its seq_id.

        images: name -> uint8 HxWx3 RGB (JPEG-encoded here at `jpeg_quality`; 0 = raw) or an EncodedImage.
        Observation fields (prefix_model, prefix_robot, inference_delay_steps, episode_start,
        steps_remaining, task) pass through; any other ndarray goes to `tensors`, any str to `metadata`."""
        if self.ack is None or self._pub is None:
            raise RuntimeError("no open session: call open() first")
        known = {f.name for f in Observation.FIELDS}
        kw = {k: v for k, v in fields.items() if k in known and v is not None}
        tensors = {k: np.asarray(v) for k, v in fields.items() if k not in known and isinstance(v, np.ndarray)}
        metadata = {k: v for k, v in fields.items() if k not in known and isinstance(v, str)}
        enc = {}
        for name, frame in (images or {}).items():
            enc[name] = (
                frame
                if hasattr(frame, "to_wire")
                else encode_image(
                    np.asarray(frame), "jpeg" if self.jpeg_quality > 0 else "raw", self.jpeg_quality or 90
                )
            )
        if episode_id is not None:
            self.episode_id = int(episode_id)
        seq = next(self._seq)
        obs = Observation(
            self.ack.session_id,
            np.asarray(state, np.float32),
            images=enc,
            tensors=tensors,
            metadata=metadata,
            urgency=float(urgency),
            priority=int(self.priority if priority is None else priority),
            **kw,
        )
        sent_ns = time.monotonic_ns()
        header = Header(SCHEMA_VERSION, MsgType.OBS, seq, self.episode_id, sent_ns, self.epoch).pack()
        if self.ack.session_key:
            obs.auth = wauth.obs_tag(self.ack.session_key, self.ack.session_id, header)
        self._pub.put(obs.encode(), attachment=header)
        self.last_seq, self.last_sent_ns = seq, sent_ns
        return seq

    def _on_action(self, sample, gen: int) -> None:  # deposit only, on Zenoh's thread
        if gen != self._gen:
            return
        t_ns, routed_ns = arrival_stamps(sample)
        att = sample.attachment
        self._inbox.deposit((t_ns, sample.payload.to_bytes(), att.to_bytes() if att is not None else b"", routed_ns))
        if self.wake is not None:
            self.wake.set()

    def _on_server_alive(self, sample, gen: int) -> None:  # deposit only, on Zenoh's thread
        import zenoh

        if gen != self._gen:
            return
        alive = sample.kind == zenoh.SampleKind.PUT
        self.server_alive = alive
        if not alive:
            self.server_lost.set()
            if self.wake is not None:
                self.wake.set()

    def get_result(self, timeout_ms: float | None = 0) -> Result | Event | None:
        """The next chunk or event from the server (decoded here, on the caller's thread), or None."""
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1e3
        while True:
            item = self._inbox.take(deadline)
            if item is None:
                return None
            out = self._heed(decode(*item))
            if out is not None:
                return out

    def poll(self) -> Result | Event | None:
        return self.get_result(0)

    def interrupt(self) -> None:
        """Wake the thread blocked in get_result (it returns None now, or its next wait does): its caller has
        something better to do than wait, e.g. the episode it was waiting for has ended."""
        self._inbox.interrupt()

    def _heed(self, out: Result | Event | None) -> Result | Event | None:
        """Set the flags a decoded event says (draining, needs_handshake); None for a drain notice of a replica
        this client already left (it opened elsewhere meanwhile)."""
        if not isinstance(out, Event):
            return out
        if out.kind == "drain":
            if self.replica is not None and out.details["replica_id"] != self.replica.replica_id:
                return None
            self.draining = True
        elif out.kind == "error" and out.session_epoch == self.epoch:  # an older session's error says nothing here
            if out.code == ErrorCode.UNKNOWN_SESSION:
                self.needs_handshake = True
            elif out.code == ErrorCode.DRAINING:
                self.draining = True
        return out

    def reset(self, episode_id: int, timeout_s: float = CONTROL_TIMEOUTS_S["reset"]) -> bool:
        """The acknowledged episode reset; later observations carry `episode_id`. False if the server
        did not acknowledge in time (it needs nothing from a reset: requests are stateless)."""
        self.episode_id = int(episode_id)
        if self.ack is None:
            return False
        try:
            reply = control_query(
                self.conn.z, self.keys.reset, reset_body(self.ack, episode_id), timeout_s, int(episode_id)
            )
        except TimeoutError:
            return False
        if isinstance(reply, Error) and reply.code == ErrorCode.UNKNOWN_SESSION:
            self.needs_handshake = True
        return isinstance(reply, ResetAck) and reply.episode_id == episode_id

    def reset_nowait(
        self,
        episode_id: int,
        on_reply: Callable[[bool], None] | None = None,
        timeout_s: float = CONTROL_TIMEOUTS_S["reset"],
    ) -> bool:
        """`reset` without waiting: the query goes out now and `on_reply(acked)` runs on Zenoh's thread when
        the answer (or the timeout) arrives. Later observations carry `episode_id` and the next one flags
        `episode_start`, which the server acts on by itself, so nothing needs to wait for the ack.
        Returns False when there is no session to reset."""
        self.episode_id = int(episode_id)
        if self.ack is None:
            return False
        gen, answered = self._gen, []

        def on_answer(reply) -> None:  # on Zenoh's thread: decode and hand over, nothing else
            if answered or gen != self._gen:
                return
            acked = False
            if reply.ok is not None:
                try:
                    msg = decode_message(reply.ok.payload.to_bytes())
                except WireError:
                    msg = None
                if isinstance(msg, Error) and msg.code == ErrorCode.UNKNOWN_SESSION:
                    self.needs_handshake = True
                acked = isinstance(msg, ResetAck) and msg.episode_id == episode_id
            answered.append(acked)
            if on_reply is not None:
                on_reply(acked)

        import zenoh

        header = Header(SCHEMA_VERSION, MsgType.CONTROL, 0, int(episode_id)).pack()
        self.conn.z.get(
            self.keys.reset,
            zenoh.handlers.Callback(on_answer, indirect=False),
            payload=reset_body(self.ack, episode_id).encode(),
            attachment=header,
            timeout=timeout_s,
        )
        return True

    # --- teardown ------------------------------------------------------------------------------------

    def _undeclare(self) -> None:
        self._gen += 1
        for d in reversed(self._decl):
            _undeclare_quietly(d)
        self._decl.clear()
        _undeclare_quietly(self._pub)
        self._pub = None
        self.ack = None

    def close(self) -> None:
        self._undeclare()
        _undeclare_quietly(self._watch)
        self._watch = None


def _undeclare_quietly(entity) -> None:
    """Undeclare a Zenoh entity; one whose session is already gone (router restart, close) is not an error."""
    if entity is None:
        return
    try:
        entity.undeclare()
    except Exception:
        pass
