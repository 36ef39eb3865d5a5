"""The remote engine: the RTC loop with the thread boundary replaced by the network (design 9).

    control thread                          network worker (1 thread)                  Zenoh (its threads)
    notify_observation ──► slot (latest)    wait: qsize <= H - s (plan_execution),     action sub ──► inbox
    get_action ◄── ActionQueue ◄── merge ◄──   a new observation, active session       server token ──► lost flag
      staleness bound, fallback             idx_before + prefixes as on the obs's tick, delay
                                            encode JPEG ─► put obs ─► await chunk (timeout)
                                            accept only the outstanding seq of this epoch
                                            merge(ceil(rtt/dt), idx_before), tracker.add(rtt)

States (9.2): CONNECTING ─► STREAMING ─► DEGRADED (requests failing, queue holds actions) ─► STALLED
(queue empty or every action stale: fallback) ; timeout streak / server liveliness lost / drain /
UNKNOWN_SESSION ─► RECONNECTING (exponential backoff, fresh handshake, new session_epoch; the handshake's
control timeouts double after a round nobody answered in time, edge.client.ControlTimeouts) ;
offline > max_offline_s or a capability/schema/checkpoint mismatch on reconnect ─► DEAD.

Invariants:
- A chunk's row 0 belongs to its observation's tick: the prefix starts with the action executed on that
  tick and the merge counts it as consumed (the queue's snapshot taken in notify_observation).
- `get_action()` never does I/O, never raises for a network or server fault, holds locks for
  microseconds, and never returns an action whose source observation is older than
  `max_action_age_s` (the staleness bound holds whatever the network does).
- A chunk is merged only if it answers the latest outstanding request of the current session epoch
  and episode; a model other than the first one acknowledged is never executed (DEAD instead).
- A chunk is merged only if it is sound (`_chunk_problem`: this session's, `chunk_size` rows, the queue's
  invariant of finite rows of `len(action_names)`, the request's own `client_mono_ns` and episode echoed); a
  bad one is counted (`bad_chunks`), fails its request like a timeout and never answers the offline clock.
- Only monotonic clocks; no wall-clock instant crosses the wire.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from edge.engine import (Action, ConfigError, Engine, EngineState, EngineStopped, FallbackBehavior, config_from_dict,
                         register_engine)
from edge.latency import LATENCY_MODES, LatencyTracker
from edge.queue import TRIM_MODES, ActionQueue, check_chunk, fit_prefix
from wire.configerrors import range_text, show
from wire.errors import WireError
from wire.keys import sanitize, sanitize_root, task_slug
from wire.messages import Observation
from wire.qos import CONTROL_TIMEOUTS_S
from wire.transport import MAX_LEASE_MS, MIN_LEASE_MS, TlsError, TlsFiles, endpoint_problem

log = logging.getLogger(__name__)

S = EngineState


_PRIORITY_MAX = next(int(f.hi) for f in Observation.FIELDS if f.name == "priority")


def _positive(v: Any) -> bool:
    """A finite number > 0 (inf would make a period 0 or a wait endless; a bool is not a number here)."""
    return not isinstance(v, bool) and isinstance(v, (int, float)) and 0 < v < math.inf


@dataclass
class RemoteEngineConfig:
    """Every field of design 9.4 (plus what a multi-replica fleet needs), with its default."""

    connect_endpoints: list[str] = field(default_factory=lambda: ["tcp/127.0.0.1:7447"])  # zenoh router endpoints
    model_id: str = ""
    revision: str = "main"
    fps: float = 30.0
    action_names: list[str] = field(default_factory=list)  # ordered: chunk column i drives action i
    state_dim: int = 0
    cameras: list[str] = field(default_factory=list)  # camera names the robot sends
    task: str = ""
    client_uuid: str = ""  # "" -> a random uuid at start()
    client_type: str = ""
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    jpeg_quality: int = 90  # 0 = raw frames (LAN/debug)
    buffer_time_s: float | None = None  # send the next observation when queue playback <= this; None: derived
    # from the measured delay d (RTC: d <= s <= H - d, see `plan_execution`)
    max_action_age_s: float = 3.0  # staleness bound (safety)
    degraded_after_s: float = 1.0  # no chunk for this long -> DEGRADED
    request_timeout_s: float = 5.0
    timeout_streak: int = 3  # consecutive requests without a usable chunk (timeouts, bad chunks) -> RECONNECTING
    reconnect_initial_backoff_s: float = 0.5
    reconnect_max_backoff_s: float = 10.0
    max_offline_s: float = 60.0  # offline longer -> DEAD
    # the handshake's status and session timeouts double after a round no replica answered in time, up to this
    control_timeout_max_s: float = 16.0
    fallback: str = "hold"  # hold | repeat_last | zero
    rtc_enabled: bool = True  # replace merging with guidance; False = append mode
    execution_horizon: int = 10  # prefix rows shipped to the server
    trim: str = "consumed"  # consumed (what every shipped scenario runs) | real_delay (LeRobot; over-trims a first chunk)
    # the delay estimate: percentile (p95 of the last latency_window round trips) | window_max | all_time_max (LeRobot's,
    # where one slow round trip, a retransmission or the first request, sets d for the rest of the session)
    latency_mode: str = "percentile"
    latency_window: int = 100
    tags: dict[str, str] = field(default_factory=dict)
    root: str = "@fleet"
    lease_ms: int = 1000  # this client's lease: how fast the router notices it is gone
    expected_checkpoint_hash: str = ""  # non-empty: refuse any other checkpoint from the start
    replica_order: list[str] = field(default_factory=list)  # preferred replicas; default: lowest load
    urgency: float = 0.5
    priority: int = 0

    def __post_init__(self) -> None:
        """Every field checked here, so a bad value is a ConfigError naming it, never a handshake that fails until
        max_offline_s or a TypeError later. The rules are the wire's where it has them (key chunks, endpoints,
        leases, the observation's urgency and priority)."""

        def bad(name, why):
            raise ConfigError(f"RemoteEngineConfig.{name}: {why}")

        def strings(name, noun, example):
            v = getattr(self, name)
            if not isinstance(v, (list, tuple)):
                hint = f"[{v}]" if isinstance(v, str) else example
                bad(name, f"must be a list of {noun}, e.g. {hint}, got {show(v)}")
            for x in v:
                if not isinstance(x, str) or not x:
                    bad(name, f"must be a list of {noun} (non-empty strings), got {x!r} in {v!r}")
            twice = sorted({x for x in v if v.count(x) > 1})
            if twice:
                bad(name, f"{twice[0]!r} is listed {v.count(twice[0])} times in {v!r}; list each once")
            setattr(self, name, list(v))

        def key_chunk(name, v, fix):
            if not isinstance(v, str):
                bad(name, f"must be a string, got {show(v)}; {fix}")
            try:
                if name == "root":
                    sanitize_root(v)
                else:
                    sanitize(v, name)
            except WireError as exc:
                bad(name, f"{str(exc).split('] ', 1)[-1]}; {fix}")

        if isinstance(self.connect_endpoints, str):
            self.connect_endpoints = [self.connect_endpoints]
        if not isinstance(self.connect_endpoints, (list, tuple)) or not self.connect_endpoints:
            bad("connect_endpoints", f"must be a list of Zenoh router endpoints, e.g. [tcp/127.0.0.1:7447], got "
                                     f"{show(self.connect_endpoints)}")
        for e in self.connect_endpoints:
            if endpoint_problem(e):
                bad("connect_endpoints", endpoint_problem(e))
        self.connect_endpoints = list(self.connect_endpoints)
        if self.buffer_time_s is not None and not _positive(self.buffer_time_s):
            bad("buffer_time_s", f"must be a finite number > 0, or null to derive it from the measured delay; got "
                                 f"{self.buffer_time_s!r}")
        if self.buffer_time_s is not None:
            self.buffer_time_s = float(self.buffer_time_s)
        for name in ("fps", "max_action_age_s", "degraded_after_s", "request_timeout_s",
                     "reconnect_initial_backoff_s", "reconnect_max_backoff_s", "max_offline_s",
                     "control_timeout_max_s"):
            v = getattr(self, name)
            if not _positive(v):
                bad(name, f"must be a finite number > 0, got {v!r}")
            setattr(self, name, float(v))
        if self.reconnect_max_backoff_s < self.reconnect_initial_backoff_s:
            bad("reconnect_max_backoff_s", "must be >= reconnect_initial_backoff_s")
        base = max(CONTROL_TIMEOUTS_S["status"], CONTROL_TIMEOUTS_S["session"])
        if self.control_timeout_max_s < base:
            bad("control_timeout_max_s", f"must be >= the base status/session timeout {base:g} s "
                                         f"(wire.qos.CONTROL_TIMEOUTS_S); {base:g} keeps the timeouts fixed, got "
                                         f"{self.control_timeout_max_s:g}")
        try:
            self.fallback = FallbackBehavior(self.fallback).value
        except ValueError:
            bad("fallback", f"{self.fallback!r} is not one of {[f.value for f in FallbackBehavior]}")
        if self.trim not in TRIM_MODES:
            bad("trim", f"{self.trim!r} is not one of {TRIM_MODES}")
        if self.latency_mode not in LATENCY_MODES:
            bad("latency_mode", f"{self.latency_mode!r} is not one of {LATENCY_MODES}")
        if not isinstance(self.rtc_enabled, bool):
            bad("rtc_enabled", f"must be true or false, got {show(self.rtc_enabled)}")
        for name, lo, hi, meaning in (
                ("jpeg_quality", 0, 100, "0: raw frames, else the JPEG quality"),
                ("execution_horizon", 0, None, "the prefix rows shipped"), ("timeout_streak", 1, None, "timeouts"),
                ("latency_window", 1, None, "round trips"),
                ("lease_ms", MIN_LEASE_MS, MAX_LEASE_MS, "ms; keep it above the link's round trip"),
                ("priority", 0, _PRIORITY_MAX, "0 = most urgent; the range of an observation's priority")):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
                kind = "a positive integer" if (lo, hi) == (1, None) else f"an integer {range_text(lo, hi, None)}"
                bad(name, f"must be {kind} ({meaning}), got {show(v)}")
        if not self.model_id:
            bad("model_id", "is required: the model id the server serves (its manifest's model_id)")
        key_chunk("model_id", self.model_id, "give the model id the server serves (its manifest's model_id)")
        key_chunk("revision", self.revision, "give the revision the server serves (its manifest's revision; "
                                             "default main)")
        key_chunk("root", self.root, "give the servers' key root, e.g. @fleet (the default)")
        if self.client_uuid != "":
            key_chunk("client_uuid", self.client_uuid,
                      "give a name of letters, digits, . _ - (no * $ ? # / or spaces), or \"\" for a random id")
        for name in ("task", "client_type", "expected_checkpoint_hash"):
            if not isinstance(getattr(self, name), str):
                bad(name, f"must be a string, got {show(getattr(self, name))}; write \"\" to leave it unset")
        if self.task:
            try:
                task_slug(self.task)
            except WireError as exc:
                bad("task", f"{str(exc).split('] ', 1)[-1]}; write the instruction in words, or \"\" for the "
                            "server's default")
        if not self.action_names:
            bad("action_names", "is required: the robot's ordered action names (they must match the policy's)")
        strings("action_names", "the robot's action names in the policy's order", "[shoulder, elbow]")
        strings("cameras", "camera names", "[front]")
        strings("replica_order", "replica ids", "[r0, r1]")
        for r in self.replica_order:
            key_chunk("replica_order", r, "give the replica ids the servers run with (their manifests' replica_id)")
        if not isinstance(self.tags, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                      for k, v in self.tags.items()):
            bad("tags", f"must be a mapping of tag names to string values, e.g. {{site: lab}}, got {show(self.tags)}")
        self.tags = dict(self.tags)
        if isinstance(self.state_dim, bool) or not isinstance(self.state_dim, int) or self.state_dim < 1:
            bad("state_dim", f"must be the robot's state size (>= 1), got {self.state_dim!r}")
        if isinstance(self.urgency, bool) or not isinstance(self.urgency, (int, float)) or not 0 <= self.urgency <= 1:
            bad("urgency", f"must be a number from 0 to 1 (1 = most time-critical), got {show(self.urgency)}")
        self.urgency = float(self.urgency)
        for name in ("tls_cert", "tls_key", "tls_ca"):
            import os

            p = getattr(self, name)
            if p is not None and not isinstance(p, str):
                bad(name, f"must be a file path or null, got {show(p)}")
            if p is not None and not os.path.isfile(p):
                bad(name, f"file {p!r} does not exist; check the path")
        if (self.tls_cert or self.tls_key) and not self.tls_ca:
            bad("tls_ca", "a client certificate needs the CA file that signed the router's certificate")
        secure = [e for e in self.connect_endpoints if e.startswith(("tls/", "quic/"))]
        if secure and not self.tls_ca:
            bad("tls_ca", f"endpoint {secure[0]} needs TLS: give the CA file that signed the router's certificate "
                          "(and tls_cert, tls_key for mTLS)")
        if self.tls_ca:
            try:  # expired, not PEM, a key of another certificate, another CA: fail at construction, not later
                TlsFiles(self.tls_ca, self.tls_cert, self.tls_key).check()
            except TlsError as exc:
                bad("tls_cert" if self.tls_cert else "tls_ca", str(exc))

    from_dict = classmethod(config_from_dict)


