"""msgpack message bodies: one dataclass per message, one table of fields per dataclass.

Every body is a msgpack map with string keys and a ``kind`` word. Decoders:
- accept any map, ignore keys they do not know (additive evolution),
- reject a missing or mistyped required key, a value out of range, or a size over `Limits`,
- raise only `WireError`, never another exception, whatever bytes arrive,
- never unpickle, never evaluate: the schema has no field that can carry code.

The field tables below are the single source of the schema; docs/wire-protocol.md is checked
against them by a test.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack
import numpy as np

from wire.errors import WireError
from wire.images import EncodedImage, image_from_wire
from wire.tensors import DEFAULT_LIMITS, Limits, decode_tensor, encode_tensor


class ErrorCode:
    """Machine-readable error words carried in `Error.code` (and `WireError.code`)."""

    MALFORMED = "MALFORMED"  # body or header does not parse / mistyped field
    TOO_LARGE = "TOO_LARGE"  # over a size limit
    BAD_TENSOR = "BAD_TENSOR"
    BAD_IMAGE = "BAD_IMAGE"
    BAD_KEY = "BAD_KEY"
    SCHEMA_VERSION = "SCHEMA_VERSION"  # client version outside the server's range
    ACTION_MISMATCH = "ACTION_MISMATCH"  # action names or order differ
    CAMERA_MISMATCH = "CAMERA_MISMATCH"  # client cameras do not cover the policy's
    STATE_DIM_MISMATCH = "STATE_DIM_MISMATCH"
    FPS_MISMATCH = "FPS_MISMATCH"  # fps differs from the trained fps and allow_resampling is off
    TASK_PINNED = "TASK_PINNED"  # pin_task and a different task
    CAPACITY = "CAPACITY"  # max_sessions reached; details carry the load
    EXCLUSIVE_BUSY = "EXCLUSIVE_BUSY"  # exclusive serving mode already has its session
    WRONG_MODEL = "WRONG_MODEL"  # checkpoint differs from the one the client pinned
    UNKNOWN_SESSION = "UNKNOWN_SESSION"
    IDENTITY_MISMATCH = "IDENTITY_MISMATCH"  # session belongs to another client, or its proof (auth) is wrong
    SESSION_LIVE = "SESSION_LIVE"  # this client uuid has a live session here; a re-open must prove it (previous_auth)
    TOO_MANY_SESSIONS = "TOO_MANY_SESSIONS"  # the client identity holds security.max_sessions_per_client sessions
    RATE_LIMITED = "RATE_LIMITED"  # the session sent more than security.max_request_rate_hz; this request is dropped
    DRAINING = "DRAINING"  # server is shutting down; go to another replica
    NOT_READY = "NOT_READY"  # still warming up
    EXPIRED = "EXPIRED"  # the request waited longer than the server's request_ttl_ms; the next one may pass
    OVERLOADED = "OVERLOADED"  # the server's queue was full and this request was dropped (overflow policy)
    NON_FINITE_ACTION = "NON_FINITE_ACTION"  # the policy produced NaN or inf actions for this request; nothing sent
    INTERNAL = "INTERNAL"  # server fault; retry

    @classmethod
    def all(cls) -> list[str]:
        return [v for k, v in vars(cls).items() if k.isupper()]


# ---- field kinds -----------------------------------------------------------------------------

_ABSENT = object()
_PACKERS = threading.local()  # each thread's msgpack.Packer (a Packer holds its buffer: not shareable)


@dataclass(frozen=True)
class F:
    """One body field: wire name, kind word, required flag, default, numeric range, doc."""

    name: str
    kind: str  # str uint int float bool tensor tensor? images tensors str_list str_map any_map cams
    required: bool = False
    default: Any = None
    lo: float | None = None
    hi: float | None = None
    unit: str = ""
    doc: str = ""


def _fail(msg_name: str, f: F, why: str) -> WireError:
    return WireError(ErrorCode.MALFORMED, f"{msg_name}.{f.name}: {why}", f.name)


def _check_str(v: Any, limits: Limits) -> bool:
    return isinstance(v, str) and len(v) <= limits.max_string_chars


def _decode_field(msg: str, f: F, v: Any, limits: Limits) -> Any:
    k = f.kind
    if v is None and (k == "tensor?" or (not f.required and k in ("uint?", "float?"))):
        return None
    if k == "str":
        if not _check_str(v, limits):
            raise _fail(msg, f, f"must be a string of at most {limits.max_string_chars} chars")
        return v
    if k in ("uint", "int", "uint?"):
        if not isinstance(v, int) or isinstance(v, bool):
            raise _fail(msg, f, f"must be an integer, got {type(v).__name__}")
        if k.startswith("uint") and v < 0:
            raise _fail(msg, f, f"must be >= 0, got {v}")
    elif k in ("float", "float?"):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise _fail(msg, f, f"must be a finite number, got {v!r}")
        v = float(v)
    elif k == "bool":
        if not isinstance(v, bool):
            raise _fail(msg, f, f"must be true or false, got {type(v).__name__}")
        return v
    elif k in ("tensor", "tensor?"):
        return decode_tensor(v, f"{msg}.{f.name}", limits)
    elif k == "images":
        if not isinstance(v, dict) or len(v) > limits.max_images:
            raise _fail(msg, f, f"must be a map of at most {limits.max_images} camera frames")
        out = {}
        for name, img in v.items():
            if not _check_str(name, limits):
                raise _fail(msg, f, "camera names must be strings")
            out[name] = image_from_wire(img, f"{msg}.{f.name}.{name}", limits)
        return out
    elif k == "tensors":
        if not isinstance(v, dict) or len(v) > limits.max_tensors:
            raise _fail(msg, f, f"must be a map of at most {limits.max_tensors} tensors")
        out = {}
        for name, t in v.items():
            if not _check_str(name, limits):
                raise _fail(msg, f, "tensor names must be strings")
            out[name] = decode_tensor(t, f"{msg}.{f.name}.{name}", limits)
        return out
    elif k == "str_list":
        if not isinstance(v, list) or len(v) > limits.max_list_items or not all(_check_str(s, limits) for s in v):
            raise _fail(msg, f, f"must be a list of at most {limits.max_list_items} strings")
        return list(v)
    elif k == "str_map":
        if (
            not isinstance(v, dict)
            or len(v) > limits.max_map_entries
            or not all(_check_str(a, limits) and _check_str(b, limits) for a, b in v.items())
        ):
            raise _fail(msg, f, f"must be a map of at most {limits.max_map_entries} string -> string")
        return dict(v)
    elif k == "cams":
        if not isinstance(v, dict) or len(v) > limits.max_images:
            raise _fail(msg, f, "must be a map camera name -> [h, w, c]")
        out = {}
        for name, shp in v.items():
            if not _check_str(name, limits) or not (
                isinstance(shp, list)
                and len(shp) == 3
                and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shp)
            ):
                raise _fail(msg, f, f"camera {name!r} needs a shape [h, w, c] of positive ints")
            out[name] = list(shp)
        return out
    elif k == "any_map":
        if not isinstance(v, dict) or len(v) > limits.max_map_entries or not all(isinstance(a, str) for a in v):
            raise _fail(msg, f, "must be a map with string keys")
        return dict(v)
    else:  # pragma: no cover - a schema bug, not an input error
        raise AssertionError(f"unknown field kind {k}")
    if f.lo is not None and v < f.lo or f.hi is not None and v > f.hi:
        raise _fail(msg, f, f"{v} is outside [{f.lo}, {f.hi}]")
    return v


class Message:
    """Base of every body. Subclasses set KIND and FIELDS and are dataclasses of the same names."""

    KIND: ClassVar[str]
    FIELDS: ClassVar[tuple[F, ...]]

    def to_wire(self) -> dict:
        out: dict[str, Any] = {"kind": self.KIND}
        plan = _PLANS.get(type(self))
        if plan is None:
            plan = _plan(type(self))
        for name, required, encode, _f, _plain, _unsigned, _label in plan:
            v = getattr(self, name)
            if v is None:
                if required:
                    out[name] = None
                continue
            out[name] = v if encode is None else encode(v)
        return out

    def encode(self) -> bytes:
        packer = getattr(_PACKERS, "packer", None)
        if packer is None:  # one a thread: msgpack.packb builds a Packer a call (~1.7 us of a 2.5 us pack)
            packer = _PACKERS.packer = msgpack.Packer(use_bin_type=True)
        return packer.pack(self.to_wire())  # autoreset: its bytes, and an empty buffer again (also after a raise)

    @classmethod
    def from_wire(cls, obj: dict, limits: Limits = DEFAULT_LIMITS):
        kwargs = {}
        max_chars = limits.max_string_chars
        plan = _PLANS.get(cls)
        if plan is None:
            plan = _plan(cls)
        for name, required, _encode, f, plain, unsigned, tensor_label in plan:
            v = obj.get(name, _ABSENT)
            if v is _ABSENT or (v is None and f.kind not in _NULLABLE):
                if required:
                    raise WireError(ErrorCode.MALFORMED, f"{cls.__name__}: required field {name!r} is missing", name)
                continue  # dataclass default applies
            # a plain value that passes its check as it is: what _decode_field would return, without its kind chain
            # (a string or a bool has no range, as in _decode_field; a number must be within [lo, hi])
            t = type(v)
            if t is plain and (
                (t is str and len(v) <= max_chars)
                or t is bool
                or (
                    ((t is int and (v >= 0 or not unsigned)) or (t is float and math.isfinite(v)))
                    and (f.lo is None or v >= f.lo)
                    and (f.hi is None or v <= f.hi)
                )
            ):
                kwargs[name] = v
                continue
            if tensor_label is not None and v is not None:  # as _decode_field would, without its kind chain
                kwargs[name] = decode_tensor(v, tensor_label, limits)
                continue
            kwargs[name] = _decode_field(cls.__name__, f, v, limits)
        return cls(**kwargs)


_NULLABLE = frozenset(("tensor?", "uint?", "float?"))  # kinds whose None is a value, not an absent field
# a kind -> the Python type a msgpack value of it may be taken as, once checked (from_wire's fast path)
_PLAIN = {"str": str, "bool": bool, "uint": int, "uint?": int, "int": int, "float": float, "float?": float}


def _encoder(kind: str):
    """What to_wire applies to a field's value of this kind that is not None (None: the value goes on the wire as
    it is)."""
    if kind in ("tensor", "tensor?"):
        return encode_tensor
    if kind == "tensors":
        return lambda v: {k: encode_tensor(t) for k, t in v.items()}
    if kind == "images":
        return lambda v: {k: img.to_wire() for k, img in v.items()}
    if kind in ("float", "float?"):
        return float
    if kind in ("uint", "int", "uint?"):
        return int
    return None


# a message class -> its fields as (name, required, encoder, F, plain type, unsigned, tensor label: the name
# decode_tensor's errors give a tensor field, None for any other kind), built on first use
_PLANS: dict[type, tuple] = {}


def _plan(cls) -> tuple:
    plan = tuple(
        (
            f.name,
            f.required,
            _encoder(f.kind),
            f,
            _PLAIN.get(f.kind),
            f.kind.startswith("uint"),
            f"{cls.__name__}.{f.name}" if f.kind in ("tensor", "tensor?") else None,
        )
        for f in cls.FIELDS
    )
    _PLANS[cls] = plan
    return plan


def _unpack(raw: Any, limits: Limits) -> dict:
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise WireError(ErrorCode.MALFORMED, f"body must be bytes, got {type(raw).__name__}")
    if len(raw) > limits.max_message_bytes:
        raise WireError(ErrorCode.TOO_LARGE, f"body is {len(raw)} bytes; the limit is {limits.max_message_bytes}")
    try:
        obj = msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=limits.max_message_bytes,
            max_bin_len=limits.max_message_bytes,
            max_array_len=limits.max_list_items,
            max_map_len=max(limits.max_map_entries, 64),
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises ValueError, TypeError, ExtraData, StackError, ...
        raise WireError(ErrorCode.MALFORMED, f"body is not valid msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, dict):
        raise WireError(ErrorCode.MALFORMED, f"body must be a msgpack map, got {type(obj).__name__}")
    return obj


REGISTRY: dict[str, type[Message]] = {}


def _register(cls):
    REGISTRY[cls.KIND] = cls
    return cls


def decode_message(
    raw: bytes, expect: type[Message] | tuple[type[Message], ...] | None = None, limits: Limits = DEFAULT_LIMITS
) -> Message:
    """Decode any body by its `kind`; with `expect`, anything else is a WireError."""
    obj = _unpack(raw, limits)
    kind = obj.get("kind")
    cls = REGISTRY.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise WireError(ErrorCode.MALFORMED, f"unknown message kind {kind!r}; known: {sorted(REGISTRY)}", "kind")
    if expect is not None and not issubclass(cls, expect):
        names = expect.__name__ if isinstance(expect, type) else "/".join(e.__name__ for e in expect)
        raise WireError(ErrorCode.MALFORMED, f"expected {names}, got {cls.__name__}", "kind")
    return cls.from_wire(obj, limits)


# ---- data plane ------------------------------------------------------------------------------


@_register
@dataclass(eq=False)
class Observation(Message):
    KIND: ClassVar[str] = "observation"
    FIELDS: ClassVar[tuple[F, ...]] = (
        F("session_id", "str", True, doc="session this observation belongs to (from SessionAck)"),
        F("state", "tensor", True, doc="robot state vector, float32 (S,) or (1, S)"),
        F("images", "images", False, {}, doc="camera name -> frame"),
        F("tensors", "tensors", False, {}, doc="extra named tensors (SDK use)"),
        F(
            "task",
            "str",
            False,
            "",
            doc="ignored by policy-server: the session's task (session_open, in the key) holds",
        ),
        F(
            "inference_delay_steps",
            "uint",
            False,
            0,
            hi=10_000,
            unit="control steps",
            doc="estimated delay d the policy must assume (RTC)",
        ),
        F("prefix_model", "tensor?", False, doc="model-space leftover (H, A) or absent"),
        F("prefix_robot", "tensor?", False, doc="robot-space leftover (H, A) or absent"),
        F("episode_start", "bool", False, False, doc="first observation of an episode"),
        F("urgency", "float", False, 0.5, 0.0, 1.0, doc="how time-critical this request is"),
        F("priority", "uint", False, 0, hi=255, doc="0 = highest"),
        F("steps_remaining", "uint?", False, unit="control steps", doc="actions left in the client queue"),
        F("metadata", "str_map", False, {}, doc="free-form labels"),
        F(
            "auth",
            "str",
            False,
            None,
            doc="session proof: wire.auth.obs_tag(session_key, session_id, attachment header); "
            "policy-server drops an observation without a valid one, unanswered (5.5)",
        ),
    )
    session_id: str
    state: np.ndarray
    images: dict[str, EncodedImage] = field(default_factory=dict)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    task: str = ""
    inference_delay_steps: int = 0
    prefix_model: np.ndarray | None = None
    prefix_robot: np.ndarray | None = None
    episode_start: bool = False
    urgency: float = 0.5
    priority: int = 0
    steps_remaining: int | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    auth: str | None = None


@_register
@dataclass(eq=False)
class ActionChunk(Message):
    KIND: ClassVar[str] = "action_chunk"
    FIELDS: ClassVar[tuple[F, ...]] = (
        F("session_id", "str", True),
        F("seq_id_echo", "uint", True, doc="header seq_id of the observation answered"),
        F("client_mono_ns_echo", "int", True, unit="ns", doc="header client_mono_ns echoed verbatim"),
        F("chunk_model", "tensor", True, doc="model-space chunk (T, A) float32"),
        F("chunk_robot", "tensor", True, doc="robot-space chunk (T, A) float32"),
        F("queue_wait_ms", "float", True, 0.0, 0.0, unit="ms", doc="server-side wait before inference"),
        F(
            "inference_ms",
            "float",
            True,
            0.0,
            0.0,
            unit="ms",
            doc="server-side pre+forward+post time (forward: until the chunks are on the host, so a GPU's whole pass)",
        ),
        F(
            "superseded_seqs",
            "uint",
            False,
            0,
            doc="observations of this session replaced unanswered since the last chunk",
        ),
        F("server_load", "float", False, 0.0, 0.0, doc="active_sessions / max_sessions"),
        F("rtc_applied", "bool", False, False, doc="chunk was generated with prefix guidance"),
        F("inference_emulated", "bool", False, False, doc="inference_ms includes emulated accelerator latency"),
    )
    session_id: str
    seq_id_echo: int
    client_mono_ns_echo: int
    chunk_model: np.ndarray
    chunk_robot: np.ndarray
    queue_wait_ms: float = 0.0
    inference_ms: float = 0.0
    superseded_seqs: int = 0
    server_load: float = 0.0
    rtc_applied: bool = False
    inference_emulated: bool = False


@_register
@dataclass(eq=False)
class DrainNotice(Message):
    """EVENT on each client's action topic: this replica stops; open a session elsewhere."""

    KIND: ClassVar[str] = "drain"
    FIELDS: ClassVar[tuple[F, ...]] = (
        F("replica_id", "str", True),
        F("reason", "str", False, ""),
        F("deadline_ms", "float", False, 0.0, 0.0, unit="ms", doc="time until the replica exits"),
    )
    replica_id: str
    reason: str = ""
    deadline_ms: float = 0.0


