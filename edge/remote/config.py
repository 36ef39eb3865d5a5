"""RemoteEngineConfig: every field of design 9.4 (plus what a multi-replica fleet needs), declared once.

Each field is one `knob(default, doc, *checks)`: its default, its meaning and the checks its value must pass sit
in one declaration. `__post_init__` runs the checks in field order (a check may read the fields before its own,
already checked), and `FIELD_DOCS` (docs/scenarios.md's engine table, the scenario JSON Schema) is read from the
same declarations, so a field cannot exist without a meaning or a check.

Invariant: a bad value is a ConfigError naming the field (`RemoteEngineConfig.<name>: ...`) at construction,
never a handshake that fails until max_offline_s or a TypeError later. The rules are the wire's where it has them
(key chunks, endpoints, leases, the observation's urgency and priority).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from edge.engine import ConfigError, FallbackBehavior, config_from_dict
from edge.latency import LATENCY_MODES
from edge.queue import TRIM_MODES
from wire.configerrors import range_text, show
from wire.errors import WireError
from wire.keys import sanitize, sanitize_root, task_slug
from wire.messages import Observation
from wire.qos import CONTROL_TIMEOUTS_S
from wire.transport import MAX_LEASE_MS, MIN_LEASE_MS, TlsError, TlsFiles, endpoint_problem

_PRIORITY_MAX = next(int(f.hi) for f in Observation.FIELDS if f.name == "priority")

# A check: (value, the config so far) -> the value kept (normalised), or Refused.
Check = Callable[[Any, Any], Any]


class Refused(Exception):
    """Why a value is refused; `name` when the message belongs to another field than the one checked."""

    def __init__(self, why: str, name: str | None = None):
        super().__init__(why)
        self.name = name


def knob(default: Any, doc: str, *checks: Check, factory: Callable[[], Any] | None = None) -> Any:
    """One config field: its default (or `factory` for a mutable one), its meaning and its checks."""
    meta = {"doc": doc, "checks": checks}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# --- the checks --------------------------------------------------------------------------------------------------


def _positive(v: Any) -> bool:
    """A finite number > 0 (inf would make a period 0 or a wait endless; a bool is not a number here)."""
    return not isinstance(v, bool) and isinstance(v, (int, float)) and 0 < v < math.inf


def positive(v, cfg):
    if not _positive(v):
        raise Refused(f"must be a finite number > 0, got {v!r}")
    return float(v)


def positive_or_null(v, cfg):
    if v is not None and not _positive(v):
        raise Refused(f"must be a finite number > 0, or null to derive it from the measured delay; got {v!r}")
    return None if v is None else float(v)


def at_least(other: str) -> Check:
    def check(v, cfg):
        if v < getattr(cfg, other):
            raise Refused(f"must be >= {other}")
        return v

    return check


def at_least_the_control_timeouts(v, cfg):
    base = max(CONTROL_TIMEOUTS_S["status"], CONTROL_TIMEOUTS_S["session"])
    if v < base:
        raise Refused(
            f"must be >= the base status/session timeout {base:g} s (wire.qos.CONTROL_TIMEOUTS_S); "
            f"{base:g} keeps the timeouts fixed, got {v:g}"
        )
    return v


def integer(lo: int, hi: int | None, meaning: str) -> Check:
    def check(v, cfg):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            kind = "a positive integer" if (lo, hi) == (1, None) else f"an integer {range_text(lo, hi, None)}"
            raise Refused(f"must be {kind} ({meaning}), got {show(v)}")
        return v

    return check


def fallback_word(v, cfg):
    try:
        return FallbackBehavior(v).value
    except ValueError:
        raise Refused(f"{v!r} is not one of {[f.value for f in FallbackBehavior]}") from None


def choice(choices: tuple | list) -> Check:
    def check(v, cfg):
        if v not in choices:
            raise Refused(f"{v!r} is not one of {choices}")
        return v

    return check


def boolean(v, cfg):
    if not isinstance(v, bool):
        raise Refused(f"must be true or false, got {show(v)}")
    return v


def required(why: str) -> Check:
    def check(v, cfg):
        if not v:
            raise Refused(f"is required: {why}")
        return v

    return check


def key_chunk(name: str, fix: str, empty_ok: bool = False) -> Check:
    """One chunk of a Zenoh key (the wire's rule: wire.keys), `fix` saying what to write instead."""

    def check(v, cfg):
        if empty_ok and v == "":
            return v
        if not isinstance(v, str):
            raise Refused(f"must be a string, got {show(v)}; {fix}")
        try:
            if name == "root":
                sanitize_root(v)
            else:
                sanitize(v, name)
        except WireError as exc:
            raise Refused(f"{str(exc).split('] ', 1)[-1]}; {fix}") from None
        return v

    return check


def text(v, cfg):
    if not isinstance(v, str):
        raise Refused(f"must be a string, got {show(v)}; write \"\" to leave it unset")
    return v


def task_words(v, cfg):
    if v:
        try:
            task_slug(v)
        except WireError as exc:
            raise Refused(
                f"{str(exc).split('] ', 1)[-1]}; write the instruction in words, or \"\" for the server's default"
            ) from None
    return v


def names(noun: str, example: str) -> Check:
    """A list of distinct non-empty strings (a tuple is kept as a list)."""

    def check(v, cfg):
        if not isinstance(v, (list, tuple)):
            hint = f"[{v}]" if isinstance(v, str) else example
            raise Refused(f"must be a list of {noun}, e.g. {hint}, got {show(v)}")
        for x in v:
            if not isinstance(x, str) or not x:
                raise Refused(f"must be a list of {noun} (non-empty strings), got {x!r} in {v!r}")
        twice = sorted({x for x in v if v.count(x) > 1})
        if twice:
            raise Refused(f"{twice[0]!r} is listed {v.count(twice[0])} times in {v!r}; list each once")
        return list(v)

    return check


def each(check: Check) -> Check:
    def check_each(v, cfg):
        for x in v:
            check(x, cfg)
        return v

    return check_each


def endpoints(v, cfg):
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, (list, tuple)) or not v:
        raise Refused(f"must be a list of Zenoh router endpoints, e.g. [tcp/127.0.0.1:7447], got {show(v)}")
    for e in v:
        if endpoint_problem(e):
            raise Refused(endpoint_problem(e))
    return list(v)


