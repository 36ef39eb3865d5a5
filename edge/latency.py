"""Inference latency samples and the delay estimate engines pass to the policy.

`max()` is the delay estimate per `mode`: `"all_time_max"` the maximum since `reset()` (LeRobot's
LatencyTracker: one warm-up spike inflates every later estimate), `"window_max"` the window's maximum and
`"percentile"` the window's `percentile`, so a spike ages out of the estimate. It is computed once per sample
in `add()` (the network worker, once per answered request) and read as a number: engines read it several
times a request. Negative and non-finite samples are ignored. Thread-safe.

The window is also kept sorted (`bisect`), so a percentile is two list reads and numpy's default (linear)
interpolation between them: an `add()` in percentile mode takes ~1.1 us instead of ~32 us with `np.percentile`
over the window (100 samples, the 2-core VM: docs/results/2026-11-27-benchmarks-full-run.md), once per answered request in every engine of a shard.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import deque

LATENCY_MODES = ("all_time_max", "window_max", "percentile")


class LatencyTracker:
    def __init__(self, maxlen: int = 100, mode: str = "all_time_max", percentile: float = 95.0):
        if mode not in LATENCY_MODES:
            raise ValueError(f"latency mode must be one of {LATENCY_MODES}, got {mode!r}")
        if maxlen < 1:
            raise ValueError(f"maxlen must be >= 1, got {maxlen}")
        if not 0.0 <= percentile <= 100.0:
            raise ValueError(f"percentile must be in [0, 100], got {percentile}")
        self.mode = mode
        self.q = float(percentile)
        self._window: deque[float] = deque(maxlen=int(maxlen))  # arrival order: the oldest leaves first
        self._sorted: list[float] = []  # the same samples, ascending
        self._max = 0.0
        self._estimate = 0.0  # max()'s value, updated by add() and reset()
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        try:
            v = float(seconds)
        except (TypeError, ValueError):
            return
        if not math.isfinite(v) or v < 0:
            return
        with self._lock:
            if len(self._window) == self._window.maxlen:
                del self._sorted[bisect.bisect_left(self._sorted, self._window[0])]
            self._window.append(v)
            bisect.insort(self._sorted, v)
            self._max = max(self._max, v)
            if self.mode == "all_time_max":
                self._estimate = self._max
            elif self.mode == "window_max":
                self._estimate = self._sorted[-1]
            else:
                self._estimate = _linear_percentile(self._sorted, self.q)

    def max(self) -> float:
        """The delay estimate in seconds (0.0 before any sample), per `mode`."""
        with self._lock:
            return self._estimate

    def percentile(self, q: float) -> float:
        if not 0.0 <= q <= 100.0:  # as np.percentile refused it: out of range, a list index would wrap silently
            raise ValueError(f"percentile must be in [0, 100], got {q}")
        with self._lock:
            if not self._window:
                return 0.0
            if self.mode == "percentile" and float(q) == self.q:  # add() computed it (the default: p95)
                return self._estimate
            return _linear_percentile(self._sorted, float(q))

    def p95(self) -> float:
        return self.percentile(95.0)

    def reset(self) -> None:
        with self._lock:
            self._window.clear()
            self._sorted.clear()
            self._max = 0.0
            self._estimate = 0.0

    def __len__(self) -> int:
        with self._lock:
            return len(self._window)


def _linear_percentile(ascending: list[float], q: float) -> float:
    """`np.percentile(x, q)` (method "linear") of a non-empty ascending list."""
    pos = (len(ascending) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ascending) - 1)
    a, b, t = ascending[lo], ascending[hi], pos - lo
    return a + (b - a) * t if t < 0.5 else b - (b - a) * (1.0 - t)  # numpy's lerp, exact at both ends