@_register
@dataclass(eq=False)
class Error(Message):
    """A refusal or failure, as a control reply or an EVENT on the action topic."""

    KIND: ClassVar[str] = "error"
    FIELDS: ClassVar[tuple[F, ...]] = (
        F("code", "str", True, doc="an ErrorCode word"),
        F("message", "str", True, doc="what went wrong and what to do"),
        F("details", "any_map", False, {}, doc="machine-readable context, e.g. load"),
        F("seq_id", "uint?", False, doc="the observation this answers, if any"),
    )
    code: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    seq_id: int | None = None


# ---- control plane ---------------------------------------------------------------------------

_MODEL_FIELDS = (
    F("replica_id", "str", True),
    F("model_id", "str", True),
    F("revision", "str", True),
    F("checkpoint_hash", "str", True, doc="sha256 of the loaded checkpoint (recipe: section 5.6)"),
    F("policy_type", "str", True),
    F("action_names", "str_list", True, doc="ordered; chunk column i drives action_names[i]"),
    F("state_dim", "uint", True),
    F("cameras", "cams", False, {}, doc="camera name -> [h, w, c] the policy consumes"),
    F("chunk_size", "uint", True),
    F("trained_fps", "float", True, unit="Hz"),
    F("supports_rtc", "bool", True),
    F("serving_mode", "str", True, doc="shared | exclusive"),
    F("warmed_up", "bool", True),
    F("active_sessions", "uint", True),
    F("max_sessions", "uint", True),
    F("load", "float", True, lo=0.0, doc="active_sessions / max_sessions"),
    F("inference_emulated", "bool", False, False),
)


