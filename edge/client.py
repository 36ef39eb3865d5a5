"""The plain client API (003's SDK shape) over the wire protocol; the remote engine is built on it.

    conn = Connection(["tcp/127.0.0.1:7447"], client_id="station-01", client_type="so100")
    arm = conn.model("arm", action_names=[...], state_dim=6, fps=30)    # discovery + session open
    seq = arm.observe(urgency=0.8, state=q, images={"front": rgb})      # non-blocking put
    r = arm.get_result(timeout_ms=200)                                  # Result | Event | None
    conn.close()

Per model handle (one session on one replica): liveliness token on its own `alive` key, action
subscriber, obs publisher, liveliness subscriber on the replica's token, then the session-open query
on the client's own `session` key (docs/protocol-contract.md). Every observation and reset carries
the session's auth tag (wire.auth, keyed by SessionAck.session_key); a re-handshake on the same
replica proves it owned the session it replaces (previous_auth). Replicas come from one discovery query, ordered ready-and-not-draining
first, lowest load first (or `replica_order`); CAPACITY, EXCLUSIVE_BUSY, DRAINING, NOT_READY, SESSION_LIVE, a replica
that does not answer its session query and one that answers neither an ack nor an error (`BrokenReplica`) move on to the next replica; any other refusal raises `SessionRefused` (never run an incompatible model),
and so does an ack that promises another model than the one asked for (`_ack_disagreement`).

Events: an Error EVENT with UNKNOWN_SESSION sets `model.needs_handshake` (the server forgot the session:
call `open()` again); a DrainNotice (or a DRAINING error) sets `model.draining` (open elsewhere).

Invariants: Zenoh callbacks only deposit (raw bytes into a bounded inbox, flags for liveliness) and
run on Zenoh's own threads (no Python thread per subscriber); only monotonic clocks; `seq_id`
strictly increases per session and `session_epoch` counts (re)opens.
"""

from __future__ import annotations

import itertools
import math
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from wire import (
    DEFAULT_ROOT, ActionChunk, DrainNotice, Error, ErrorCode, Header, MsgType, Observation, ReplicaKeys, Reset,
    ResetAck, SCHEMA_VERSION, SessionAck, SessionOpen, Status, WireError, decode_message, discovery_key, encode_image,
    replicas_alive_key, unpack_header,
)
from wire import auth as wauth
from wire.header import MSG_TYPE_OFFSET
from wire.qos import CONTROL_TIMEOUTS_S, declare_publisher
from wire.transport import arrival_stamps

RETRY_ELSEWHERE = {ErrorCode.CAPACITY, ErrorCode.EXCLUSIVE_BUSY, ErrorCode.DRAINING, ErrorCode.NOT_READY,
                   ErrorCode.SESSION_LIVE}  # SESSION_LIVE: our previous process's session is not gone yet
INBOX_MAX = 64  # messages the inbox holds: past it (or INBOX_MAX_BYTES) the oldest event goes, else the oldest chunk
INBOX_MAX_BYTES = 8 << 20  # their payloads and attachments together: a chunk is a few KB, a 32 MiB message is no chunk


def _is_chunk(attachment: bytes) -> bool:
    """Whether a message's attachment header says CHUNK (its msg_type byte, wire.header), without unpacking it."""
    return len(attachment) > MSG_TYPE_OFFSET and attachment[MSG_TYPE_OFFSET] == MsgType.CHUNK


def spread_key(load: float, rng: random.Random) -> float:
    """A replica's place in discovery's order, drawn with weight = its free capacity (1 - load): sorting by
    it descending is a weighted random permutation (Efraimidis-Spirakis, u ** (1 / w)).

    Robots that start or fail over together all read the same Status (say load 0 everywhere) before any of
    them has opened a session; ordering by load, then replica id, sends every one of them to the same
    replica until it is full. A draw spreads such a herd evenly (the 300-robot headline: 99 / 99 / 102
    sessions on three replicas), and still favours the replica with the most room."""
    weight = max(0.0, 1.0 - float(load))
    if weight <= 0.0:
        return -math.inf  # full: last, still tried (its CAPACITY refusal moves on)
    return rng.random() ** (1.0 / weight)


class SessionRefused(Exception):
    """The server refused the session for a reason another replica would not fix."""

    def __init__(self, code: str, message: str, details: dict | None = None):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.details = code, message, dict(details or {})