def string_tags(v, cfg):
    if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
        raise Refused(f"must be a mapping of tag names to string values, e.g. {{site: lab}}, got {show(v)}")
    return dict(v)


def state_size(v, cfg):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise Refused(f"must be the robot's state size (>= 1), got {v!r}")
    return v


def unit_interval(v, cfg):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
        raise Refused(f"must be a number from 0 to 1 (1 = most time-critical), got {show(v)}")
    return float(v)


def fraction(v, cfg):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
        raise Refused(f"must be a number from 0 to 1 (a fraction of the replica's max_sessions), got {show(v)}")
    return float(v)


def file_or_null(v, cfg):
    if v is not None and not isinstance(v, str):
        raise Refused(f"must be a file path or null, got {show(v)}")
    if v is not None and not os.path.isfile(v):
        raise Refused(f"file {v!r} does not exist; check the path")
    return v


def tls_ca_when_needed(v, cfg):
    """The CA a client certificate or a tls/quic endpoint needs; the files themselves checked together."""
    if (cfg.tls_cert or cfg.tls_key) and not v:
        raise Refused("a client certificate needs the CA file that signed the router's certificate")
    secure = [e for e in cfg.connect_endpoints if e.startswith(("tls/", "quic/"))]
    if secure and not v:
        raise Refused(
            f"endpoint {secure[0]} needs TLS: give the CA file that signed the router's certificate "
            "(and tls_cert, tls_key for mTLS)"
        )
    if v:
        try:  # expired, not PEM, a key of another certificate, another CA: fail at construction, not later
            TlsFiles(v, cfg.tls_cert, cfg.tls_key).check()
        except TlsError as exc:
            raise Refused(str(exc), "tls_cert" if cfg.tls_cert else "tls_ca") from None
    return v