@dataclass(eq=False)
class _ModelMessage(Message):
    """The required model fields of _MODEL_FIELDS as attributes, declared once for Status and SessionAck (the two
    messages that describe the served model). A subclass declares its own required fields next, and the defaulted
    `cameras` and `inference_emulated` among its defaults (a defaulted dataclass field cannot precede a required
    one), so both keep their field order and constructor. Not registered: no message of its own."""

    replica_id: str
    model_id: str
    revision: str
    checkpoint_hash: str
    policy_type: str
    action_names: list[str]
    state_dim: int
    chunk_size: int
    trained_fps: float
    supports_rtc: bool
    serving_mode: str
    warmed_up: bool
    active_sessions: int
    max_sessions: int
    load: float


@_register
@dataclass(eq=False)
class Status(_ModelMessage):
    KIND: ClassVar[str] = "status"
    FIELDS: ClassVar[tuple[F, ...]] = _MODEL_FIELDS + (
        F("ready", "bool", True, doc="warmed up and accepting sessions"),
        F("draining", "bool", False, False),
        F("schema_min", "uint", True),
        F("schema_max", "uint", True),
        F("default_task", "str", False, ""),
        F("pin_task", "bool", False, False),
        F("execution_horizon", "uint", False, 0),
    )
    ready: bool
    schema_min: int
    schema_max: int
    cameras: dict[str, list[int]] = field(default_factory=dict)
    inference_emulated: bool = False
    draining: bool = False
    default_task: str = ""
    pin_task: bool = False
    execution_horizon: int = 0


