"""Inference latency samples and the delay estimate engines pass to the policy.

`max()` is the delay estimate per `mode`: `"all_time_max"` the maximum since `reset()` (LeRobot's
LatencyTracker: one warm-up spike inflates every later estimate), `"window_max"` the window's maximum and
`"percentile"` the window's `percentile`, so a spike ages out of the estimate. It is computed once per sample
in `add()` (the network worker, once per answered request) and read as a number: engines read it several
times a request. Negative and non-finite samples are ignored. Thread-safe.
"""

from __future__ import annotations

import math
import threading
from collections import deque

import numpy as np

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
        self._window: deque[float] = deque(maxlen=int(maxlen))
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
            self._window.append(v)
            self._max = max(self._max, v)
            if self.mode == "all_time_max":
                self._estimate = self._max
            elif self.mode == "window_max":
                self._estimate = max(self._window)
            else:
                self._estimate = float(np.percentile(np.fromiter(self._window, float), self.q))

    def max(self) -> float:
        """The delay estimate in seconds (0.0 before any sample), per `mode`."""
        with self._lock:
            return self._estimate

    def percentile(self, q: float) -> float:
        with self._lock:
            if not self._window:
                return 0.0
            if self.mode == "percentile" and float(q) == self.q:  # add() computed it (the default: p95)
                return self._estimate
            return float(np.percentile(np.fromiter(self._window, float), q))

    def p95(self) -> float:
        return self.percentile(95.0)

    def reset(self) -> None:
        with self._lock:
            self._window.clear()
            self._max = 0.0
            self._estimate = 0.0

    def __len__(self) -> int:
        with self._lock:
            return len(self._window)