class BrokenReplica(Exception):
    """A replica answered the session open with something that is neither an ack nor a refusal (undecodable,
    another message): a broken replica, not a verdict on the model, so `open` moves on to the next one."""


class NoReplica(ConnectionError):
    """No replica answered, or every replica refused for capacity/draining reasons. `unanswered`: no replica
    answered in time at all (discovery waited out its timeout with nothing, or every session query did): the
    link, or every replica, is slower than the timeouts. A refusal in words (CAPACITY, NOT_READY...) is an
    answer; so is an empty discovery that came back at once (the router knows no replica to ask)."""

    def __init__(self, message: str, unanswered: bool = False):
        super().__init__(message)
        self.unanswered = unanswered


class ControlTimeouts:
    """How long the next handshake round waits for replies, per control query (`CONTROL_TIMEOUTS_S` names).

    With fixed timeouts a link whose round trip is over them fails every round the same way until the robot
    goes DEAD (docs/bench.md, "1,000 robots on this host"). So: after a round in which no replica answered in
    time (`grow`), the status and session timeouts double, up to `max_s`; a session opened (`settle`) brings
    them back to the base (a refusal in words changes nothing: it came in time, at the timeouts it had). Every
    timeout is also at least twice the link's measured round trip plus `MARGIN_S` (`seed`: a robot that lost its
    session on a slow link reopens without a failing round first).

    Invariant: base <= timeout_s(name) <= max(max_s, base), whatever was grown or seeded."""

    GROWING = ("status", "session")  # the handshake's queries; reset is seeded, never grown (it is not awaited)
    MARGIN_S = 0.5

    def __init__(self, max_s: float, base: dict[str, float] | None = None):
        self.base = dict(CONTROL_TIMEOUTS_S if base is None else base)
        self.max_s = float(max_s)
        self.grown_s = 0.0  # the growing queries' timeout after rounds no replica answered; 0: none since an answer
        self.rtt_s = 0.0

    def timeout_s(self, name: str) -> float:
        base = self.base[name]
        grown = self.grown_s if name in self.GROWING else 0.0
        seeded = 2.0 * self.rtt_s + self.MARGIN_S if self.rtt_s > 0 else 0.0
        return max(base, min(max(grown, seeded), self.max_s))

    def grow(self) -> None:
        """No replica answered in time this round: wait twice as long next round (at most max_s)."""
        self.grown_s = min(2.0 * max(self.timeout_s(n) for n in self.GROWING), self.max_s)

    def settle(self) -> None:
        """A session opened: back to the base (and the seed)."""
        self.grown_s = 0.0

    def seed(self, rtt_s: float) -> None:
        """The link's measured round trip (0: none known)."""
        v = float(rtt_s)
        self.rtt_s = v if math.isfinite(v) and v > 0 else 0.0


@dataclass
class Result:
    seq_id: int
    episode_id: int
    session_epoch: int
    chunk_model: np.ndarray
    chunk_robot: np.ndarray
    rtt_s: float
    queue_wait_ms: float
    inference_ms: float
    superseded_seqs: int = 0
    server_load: float = 0.0
    rtc_applied: bool = False
    inference_emulated: bool = False
    t_recv: float = 0.0  # monotonic seconds
    session_id: str = ""
    error: None = None
    sent_ns: int = 0  # the request's client_mono_ns (echoed): when it was sent, on this client's monotonic clock
    routed_ns: int | None = None  # when the first router routed the chunk, on this client's monotonic clock (its
    # Zenoh timestamp: the router's wall clock, so a router on another host adds the two hosts' clocks' difference)


@dataclass
class Event:
    """An EVENT from the server: an Error for a request (or the session) or a DrainNotice."""

    kind: str  # "error" | "drain" | "bad_chunk" (a reply that does not decode, or a chunk whose header and body disagree)
    code: str
    message: str
    seq_id: int | None
    episode_id: int
    session_epoch: int
    details: dict = field(default_factory=dict)

    @property
    def error(self) -> str:
        return self.code