@_register
@dataclass(eq=False)
class SessionOpen(Message):
    KIND: ClassVar[str] = "session_open"
    FIELDS: ClassVar[tuple[F, ...]] = (
        F("client_uuid", "str", True),
        F("schema_version", "uint", True),
        F("fps", "float", True, lo=0.0, unit="Hz", doc="client control rate"),
        F("action_names", "str_list", True, doc="ordered action features of the robot"),
        F("state_dim", "uint", True),
        F("cameras", "cams", False, {}, doc="camera name -> [h, w, c] the client will send"),
        F("policy_type", "str", False, "", doc="expected policy type; empty = any"),
        F("task", "str", False, ""),
        F("rtc_enabled", "bool", False, False, doc="client wants replace (RTC) merging"),
        F("execution_horizon", "uint", False, 0, unit="steps"),
        F("expected_checkpoint_hash", "str", False, "", doc="non-empty = refuse any other checkpoint"),
        F("client_type", "str", False, ""),
        F("tags", "str_map", False, {}),
        F(
            "latency_budget_ms",
            "float",
            False,
            0.0,
            0.0,
            unit="ms",
            doc="the client's latency budget for deadline scheduling; 0 = the server's setting",
        ),
        F("previous_session_id", "str", False, None, doc="re-handshake: the session this one replaces"),
        F(
            "previous_auth",
            "str",
            False,
            None,
            doc="re-handshake proof: wire.auth.reopen_tag(previous session_key, previous_session_id, client_uuid)",
        ),
    )
    client_uuid: str
    schema_version: int
    fps: float
    action_names: list[str]
    state_dim: int
    cameras: dict[str, list[int]] = field(default_factory=dict)
    policy_type: str = ""
    task: str = ""
    rtc_enabled: bool = False
    execution_horizon: int = 0
    expected_checkpoint_hash: str = ""
    client_type: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    latency_budget_ms: float = 0.0
    previous_session_id: str | None = None
    previous_auth: str | None = None


