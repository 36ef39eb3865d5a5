"""In-process metrics of one policy-server replica: what it counts, times and exposes.

    observe / inc / set ──► series[(name, labels)] ─┬─► ring buffer of recent (t, value) ──► get_stats, get_latest
       (hot path, any thread)                        └─► Prometheus state: total | value |  ──► render_prometheus
                                                         le-buckets + _sum + _count            (/metrics scrape)

A metric name has one type for the life of the process: the type in `KNOWN_METRICS`, or for an
unregistered name the type of the method that first used it. A call with the wrong method raises
`TypeError` naming the right one; it is a programming error, found on the first call.

Invariant: both views of a series are updated in one critical section of one lock, so a scrape
never sees `_count` disagree with the buckets, and a counter never goes down. The lock is held
for a few array and float assignments per call; percentiles, formatting and callbacks run outside it.
"""

from __future__ import annotations

import bisect
import logging
import math
import re
import threading
import time
from array import array
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

log = logging.getLogger(__name__)

PREFIX = "policy_server_"
COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
METHOD_FOR_KIND = {COUNTER: "inc", GAUGE: "set", HISTOGRAM: "observe"}

# Design 11: inference 15-150 ms, end-to-end up to ~250 ms; staleness and queue waits reach seconds under overload.
LATENCY_MS_BUCKETS = (1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 75.0, 100.0, 150.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0)
# Three JPEG cameras plus state land at tens to hundreds of KiB per observation.
PAYLOAD_BYTES_BUCKETS = tuple(float(1024 * 4**k) for k in range(9))  # 1 KiB .. 64 MiB
BATCH_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
DEFAULT_BUCKETS = LATENCY_MS_BUCKETS  # for histograms typed by first use: most of what a server times is in ms


@dataclass(frozen=True)
class MetricSpec:
    kind: str  # COUNTER | GAUGE | HISTOGRAM
    help: str
    buckets: tuple[float, ...] = ()  # histogram upper bounds, ascending; +Inf is implicit


def _hist(help: str, buckets: tuple[float, ...] = LATENCY_MS_BUCKETS) -> MetricSpec:
    return MetricSpec(HISTOGRAM, help, buckets)


# The metric word used in code is the word in Grafana (prefixed `policy_server_`, counters suffixed `_total`).
# Labels in use: client, model, error, code, reason.
KNOWN_METRICS: dict[str, MetricSpec] = {
    "inference_latency_ms": _hist("Time spent in model inference (pre + forward + post), ms."),
    "scheduling_wait_ms": _hist("Time a request sat in the queue before inference started, ms."),
    "e2e_latency_ms": _hist("Total server-side time per request (queue wait + inference), ms."),
    "observation_staleness_ms": _hist("Age of an observation when the worker picked it up, ms (server monotonic clock)."),
    "payload_size_bytes": _hist("Size of the binary observation payload, bytes.", PAYLOAD_BYTES_BUCKETS),
    "batch_size": _hist("Requests per inference dispatch.", BATCH_BUCKETS),
    "queue_depth": MetricSpec(GAUGE, "Sessions with a pending observation, sampled at dispatch time."),
    "active_clients": MetricSpec(GAUGE, "Clients currently connected."),
    "active_sessions": MetricSpec(GAUGE, "Sessions currently open on this replica."),
    "load": MetricSpec(GAUGE, "active_sessions / max_sessions of this replica."),
    "queue_full_drops": MetricSpec(COUNTER, "Requests dropped because the queue was full."),
    "dispatch_errors": MetricSpec(COUNTER, "Failed dispatches after retries were exhausted (label error)."),
    "dispatch_retries": MetricSpec(COUNTER, "Dispatch retry attempts."),
    "send_errors": MetricSpec(COUNTER, "Action chunks or events that could not be published."),
    "requests_expired": MetricSpec(COUNTER, "Requests dropped because they outlived their deadline."),
    "observation_errors": MetricSpec(COUNTER, "Malformed observations rejected (label code)."),
    "client_disconnected": MetricSpec(COUNTER, "Client disconnect events (liveliness lost or session closed)."),
    "superseded_requests": MetricSpec(COUNTER, "Observations replaced unanswered by a newer one of the same session."),
    "requests": MetricSpec(COUNTER, "Observations accepted for inference."),
    "sessions_opened": MetricSpec(COUNTER, "Session opens accepted."),
    "sessions_rejected": MetricSpec(COUNTER, "Session opens rejected (label reason)."),
    "chunks_sent": MetricSpec(COUNTER, "Action chunks published."),
    "security_denials": MetricSpec(COUNTER, "Requests refused or dropped by the session guard (label reason: bad_auth, "
                                            "foreign_session, session_live, too_large, rate_limited, ...)."),
    "metric_callback_errors": MetricSpec(COUNTER, "Exceptions raised by on_metric callbacks (swallowed)."),
}

