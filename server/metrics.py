"""The metrics of one policy-server process: Prometheus families on `prometheus-client`, and fixed-size sketches.

    observe / inc / set ──► child of a prometheus-client family ──► /metrics (text 0.0.4 or OpenMetrics,
       (hot path, any thread)   (labels: model, reason, code, error)     plus process_* and python_* families)
    Sketch.add ──────────────► fixed log-spaced bins ──► percentiles for the status query (/sessions)

Owns the list of families (`KNOWN_METRICS`: type, help, label names) and their exposition. Per-robot
detail never becomes a label: it goes to the audit log (one line per request) and to the status query
(each session's counters and sketches, `server.service.PolicyServer.session_report`).

Invariants:
- Memory is bounded by the families x their label values (models, reasons, codes: a few dozen series
  in all), never by the robots served: a label outside a family's declared names, `client` included,
  raises ValueError on first use.
- A name has one type for the life of the process; the wrong method raises TypeError naming the right one.
- A `Sketch` is a fixed array (`Sketch.BINS` uint32 counters, < 1 KB): its memory does not grow with the
  values it has seen; a percentile is within `Sketch.RELATIVE_ERROR` of an observed value.
"""

from __future__ import annotations

import math
import threading
import time
from array import array
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.exposition import choose_encoder

NAMESPACE = "policy_server"
PREFIX = NAMESPACE + "_"
COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
METHOD_FOR_KIND = {COUNTER: "inc", GAUGE: "set", HISTOGRAM: "observe"}

# Design 11: inference 15-150 ms, end-to-end up to ~250 ms; queue waits reach seconds under overload.
LATENCY_MS_BUCKETS = (
    1.0,
    2.5,
    5.0,
    10.0,
    15.0,
    25.0,
    50.0,
    75.0,
    100.0,
    150.0,
    250.0,
    500.0,
    1000.0,
    2500.0,
    5000.0,
    10000.0,
)
# Three JPEG cameras plus state land at tens to hundreds of KiB per observation.
PAYLOAD_BYTES_BUCKETS = tuple(float(1024 * 4**k) for k in range(9))  # 1 KiB .. 64 MiB
BATCH_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)

# Labels a family may carry: each takes a handful of values per process (models served, error codes,
# refusal reasons). `client` is not among them: 1,000 robots would make 1,000 series per family.
BOUNDED_LABELS = frozenset({"model", "replica", "outcome", "reason", "code", "error"})


@dataclass(frozen=True)
class MetricSpec:
    kind: str  # COUNTER | GAUGE | HISTOGRAM
    help: str
    labels: tuple[str, ...] = ("model",)
    buckets: tuple[float, ...] = ()  # histogram upper bounds, ascending; +Inf is implicit


def _hist(help: str, buckets: tuple[float, ...] = LATENCY_MS_BUCKETS) -> MetricSpec:
    return MetricSpec(HISTOGRAM, help, ("model",), buckets)


# The name in code is the name on the wire, in the audit log and in bench figures (`queue_wait_ms`,
# `inference_ms`); Prometheus shows it as `policy_server_<name>`, counters suffixed `_total`.
KNOWN_METRICS: dict[str, MetricSpec] = {
    "inference_ms": _hist("Time spent in model inference (pre + forward + post) per request, ms."),
    "queue_wait_ms": _hist("Time a request sat in the queue before inference started, ms."),
    "e2e_latency_ms": _hist("Total server-side time per request (queue wait + inference + publish), ms."),
    "payload_size_bytes": _hist("Size of the binary observation payload, bytes.", PAYLOAD_BYTES_BUCKETS),
    "batch_size": _hist("Requests per inference dispatch.", BATCH_BUCKETS),
    "queue_depth": MetricSpec(GAUGE, "Sessions with a pending observation, sampled at dispatch time."),
    "active_clients": MetricSpec(GAUGE, "Clients currently connected."),
    "active_sessions": MetricSpec(GAUGE, "Sessions currently open on this replica."),
    "load": MetricSpec(GAUGE, "active_sessions / max_sessions of this replica."),
    "queue_full_drops": MetricSpec(COUNTER, "Requests dropped because the queue was full."),
    "dispatch_errors": MetricSpec(
        COUNTER, "Failed dispatches after retries were exhausted (label error).", ("model", "error")
    ),
    "dispatch_retries": MetricSpec(COUNTER, "Dispatch retry attempts."),
    "send_errors": MetricSpec(COUNTER, "Action chunks or events that could not be published."),
    "requests_expired": MetricSpec(COUNTER, "Requests dropped because they outlived their deadline."),
    "non_finite_actions": MetricSpec(
        COUNTER, "Action chunks withheld because the policy produced NaN or inf (answered NON_FINITE_ACTION)."
    ),
    "observation_errors": MetricSpec(COUNTER, "Malformed or refused observations (label code).", ("model", "code")),
    "client_disconnected": MetricSpec(COUNTER, "Client disconnect events (liveliness lost or session closed)."),
    "superseded_requests": MetricSpec(COUNTER, "Observations replaced unanswered by a newer one of the same session."),
    "requests": MetricSpec(COUNTER, "Observations accepted for inference."),
    "sessions_opened": MetricSpec(COUNTER, "Session opens accepted."),
    "sessions_rejected": MetricSpec(COUNTER, "Session opens rejected (label reason).", ("model", "reason")),
    "chunks_sent": MetricSpec(COUNTER, "Action chunks published."),
    "security_denials": MetricSpec(
        COUNTER,
        "Requests refused or dropped by the session guard (label reason: bad_auth, "
        "foreign_session, session_live, too_large, rate_limited, ...).",
        ("reason",),
    ),
}