@_register
@dataclass(eq=False)
class SessionAck(_ModelMessage):
    KIND: ClassVar[str] = "session_ack"
    FIELDS: ClassVar[tuple[F, ...]] = _MODEL_FIELDS + (
        F("session_id", "str", True),
        F("schema_version", "uint", True, doc="the version both sides now speak"),
        F("rtc_enabled", "bool", True, doc="effective merge mode (false after an RTC downgrade)"),
        F("execution_horizon", "uint", False, 0),
        F("task", "str", False, "", doc="effective task"),
        F("warnings", "str_list", False, []),
        F(
            "session_key",
            "str",
            False,
            None,
            doc="per-session secret (hex) for the auth tags of observations and resets; never logged, never re-sent; "
            "policy-server always sends one",
        ),
    )
    session_id: str
    schema_version: int
    rtc_enabled: bool
    cameras: dict[str, list[int]] = field(default_factory=dict)
    inference_emulated: bool = False
    execution_horizon: int = 0
    task: str = ""
    warnings: list[str] = field(default_factory=list)
    session_key: str | None = None


@_register
@dataclass(eq=False)
class Reset(Message):
    KIND: ClassVar[str] = "reset"
    FIELDS: ClassVar[tuple[F, ...]] = (
        F("session_id", "str", True),
        F("episode_id", "uint", True, hi=(1 << 32) - 1, doc="the new episode"),
        F("auth", "str", False, None, doc="session proof: wire.auth.reset_tag(session_key, session_id, episode_id)"),
    )
    session_id: str
    episode_id: int
    auth: str | None = None


@_register
@dataclass(eq=False)
class ResetAck(Message):
    KIND: ClassVar[str] = "reset_ack"
    FIELDS: ClassVar[tuple[F, ...]] = (
        F("session_id", "str", True),
        F("episode_id", "uint", True, hi=(1 << 32) - 1),
    )
    session_id: str
    episode_id: int


@_register
@dataclass(eq=False)
class StatusRequest(Message):
    """Optional body of a status query (an empty query is valid too)."""

    KIND: ClassVar[str] = "status_request"
    FIELDS: ClassVar[tuple[F, ...]] = (F("client_uuid", "str", False, ""),)
    client_uuid: str = ""


def fields_of(cls: type[Message]) -> dict[str, F]:
    return {f.name: f for f in cls.FIELDS}


def _check_tables() -> None:
    for cls in REGISTRY.values():
        names = {f.name for f in dataclasses.fields(cls)}
        wire = {f.name for f in cls.FIELDS}
        assert names == wire, f"{cls.__name__}: dataclass fields {names ^ wire} not in FIELDS"


_check_tables()