_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


@dataclass(frozen=True)
class Stats:
    """Summary of the values recorded into matching series; `count == 0` means no data (all fields 0.0)."""

    count: int
    mean: float
    p50: float
    p95: float
    p99: float
    max: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


EMPTY_STATS = Stats(0, 0.0, 0.0, 0.0, 0.0, 0.0)


class _Series:
    """One (name, labels) pair. Every field is guarded by `Metrics._lock`."""

    __slots__ = ("name", "kind", "labels", "label_key", "bounds", "buckets", "sum", "count", "value", "vals", "ts", "pos", "last", "last_t")

    def __init__(self, name: str, kind: str, labels: dict[str, str], bounds: tuple[float, ...]):
        self.name = name
        self.kind = kind
        self.labels = labels
        self.label_key = tuple(sorted(labels.items()))
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)  # non-cumulative; the last slot is +Inf
        self.sum = 0.0
        self.count = 0
        self.value = 0.0  # counter total or gauge value
        self.vals = array("d")  # grows to ring_buffer_size, then wraps at `pos`
        self.ts = array("d")
        self.pos = 0
        self.last = 0.0
        self.last_t = -math.inf


def _merge_labels_arg(labels: dict[str, Any]) -> dict[str, Any]:
    """Accept design 003's `labels={"model": ...}` spelling as well as `model=...` keywords."""
    mapping = labels.pop("labels")
    if not isinstance(mapping, dict):
        raise TypeError(f"labels= must be a dict of label name -> value, got {type(mapping).__name__}")
    return {**mapping, **labels}


def _matches(series: _Series, want: dict[str, str]) -> bool:
    labels = series.labels
    return all(labels.get(k) == v for k, v in want.items())


def _stats(values: np.ndarray) -> Stats:
    if values.size == 0:
        return EMPTY_STATS
    p50, p95, p99 = np.percentile(values, (50.0, 95.0, 99.0))
    return Stats(int(values.size), float(values.mean()), float(p50), float(p95), float(p99), float(values.max()))


def _fmt_float(v: float) -> str:
    if v != v:
        return "NaN"
    if v == math.inf:
        return "+Inf"
    if v == -math.inf:
        return "-Inf"
    return repr(float(v))


def _escape_label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n")


def _fmt_labels(pairs: tuple[tuple[str, str], ...]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label_value(v)}"' for k, v in pairs) + "}"


def _json_number(v: float) -> float | None:
    return v if math.isfinite(v) else None


