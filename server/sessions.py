"""Sessions of one replica: the open-time validation matrix (design 8.4), the registry, identity.

    SessionOpen ──► validate_open(open, ctx) ──► Decision(ack fields | Error) ──► SessionRegistry.add
    obs/reset on <task>/<client>/... ──► registry.lookup(session_id, client_uuid) ──► Session | Error

Owns: `Session` (per-session pipeline, merge mode, counters, keys), `ReplicaInfo` (what Status and
SessionAck report about the model), `validate_open` and `SessionRegistry`.

Invariants:
- A session is bound to the client uuid of the key it was opened on; any message for it on another
  client's key is refused (IDENTITY_MISMATCH). Session ids are random and unguessable; the proof
  that a message comes from the session's owner is its auth tag (wire.auth, server.guard).
- Rejections name the check, both values, and what to do; the client gets them verbatim.
- Capacity counts open sessions; `exclusive` serving mode means one session, whatever max_sessions.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from server.metrics import Sketch
from wire import MAX_SUPPORTED as SCHEMA_MAX
from wire import MIN_SUPPORTED as SCHEMA_MIN
from wire import ErrorCode
from wire.keys import ClientKeys
from wire.messages import Error, SessionAck, SessionOpen, Status


@dataclass
class ReplicaInfo:
    """The model as this replica serves it (the model fields of Status and SessionAck)."""

    replica_id: str
    model_id: str
    revision: str
    checkpoint_hash: str
    policy_type: str
    action_names: list[str]
    state_dim: int
    cameras: dict[str, list[int]]
    chunk_size: int
    trained_fps: float
    supports_rtc: bool
    serving_mode: str  # shared | exclusive
    max_sessions: int
    execution_horizon: int
    default_task: str = ""
    pin_task: bool = False
    allow_resampling: bool = False  # accept a client fps other than trained_fps (else FPS_MISMATCH)
    inference_emulated: bool = False
    allowlist: tuple[str, ...] = ()  # client uuids or "tag=value"; empty = everyone
    known_clients: dict[str, Any] = field(default_factory=dict)  # client uuid -> manifest clients.known entry
    accept_unknown: bool = True
    rtc_unsupported_reason: str = ""  # why an RTC session gets append mode (a LeRobot policy's own words)

    def model_fields(self, active: int, warmed_up: bool) -> dict[str, Any]:
        cap = self.effective_max_sessions
        return dict(
            replica_id=self.replica_id,
            model_id=self.model_id,
            revision=self.revision,
            checkpoint_hash=self.checkpoint_hash,
            policy_type=self.policy_type,
            action_names=list(self.action_names),
            state_dim=self.state_dim,
            cameras=dict(self.cameras),
            chunk_size=self.chunk_size,
            trained_fps=self.trained_fps,
            supports_rtc=self.supports_rtc,
            serving_mode=self.serving_mode,
            warmed_up=warmed_up,
            active_sessions=active,
            max_sessions=cap,
            load=active / cap if cap else 1.0,
            inference_emulated=self.inference_emulated,
        )

    @property
    def effective_max_sessions(self) -> int:
        return 1 if self.serving_mode == "exclusive" else self.max_sessions


@dataclass
class Session:
    session_id: str
    client_uuid: str
    keys: ClientKeys
    task: str
    rtc_enabled: bool
    execution_horizon: int
    fps: float
    schema_version: int = 1  # agreed at the open; every observation's header must carry it
    client_type: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    pipeline: Any = None
    publisher: Any = None  # zenoh publisher on keys.action
    episode_id: int = 0
    opened_mono: float = field(default_factory=time.monotonic)
    last_seen_mono: float = field(default_factory=time.monotonic)
    last_seq: int = 0
    requests: int = 0
    cadence_s: float | None = None  # EWMA of the time between observations
    latency_budget_ms: float | None = None  # deadline scheduling: the client's, else clients.known, else defaults
    priority: int | None = None  # clients.known priority tier; None = the observation's own
    reset_pending: bool = False  # an acked reset the dispatch thread applies before the next preprocess
    alive_lost_mono: float | None = None  # client liveliness lost at; GC after the grace period
    session_key: str = ""  # the secret of wire.auth proofs (SessionAck.session_key); never logged
    bucket: Any = None  # server.guard.TokenBucket: the session's request-rate budget
    answer_bucket: Any = None  # and its budget of RATE_LIMITED answers (a flood never becomes a reply flood)
    lock: threading.Lock = field(default_factory=threading.Lock)  # one request at a time through the pipeline
    # the per-robot detail of the /sessions status, in fixed memory (metrics carry no client label)
    outcomes: Counter = field(default_factory=Counter)  # audit outcome -> requests (ok, expired, error:<code>, ...)
    queue_wait_ms: Sketch = field(default_factory=Sketch)
    inference_ms: Sketch = field(default_factory=Sketch)

    def touch(self, now: float, alpha: float) -> None:
        gap = now - self.last_seen_mono
        if self.requests and gap > 0:
            self.cadence_s = gap if self.cadence_s is None else (1 - alpha) * self.cadence_s + alpha * gap
        self.last_seen_mono = now


@dataclass
class Decision:
    ok: bool
    error: Error | None = None
    reason: str = ""  # metrics label for a rejection
    rtc_enabled: bool = False
    task: str = ""
    warnings: list[str] = field(default_factory=list)


def _reject(code: str, message: str, reason: str, **details) -> Decision:
    return Decision(False, Error(code, message, details=details), reason=reason)


def validate_open(
    req: SessionOpen, info: ReplicaInfo, *, active: int, ready: bool, draining: bool, client_uuid_from_key: str
) -> Decision:
    """The validation matrix of design 8.4, in the order a user wants to hear about problems."""
    if draining:
        return _reject(
            ErrorCode.DRAINING, f"replica {info.replica_id} is draining; open a session on another replica", "draining"
        )
    if not ready:
        return _reject(
            ErrorCode.NOT_READY, f"replica {info.replica_id} is still warming up; retry in a moment", "not_ready"
        )
    if req.client_uuid != client_uuid_from_key:
        return _reject(
            ErrorCode.IDENTITY_MISMATCH,
            f"client_uuid {req.client_uuid!r} differs from the uuid in the key ({client_uuid_from_key!r}); "
            "open the session on your own keys",
            "identity",
        )
    if not SCHEMA_MIN <= req.schema_version <= SCHEMA_MAX:
        return _reject(
            ErrorCode.SCHEMA_VERSION,
            f"client speaks wire schema {req.schema_version}; this server supports {SCHEMA_MIN}..{SCHEMA_MAX}. "
            "Upgrade the older side",
            "schema",
            schema_min=SCHEMA_MIN,
            schema_max=SCHEMA_MAX,
        )
    if not info.accept_unknown and req.client_uuid not in info.known_clients:
        return _reject(
            ErrorCode.IDENTITY_MISMATCH,
            f"client {req.client_uuid!r} is not in this replica's clients.known "
            "and clients.accept_unknown is false; add it to the manifest",
            "unknown_client",
        )
    known = info.known_clients.get(req.client_uuid)
    if known is not None and getattr(known, "model", None) not in (None, info.model_id):
        return _reject(
            ErrorCode.IDENTITY_MISMATCH,
            f"client {req.client_uuid!r} is configured for model "
            f"{known.model!r}; this replica serves {info.model_id!r}",
            "known_client_model",
        )
    if (
        info.allowlist
        and req.client_uuid not in info.allowlist
        and not any(f"{k}={v}" in info.allowlist for k, v in req.tags.items())
    ):
        return _reject(
            ErrorCode.IDENTITY_MISMATCH, f"client {req.client_uuid!r} is not on this replica's allowlist", "allowlist"
        )
    if req.expected_checkpoint_hash and req.expected_checkpoint_hash != info.checkpoint_hash:
        return _reject(
            ErrorCode.WRONG_MODEL,
            f"client pinned checkpoint {req.expected_checkpoint_hash[:16]}... but this replica serves "
            f"{info.checkpoint_hash[:16]}... ({info.model_id}@{info.revision}); never run another model's chunks",
            "wrong_model",
            checkpoint_hash=info.checkpoint_hash,
        )
    if req.policy_type and req.policy_type != info.policy_type:
        return _reject(
            ErrorCode.WRONG_MODEL,
            f"client expects policy type {req.policy_type!r}; this replica serves {info.policy_type!r}",
            "policy_type",
            policy_type=info.policy_type,
        )
    if list(req.action_names) != list(info.action_names):
        same_set = sorted(req.action_names) == sorted(info.action_names)
        how = "the same names in another order" if same_set else "different names"
        return _reject(
            ErrorCode.ACTION_MISMATCH,
            f"action names must match the policy's exactly, in order (chunk column i drives action i); "
            f"client sent {how}: client {list(req.action_names)} vs policy {list(info.action_names)}. "
            "Fix the robot's action feature order or its rename map",
            "action_names",
            action_names=list(info.action_names),
        )
    missing = sorted(set(info.cameras) - set(req.cameras))
    if missing:
        return _reject(
            ErrorCode.CAMERA_MISMATCH,
            f"the policy needs cameras {sorted(info.cameras)}; the client does not send {missing}. "
            "Add them or rename the robot's cameras to the policy's names",
            "cameras",
            cameras=dict(info.cameras),
        )
    if req.state_dim != info.state_dim:
        return _reject(
            ErrorCode.STATE_DIM_MISMATCH,
            f"state has {req.state_dim} values on the client but the policy expects {info.state_dim}",
            "state_dim",
            state_dim=info.state_dim,
        )
    warnings: list[str] = []
    for name, shape in info.cameras.items():
        h, w = req.cameras[name][0], req.cameras[name][1]
        if h * shape[1] != w * shape[0]:
            warnings.append(
                f"camera {name!r}: client {h}x{w} has another aspect ratio than training "
                f"{shape[0]}x{shape[1]}; frames are resized to the training size"
            )
    if abs(req.fps - info.trained_fps) > 1e-6:
        # a chunk is a plan in time steps of the trained rate: played at another rate it is another motion
        msg = f"client runs at {req.fps:g} fps but the policy was trained at {info.trained_fps:g} fps"
        if not info.allow_resampling:
            return _reject(
                ErrorCode.FPS_MISMATCH,
                msg + ". Run the robot at the trained rate, or set allow_resampling: "
                "true in the server's manifest to accept it",
                "fps",
                trained_fps=info.trained_fps,
                client_fps=req.fps,
            )
        warnings.append(msg + " (allow_resampling is on: each chunk plays at the client's rate, stretched in time)")
    task = req.task or info.default_task
    if info.pin_task and req.task and req.task != info.default_task:
        return _reject(
            ErrorCode.TASK_PINNED,
            f"this replica is pinned to task {info.default_task!r}; the client asked "
            f"for {req.task!r}. Send the pinned task or an empty task",
            "task_pinned",
            default_task=info.default_task,
        )
    rtc = bool(req.rtc_enabled)
    if rtc and not info.supports_rtc:
        rtc = False
        why = f" ({info.rtc_unsupported_reason})" if info.rtc_unsupported_reason else ""
        warnings.append(
            f"policy type {info.policy_type!r} does not support RTC guidance{why}; this session runs in "
            "append mode (rtc_enabled=false in the ack)"
        )
    cap = info.effective_max_sessions
    if active >= cap:
        if info.serving_mode == "exclusive":
            return _reject(
                ErrorCode.EXCLUSIVE_BUSY,
                f"policy type {info.policy_type!r} keeps per-episode state (chunk-stateful), so this replica "
                "serves exactly one session and it is taken. Use another replica",
                "exclusive_busy",
                active_sessions=active,
                max_sessions=cap,
                load=1.0,
            )
        return _reject(
            ErrorCode.CAPACITY,
            f"replica {info.replica_id} is full ({active}/{cap} sessions); try another replica",
            "capacity",
            active_sessions=active,
            max_sessions=cap,
            load=active / cap if cap else 1.0,
        )
    return Decision(True, rtc_enabled=rtc, task=task, warnings=warnings)


class SessionRegistry:
    """Open sessions of one replica, thread-safe (control queryables write, the worker reads)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_id: dict[str, Session] = {}
        self._by_client: dict[str, str] = {}

    @staticmethod
    def new_id() -> str:
        return secrets.token_hex(8)

    def __len__(self) -> int:
        return len(self._by_id)

    def add(self, session: Session) -> Session | None:
        """Register; returns a previous session of the same client (replaced: a client re-handshake)."""
        with self._lock:
            old_id = self._by_client.get(session.client_uuid)
            old = self._by_id.pop(old_id, None) if old_id else None
            self._by_id[session.session_id] = session
            self._by_client[session.client_uuid] = session.session_id
            return old

    def get(self, session_id: str) -> Session | None:
        return self._by_id.get(session_id)

    def by_client(self, client_uuid: str) -> Session | None:
        sid = self._by_client.get(client_uuid)
        return self._by_id.get(sid) if sid else None

    def lookup(self, session_id: str, client_uuid: str) -> tuple[Session | None, Error | None]:
        s = self._by_id.get(session_id)
        if s is None:
            return None, Error(
                ErrorCode.UNKNOWN_SESSION,
                f"session {session_id!r} is not open on this replica (it may have restarted); open a new session",
            )
        if s.client_uuid != client_uuid:
            return None, Error(ErrorCode.IDENTITY_MISMATCH, f"session {session_id!r} belongs to another client")
        return s, None

    def count_client(self, client_uuid: str) -> int:
        with self._lock:
            return sum(1 for s in self._by_id.values() if s.client_uuid == client_uuid)

    def remove(self, session_id: str) -> Session | None:
        with self._lock:
            s = self._by_id.pop(session_id, None)
            if s is not None and self._by_client.get(s.client_uuid) == session_id:
                del self._by_client[s.client_uuid]
            return s

    def all(self) -> list[Session]:
        with self._lock:
            return list(self._by_id.values())


def make_status(info: ReplicaInfo, active: int, ready: bool, warmed_up: bool, draining: bool) -> Status:
    return Status(
        **info.model_fields(active, warmed_up),
        ready=ready and not draining,
        draining=draining,
        schema_min=SCHEMA_MIN,
        schema_max=SCHEMA_MAX,
        default_task=info.default_task,
        pin_task=info.pin_task,
        execution_horizon=info.execution_horizon,
    )


def make_ack(info: ReplicaInfo, session: Session, decision: Decision, active: int, schema_version: int) -> SessionAck:
    return SessionAck(
        **info.model_fields(active, True),
        session_id=session.session_id,
        schema_version=schema_version,
        rtc_enabled=decision.rtc_enabled,
        execution_horizon=session.execution_horizon,
        task=decision.task,
        warnings=list(decision.warnings),
        session_key=session.session_key or None,
    )