def exposed_names(name: str) -> list[str]:
    """The sample names a family shows in a text-0.0.4 scrape (what a dashboard or the bench queries)."""
    spec = KNOWN_METRICS[name]
    full = PREFIX + name
    if spec.kind == COUNTER:
        return [full + "_total"]
    if spec.kind == HISTOGRAM:
        return [full + "_bucket", full + "_sum", full + "_count"]
    return [full]


class Metrics:
    """The process's families, on its own `CollectorRegistry` (several servers in one test process never mix).

    Labels are keywords (`model="pi0"`), exactly the family's declared names. `process=True` also
    registers the standard `process_*` (RSS, CPU, open fds), `python_gc_*` and `python_info` collectors.
    """

    def __init__(self, process: bool = True):
        self.registry = CollectorRegistry(auto_describe=True)
        self._families: dict[str, object] = {}
        self._children: dict[tuple, object] = {}  # (name, *label items in call order) -> child: the hot-path lookup
        self._lock = threading.Lock()
        for name, spec in KNOWN_METRICS.items():
            cls = {COUNTER: Counter, GAUGE: Gauge, HISTOGRAM: Histogram}[spec.kind]
            kw = {"buckets": spec.buckets} if spec.kind == HISTOGRAM else {}
            self._families[name] = cls(name, spec.help, spec.labels, namespace=NAMESPACE, registry=self.registry, **kw)
        if process:
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
            GCCollector(registry=self.registry)

    # ---- hot path: one dict lookup and the library's own lock per call -----------------------------------

    def observe(self, name: str, value: float, **labels) -> None:
        """Record one value of a distribution (latencies, sizes)."""
        if value != value:
            raise ValueError(f"observe({name!r}) got NaN")
        try:
            child = self._children[(name, HISTOGRAM, *labels.items())]
        except KeyError:
            child = self._child(name, HISTOGRAM, labels)
        child.observe(value)

    def inc(self, name: str, n: float = 1, **labels) -> None:
        """Add `n` (>= 0) to a counter."""
        try:
            child = self._children[(name, COUNTER, *labels.items())]
        except KeyError:
            child = self._child(name, COUNTER, labels)
        child.inc(n)

    def set(self, name: str, value: float, **labels) -> None:
        """Set a gauge."""
        try:
            child = self._children[(name, GAUGE, *labels.items())]
        except KeyError:
            child = self._child(name, GAUGE, labels)
        child.set(value)

    # ---- cold path: first use of a label set -----------------------------------------------------------

    def _child(self, name: str, kind: str, labels: dict):
        spec = KNOWN_METRICS.get(name)
        if spec is None:
            raise ValueError(
                f"metric {name!r} is not in server.metrics.KNOWN_METRICS; add it there with its type, "
                "help and label names"
            )
        if spec.kind != kind:
            raise TypeError(
                f"metric {name!r} is a {spec.kind}: use Metrics.{METHOD_FOR_KIND[spec.kind]}(), "
                f"not {METHOD_FOR_KIND[kind]}()"
            )
        if set(labels) != set(spec.labels):
            unbounded = sorted(set(labels) - BOUNDED_LABELS)
            why = (
                (
                    f"; {', '.join(unbounded)} would make a series per value (per-robot detail belongs in the audit "
                    "log and the /sessions status)"
                )
                if unbounded
                else ""
            )
            raise ValueError(f"metric {name!r} takes labels {list(spec.labels)}, got {sorted(labels)}{why}")
        family = self._families[name]
        child = family.labels(**labels) if spec.labels else family
        with self._lock:
            self._children[(name, kind, *labels.items())] = child
        return child

    # ---- exposition ------------------------------------------------------------------------------------

    def render(self, accept: str = "", names: set[str] | None = None) -> tuple[bytes, str]:
        """(body, content type) of a scrape: OpenMetrics when `accept` asks for it, else text 0.0.4.

        `names` (family names, short `load` or full `policy_server_load`, or sample names such as
        `policy_server_requests_total`) restricts the scrape to those families: a cheap poll."""
        encoder, content_type = choose_encoder(accept or "")
        registry = self.registry
        if names:
            samples: set[str] = set()
            for n in names:
                short = n[len(PREFIX) :] if n.startswith(PREFIX) else n
                for suffix in ("_total", "_bucket", "_sum", "_count"):
                    if short.endswith(suffix) and short[: -len(suffix)] in KNOWN_METRICS:
                        short = short[: -len(suffix)]
                samples.update(exposed_names(short) if short in KNOWN_METRICS else [n])
            registry = registry.restricted_registry(samples)
        return encoder(registry), content_type

    def text(self, names: set[str] | None = None) -> str:
        """The text-0.0.4 scrape as a string (what `GET /metrics` answers a plain Prometheus)."""
        return self.render("", names)[0].decode("utf-8")


