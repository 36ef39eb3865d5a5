"""A stand-in for edge's remote engine with the same surface, for testing the bench's own pipeline.

It serves 10-step chunks from a zero policy, goes STALLED during [stall_from, stall_to) seconds of
monotonic time after start (when given), and reports one request record per chunk. `fake_raise`
[from_s, to_s]: get_action raises in that window, and reset raises then too (a broken contract).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np


@dataclass
class FakeAction:
    values: np.ndarray
    session_id: str
    seq_id: int
    episode_id: int
    chunk_index: int
    age_s: float
    source: str


class FakeEngine:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.dim = len(cfg.get("action_names", [0, 0]))
        self.state = "CONNECTING"
        self.failed = False
        self._records: list[dict] = []
        self._transitions: list[tuple] = []
        self._lock = threading.Lock()
        self.seq = 0
        self.k = 0
        self.t_start = 0.0
        self.episode = 0
        self.stall = cfg.get("fake_stall")  # [from_s, to_s] after start
        self.raise_window = cfg.get("fake_raise")  # [from_s, to_s] after start

    def _to(self, state: str, reason: str = "") -> None:
        if state != self.state:
            with self._lock:
                self._transitions.append((time.monotonic(), self.state, state, reason))
            self.state = state

    def start(self):
        self.t_start = time.monotonic()
        self._to("STREAMING", "session open")

    def stop(self):
        self._to("STOPPED", "stop")

    def _raising(self) -> bool:
        el = time.monotonic() - self.t_start
        return bool(self.raise_window) and self.raise_window[0] <= el < self.raise_window[1]

    def reset(self):
        self.episode += 1
        if self._raising():
            raise RuntimeError("fake engine: reset broke its contract")

    def pause(self):
        self._to("PAUSED")

    def resume(self):
        self._to("STREAMING")

    def notify_observation(self, obs):
        assert "state" in obs

    def get_action(self):
        if self._raising():
            raise ValueError("fake engine: get_action broke its contract")
        el = time.monotonic() - self.t_start
        if self.stall and self.stall[0] <= el < self.stall[1]:
            self._to("STALLED", "queue empty")
            return None
        if self.state == "STALLED":
            self._to("STREAMING", "merge")
        if self.k % 10 == 0:
            self.seq += 1
            with self._lock:
                self._records.append(
                    {
                        "seq": self.seq,
                        "rtt_ms": 20.0 + self.seq % 5,
                        "queue_wait_ms": 1.0,
                        "inference_ms": 5.0,
                        "network_ms": 14.0,
                        "delay_steps": 1,
                        "outcome": "ok",
                    }
                )
        self.k += 1
        return FakeAction(
            np.full(self.dim, 0.01 * (self.k % 10), np.float32),
            "s1",
            self.seq,
            self.episode,
            self.k % 10,
            0.01 * (self.k % 10),
            "chunk",
        )

    def drain_records(self):
        with self._lock:
            out, self._records = self._records, []
        return out

    def drain_transitions(self):
        with self._lock:
            out, self._transitions = self._transitions, []
        return out


def make(cfg: dict) -> FakeEngine:
    return FakeEngine(cfg)