class Connection:
    """One Zenoh session to the router(s) for one client id; `model()` opens sessions on it.
    `session`: share an already open Zenoh session (it is then not closed here)."""

    def __init__(self, server: str | list[str], client_id: str, client_type: str = "", root: str = DEFAULT_ROOT,
                 lease_ms: int = 1000, tls=None, session=None):
        from wire.keys import sanitize
        from wire.transport import open_session

        self.client_id = sanitize(client_id, "client_id")
        self.client_type = client_type
        self.root = root
        self.endpoints = [server] if isinstance(server, str) else list(server)
        self._own = session is None
        self.z = session or open_session(connect=self.endpoints, lease_ms=lease_ms, tls=tls, what=f"client {client_id}")
        self._models: list[Model] = []

    def model(self, model_id: str, revision: str = "main", *, latency_budget_ms: float | None = None, priority: int = 0,
              task: str = "", fps: float = 30.0, action_names: list[str] | None = None, state_dim: int = 0,
              cameras: dict[str, list[int]] | list[str] | None = None, rtc_enabled: bool = False,
              execution_horizon: int = 0, expected_checkpoint_hash: str = "", replica_order: list[str] | None = None,
              open: bool = True, **extra) -> "Model":
        """A handle on `model_id`; with `open` (default) discovery and the session handshake run now.
        `extra`: policy_type, tags, jpeg_quality (see `Model`)."""
        m = Model(self, model_id, revision, latency_budget_ms=latency_budget_ms, priority=priority, task=task, fps=fps,
                  action_names=action_names, state_dim=state_dim, cameras=cameras, rtc_enabled=rtc_enabled,
                  execution_horizon=execution_horizon, expected_checkpoint_hash=expected_checkpoint_hash,
                  replica_order=replica_order, **extra)
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

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Model:
    """One session of this client with one replica of a model.

    Flags the caller reads (set by `get_result` while decoding, or by Zenoh's liveliness callback):
    `server_lost` (Event: the replica's token went away), `draining` (DrainNotice or a DRAINING error),
    `needs_handshake` (UNKNOWN_SESSION: the server forgot this session; call `open()` again).
    """

    def __init__(self, conn: Connection, model_id: str, revision: str = "main", *, latency_budget_ms: float | None = None,
                 priority: int = 0, task: str = "", fps: float = 30.0, action_names: list[str] | None = None,
                 state_dim: int = 0, cameras: dict[str, list[int]] | list[str] | None = None, rtc_enabled: bool = False,
                 execution_horizon: int = 0, expected_checkpoint_hash: str = "", policy_type: str = "",
                 replica_order: list[str] | None = None, tags: dict[str, str] | None = None, jpeg_quality: int = 90):
        self.conn = conn
        self.model_id, self.revision = model_id, revision
        self.latency_budget_ms, self.priority = latency_budget_ms, priority
        self.open_args = dict(task=task, fps=float(fps), action_names=list(action_names or []), state_dim=int(state_dim),
                              cameras=camera_shapes(cameras), rtc_enabled=bool(rtc_enabled),
                              execution_horizon=int(execution_horizon), expected_checkpoint_hash=expected_checkpoint_hash,
                              policy_type=policy_type, tags=dict(tags or {}),
                              latency_budget_ms=float(latency_budget_ms or 0.0))
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
        self._inbox: deque = deque()  # bounded by _deposit: Zenoh's thread never waits
        self._inbox_bytes = 0
        self._cv = threading.Condition()
        self._interrupted = False  # set by interrupt(): a waiting get_result returns None at once
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
        self._watch = None

    # --- discovery and handshake -------------------------------------------------------------------

    def discover(self, timeout_s: float = CONTROL_TIMEOUTS_S["status"]) -> list[Status]:
        """Every replica's Status, best first: ready and not draining, then `replica_order`, then a draw
        weighted by free capacity (`spread_key`). A Status that does not decode, names no key chunk as its
        replica id, or names another model or revision is left out."""
        key = discovery_key(self.model_id, self.revision, self.conn.root)
        found: dict[str, Status] = {}
        for reply in self.conn.z.get(key, timeout=timeout_s):
            if reply.ok is None:
                continue
            try:
                st = decode_message(reply.ok.payload.to_bytes(), expect=Status)
                # a replica id that is no key chunk has no keys to open a session on: its WireError, raised in
                # open(), ended the whole round before any sound replica was tried (every round it sorted first)
                ReplicaKeys(self.model_id, self.revision, st.replica_id, self.conn.root)
            except WireError:
                continue
            if (st.model_id, st.revision) != (self.model_id, self.revision):
                continue  # it says it serves another model: not one to open this model's session on
            found[st.replica_id] = st
        order = {r: i for i, r in enumerate(self.replica_order)}
        return sorted(found.values(), key=lambda s: (not s.ready or s.draining, order.get(s.replica_id, len(order)),
                                                     -spread_key(s.load, self._rng), s.replica_id))

    def open(self, exclude: set[str] | frozenset = frozenset(), task: str | None = None, *,
             status_timeout_s: float = CONTROL_TIMEOUTS_S["status"],
             session_timeout_s: float = CONTROL_TIMEOUTS_S["session"], deadline: float | None = None) -> SessionAck:
        """Discover and open a session on the best replica not in `exclude`.

        CAPACITY, EXCLUSIVE_BUSY, DRAINING, NOT_READY and a replica that does not answer move on to the
        next replica; any other refusal raises `SessionRefused`; nothing left raises `NoReplica`.
        `deadline` (monotonic s): no query waits past it (the caller's offline budget)."""

        def wait_s(timeout_s: float) -> float:
            return timeout_s if deadline is None else max(min(timeout_s, deadline - time.monotonic()), 0.01)

        self._watch_replicas()
        waited, t0 = wait_s(status_timeout_s), time.monotonic()
        found = self.discover(waited)
        replicas = [s for s in found if s.replica_id not in exclude]
        if self.replica_order:
            replicas = [s for s in replicas if s.replica_id in self.replica_order] or replicas
        if not replicas:
            elapsed = time.monotonic() - t0
            # ran out of time, not "the router knows no replica" (that answer comes at once, and waiting longer
            # would not change it)
            timed_out = not found and elapsed >= 0.9 * waited
            wait = f"waited {elapsed:.1f} s, timeout {waited:.1f} s; excluded: {sorted(exclude) or 'none'}"
            if found:  # they answered, and each is excluded (drained, or tried this round)
                raise NoReplica(f"no replica of {self.model_id}@{self.revision} under {self.conn.root} is left to "
                                f"try: {sorted(s.replica_id for s in found)} answered and all are excluded ({wait})")
            if timed_out:
                raise NoReplica(f"no replica of {self.model_id}@{self.revision} answered under {self.conn.root} "
                                f"({wait}); is the server running and connected to the router, and is the round "
                                f"trip of the link under the timeout?", unanswered=True)
            # empty before the timeout: the router knows no server of this model id and revision (a typo in
            # either, or the server is not running or not on this router)
            raise NoReplica(f"no server serves model_id {self.model_id!r} revision {self.revision!r} under "
                            f"{self.conn.root} on this router ({wait}: the router answered, and knows no replica "
                            f"of it); check model_id and revision against the server's manifest "
                            f"(model_id, model.revision, root) and that the server is running and connected to the "
                            f"same router")
        refusals, timeouts = [], 0
        for st in replicas:
            if not st.ready or st.draining:
                refusals.append(f"{st.replica_id}: {'DRAINING' if st.draining else 'NOT_READY'}")
                continue
            waited, t0 = wait_s(session_timeout_s), time.monotonic()
            try:
                return self._open_on(st, task, waited)
            except SessionRefused as exc:
                if exc.code not in RETRY_ELSEWHERE:
                    raise
                refusals.append(f"{st.replica_id}: {exc.code}")
            except BrokenReplica as exc:
                refusals.append(str(exc))
            except TimeoutError:
                elapsed = time.monotonic() - t0
                timeouts += elapsed >= 0.9 * waited  # at once: the replica's queryable is gone (it died), not slow
                refusals.append(f"{st.replica_id}: no answer to the session query (waited {elapsed:.1f} s, timeout "
                                f"{waited:.1f} s: a dead or hung replica, or a link slower than the timeout)")
        unanswered = timeouts == len(refusals)
        raise NoReplica(f"{'no replica' if unanswered else 'every replica'} of {self.model_id} "
                        f"{'answered its session query' if unanswered else 'refused'}: {'; '.join(refusals)}",
                        unanswered=unanswered)

    def _watch_replicas(self) -> None:
        """Declared once, kept across sessions: a liveliness subscriber on every replica token of this model
        (`<root>/<model>/<revision>/*/alive`; client tokens sit deeper and do not match)."""
        if self._watch is not None:
            return
        import zenoh

        key = replicas_alive_key(self.model_id, self.revision, self.conn.root)
        self._watch = self.conn.z.liveliness().declare_subscriber(
            key, zenoh.handlers.Callback(self._on_replica_token, indirect=False))

    def _on_replica_token(self, sample) -> None:  # deposit only, on Zenoh's thread
        import zenoh

        if sample.kind == zenoh.SampleKind.PUT and self.nudge is not None:
            self.nudge.set()

    def _open_on(self, st: Status, task: str | None, timeout_s: float = CONTROL_TIMEOUTS_S["session"]) -> SessionAck:
        import zenoh

        prev = self.ack if self.ack is not None and self.ack.replica_id == st.replica_id else self._prev_ack
        self._undeclare()
        rk = ReplicaKeys(self.model_id, self.revision, st.replica_id, self.conn.root)
        eff_task = (task if task is not None else self.open_args["task"]) or st.default_task
        keys = rk.client(eff_task, self.conn.client_id)
        z = self.conn.z
        self._gen += 1
        gen = self._gen
        self.server_lost.clear()
        self.server_alive = False
        self.draining = False
        self.needs_handshake = False
        self.epoch += 1
        self._seq = itertools.count(1)  # seq_id restarts at 1 in every session
        self.last_seq = 0
        with self._cv:
            self._inbox.clear()
            self._inbox_bytes = 0
        # indirect=False: the deposit runs on Zenoh's own thread, no Python thread per subscriber
        self._decl.append(z.liveliness().declare_token(keys.alive))
        self._decl.append(z.declare_subscriber(
            keys.action, zenoh.handlers.Callback(lambda s: self._on_action(s, gen), indirect=False)))
        self._decl.append(z.liveliness().declare_subscriber(
            rk.alive, zenoh.handlers.Callback(lambda s: self._on_server_alive(s, gen), indirect=False), history=True))
        self._pub = declare_publisher(z, keys.obs, "obs")
        body = SessionOpen(client_uuid=self.conn.client_id, schema_version=SCHEMA_VERSION,
                           client_type=self.conn.client_type, **{**self.open_args, "task": eff_task})
        if prev is not None and prev.replica_id == st.replica_id and prev.session_key:
            # a re-handshake proves it owns the session it replaces (server.guard: a live session is never hijacked)
            body.previous_session_id = prev.session_id
            body.previous_auth = wauth.reopen_tag(prev.session_key, prev.session_id, self.conn.client_id)
        try:
            reply = self._query(keys.session, body, timeout_s)
        except BaseException:
            self._undeclare()
            raise
        if isinstance(reply, Error):
            self._undeclare()
            raise SessionRefused(reply.code, reply.message, reply.details)
        if not isinstance(reply, SessionAck):
            # before, a SessionRefused(MALFORMED): the robot went DEAD though a sound replica served the model
            self._undeclare()
            what = f"undecodable reply ({reply})" if isinstance(reply, WireError) else type(reply).__name__
            raise BrokenReplica(f"{st.replica_id}: session open answered with {what}")
        disagreement = self._ack_disagreement(reply, st.replica_id)
        if disagreement is not None:
            self._undeclare()  # its token goes: the replica forgets the session after its grace period
            raise SessionRefused(*disagreement)
        self.replica, self.keys, self.ack = rk, keys, reply
        self._prev_ack = reply
        return reply

    def _ack_disagreement(self, ack: SessionAck, replica_id: str) -> tuple[str, str] | None:
        """(code, message) when the ack promises another model than the one asked for, else None.

        A replica acknowledges only what it serves (it refuses any mismatch in words), so an ack that disagrees
        with the request is a broken or hostile replica: before, the engine streamed from it and executed
        chunks of its width (a 5-column chunk on a 3-action robot)."""
        a = self.open_args
        if ack.model_id != self.model_id or ack.revision != self.revision:
            return ErrorCode.WRONG_MODEL, (f"replica {replica_id} acknowledged {ack.model_id}@{ack.revision}; this "
                                           f"client asked for {self.model_id}@{self.revision}")
        if a["action_names"] and list(ack.action_names) != a["action_names"]:
            return ErrorCode.ACTION_MISMATCH, (f"replica {replica_id} acknowledged action_names "
                                               f"{list(ack.action_names)}; this client drives {a['action_names']}")
        if a["state_dim"] and ack.state_dim != a["state_dim"]:
            return ErrorCode.STATE_DIM_MISMATCH, (f"replica {replica_id} acknowledged state_dim {ack.state_dim}; this "
                                                  f"client sends {a['state_dim']}")
        if a["expected_checkpoint_hash"] and ack.checkpoint_hash != a["expected_checkpoint_hash"]:
            return ErrorCode.WRONG_MODEL, (f"replica {replica_id} acknowledged checkpoint {ack.checkpoint_hash!r}; "
                                           f"this client pinned {a['expected_checkpoint_hash']!r}")
        if a["policy_type"] and ack.policy_type != a["policy_type"]:
            return ErrorCode.WRONG_MODEL, (f"replica {replica_id} acknowledged policy_type {ack.policy_type!r}; this "
                                           f"client asked for {a['policy_type']!r}")
        if ack.chunk_size < 1:
            return ErrorCode.MALFORMED, f"replica {replica_id} acknowledged chunk_size {ack.chunk_size}; it must be >= 1"
        return None

    def _query(self, key: str, body, timeout_s: float, episode_id: int = 0):
        header = Header(SCHEMA_VERSION, MsgType.CONTROL, 0, episode_id).pack()
        for reply in self.conn.z.get(key, payload=body.encode(), attachment=header, timeout=timeout_s):
            if reply.ok is None:
                continue
            try:
                return decode_message(reply.ok.payload.to_bytes())
            except WireError as exc:
                return exc  # undecodable: neither an answer nor a refusal (a reset is not acknowledged by it)
        raise TimeoutError(f"no reply on {key} within {timeout_s} s")

    # --- data plane ----------------------------------------------------------------------------------

    def observe(self, urgency: float = 0.5, priority: int | None = None, *, state, images: dict | None = None,
                episode_id: int | None = None, **fields) -> int:
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
            enc[name] = frame if hasattr(frame, "to_wire") else encode_image(
                np.asarray(frame), "jpeg" if self.jpeg_quality > 0 else "raw", self.jpeg_quality or 90)
        if episode_id is not None:
            self.episode_id = int(episode_id)
        seq = next(self._seq)
        obs = Observation(self.ack.session_id, np.asarray(state, np.float32), images=enc, tensors=tensors,
                          metadata=metadata, urgency=float(urgency),
                          priority=int(self.priority if priority is None else priority), **kw)
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
        item = (t_ns, sample.payload.to_bytes(), att.to_bytes() if att is not None else b"", routed_ns)
        with self._cv:
            self._deposit(item)
            self._cv.notify_all()
        if self.wake is not None:
            self.wake.set()

    def _deposit(self, item: tuple) -> None:
        """Append `item` (t_ns, payload, attachment, routed_ns) to the inbox, held under `_cv`. Past INBOX_MAX
        messages or INBOX_MAX_BYTES the oldest event (error, drain notice, anything but a chunk) goes first, then
        the oldest chunk, never the newest message: a stream of events after a chunk pushed the chunk out of a
        message-capped inbox, and its request timed out (a hostile server's 200 events a chunk: 1 timeout in 51
        requests). Read from the header's msg_type byte, no decode on Zenoh's thread; a message whose header lies
        is dropped at decode."""
        self._inbox.append(item)
        self._inbox_bytes += len(item[1]) + len(item[2])
        while len(self._inbox) > INBOX_MAX or (self._inbox_bytes > INBOX_MAX_BYTES and len(self._inbox) > 1):
            last = len(self._inbox) - 1  # the newest always stays
            at = next((i for i, old in enumerate(self._inbox) if i < last and not _is_chunk(old[2])), 0)
            gone = self._inbox[at]
            del self._inbox[at]
            self._inbox_bytes -= len(gone[1]) + len(gone[2])

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
            with self._cv:
                while not self._inbox:
                    left = None if deadline is None else deadline - time.monotonic()
                    if self._interrupted or (left is not None and left <= 0):
                        self._interrupted = False
                        return None
                    self._cv.wait(left)
                t_ns, payload, att, routed_ns = self._inbox.popleft()
                self._inbox_bytes -= len(payload) + len(att)
            out = self._decode(t_ns, payload, att, routed_ns)
            if out is not None:
                return out

    def poll(self) -> Result | Event | None:
        return self.get_result(0)

    def interrupt(self) -> None:
        """Wake the thread blocked in get_result (it returns None now, or its next wait does): its caller has
        something better to do than wait, e.g. the episode it was waiting for has ended."""
        with self._cv:
            self._interrupted = True
            self._cv.notify_all()

    def _decode(self, t_ns: int, payload: bytes, att: bytes, routed_ns: int | None = None):
        try:
            h = unpack_header(att)
            msg = decode_message(payload)
        except WireError as exc:
            return Event("bad_chunk", exc.code, f"undecodable message from the server: {exc}", None, 0, 0)
        if isinstance(msg, ActionChunk):
            if h.msg_type != MsgType.CHUNK or msg.seq_id_echo != h.seq_id:
                return Event("bad_chunk", ErrorCode.MALFORMED, "chunk header and body disagree", h.seq_id,
                             h.episode_id, h.session_epoch)
            return Result(h.seq_id, h.episode_id, h.session_epoch, msg.chunk_model, msg.chunk_robot,
                          (t_ns - msg.client_mono_ns_echo) / 1e9, msg.queue_wait_ms, msg.inference_ms,
                          msg.superseded_seqs, msg.server_load, msg.rtc_applied, msg.inference_emulated, t_ns / 1e9,
                          msg.session_id, sent_ns=msg.client_mono_ns_echo, routed_ns=routed_ns)
        if isinstance(msg, DrainNotice):
            if self.replica is not None and msg.replica_id != self.replica.replica_id:
                return None  # from the replica this client already left (it opened elsewhere meanwhile)
            self.draining = True
            return Event("drain", ErrorCode.DRAINING, msg.reason or "replica draining", None, h.episode_id,
                         h.session_epoch, {"replica_id": msg.replica_id, "deadline_ms": msg.deadline_ms})
        if isinstance(msg, Error):
            if h.session_epoch == self.epoch:  # an error about an older session says nothing about this one
                if msg.code == ErrorCode.UNKNOWN_SESSION:
                    self.needs_handshake = True
                elif msg.code == ErrorCode.DRAINING:
                    self.draining = True
            return Event("error", msg.code, msg.message, msg.seq_id if msg.seq_id is not None else h.seq_id,
                         h.episode_id, h.session_epoch, msg.details)
        return None

    def reset(self, episode_id: int, timeout_s: float = CONTROL_TIMEOUTS_S["reset"]) -> bool:
        """The acknowledged episode reset; later observations carry `episode_id`. False if the server
        did not acknowledge in time (it needs nothing from a reset: requests are stateless)."""
        self.episode_id = int(episode_id)
        if self.ack is None:
            return False
        try:
            reply = self._query(self.keys.reset, self._reset_body(episode_id), timeout_s, int(episode_id))
        except TimeoutError:
            return False
        if isinstance(reply, Error) and reply.code == ErrorCode.UNKNOWN_SESSION:
            self.needs_handshake = True
        return isinstance(reply, ResetAck) and reply.episode_id == episode_id

    def reset_nowait(self, episode_id: int, on_reply: Callable[[bool], None] | None = None,
                     timeout_s: float = CONTROL_TIMEOUTS_S["reset"]) -> bool:
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
        self.conn.z.get(self.keys.reset, zenoh.handlers.Callback(on_answer, indirect=False), payload=self._reset_body(episode_id).encode(),
                        attachment=header, timeout=timeout_s)
        return True

    def _reset_body(self, episode_id: int) -> Reset:
        ack = self.ack
        tag = wauth.reset_tag(ack.session_key, ack.session_id, int(episode_id)) if ack.session_key else None
        return Reset(ack.session_id, int(episode_id), auth=tag)

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


def camera_shapes(cameras: dict[str, list[int]] | list[str] | tuple | None) -> dict[str, list[int]]:
    """Camera name -> [h, w, c] for the session open. Names alone get a placeholder shape [1, 1, 3]: the
    server checks names (coverage) and only warns about aspect ratios, so shapes are advisory."""
    if not cameras:
        return {}
    if isinstance(cameras, dict):
        return {str(k): [int(d) for d in v] for k, v in cameras.items()}
    return {str(name): [1, 1, 3] for name in cameras}