# What each RemoteEngineConfig field means, for the generated docs (docs/scenarios.md's engine table)
# and the scenario JSON Schema; a test fails when a field has no line here.
FIELD_DOCS = {
    "connect_endpoints": "Zenoh router endpoints, protocol/address (e.g. tcp/10.0.0.1:7447, tls/[::1]:7447)",
    "model_id": "the model id the server serves (its manifest's model_id; a key chunk: no * $ ? # / or spaces)",
    "revision": "checkpoint revision in the keys (a key chunk)",
    "fps": "control rate in Hz (finite, > 0); one get_action per tick",
    "action_names": "the robot's ordered action names, each once: chunk column i drives action i",
    "state_dim": "the robot's state size",
    "cameras": "camera names the robot sends, each once",
    "task": "task string sent with each observation",
    "client_uuid": "this client's id in the keys (a key chunk); empty: a random uuid at start()",
    "client_type": "free text reported to the server",
    "tls_cert": "client certificate (mTLS)",
    "tls_key": "its private key",
    "tls_ca": "CA file that signed the router's certificate (enables TLS)",
    "jpeg_quality": "JPEG quality of camera frames, 1..100; 0 = raw frames (LAN, debug)",
    "buffer_time_s": "send the next observation when the queue holds this much playback or less; null: derived "
                     "from the measured delay d so that RTC's d <= s <= H - d holds (s: steps executed per chunk)",
    "max_action_age_s": "staleness bound: an action older than this is never executed (safety)",
    "degraded_after_s": "no chunk for this long: DEGRADED",
    "request_timeout_s": "a request without an answer for this long counts as a timeout",
    "timeout_streak": "consecutive requests without a usable chunk (timed out, or answered with a bad chunk) that "
                      "make the engine RECONNECTING",
    "reconnect_initial_backoff_s": "first wait between reconnect attempts (doubles, with jitter)",
    "reconnect_max_backoff_s": "longest wait between reconnect attempts",
    "max_offline_s": "offline longer than this: DEAD (the robot's own safety takes over)",
    "control_timeout_max_s": "cap of the handshake's status and session timeouts (base 2 s): they double after a "
                             "round in which no replica answered in time (a link slower than them), and come back "
                             "to the base with a session; at least 2 x the measured round trip + 0.5 s",
    "fallback": "what get_action returns when STALLED: hold (nothing), repeat_last, zero",
    "rtc_enabled": "real-time chunking: guide the next chunk with the executed prefix; false = append mode",
    "execution_horizon": "prefix rows shipped to the server with each observation (RTC)",
    "trim": "how a late chunk is trimmed: real_delay (LeRobot: by the measured delay) or consumed (by the "
            "actions executed since the request, which fixes the first chunk's over-trim)",
    "latency_mode": "the delay estimate RTC plans with: percentile (p95 of the window), window_max, all_time_max (LeRobot)",
    "latency_window": "requests in the latency window (window_max, percentile)",
    "tags": "tag: value labels (strings) sent at session open (server allowlists may use them)",
    "root": "the verbatim root key chunk: @ and a key chunk",
    "lease_ms": "this client's Zenoh lease, 100..600000 ms: how fast the router notices it is gone",
    "expected_checkpoint_hash": "non-empty: refuse any other checkpoint from the start",
    "replica_order": "preferred replica ids, in order, each once; default: the least loaded",
    "urgency": "0..1, sent with each request for deadline-aware scheduling",
    "priority": "priority tier for priority_tiered scheduling, 0..255 (0 = most urgent)",
}