# --- the config ------------------------------------------------------------------------------------------------

_MODEL_FIX = "give the model id the server serves (its manifest's model_id)"


@dataclass
class RemoteEngineConfig:
    """Every field of design 9.4 (plus what a multi-replica fleet needs), with its default, meaning and checks."""

    connect_endpoints: list[str] = knob(
        None,
        "Zenoh router endpoints, protocol/address (e.g. tcp/10.0.0.1:7447, tls/[::1]:7447)",
        endpoints,
        factory=lambda: ["tcp/127.0.0.1:7447"],
    )
    model_id: str = knob(
        "",
        "the model id the server serves (its manifest's model_id; a key chunk: no * $ ? # / or spaces)",
        required("the model id the server serves (its manifest's model_id)"),
        key_chunk("model_id", _MODEL_FIX),
    )
    revision: str = knob(
        "main",
        "checkpoint revision in the keys (a key chunk)",
        key_chunk("revision", "give the revision the server serves (its manifest's revision; default main)"),
    )
    fps: float = knob(30.0, "control rate in Hz (finite, > 0); one get_action per tick", positive)
    action_names: list[str] = knob(
        None,
        "the robot's ordered action names, each once: chunk column i drives action i",
        required("the robot's ordered action names (they must match the policy's)"),
        names("the robot's action names in the policy's order", "[shoulder, elbow]"),
        factory=list,
    )
    state_dim: int = knob(0, "the robot's state size", state_size)
    cameras: list[str] = knob(
        None, "camera names the robot sends, each once", names("camera names", "[front]"), factory=list
    )
    task: str = knob("", "task string sent with each observation", text, task_words)
    client_uuid: str = knob(
        "",
        "this client's id in the keys (a key chunk); empty: a random uuid at start()",
        key_chunk(
            "client_uuid",
            "give a name of letters, digits, . _ - (no * $ ? # / or spaces), or \"\" for a random id",
            empty_ok=True,
        ),
    )
    client_type: str = knob("", "free text reported to the server", text)
    tls_cert: str | None = knob(None, "client certificate (mTLS)", file_or_null)
    tls_key: str | None = knob(None, "its private key", file_or_null)
    tls_ca: str | None = knob(
        None, "CA file that signed the router's certificate (enables TLS)", file_or_null, tls_ca_when_needed
    )
    jpeg_quality: int = knob(
        90,
        "JPEG quality of camera frames, 1..100; 0 = raw frames (LAN, debug)",
        integer(0, 100, "0: raw frames, else the JPEG quality"),
    )
    buffer_time_s: float | None = knob(
        None,
        "send the next observation when the queue holds this much playback or less; null: derived from the "
        "measured delay d so that RTC's d <= s <= H - d holds (s: steps executed per chunk)",
        positive_or_null,
    )
    max_action_age_s: float = knob(
        3.0, "staleness bound: an action older than this is never executed (safety)", positive
    )
    degraded_after_s: float = knob(1.0, "no chunk for this long: DEGRADED", positive)
    request_timeout_s: float = knob(5.0, "a request without an answer for this long counts as a timeout", positive)
    timeout_streak: int = knob(
        3,
        "consecutive requests without a usable chunk (timed out, or answered with a bad chunk) that make the "
        "engine RECONNECTING",
        integer(1, None, "timeouts"),
    )
    reconnect_initial_backoff_s: float = knob(
        0.5, "first wait between reconnect attempts (doubles, with jitter)", positive
    )
    reconnect_max_backoff_s: float = knob(
        10.0, "longest wait between reconnect attempts", positive, at_least("reconnect_initial_backoff_s")
    )
    rebalance: bool = knob(
        True,
        "at an episode boundary, move the session to a less loaded replica of the same checkpoint when this one "
        "holds more than its fair share of sessions (edge.remote.rebalance)",
        boolean,
    )
    rebalance_check_s: float = knob(
        30.0,
        "how often (jittered +-25 %) the engine reads the replicas' loads at its next episode boundary; a replica "
        "token appearing (a replica returned or added) brings the check forward",
        positive,
    )
    rebalance_threshold: float = knob(
        0.05,
        "0..1: a replica's sessions over its fair share, as a fraction of its max_sessions, before robots move",
        fraction,
    )
    rebalance_min_dwell_s: float = knob(
        20.0, "least time a session stays on a replica before it may move: at most one move per this long", positive
    )
    max_offline_s: float = knob(60.0, "offline longer than this: DEAD (the robot's own safety takes over)", positive)
    control_timeout_max_s: float = knob(
        16.0,
        "cap of the handshake's status and session timeouts (base 2 s): they double after a round in which no "
        "replica answered in time (a link slower than them), and come back to the base with a session; at "
        "least 2 x the measured round trip + 0.5 s",
        positive,
        at_least_the_control_timeouts,
    )
    fallback: str = knob(
        "hold", "what get_action returns when STALLED: hold (nothing), repeat_last, zero", fallback_word
    )
    rtc_enabled: bool = knob(
        True, "real-time chunking: guide the next chunk with the executed prefix; false = append mode", boolean
    )
    execution_horizon: int = knob(
        10, "prefix rows shipped to the server with each observation (RTC)", integer(0, None, "the prefix rows shipped")
    )
    # consumed is what every shipped scenario runs; real_delay is LeRobot's
    trim: str = knob(
        "consumed",
        "how a late chunk is trimmed: real_delay (LeRobot: by the measured delay) or consumed (by the "
        "actions executed since the request, which fixes the first chunk's over-trim)",
        choice(TRIM_MODES),
    )
    # LeRobot's all_time_max lets one slow round trip (a retransmission, the first request) set d for the session
    latency_mode: str = knob(
        "percentile",
        "the delay estimate RTC plans with: percentile (p95 of the window), window_max, all_time_max (LeRobot)",
        choice(LATENCY_MODES),
    )
    latency_window: int = knob(
        100, "requests in the latency window (window_max, percentile)", integer(1, None, "round trips")
    )
    tags: dict[str, str] = knob(
        None,
        "tag: value labels (strings) sent at session open (server allowlists may use them)",
        string_tags,
        factory=dict,
    )
    root: str = knob(
        "@fleet",
        "the verbatim root key chunk: @ and a key chunk",
        key_chunk("root", "give the servers' key root, e.g. @fleet (the default)"),
    )
    lease_ms: int = knob(
        1000,
        "this client's Zenoh lease, 100..600000 ms: how fast the router notices it is gone",
        integer(MIN_LEASE_MS, MAX_LEASE_MS, "ms; keep it above the link's round trip"),
    )
    expected_checkpoint_hash: str = knob("", "non-empty: refuse any other checkpoint from the start", text)
    replica_order: list[str] = knob(
        None,
        "preferred replica ids, in order, each once; default: the least loaded",
        names("replica ids", "[r0, r1]"),
        each(key_chunk("replica_order", "give the replica ids the servers run with (their manifests' replica_id)")),
        factory=list,
    )
    urgency: float = knob(0.5, "0..1, sent with each request for deadline-aware scheduling", unit_interval)
    priority: int = knob(
        0,
        "priority tier for priority_tiered scheduling, 0..255 (0 = most urgent)",
        integer(0, _PRIORITY_MAX, "0 = most urgent; the range of an observation's priority"),
    )

    def __post_init__(self) -> None:
        """Each field's checks, in field order; the first refusal is a ConfigError naming its field."""
        for f in fields(self):
            for check in f.metadata["checks"]:
                try:
                    setattr(self, f.name, check(getattr(self, f.name), self))
                except Refused as exc:
                    raise ConfigError(f"RemoteEngineConfig.{exc.name or f.name}: {exc}") from None

    from_dict = classmethod(config_from_dict)


# What each field means, for the generated docs (docs/scenarios.md's engine table) and the scenario JSON Schema.
FIELD_DOCS: dict[str, str] = {f.name: f.metadata["doc"] for f in fields(RemoteEngineConfig)}