class Sketch:
    """Percentiles of a stream in fixed memory: log-spaced bins from `LO` to `HI` (ms), ratio `GAMMA`.

    A value v lands in bin floor(log(v / LO) / log(GAMMA)) (clamped to the first and last); a
    percentile answers the geometric middle of its bin, clamped to [min, max] seen, so it is within
    RELATIVE_ERROR of a value in that bin. Not locked: each sketch has one writer at a time (a
    session's is written under the session's lock, a replica's by `WindowedSketch` under its lock).
    """

    LO, HI, GAMMA = 0.01, 100_000.0, 1.1
    BINS = int(math.ceil(math.log(HI / LO) / math.log(GAMMA))) + 1
    RELATIVE_ERROR = (GAMMA - 1) / 2
    _LOG_LO, _LOG_GAMMA = math.log(LO), math.log(GAMMA)

    __slots__ = ("bins", "count", "total", "min", "max")

    def __init__(self):
        self.bins = array("I", bytes(4 * self.BINS))
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, v: float) -> None:
        i = int((_log(v) - _SKETCH_LOG_LO) * _SKETCH_INV_LOG_GAMMA) if v > _SKETCH_LO else 0
        self.bins[i if i < _SKETCH_BINS else _SKETCH_BINS - 1] += 1
        self.count += 1
        self.total += v
        if v < self.min:
            self.min = v
        if v > self.max:
            self.max = v

    def merge(self, other: Sketch) -> None:
        for i, n in enumerate(other.bins):
            if n:
                self.bins[i] += n
        self.count += other.count
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0..1), or None before the first value."""
        if not self.count:
            return None
        rank = q * (self.count - 1)
        seen = 0
        for i, n in enumerate(self.bins):
            seen += n
            if seen > rank:
                if i == self.BINS - 1:  # the overflow bin: its values are beyond HI, the max is the best answer
                    return self.max
                mid = self.LO * self.GAMMA ** (i + 0.5)
                return min(max(mid, self.min), self.max)
        return self.max

    def summary(self, digits: int = 3) -> dict:
        """{count, mean, p50, p95, p99, max} (None where empty), JSON-ready."""
        if not self.count:
            return {"count": 0, "mean": None, "p50": None, "p95": None, "p99": None, "max": None}
        r = lambda v: round(v, digits)  # noqa: E731
        return {
            "count": self.count,
            "mean": r(self.total / self.count),
            "p50": r(self.quantile(0.5)),
            "p95": r(self.quantile(0.95)),
            "p99": r(self.quantile(0.99)),
            "max": r(self.max),
        }


# module constants: the hot path reads them without an attribute lookup
_log = math.log
_SKETCH_LO, _SKETCH_BINS = Sketch.LO, Sketch.BINS
_SKETCH_LOG_LO, _SKETCH_INV_LOG_GAMMA = math.log(Sketch.LO), 1.0 / math.log(Sketch.GAMMA)


class WindowedSketch:
    """Recent-value percentiles of a replica: the current and the previous `window_s` (two `Sketch`es rotated),
    so a figure says how the replica does now, not since it started.

    `add` is the hot path: no lock, no clock (a value racing a rotation lands in the window just closed,
    which `recent` still reads). `tick` rotates; the replica's housekeeping thread calls it, and `recent`
    calls it first."""

    def __init__(self, window_s: float = 60.0, clock=time.monotonic):
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._cur, self._prev = Sketch(), Sketch()
        self._rotated = clock()

    def add(self, v: float) -> None:
        self._cur.add(v)

    def tick(self) -> None:
        now = self._clock()
        if now - self._rotated < self.window_s:
            return
        with self._lock:
            if now - self._rotated >= self.window_s:
                self._prev = self._cur if now - self._rotated < 2 * self.window_s else Sketch()
                self._cur, self._rotated = Sketch(), now

    def recent(self) -> Sketch:
        """The values of the last one to two windows, merged into a new Sketch."""
        self.tick()
        out = Sketch()
        with self._lock:
            out.merge(self._prev)
            out.merge(self._cur)
        return out