@dataclass(frozen=True)
class _Meta:
    """Provenance of a merged chunk (shared by its rows)."""

    session_id: str
    seq_id: int
    episode_id: int
    t_obs: float  # monotonic s when the source observation was taken


@dataclass(frozen=True)
class ExecutionPlan:
    """When the engine asks again, in control steps: the next request goes out when the queue holds
    `buffer_steps` actions or fewer, so each chunk is executed for `execution_steps` (s) steps counted from
    its observation (s = H - buffer_steps in RTC mode). `violation` names the numbers when the plan breaks
    RTC's d <= s <= H - d (an explicit buffer_time_s, or a delay over half the chunk), else "". """

    delay_steps: int
    chunk_size: int
    buffer_steps: float
    execution_steps: int
    violation: str
    buffer_s: float  # buffer_steps in seconds: an explicit buffer_time_s exactly, so its timing is unchanged


def plan_execution(delay_steps: int, chunk_size: int, dt: float, buffer_time_s: float | None,
                   rtc_enabled: bool = True) -> ExecutionPlan:
    """The request point for a measured delay d (control steps) and a chunk of H rows.

    Derived (buffer_time_s None), RTC: s = H // 2 clamped into [d, H - d]; a chunk shorter than 2d has
    no such s, so s = d (the one request in flight cannot be outrun) and the plan names the violation.
    Derived, append (every chunk is executed whole, s = H): ask when d + 2 actions are left, so the next
    chunk lands with 2 to spare whatever its delay, and the queue holds the least old plan it can.
    An explicit buffer_time_s wins; in RTC mode a violation of d <= s <= H - d is named.
    """
    d, big_h = max(int(delay_steps), 0), max(int(chunk_size), 1)
    if buffer_time_s is None:
        if not rtc_enabled:
            b = min(d + 2, big_h)
            return ExecutionPlan(d, big_h, float(b), big_h, "", (b + 1e-6) * dt)
        if 2 * d <= big_h:
            s = min(max(big_h // 2, d), big_h - d)
            return ExecutionPlan(d, big_h, float(big_h - s), s, "", (big_h - s + 1e-6) * dt)
        return ExecutionPlan(d, big_h, float(big_h - d), d, _violation(d, d, big_h, "derived", dt),
                             (big_h - d + 1e-6) * dt)
    buffer_steps = buffer_time_s / dt
    if not rtc_enabled:
        return ExecutionPlan(d, big_h, buffer_steps, big_h, "", buffer_time_s)
    s = max(int(round(big_h - buffer_steps)), 0)
    ok = d <= s <= big_h - d
    why = "" if ok else _violation(d, s, big_h, f"buffer_time_s={buffer_time_s:g}", dt)
    return ExecutionPlan(d, big_h, buffer_steps, s, why, buffer_time_s)


def _violation(d: int, s: int, big_h: int, source: str, dt: float) -> str:
    if 2 * d > big_h:
        fix = f"no s fits: the delay is over half the chunk; lower the delay or serve a chunk of >= {2 * d} rows"
    else:
        fix = (f"set buffer_time_s between {d * dt:.3g} and {(big_h - d) * dt:.3g} s ({d} to {big_h - d} steps), "
               f"or leave it unset (null) to derive it from the delay")
    return (f"RTC needs d <= s <= H - d; {source} gives d={d}, s={s}, H={big_h} "
            f"({d} <= {s} <= {big_h - d} fails): {fix}")


NUDGE_SPREAD_S = 1.0  # a fleet nudged by one replica token comes back spread over at most this window


@register_engine("remote", RemoteEngineConfig)
class RemoteEngine(Engine):
    def __init__(self, config: RemoteEngineConfig, shutdown_event: threading.Event | None = None, connection=None,
                 latency_override: Callable[[int], float] | None = None):
        if not config.client_uuid:
            import uuid

            config.client_uuid = f"robot-{uuid.uuid4().hex[:12]}"
        self.cfg = config
        self.latency_override = latency_override  # request seq -> seconds used instead of the rtt (parity tests)
        self.dt = 1.0 / config.fps
        self.shutdown_event = shutdown_event
        self._conn_given = connection
        self.queue = ActionQueue(config.rtc_enabled, config.trim, action_dim=len(config.action_names))
        self.tracker = LatencyTracker(config.latency_window, config.latency_mode)
        from edge.client import ControlTimeouts

        self.control_timeouts = ControlTimeouts(config.control_timeout_max_s)  # the worker's; see _handshake
        self._execution_steps = 0  # s of the request last sent (its records report it)
        self._warned_plans: set[tuple[int, int, int]] = set()  # (d, s, H) already warned about
        self.A = len(config.action_names)
        # control-thread side
        self._slot_lock = threading.Lock()
        # (obs, t_mono, version, episode, due, queue snapshot on its tick: edge.queue.ActionQueue.snapshot)
        self._slot: tuple[dict, float, int, int, bool, tuple[int, int]] | None = None
        self._slot_version = 0
        self._due_buffer_s = 0.0  # the request point the worker plans with (an empty queue is always due)
        self._steps_remaining = 0  # the queue's length when the last request left (its records carry it)
        self._last_values: np.ndarray | None = None
        self._last_action: Action | None = None  # the last chunk action returned: repeat_last's provenance
        self._t_last_obs = 0.0
        self._stalled = False
        self._awaiting_first = True  # start() and reset(): None until the first chunk is expected
        self._episode = 0
        self._abandoned_seq: int | None = None  # the request an episode reset stopped waiting for (_request)
        # worker side
        self._state = S.STOPPED  # what callers see (see _publish)
        self._link = S.STOPPED  # the worker's view of the session
        self._state_lock = threading.Lock()
        self._state_since = time.monotonic()
        self._time_in: dict[str, float] = {}
        self._transitions: deque = deque(maxlen=10000)
        self._records: deque = deque(maxlen=20000)
        self._wake = threading.Event()
        self._want_obs = False  # the worker is waiting for a fresh observation (notify wakes it)
        self._stop = threading.Event()
        self._nudge = threading.Event()  # set by stop() and when a replica token of the model appears
        self._nudge_floor = 0.0  # the least a nudged back-off now waits: doubles with each nudged retry, 0 on a chunk
        self._paused = False
        self._reset_pending: int | None = None
        self._started_episode = -1  # the episode whose episode_start went out (worker-owned: no race with reset)
        self._thread: threading.Thread | None = None
        self._conn = None
        self._model = None
        self._first_ack = None
        self._ready = False
        self._dead_reason = ""
        self.counters = {k: 0 for k in ("requests", "chunks", "timeouts", "errors", "late_chunks", "superseded",
                                        "reconnects", "none_ticks", "fallback_ticks", "staleness_refusals",
                                        "discarded_chunks", "resets", "resets_acked", "replica_nudges",
                                        "plan_warnings", "bad_chunks")}
        self.last_error = ""

    # --- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        if self._stop.is_set() or self._link == S.DEAD:  # its session is closed: a new engine opens a new one
            raise EngineStopped("remote", self._link, self._dead_reason)
        if self._thread is not None:
            return
        self._last_ok = time.monotonic()  # the offline clock starts now (anything from the server restarts it)
        self._last_merged = self._last_ok  # the DEGRADED clock (a merged chunk restarts it)
        self._set_state(S.CONNECTING, "start")
        self._thread = threading.Thread(target=self._run, name=f"remote-engine {self.cfg.client_uuid}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._nudge.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(5.0, self.cfg.request_timeout_s + 2))
        self._close_conn()
        self.queue.clear()  # the closed session's chunks are never executed (get_action checks _stop as well)
        if self._link != S.DEAD:
            self._set_state(S.STOPPED, "stop")

    def reset(self) -> None:
        """Episode boundary: clear the queue, bump the episode; the worker sends the acked reset."""
        self.queue.clear()
        with self._slot_lock:  # an observation notified before the reset belongs to the finished episode
            self._episode += 1
            self._slot = None
        self._reset_pending = self._episode
        self._awaiting_first = True
        if self._stalled and self._link == S.STREAMING:  # on a failing link the new episode is stalled too
            self._stalled = False
            self._publish("episode reset")
        self._last_values = None
        self._last_action = None
        self.counters["resets"] += 1
        self._wake.set()
        m = self._model
        if m is not None:  # a worker waiting for the finished episode's chunk stops waiting (see _request)
            m.interrupt()

    def pause(self) -> None:
        self._paused = True
        if self._link != S.STOPPED:  # before start() the engine starts paused; after stop() it stays STOPPED
            self._set_state(S.PAUSED, "pause")

    def resume(self) -> None:
        self._paused = False
        if self._link == S.PAUSED:
            self._set_state(S.STREAMING if self._model is not None and self._model.ack is not None else S.CONNECTING,
                            "resume")
        self._wake.set()

    # --- control thread ----------------------------------------------------------------------------

    def notify_observation(self, obs: dict[str, Any]) -> None:
        now = time.monotonic()
        # Taken on a tick whose action brings the queue to the buffer (or under it): a request may carry it.
        # One taken earlier may not: a worker that woke on a timer between two ticks would send an observation
        # up to a period old, and its chunk would land a tick later than the local `rtc` engine's (which infers
        # on the tick). The tick's own get_action follows, so the request leaves on the tick that reaches the
        # buffer, not one after it (a tick less of margin: with degraded_after_s = buffer_time_s every chunk
        # came late enough to flicker DEGRADED).
        due = self._due(self.queue.qsize(), self._due_buffer_s)
        with self._slot_lock:
            self._slot_version += 1
            # the queue as it stands on this tick, before its get_action: the request's prefix and index
            self._slot = (obs, now, self._slot_version, self._episode, due, self.queue.snapshot())
        if due and self._want_obs:  # the worker waits for exactly this; otherwise it sleeps on
            self._wake.set()

    def get_action(self) -> Action | None:
        now = time.monotonic()
        max_age = self.cfg.max_action_age_s
        # DEAD or stopped: nothing more from the queue, not even a queued chunk of the closed session; the
        # fallback only, as on a stall (a velocity-controlled robot needs its zero whatever ended the stream)
        closed = self._link == S.DEAD or self._stop.is_set()
        while not closed:
            item = self.queue.get_with_meta()
            if item is None:
                break
            values, meta, index = item
            if meta is None or meta.episode_id != self._episode:
                continue  # a chunk of a finished episode: never executed
            age = now - meta.t_obs
            if age > max_age:
                # the rest of this chunk shares its source observation: all stale; a later chunk (append
                # mode) may still be fresh
                self.counters["staleness_refusals"] += 1 + self.queue.skip_source(meta)
                continue
            self._last_values = values
            self._awaiting_first = False
            if self._stalled:
                self._stalled = False
                self._publish("fresh action")
            self._last_action = Action(values, "chunk", meta.session_id, meta.seq_id, meta.episode_id, index, age)
            self._t_last_obs = meta.t_obs
            return self._last_action
        # nothing fresh: STALLED, apply the fallback
        # Waiting for an episode's first chunk on a healthy link is gating, not a stall; on a failing link it is.
        if not closed and not self._stalled and (not self._awaiting_first
                                                 or self._link in (S.DEGRADED, S.RECONNECTING)):
            self._stalled = True
            self._publish("queue empty or stale")
        fb = self.cfg.fallback
        last = self._last_action
        if fb == "repeat_last" and self._last_values is not None and last is not None:
            self.counters["fallback_ticks"] += 1  # provenance of the repeated action; its age keeps growing
            return Action(self._last_values.copy(), "repeat_last", last.session_id, last.seq_id, last.episode_id,
                          last.chunk_index, now - self._t_last_obs)
        if fb == "zero":
            self.counters["fallback_ticks"] += 1
            return Action(np.zeros(self.A, np.float32), "zero", self._session_id(), episode_id=self._episode)
        self.counters["none_ticks"] += 1
        return None

    # --- status ----------------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready and self._link not in (S.DEAD, S.STOPPED)

    @property
    def failed(self) -> bool:
        """DEAD, and said so: the visible state (set after dead_reason; the shutdown event follows at once)."""
        return self._state == S.DEAD

    @property
    def state(self) -> EngineState:
        return self._state

    @property
    def stats(self) -> dict[str, Any]:
        now = time.monotonic()
        time_in = dict(self._time_in)
        time_in[self._state.value] = time_in.get(self._state.value, 0.0) + now - self._state_since
        m = self._model  # read once: stop() may clear it meanwhile
        replica = m.replica if m is not None else None
        return {**self.counters, "state": self._state.value, "time_in_state_s": time_in, "qsize": self.queue.qsize(),
                "latency_max_s": self.tracker.max(), "session_id": self._session_id(),
                "replica_id": replica.replica_id if replica is not None else "",
                "session_epoch": m.epoch if m is not None else 0, "dead_reason": self._dead_reason,
                "last_error": self.last_error}

    def _session_id(self) -> str:
        m = self._model
        ack = m.ack if m is not None else None
        return ack.session_id if ack is not None else ""

    def drain_records(self) -> list[dict]:
        out = []
        while self._records:
            out.append(self._records.popleft())
        return out

    def drain_transitions(self) -> list[tuple]:
        out = []
        while self._transitions:
            out.append(self._transitions.popleft())
        return out

    def _set_state(self, new: EngineState, reason: str) -> None:
        """Set the link state (worker, or lifecycle calls); DEAD is final."""
        if self._link == S.DEAD:
            return
        self._link = new
        if new == S.DEAD:
            self._dead_reason = reason
            log.error("%s: DEAD: %s", self.cfg.client_uuid, reason)
        self._publish(reason)
        if new == S.DEAD and self.shutdown_event is not None:
            self.shutdown_event.set()  # last: whoever waits on it reads failed, the state and the reason

    def _publish(self, reason: str) -> None:
        """The state a control loop sees: the link state, or STALLED while it gets nothing fresh."""
        link = self._link
        new = S.STALLED if self._stalled and link in (S.STREAMING, S.DEGRADED, S.RECONNECTING) else link
        with self._state_lock:
            old = self._state
            if new == old:
                return
            now = time.monotonic()
            self._time_in[old.value] = self._time_in.get(old.value, 0.0) + now - self._state_since
            self._state, self._state_since = new, now
            self._transitions.append((now, old.value, new.value, reason))

    # --- worker ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = self.cfg.reconnect_initial_backoff_s
        exclude: set[str] = set()
        opened_at_chunks = -1  # counters["chunks"] when the current session opened
        while not self._stop.is_set() and self._link != S.DEAD:
            offline = time.monotonic() - self._last_ok
            if self._model is None or self._model.ack is None or self._link in (S.CONNECTING, S.RECONNECTING):
                if offline > self.cfg.max_offline_s:
                    self._set_state(S.DEAD, f"offline for more than max_offline_s={self.cfg.max_offline_s:g} s "
                                    f"({self.last_error or 'no server'})")
                    break
                self._nudge.clear()  # a replica token appearing from now on cuts the backoff below
                if self._handshake(exclude):
                    # the backoff starts over once this session merges a chunk, not on its ack: a replica that
                    # acknowledges and then drains, forgets or fails every session would otherwise be asked again
                    # at once, again and again (a drain notice on every open: 51 reconnects in 4 s)
                    opened_at_chunks = self.counters["chunks"]
                    exclude = set()
                    continue
                if self._link == S.DEAD:
                    break
                exclude = set()  # after a failed round every replica is a candidate again
                if self._back_off(backoff):
                    break
                backoff = min(backoff * 2, self.cfg.reconnect_max_backoff_s)
                continue
            outcome = self._cycle()
            if self.counters["chunks"] != opened_at_chunks:
                backoff = self.cfg.reconnect_initial_backoff_s
                self._nudge_floor = 0.0
            if outcome in ("lost", "drain", "unknown_session", "streak"):
                if outcome == "drain" and self._model.replica is not None:
                    exclude = {self._model.replica.replica_id}
                self._reconnect(outcome)
                if self.counters["chunks"] == opened_at_chunks:  # the session gave nothing: back off before the next
                    if self._back_off(backoff):
                        break
                    backoff = min(backoff * 2, self.cfg.reconnect_max_backoff_s)
            elif outcome in ("timeout", "error") and time.monotonic() - self._last_ok > self.cfg.max_offline_s:
                self._set_state(S.DEAD, f"no chunk for more than max_offline_s={self.cfg.max_offline_s:g} s "
                                f"({self.last_error or 'timeouts'})")
        self._close_conn()

    def _back_off(self, backoff: float) -> bool:
        """Wait out a reconnect backoff (jittered), cut short by a replica token appearing; True when stopped.
        A nudged retry that gets no chunk doubles the least the next nudged back-off waits (from
        reconnect_initial_backoff_s, never past the back-off itself; a merged chunk sets it to 0): a replica
        whose token flaps, or that acknowledges and fails every session, no longer cuts every back-off short."""
        # jittered: a fleet that lost its replica at the same instant must not come back in lockstep
        wait = backoff * random.uniform(0.5, 1.0)
        started = time.monotonic()
        if self._nudge.wait(wait):
            if self._stop.is_set():
                return True
            # a replica's token appeared (server up, or our link to the router healed): try again
            # soon, spread over a short window so a whole fleet does not open sessions in one burst
            self.counters["replica_nudges"] += 1
            soonest = max(min(wait, self._nudge_floor) - (time.monotonic() - started), 0.0)
            self._nudge_floor = max(2 * self._nudge_floor, self.cfg.reconnect_initial_backoff_s)
            return self._stop.wait(soonest + random.uniform(0.0, min(self.cfg.reconnect_initial_backoff_s,
                                                                      NUDGE_SPREAD_S)))
        return False

    def _connect(self) -> None:
        if self._conn is not None:
            return
        from edge.client import Connection

        if self._conn_given is not None:
            self._conn = self._conn_given
            return
        tls = None
        if self.cfg.tls_ca:
            from wire.transport import TlsFiles

            tls = TlsFiles(self.cfg.tls_ca, self.cfg.tls_cert, self.cfg.tls_key)
        self._conn = Connection(self.cfg.connect_endpoints, self.cfg.client_uuid, self.cfg.client_type,
                                root=self.cfg.root, lease_ms=self.cfg.lease_ms, tls=tls)

    def _handshake(self, exclude: set[str]) -> bool:
        from edge.client import NoReplica, SessionRefused

        try:
            self._connect()
            if self._model is None:
                c = self.cfg
                self._model = self._conn.model(
                    c.model_id, c.revision, priority=c.priority, open=False, task=c.task, fps=c.fps,
                    action_names=list(c.action_names), state_dim=c.state_dim, cameras=self._camera_shapes(),
                    rtc_enabled=c.rtc_enabled, execution_horizon=c.execution_horizon,
                    expected_checkpoint_hash=c.expected_checkpoint_hash, replica_order=list(c.replica_order),
                    tags=dict(c.tags), jpeg_quality=c.jpeg_quality)
                self._model.wake = self._wake
                self._model.nudge = self._nudge
            if self._first_ack is not None:  # a reconnect: this exact checkpoint or nothing
                self._model.open_args["expected_checkpoint_hash"] = self._first_ack.checkpoint_hash
            ct = self.control_timeouts
            ct.seed(self.tracker.p95())
            ack = self._model.open(exclude, status_timeout_s=ct.timeout_s("status"),
                                   session_timeout_s=ct.timeout_s("session"),
                                   deadline=self._last_ok + self.cfg.max_offline_s)
        except SessionRefused as exc:
            self.last_error = str(exc)
            self._set_state(S.DEAD, f"session refused: {exc}")
            return False
        except NoReplica as exc:
            self.last_error = str(exc)
            # a link slower than the timeouts fails every round alike unless they grow; a refusal in words
            # (CAPACITY...) came in time: nothing grows, and what a slow link needed is kept for the next round
            if exc.unanswered:
                self.control_timeouts.grow()
            log.info("%s: no session yet: %s", self.cfg.client_uuid, exc)
            return False
        except (ConnectionError, TimeoutError) as exc:
            self.last_error = str(exc)
            log.info("%s: no session yet: %s", self.cfg.client_uuid, exc)
            return False
        except Exception as exc:  # a zenoh error while the router restarts, and the like
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("%s: handshake failed: %s", self.cfg.client_uuid, self.last_error)
            return False
        self.control_timeouts.settle()
        if self._first_ack is None:
            self._first_ack = ack
        else:
            mismatch = _capability_mismatch(self._first_ack, ack)
            if mismatch:
                self._model.close()
                self._set_state(S.DEAD, f"the server came back with another model: {mismatch}")
                return False
        if self.queue.rtc_enabled and not ack.rtc_enabled:
            # the server downgraded the session (its policy cannot guide): replace mode would throw away
            # the leftover at every merge with nothing blending the seam, so append as LeRobot does
            log.warning("%s: %s serves this session without RTC; merging in append mode", self.cfg.client_uuid,
                        ack.replica_id)
            self.queue.set_rtc_enabled(False)
        if ack.warmed_up:
            self._ready = True
        self._outstanding = None
        self._pending_outcome = None  # an event about the previous session (e.g. its drain) is not about this one
        self._started_episode = -1  # a new session starts its first episode with episode_start
        self._set_state(S.PAUSED if self._paused else S.STREAMING, f"session {ack.session_id} on {ack.replica_id}")
        return True

    def step_once(self, timeout_s: float | None = None) -> str:
        """One request on the caller's thread (golden parity, tests): handshake if needed, send the latest
        observation, wait for its chunk. Never call it on an engine whose worker runs (start()); after stop() or
        DEAD it sends nothing ("stopped")."""
        if self._thread is not None:
            raise RuntimeError("step_once is for an engine driven by the caller; this one runs its worker")
        if self._stop.is_set() or self._link == S.DEAD:
            return "stopped"  # its session is closed: no new one (a driver's get_action must not raise)
        if self._link == S.STOPPED:
            self._last_ok = self._last_merged = time.monotonic()
            self._set_state(S.CONNECTING, "step_once")
        if (self._model is None or self._model.ack is None) and not self._handshake(set()):
            return "no_session"
        with self._slot_lock:
            slot = self._slot
        if slot is None:
            return "no_observation"
        if timeout_s is not None:
            self.cfg.request_timeout_s = float(timeout_s)
        return self._request(self._model, slot[0], slot[1], slot[3], slot[5])

    def _camera_shapes(self) -> dict[str, list[int]]:
        """Camera shapes for the session open, from the latest observation (or placeholders)."""
        with self._slot_lock:
            obs = self._slot[0] if self._slot else {}
        imgs = obs.get("images") or {}
        out = {}
        for name in self.cfg.cameras:
            frame = imgs.get(name)
            shape = list(np.asarray(frame).shape) if frame is not None and not hasattr(frame, "to_wire") else [1, 1, 3]
            out[name] = shape
        return out

    def _reconnect(self, why: str) -> None:
        self.counters["reconnects"] += 1
        self._set_state(S.RECONNECTING, why)

    def _close_conn(self) -> None:
        try:
            if self._model is not None:
                self._model.close()
            if self._conn is not None and self._conn_given is None:
                self._conn.close()
        except Exception:
            pass
        self._conn = None if self._conn_given is None else self._conn
        self._model = None if self._conn_given is None else self._model

    def _cycle(self) -> str:
        """Wait until a request is due, send it, await its chunk. Returns an outcome word."""
        m = self._model
        if m.server_lost.is_set():
            return "lost"
        if self._reset_pending is not None:
            ep = self._reset_pending
            self._reset_pending = None
            try:  # acknowledged, but not awaited: the next observation's episode_start resets the session too
                # seeded from the measured round trip: a slow link's ack still counts in resets_acked
                self.control_timeouts.seed(self.tracker.p95())
                m.reset_nowait(ep, self._on_reset_reply, timeout_s=self.control_timeouts.timeout_s("reset"))
            except Exception as exc:
                log.info("%s: reset to episode %d not sent: %s", self.cfg.client_uuid, ep, exc)
        # wait for: a fresh observation, queue playback under the buffer, not paused
        while not self._stop.is_set():
            self._wake.clear()
            self._drain_inbox()  # late chunks, events
            if m.server_lost.is_set():
                return "lost"
            if getattr(self, "_pending_outcome", None):
                out, self._pending_outcome = self._pending_outcome, None
                return out
            with self._slot_lock:
                slot = self._slot
            # a request carries an observation not sent yet and taken while the queue was at or under the
            # buffer (notify_observation), so it leaves on the tick that made it due, not up to a period later
            fresh = slot is not None and slot[2] != getattr(self, "_sent_version", -1) and slot[4]
            qsize = self.queue.qsize()
            plan = self.execution_plan()
            self._due_buffer_s = plan.buffer_s  # notify_observation marks observations taken at or under it
            buffered = qsize * self.dt - plan.buffer_s  # > 0: seconds until a request is due
            # due now, counting the action the observation's tick takes (it may not have run yet); a chunk
            # merged since the observation refilled the queue, and that observation is no longer due
            if not self._paused and self._reset_pending is None and fresh and self._due(qsize, plan.buffer_s):
                break
            if self._reset_pending is not None:
                return "ok"
            self._check_degraded()
            # The tick that brings the queue to the buffer wakes us with its observation (notify_observation):
            # one wake-up a request, not a poll; every needless wake-up costs the control loop of a shard
            # hosting hundreds of engines its GIL. The timeout is the DEGRADED check's, or a backstop.
            self._want_obs = not self._paused
            if self._paused:
                timeout = 1.0
            elif buffered > 0:
                timeout = buffered + self.dt + 1e-3
                if self._link == S.STREAMING:
                    timeout = min(timeout, max(self._last_merged + self.cfg.degraded_after_s - time.monotonic(), 0.0) + 1e-3)
                timeout = min(timeout, 1.0)
            else:
                timeout = 0.25  # waiting for an observation: notify_observation wakes us first
            self._wake.wait(timeout)
            self._want_obs = False
        if self._stop.is_set():
            return "stopped"
        obs, t_obs, version, episode, _due, at_obs = slot
        self._sent_version = version
        self._execution_steps = plan.execution_steps
        return self._request(m, obs, t_obs, episode, at_obs)

    def _due(self, qsize: int, buffer_s: float) -> bool:
        """A request is due when the queue, less the action of the tick now running, is at or under the buffer."""
        return (qsize - 1) * self.dt <= buffer_s + 1e-9

    def delay_steps(self) -> int:
        """The delay estimate d in control steps (what each request ships as inference_delay_steps)."""
        return int(math.ceil(self.tracker.max() / self.dt - 1e-9))

    def execution_plan(self) -> ExecutionPlan:
        """The request point for the delay measured now (see `plan_execution`); a plan that breaks RTC's
        d <= s <= H - d is logged once per (d, s, H)."""
        ack = self._first_ack
        chunk = int(getattr(ack, "chunk_size", 0) or 0) or int(round(1.0 / self.dt))  # before a session: 1 s
        plan = plan_execution(self.delay_steps(), chunk, self.dt, self.cfg.buffer_time_s, self.queue.rtc_enabled)
        key = (plan.delay_steps, plan.execution_steps, plan.chunk_size)
        if plan.violation and key not in self._warned_plans:
            self._warned_plans.add(key)
            self.counters["plan_warnings"] += 1
            log.warning("%s: %s", self.cfg.client_uuid, plan.violation)
        return plan

    def _on_reset_reply(self, acked: bool) -> None:  # on Zenoh's thread
        if acked:
            self.counters["resets_acked"] += 1
            self._last_ok = time.monotonic()  # the server holds this session: not offline (see _handle)

    def _check_degraded(self) -> None:
        if self._link == S.STREAMING and time.monotonic() - self._last_merged > self.cfg.degraded_after_s \
                and self.queue.qsize() > 0:
            self._set_state(S.DEGRADED, f"no chunk for {self.cfg.degraded_after_s:g} s")

    def _request(self, m, obs: dict, t_obs: float, episode: int, at_obs: tuple[int, int] | None = None) -> str:
        c = self.cfg
        H = c.execution_horizon
        # the leftover and index on the observation's tick (its own action included): the chunk's row 0 is
        # that tick's, as the policy plans it; the queue now, if a merge came in between
        left_model, left_robot, idx_before = self.queue.left_over_since(at_obs)
        prefix_model = prefix_robot = None
        if self.queue.rtc_enabled and H > 0:
            prefix_model = fit_prefix(left_model, H)
            prefix_robot = fit_prefix(left_robot, H)
        delay = self.delay_steps()
        remaining = self._steps_remaining = self.queue.qsize()  # actions left as it leaves (wire: steps_remaining)
        t0 = time.monotonic()
        images = {n: (obs.get("images") or {})[n] for n in c.cameras if n in (obs.get("images") or {})}
        episode_start = episode != self._started_episode
        try:
            seq = m.observe(c.urgency, state=np.asarray(obs["state"], np.float32), images=images, episode_id=episode,
                            inference_delay_steps=delay, prefix_model=prefix_model, prefix_robot=prefix_robot,
                            episode_start=episode_start, steps_remaining=remaining,
                            **({"task": obs["task"]} if obs.get("task") else {}))
        except Exception as exc:
            self.last_error = f"observe failed: {type(exc).__name__}: {exc}"
            self.counters["errors"] += 1
            return "error"
        self._started_episode = episode
        encode_ms = (time.monotonic() - t0) * 1e3
        self.counters["requests"] += 1
        # from the observation's tick to this worker taking it up: its wake-up (on a bench shard, every engine's
        # worker shares a process and its GIL with the control loop, so this is where a busy shard shows)
        send_lag_ms = (t0 - t_obs) * 1e3
        self._outstanding = (seq, m.epoch, episode, t_obs, idx_before, delay, encode_ms, send_lag_ms, m.last_sent_ns)
        deadline = t0 + c.request_timeout_s
        while not self._stop.is_set():
            if self._episode != episode:
                # The episode ended while this request was in flight: its chunk would be discarded on arrival,
                # so waiting for it only delays the new episode's first request by the rest of a round trip.
                # Abandoned, not timed out: its chunk, if it comes, is counted as discarded.
                self._abandoned_seq = seq
                self._outstanding = None
                self._record_timeout(seq, delay, encode_ms, "abandoned", sent_ns=int(t0 * 1e9), send_lag_ms=send_lag_ms)
                return "ok"
            left = deadline - time.monotonic()
            if left <= 0:
                break
            r = m.get_result(min(left, 0.25) * 1e3)
            if m.server_lost.is_set():
                self._record_timeout(seq, delay, encode_ms, "lost", send_lag_ms=send_lag_ms)
                return "lost"
            if r is None:
                continue
            outcome = self._handle(r)
            if outcome == "merged":
                self._timeouts_in_row = 0
                return "ok"
            if outcome in ("drain", "unknown_session"):
                return outcome
            if outcome in ("error", "error_final"):
                return "error"
            if outcome == "bad_chunk":
                # no usable chunk, as a timeout: a streak of them reconnects (perhaps to a sound replica)
                self._timeouts_in_row = getattr(self, "_timeouts_in_row", 0) + 1
                if self._timeouts_in_row >= c.timeout_streak:
                    self._timeouts_in_row = 0
                    return "streak"
                return "error"
        if self._stop.is_set():
            return "stopped"
        # timed out: the request stays outstanding (a late answer may still be merged)
        self.counters["timeouts"] += 1
        self._timeouts_in_row = getattr(self, "_timeouts_in_row", 0) + 1
        self._record_timeout(seq, delay, encode_ms, "timeout", send_lag_ms=send_lag_ms)
        if self._link == S.STREAMING:
            self._set_state(S.DEGRADED, "request timed out")
        if self._timeouts_in_row >= c.timeout_streak:
            self._timeouts_in_row = 0
            return "streak"
        return "timeout"

    def _record_timeout(self, seq, delay, encode_ms, outcome, sent_ns: int | None = None,
                        send_lag_ms: float = float("nan")) -> None:
        """The record of a request that got no chunk: timeout, lost, abandoned."""
        rec = {"t": time.monotonic(), "seq": seq, "rtt_ms": float("nan"), "queue_wait_ms": float("nan"),
               "inference_ms": float("nan"), "network_ms": float("nan"), "encode_ms": encode_ms,
               "send_lag_ms": send_lag_ms, "merge_lag_ms": float("nan"),
               "delay_steps": delay, "execution_steps": self._execution_steps,
               "steps_remaining": self._steps_remaining, "superseded": 0, "outcome": outcome}
        if sent_ns is not None:
            rec["sent_ns"] = sent_ns
        self._records.append(rec)

    def _chunk_problem(self, r, m) -> str:
        """Why a chunk cannot be executed whatever it answers ("" if it can): another session's, another size than
        the session's chunk_size, or the queue's refusal (not floating point, not (chunk_size, len(action_names)) in
        both spaces, a NaN or an infinity). Checked here, on the worker, as the chunk arrives: never per tick."""
        ack = m.ack if m is not None else None
        if ack is None or r.session_epoch != m.epoch:
            return ""  # another session's: never merged (late), nothing to judge it by
        if r.session_id != ack.session_id:
            return f"it names session {r.session_id!r}; this session is {ack.session_id!r}"
        for name in ("chunk_model", "chunk_robot"):
            rows = np.shape(getattr(r, name))[:1]
            if rows != (ack.chunk_size,):
                return f"{name} has shape {np.shape(getattr(r, name))}; the session's chunks have {ack.chunk_size} rows"
        try:
            check_chunk(r.chunk_model, r.chunk_robot, self.A)
        except ValueError as exc:
            return str(exc)
        return ""

    def _refuse_chunk(self, out, problem: str) -> str:
        """The outstanding request's chunk is unusable: the request failed (a bad chunk, counted and recorded as one;
        DEGRADED, as for a timeout) and the next one may leave at once."""
        self.counters["errors"] += 1
        self.counters["bad_chunks"] += 1
        self.last_error = f"bad chunk: {problem}"
        log.warning("%s: chunk of seq %d refused: %s", self.cfg.client_uuid, out[0], problem)
        self._record_failed(out, "bad_chunk")
        self._outstanding = None
        if self._link == S.STREAMING:
            self._set_state(S.DEGRADED, f"bad chunk: {problem}")
        return "bad_chunk"

    def _record_failed(self, out, outcome: str) -> None:
        """The record of a request answered with an error or a bad chunk."""
        self._records.append({"t": time.monotonic(), "seq": out[0], "rtt_ms": float("nan"),
                              "queue_wait_ms": float("nan"), "inference_ms": float("nan"),
                              "network_ms": float("nan"), "encode_ms": out[6], "send_lag_ms": out[7],
                              "merge_lag_ms": float("nan"), "delay_steps": out[5],
                              "execution_steps": self._execution_steps,
                              "steps_remaining": self._steps_remaining, "superseded": 0, "outcome": outcome})

    def _drain_inbox(self) -> None:
        m = self._model
        while True:
            r = m.poll()
            if r is None:
                return
            outcome = self._handle(r)
            if outcome in ("drain", "unknown_session"):
                self._pending_outcome = outcome

    def _handle(self, r) -> str:
        """Merge a chunk (if it answers the outstanding request and is sound) or act on an event."""
        from edge.client import Event

        m = self._model
        out = getattr(self, "_outstanding", None)
        if isinstance(r, Event):
            if r.kind == "drain":
                return "drain"  # the client matched its replica id (a server's drain header carries epoch 0)
            if r.kind == "bad_chunk":  # undecodable, or header and body disagree: nothing in it can be trusted
                self.counters["bad_chunks"] += 1
                self.last_error = f"bad chunk: {r.code}: {r.message}"
                return "ignored"
            if m is None or r.session_epoch != m.epoch:
                # about an older session (seq ids restart at 1 in each): a late ACTION_MISMATCH of a session already
                # replaced killed the robot (DEAD), a late error failed the new session's request of the same seq
                return "ignored"
            if r.code == "UNKNOWN_SESSION":
                return "unknown_session"
            if r.code in ("WRONG_MODEL", "IDENTITY_MISMATCH", "ACTION_MISMATCH"):
                self._set_state(S.DEAD, f"server error {r.code}: {r.message}")
                return "error_final"
            if out is not None and r.seq_id == out[0]:
                self.counters["errors"] += 1
                self.last_error = f"{r.code}: {r.message}"
                self._record_failed(out, f"error:{r.code}")
                self._outstanding = None
                if self._link == S.STREAMING:  # the request failed: the state says so, as for a timeout
                    self._set_state(S.DEGRADED, f"server error {r.code}")
                return "error"
            return "ignored"
        # a chunk
        problem = self._chunk_problem(r, m)
        if problem:
            if out is not None and r.seq_id == out[0] and r.session_epoch == out[1]:
                return self._refuse_chunk(out, problem)
            self.counters["bad_chunks"] += 1  # answers nothing outstanding: counted, never merged
            self.last_error = f"bad chunk: {problem}"
            return "ignored"
        # A sound chunk of this session, like an acknowledged reset, answers the offline clock (DEAD after
        # max_offline_s offline): the server and the link work, even when the chunk comes too late to merge. A
        # robot whose episodes end before their chunks arrive runs its fallback (STALLED); it is not offline (at
        # 1 Hz, where the reacher's episode is two ticks, robots went DEAD that way with their server answering).
        # A bad chunk does not: a server that sends only those is offline, and the ladder runs to DEAD.
        if m is not None and r.session_epoch == m.epoch:
            self._last_ok = time.monotonic()
        if out is None or r.seq_id != out[0] or r.session_epoch != out[1]:
            if r.seq_id == self._abandoned_seq:
                self.counters["discarded_chunks"] += 1  # the finished episode's, no longer awaited
                return "ignored"
            self.counters["late_chunks"] += 1
            return "ignored"
        seq, epoch, episode, t_obs, idx_before, delay, encode_ms, send_lag_ms, sent_ns = out
        if r.sent_ns != sent_ns:
            # its rtt would be made up: one chunk echoing 0 set the delay estimate to the host's uptime, and every
            # later request shipped an inference_delay_steps the wire refuses (no chunk again in that session)
            return self._refuse_chunk(out, f"it echoes client_mono_ns {r.sent_ns}; seq {seq} was sent at {sent_ns}")
        if episode == self._episode and r.episode_id != episode:
            # the episode has not changed here: the server echoed another one (a reset in between is the case below)
            return self._refuse_chunk(out, f"it echoes episode {r.episode_id}; seq {seq} was sent in episode {episode}")
        self._outstanding = None
        if episode != self._episode:
            self.counters["discarded_chunks"] += 1  # a reset happened while it was in flight
            return "merged"
        latency = r.rtt_s if self.latency_override is None else float(self.latency_override(self.counters["chunks"] + 1))
        real_delay = int(math.ceil(latency / self.dt - 1e-9))
        try:  # sound by _chunk_problem; the queue keeps its own invariant whoever merges (edge.queue)
            self.queue.merge(r.chunk_model, r.chunk_robot, real_delay, idx_before,
                             meta=_Meta(m.ack.session_id if m.ack else "", seq, episode, t_obs))
        except ValueError as exc:
            return self._refuse_chunk(out, str(exc))
        self.tracker.add(latency)
        self._last_ok = self._last_merged = time.monotonic()
        rtt_ms = r.rtt_s * 1e3
        self._records.append({"t": r.t_recv, "seq": seq, "rtt_ms": rtt_ms, "queue_wait_ms": r.queue_wait_ms,
                              "inference_ms": r.inference_ms, "network_ms": rtt_ms - r.queue_wait_ms - r.inference_ms,
                              "encode_ms": encode_ms, "send_lag_ms": send_lag_ms,
                              # from the chunk's arrival (Zenoh's callback) to its merge here, on this worker
                              "merge_lag_ms": (self._last_merged - r.t_recv) * 1e3, "delay_steps": delay,
                              # from the first router routing the chunk to its arrival here (its Zenoh timestamp)
                              "downlink_from_router_ms": (r.t_recv * 1e9 - r.routed_ns) / 1e6 if r.routed_ns
                              else math.nan,
                              "execution_steps": self._execution_steps, "steps_remaining": self._steps_remaining,
                              "superseded": r.superseded_seqs,
                              "outcome": "ok", "real_delay": real_delay, "sent_ns": r.sent_ns})
        self.counters["superseded"] += r.superseded_seqs
        self.counters["chunks"] += 1  # after its record: a chunk counted is a chunk drain_records() can return
        if self._link in (S.DEGRADED, S.CONNECTING, S.RECONNECTING):
            self._set_state(S.STREAMING, "chunk merged")
        return "merged"


def _capability_mismatch(first, ack) -> str:
    for name in ("checkpoint_hash", "policy_type", "action_names", "state_dim", "chunk_size", "model_id",
                 "rtc_enabled"):
        a, b = getattr(first, name), getattr(ack, name)
        if a != b:
            return f"{name} {a!r} -> {b!r}"
    return ""
