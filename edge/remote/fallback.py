"""What the remote engine's `get_action` returns, on the control thread: the fallback ladder.

    a fresh action of this episode's chunk ─► it ; stale (older than max_action_age_s) ─► skipped with the rest
    of its chunk ; nothing fresh ─► STALLED and the fallback: repeat_last (the last chunk action, its age still
    growing), zero, or hold (None)

Invariants: no I/O, no exception for a network or server fault, locks held for microseconds; never an action whose
source observation is older than `max_action_age_s` (the staleness bound holds whatever the network does); after
DEAD or stop() nothing from the queue, the fallback only (a velocity-controlled robot needs its zero whatever ended
the stream). Waiting for an episode's first chunk on a healthy link is gating, not a stall; on a failing link
(DEGRADED, RECONNECTING) it is one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from edge.engine import Action, EngineState
from edge.queue import ActionQueue
from edge.remote.link import Link

S = EngineState


class FallbackLadder:
    def __init__(self, cfg, queue: ActionQueue, link: Link, counters: dict[str, int]):
        self.cfg, self.queue, self.link, self.counters = cfg, queue, link, counters
        self.action_dim = len(cfg.action_names)
        self.last_values: np.ndarray | None = None
        self.last_action: Action | None = None  # the last chunk action returned: repeat_last's provenance
        self.t_last_obs = 0.0
        self.awaiting_first = True  # start() and reset(): None until the first chunk is expected

    def new_episode(self) -> None:
        """reset(): the next chunk is the new episode's first; nothing of the finished one is repeated."""
        self.awaiting_first = True
        if self.link.stalled and self.link.state == S.STREAMING:  # on a failing link the new episode is stalled too
            self.link.set_stalled(False, "episode reset")
        self.last_values = None
        self.last_action = None

    def next_action(self, episode: int, closed: bool, session_id: Callable[[], str]) -> Action | None:
        """The action of this tick for `episode`; `closed`: DEAD or stopped (the fallback only)."""
        now = time.monotonic()
        max_age = self.cfg.max_action_age_s
        link = self.link
        get = self.queue.get_with_meta
        while not closed:
            item = get()
            if item is None:
                break
            values, meta, index = item
            if meta is None or meta.episode_id != episode:
                continue  # a chunk of a finished episode: never executed
            age = now - meta.t_obs
            if age > max_age:
                # the rest of this chunk shares its source observation: all stale; a later chunk (append
                # mode) may still be fresh
                self.counters["staleness_refusals"] += 1 + self.queue.skip_source(meta)
                continue
            self.last_values = values
            self.awaiting_first = False
            if link.stalled:
                link.set_stalled(False, "fresh action")
            self.last_action = Action(values, "chunk", meta.session_id, meta.seq_id, meta.episode_id, index, age)
            self.t_last_obs = meta.t_obs
            return self.last_action
        # nothing fresh: STALLED, apply the fallback
        if not closed and not link.stalled and (not self.awaiting_first or link.state in (S.DEGRADED, S.RECONNECTING)):
            link.set_stalled(True, "queue empty or stale")
        fb = self.cfg.fallback
        last = self.last_action
        if fb == "repeat_last" and self.last_values is not None and last is not None:
            self.counters["fallback_ticks"] += 1  # provenance of the repeated action; its age keeps growing
            return Action(
                self.last_values.copy(),
                "repeat_last",
                last.session_id,
                last.seq_id,
                last.episode_id,
                last.chunk_index,
                now - self.t_last_obs,
            )
        if fb == "zero":
            self.counters["fallback_ticks"] += 1
            return Action(np.zeros(self.action_dim, np.float32), "zero", session_id(), episode_id=episode)
        self.counters["none_ticks"] += 1
        return None