class Metrics:
    """Thread-safe registry of counters, gauges and distributions, keyed by (name, labels).

    `ring_buffer_size` bounds the recent values each series keeps for percentiles (design 003); a
    series' buffer grows on demand up to 16 bytes x ring_buffer_size, so call `forget(client=...)`
    for clients that leave for good. `clock` is the monotonic clock that stamps values; tests pass
    a fake one. Labels are keywords (`client="a"`) or, as in design 003, `labels={"client": "a"}`;
    label values are stored as strings.
    """

    def __init__(self, ring_buffer_size: int = 10000, clock: Callable[[], float] = time.monotonic):
        if ring_buffer_size < 1:
            raise ValueError(f"ring_buffer_size must be >= 1, got {ring_buffer_size}")
        self.ring_buffer_size = int(ring_buffer_size)
        self._clock = clock
        self._lock = threading.Lock()
        self._kinds: dict[str, str] = {}  # name -> kind, fixed at first use (or by KNOWN_METRICS)
        self._families: dict[str, dict[tuple, _Series]] = {}  # name -> label_key -> series
        self._cache: dict[Any, _Series] = {}  # (name, *kwargs items in call order) -> series: the hot-path lookup
        self._callbacks: tuple[Callable[[str, float, dict], Any], ...] = ()  # copy-on-write: iterated without the lock
        self._reported_callbacks: set[int] = set()

    # ---- hot path ---------------------------------------------------------------------------------
    # The three recorders repeat the ring-buffer write instead of sharing a helper: a method call
    # would cost more than the write itself. The cache is read without the lock (a dict get is
    # atomic under the GIL); it is only written under the lock, in _resolve and forget.

    def observe(self, name: str, value: float, **labels: Any) -> None:
        """Record one value of a distribution (latencies, sizes): ring buffer + histogram buckets."""
        v = float(value)
        if v != v:
            raise ValueError(f"observe({name!r}) got NaN")
        try:
            s = self._cache[(name, *labels.items())] if labels else self._cache[name]
        except (KeyError, TypeError):
            s = self._series(name, HISTOGRAM, labels)
        if s.kind is not HISTOGRAM:
            self._wrong_kind(name, HISTOGRAM, s.kind)
        now = self._clock()
        with self._lock:
            s.buckets[bisect.bisect_left(s.bounds, v)] += 1  # bucket i counts v <= bounds[i] (Prometheus `le`)
            s.sum += v
            s.count += 1
            s.last = v
            s.last_t = now
            pos = s.pos
            if pos == len(s.vals):  # still growing towards ring_buffer_size
                s.vals.append(v)
                s.ts.append(now)
            else:
                s.vals[pos] = v
                s.ts[pos] = now
            s.pos = pos + 1 if pos + 1 < self.ring_buffer_size else 0
        if self._callbacks:
            self._fire(name, v, s.labels)

    def inc(self, name: str, n: float = 1, **labels: Any) -> None:
        """Add `n` (>= 0) to a counter. The ring buffer keeps the increments, so `get_stats` counts recent events."""
        v = float(n)
        if not v >= 0.0:
            raise ValueError(f"inc({name!r}) needs n >= 0 (counters never go down), got {n!r}")
        try:
            s = self._cache[(name, *labels.items())] if labels else self._cache[name]
        except (KeyError, TypeError):
            s = self._series(name, COUNTER, labels)
        if s.kind is not COUNTER:
            self._wrong_kind(name, COUNTER, s.kind)
        now = self._clock()
        with self._lock:
            s.value += v
            s.count += 1
            s.last = v
            s.last_t = now
            pos = s.pos
            if pos == len(s.vals):  # still growing towards ring_buffer_size
                s.vals.append(v)
                s.ts.append(now)
            else:
                s.vals[pos] = v
                s.ts[pos] = now
            s.pos = pos + 1 if pos + 1 < self.ring_buffer_size else 0
        if self._callbacks:
            self._fire(name, v, s.labels)

    def set(self, name: str, value: float, **labels: Any) -> None:
        """Set a gauge. The ring buffer keeps past settings, so `get_stats` summarises a gauge over time."""
        v = float(value)
        try:
            s = self._cache[(name, *labels.items())] if labels else self._cache[name]
        except (KeyError, TypeError):
            s = self._series(name, GAUGE, labels)
        if s.kind is not GAUGE:
            self._wrong_kind(name, GAUGE, s.kind)
        now = self._clock()
        with self._lock:
            s.value = v
            s.count += 1
            s.last = v
            s.last_t = now
            pos = s.pos
            if pos == len(s.vals):  # still growing towards ring_buffer_size
                s.vals.append(v)
                s.ts.append(now)
            else:
                s.vals[pos] = v
                s.ts[pos] = now
            s.pos = pos + 1 if pos + 1 < self.ring_buffer_size else 0
        if self._callbacks:
            self._fire(name, v, s.labels)

    def _series(self, name: str, kind: str, labels: dict[str, Any]) -> _Series:
        """Slow lookup for a call the hot-path cache missed: first use, `labels=` mapping, unhashable values."""
        if "labels" in labels:
            labels = _merge_labels_arg(labels)
        key = (name, *labels.items()) if labels else name
        try:
            s = self._cache[key]
        except KeyError:
            s = self._resolve(name, kind, labels, key)
        except TypeError:
            s = self._resolve(name, kind, labels, None)
        return s

    # ---- cold path: first use of a series ---------------------------------------------------------

    def _resolve(self, name: str, kind: str, labels: dict[str, Any], cache_key: Any) -> _Series:
        canonical = {k: str(v) for k, v in labels.items()}
        label_key = tuple(sorted(canonical.items()))
        with self._lock:
            family_kind = self._kinds.get(name)
            if family_kind is None:
                family_kind = self._register_family(name, kind)
            if family_kind != kind:
                self._wrong_kind(name, kind, family_kind)
            family = self._families[name]
            s = family.get(label_key)
            if s is None:
                for k in canonical:
                    if not _LABEL_RE.match(k) or k.startswith("__"):
                        raise ValueError(f"label name {k!r} of metric {name!r} is not a valid Prometheus label name")
                    if kind == HISTOGRAM and k == "le":
                        raise ValueError(f"histogram {name!r} cannot take a label named 'le' (reserved for buckets)")
                spec = KNOWN_METRICS.get(name)
                bounds = (spec.buckets if spec and spec.buckets else DEFAULT_BUCKETS) if kind == HISTOGRAM else ()
                s = family[label_key] = _Series(name, kind, canonical, bounds)
            if cache_key is not None:
                self._cache[cache_key] = s
            return s

    def _register_family(self, name: str, kind: str) -> str:
        spec = KNOWN_METRICS.get(name)
        if spec is None:
            if not _NAME_RE.match(name):
                raise ValueError(f"metric name {name!r} must match [a-zA-Z_][a-zA-Z0-9_]* (it becomes a Prometheus name)")
            family_kind = kind
        else:
            family_kind = spec.kind
        self._kinds[name] = family_kind
        self._families[name] = {}
        return family_kind

    @staticmethod
    def _wrong_kind(name: str, called: str, actual: str) -> None:
        raise TypeError(
            f"metric {name!r} is a {actual}: use Metrics.{METHOD_FOR_KIND[actual]}(), not {METHOD_FOR_KIND[called]}()"
        )

    # ---- callbacks -------------------------------------------------------------------------------

    def on_metric(self, callback: Callable[[str, float, dict], Any]) -> Callable[[str, float, dict], Any]:
        """Call `callback(name, value, labels)` after every observe/inc/set (value = the increment for inc).

        Runs on the recording thread, after the lock is released; keep it short. Exceptions are
        swallowed, counted in `metric_callback_errors` and logged once per callback. Usable as a decorator.
        """
        with self._lock:
            self._callbacks = (*self._callbacks, callback)
        return callback

    def _fire(self, name: str, value: float, labels: dict[str, str]) -> None:
        for cb in self._callbacks:
            try:
                cb(name, value, dict(labels))  # a copy: a callback must not be able to rename a series
            except Exception:
                self._count_callback_error(cb)

    def _count_callback_error(self, cb: Callable) -> None:
        # Recorded like inc() but without firing callbacks: a failing callback must not recurse.
        s = self._series("metric_callback_errors", COUNTER, {})
        now = self._clock()
        with self._lock:
            s.value += 1.0
            s.count += 1
            s.last = 1.0
            s.last_t = now
            if s.pos == len(s.vals):
                s.vals.append(1.0)
                s.ts.append(now)
            else:
                s.vals[s.pos] = 1.0
                s.ts[s.pos] = now
            s.pos = s.pos + 1 if s.pos + 1 < self.ring_buffer_size else 0
            first = id(cb) not in self._reported_callbacks
            self._reported_callbacks.add(id(cb))
        if first:
            log.warning("on_metric callback %r raised; swallowed (further failures are only counted)", cb, exc_info=True)

    # ---- queries -----------------------------------------------------------------------------------

    def _matching(self, name: str, labels: dict[str, Any]) -> list[_Series]:
        """Series of `name` whose labels include all of `labels`. Caller holds the lock."""
        want = {k: str(v) for k, v in labels.items()}
        return [s for s in self._families.get(name, {}).values() if _matches(s, want)]

    def get_stats(self, name: str, window_seconds: float | None = None, **labels: Any) -> Stats:
        """Stats over the ring-buffered values of every series of `name` whose labels include `labels`.

        With `window_seconds`, only values recorded in the last `window_seconds` (monotonic clock) count.
        For a counter the values are the increments; for a gauge, the values it was set to.
        """
        if "labels" in labels:
            labels = _merge_labels_arg(labels)
        with self._lock:
            # np.array copies, so the arrays can keep growing once the lock is released.
            parts = [(np.array(s.vals, dtype=np.float64), np.array(s.ts, dtype=np.float64)) for s in self._matching(name, labels)]
            now = self._clock()
        if not parts:
            return EMPTY_STATS
        values = np.concatenate([v for v, _ in parts])
        if window_seconds is not None:
            stamps = np.concatenate([t for _, t in parts])
            values = values[stamps >= now - window_seconds]
        return _stats(values)

    def get_latest(self, name: str, **labels: Any) -> float | None:
        """A counter's total (summed over matching series); otherwise the most recent value among matching series.

        None when no series of `name` matches.
        """
        if "labels" in labels:
            labels = _merge_labels_arg(labels)
        with self._lock:
            matching = self._matching(name, labels)
            if not matching:
                return None
            if self._kinds[name] == COUNTER:
                return math.fsum(s.value for s in matching)
            return max(matching, key=lambda s: s.last_t).last

    def forget(self, **labels: Any) -> int:
        """Drop every series (of any name) whose labels include `labels`, e.g. `forget(client=uuid)` when a
        client leaves for good, so fleet churn does not grow memory. Returns the number of series dropped."""
        if not labels:
            raise ValueError("forget() needs at least one label; it would drop every series")
        if "labels" in labels:
            labels = _merge_labels_arg(labels)
        want = {k: str(v) for k, v in labels.items()}
        with self._lock:
            dropped = 0
            for family in self._families.values():
                for key in [k for k, s in family.items() if _matches(s, want)]:
                    del family[key]
                    dropped += 1
            self._cache = {k: s for k, s in self._cache.items() if not _matches(s, want)}
            return dropped

    def snapshot(self) -> dict[str, dict]:
        """JSON-friendly view: {name: {"type", "help", "series": [...]}}. Non-finite numbers become None.

        Counter and gauge series carry `value`; histogram series carry `count`, `sum`, `latest` and
        `stats` (over the ring buffer, no window).
        """
        with self._lock:
            copied = []
            for name, family in self._families.items():
                rows = []
                for s in family.values():
                    ring = np.array(s.vals, dtype=np.float64) if s.kind == HISTOGRAM else None
                    rows.append((s.label_key, s.kind, s.value, s.count, s.sum, s.last, ring))
                copied.append((name, self._kinds[name], rows))
        out: dict[str, dict] = {}
        for name, kind, rows in sorted(copied):
            series = []
            for label_key, _, value, count, total, last, ring in sorted(rows, key=lambda r: r[0]):
                row: dict[str, Any] = {"labels": dict(label_key)}
                if kind == HISTOGRAM:
                    stats = _stats(ring)
                    row.update(count=count, sum=_json_number(total), latest=_json_number(last) if count else None,
                               stats={k: _json_number(v) if isinstance(v, float) else v for k, v in stats.as_dict().items()})
                else:
                    row["value"] = _json_number(value)
                series.append(row)
            out[name] = {"type": kind, "help": self._help(name), "series": series}
        return out

    @staticmethod
    def _help(name: str) -> str:
        spec = KNOWN_METRICS.get(name)
        return spec.help if spec else f"{name} (not in server.metrics.KNOWN_METRICS; typed by first use)."

    # ---- Prometheus ---------------------------------------------------------------------------------

    def render_prometheus(self, names: set[str] | None = None) -> str:
        """The registry (or only the families in `names`, short or full names) in Prometheus text format 0.0.4.

        Every family in `KNOWN_METRICS` gets HELP and TYPE lines even before its first sample, so a
        scrape documents what this server can report; names are `policy_server_<name>`, counters
        end in `_total`, histograms expose cumulative `le` buckets ending in `+Inf` plus `_sum`/`_count`.
        """
        want = None if not names else {n[len(PREFIX):] if n.startswith(PREFIX) else n for n in names}
        want = None if want is None else want | {n[:-len("_total")] for n in want if n.endswith("_total")}
        with self._lock:
            copied = {
                name: (self._kinds[name], [(s.label_key, s.value, list(s.buckets), s.bounds, s.sum, s.count) for s in family.values()])
                for name, family in self._families.items() if want is None or name in want
            }
        for name, spec in KNOWN_METRICS.items():
            if want is None or name in want:
                copied.setdefault(name, (spec.kind, []))
        lines: list[str] = []
        for name in sorted(copied):
            kind, rows = copied[name]
            full = PREFIX + name
            if kind == COUNTER and not full.endswith("_total"):
                full += "_total"
            lines.append(f"# HELP {full} {_escape_help(self._help(name))}")
            lines.append(f"# TYPE {full} {kind}")
            for label_key, value, buckets, bounds, total, count in sorted(rows, key=lambda r: r[0]):
                if kind != HISTOGRAM:
                    lines.append(f"{full}{_fmt_labels(label_key)} {_fmt_float(value)}")
                    continue
                cumulative = 0
                for bound, n in zip((*bounds, math.inf), buckets):
                    cumulative += n
                    lines.append(f"{full}_bucket{_fmt_labels((*label_key, ('le', _fmt_float(bound))))} {cumulative}")
                lines.append(f"{full}_sum{_fmt_labels(label_key)} {_fmt_float(total)}")
                lines.append(f"{full}_count{_fmt_labels(label_key)} {count}")
        return "\n".join(lines) + "\n"
