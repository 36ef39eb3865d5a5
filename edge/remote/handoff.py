"""What the remote engine's control thread hands its network worker, and the events that wake the worker.

The control thread writes (notify_observation, reset, pause); the worker reads. The latest observation is a
latest-only slot: a newer one replaces an older one not yet sent. Invariant: the slot, its version and the
episode change together under `lock`, so an observation notified before a reset is never sent as the new
episode's.
"""

from __future__ import annotations

import threading

from edge.remote.drive import Signal


class Handoff:
    def __init__(self):
        self.lock = threading.Lock()
        # (obs, t_mono, version, episode, due, queue snapshot on its tick: edge.queue.ActionQueue.snapshot)
        self.slot: tuple[dict, float, int, int, bool, tuple[int, int]] | None = None
        self.version = 0
        self.episode = 0
        self.reset_pending: int | None = None  # the episode whose reset the worker sends next
        self.paused = False
        self.due_buffer_s = 0.0  # the request point the worker plans with (an empty queue is always due)
        self.want_obs = False  # the worker is waiting for a fresh observation (notify wakes it)
        # Signals (edge.remote.drive): a pooled worker waiting on one resumes when it is set
        self.wake = Signal()
        self.stop = Signal()
        self.nudge = Signal()  # set by stop() and when a replica token of the model appears

    def latest(self):
        with self.lock:
            return self.slot
