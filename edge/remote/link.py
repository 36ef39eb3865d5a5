"""The remote engine's link state machine (design 9.2) as a transition table, and its reconnect back-off.

    CONNECTING ─► STREAMING ─► DEGRADED (requests failing, queue holds actions) ─► STALLED (queue empty or every
    action stale: fallback) ; timeout streak / server liveliness lost / drain / UNKNOWN_SESSION ─► RECONNECTING
    (exponential back-off, fresh handshake, new session_epoch) ; offline > max_offline_s or a capability/schema/
    checkpoint mismatch on reconnect ─► DEAD.

`TRANSITIONS` maps (state, event) to the next state; `ANY` is a row for every state, an explicit row wins over
it, and an event with no row (or a row of None) leaves the state as it is. `Link` keeps the worker's view of the
session (`state`) and what callers see (`visible`: STALLED while the control loop gets nothing fresh on a live
link), with the time spent in each and the transitions.

Invariants: DEAD is final; `failed` (visible DEAD) turns true only after the dead reason is set, and the
shutdown event is set last, so whoever waits on it reads the state and the reason.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque

from edge.engine import EngineState
from edge.remote.drive import Signal, Wait, run_inline

log = logging.getLogger(__name__)

S = EngineState
ANY = "*"

TRANSITIONS: dict[tuple[EngineState | str, str], EngineState | None] = {
    (ANY, "start"): S.CONNECTING,  # start(): the worker opens a session
    (S.STOPPED, "step"): S.CONNECTING,  # step_once() on an engine never started
    (ANY, "session"): S.STREAMING,  # a session acknowledged
    (ANY, "session_paused"): S.PAUSED,  # ... while the engine is paused
    (S.CONNECTING, "chunk_merged"): S.STREAMING,
    (S.RECONNECTING, "chunk_merged"): S.STREAMING,
    (S.DEGRADED, "chunk_merged"): S.STREAMING,
    (S.STREAMING, "request_failed"): S.DEGRADED,  # a timeout, a bad chunk, a server error
    (S.STREAMING, "no_chunk"): S.DEGRADED,  # nothing merged for degraded_after_s, the queue still holding actions
    (ANY, "reconnect"): S.RECONNECTING,  # a timeout streak, liveliness lost, a drain, UNKNOWN_SESSION
    (ANY, "pause"): S.PAUSED,
    (S.STOPPED, "pause"): None,  # before start() the engine starts paused; after stop() it stays STOPPED
    (S.PAUSED, "resume"): S.STREAMING,  # with a session
    (S.PAUSED, "resume_unopened"): S.CONNECTING,  # without one yet
    (ANY, "stop"): S.STOPPED,
    (ANY, "fatal"): S.DEAD,  # offline > max_offline_s, a refusal, another model on reconnect
}

# the link states in which an empty or stale queue shows as STALLED
_STALLABLE = (S.STREAMING, S.DEGRADED, S.RECONNECTING)


def next_state(state: EngineState, event: str) -> EngineState | None:
    """The state `event` leads to from `state` (None: it stays); DEAD is final."""
    if event not in _EVENTS:
        raise KeyError(f"no link event {event!r}; known: {sorted(_EVENTS)}")
    if state == S.DEAD:
        return None
    key = (state, event)
    return TRANSITIONS[key] if key in TRANSITIONS else TRANSITIONS.get((ANY, event))


_EVENTS = {event for _, event in TRANSITIONS}


class Link:
    """The link state (the worker's, and lifecycle calls') and the state callers see."""

    def __init__(self, name: str, shutdown_event: threading.Event | None = None):
        self.name = name  # the client id, for the log
        self.shutdown_event = shutdown_event
        self.state = S.STOPPED  # the worker's view of the session
        self.visible = S.STOPPED  # what callers see (see publish)
        self.stalled = False  # the control loop gets nothing fresh (get_action)
        self.dead_reason = ""
        self.transitions: deque = deque(maxlen=10000)
        self._lock = threading.Lock()
        self._since = time.monotonic()
        self._time_in: dict[str, float] = {}

    def fire(self, event: str, reason: str) -> None:
        """Take the transition of `event` from the current state, if the table has one."""
        new = next_state(self.state, event)
        if new is not None:
            self.set(new, reason)

    def set(self, new: EngineState, reason: str) -> None:
        """Set the link state; DEAD is final."""
        if self.state == S.DEAD:
            return
        self.state = new
        if new == S.DEAD:
            self.dead_reason = reason
            log.error("%s: DEAD: %s", self.name, reason)
        self.publish(reason)
        if new == S.DEAD and self.shutdown_event is not None:
            self.shutdown_event.set()  # last: whoever waits on it reads failed, the state and the reason

    def set_stalled(self, stalled: bool, reason: str) -> None:
        self.stalled = stalled
        self.publish(reason)

    def publish(self, reason: str) -> None:
        """The state a control loop sees: the link state, or STALLED while it gets nothing fresh."""
        link = self.state
        new = S.STALLED if self.stalled and link in _STALLABLE else link
        with self._lock:
            old = self.visible
            if new == old:
                return
            now = time.monotonic()
            self._time_in[old.value] = self._time_in.get(old.value, 0.0) + now - self._since
            self.visible, self._since = new, now
            self.transitions.append((now, old.value, new.value, reason))

    def time_in_state(self) -> dict[str, float]:
        """Seconds spent in each visible state, the current one up to now."""
        time_in = dict(self._time_in)
        state, since = self.visible, self._since
        time_in[state.value] = time_in.get(state.value, 0.0) + time.monotonic() - since
        return time_in


NUDGE_SPREAD_S = 1.0  # a fleet nudged by one replica token comes back spread over at most this window


class Backoff:
    """The wait between reconnect attempts: doubling from reconnect_initial_backoff_s to reconnect_max_backoff_s
    (read from `cfg` at each use), jittered, cut short by a replica token of the model appearing (`nudge`), ended
    by `stop`."""

    def __init__(self, cfg, nudge: Signal, stop: Signal, counters: dict[str, int]):
        self.cfg = cfg
        self.nudge, self.stop = nudge, stop
        self.counters = counters  # replica_nudges
        self.nudge_floor = 0.0  # the least a nudged back-off now waits: doubles with each nudged retry, 0 on a chunk

    def grown(self, backoff_s: float) -> float:
        """The back-off after one that gave nothing."""
        return min(backoff_s * 2, self.cfg.reconnect_max_backoff_s)

    def chunk_merged(self) -> None:
        """A session that gives chunks: the next nudge retries at once again."""
        self.nudge_floor = 0.0

    def wait(self, backoff_s: float) -> bool:
        """`waiting` on this thread."""
        return run_inline(self.waiting(backoff_s))

    def waiting(self, backoff_s: float):
        """Wait out a reconnect back-off (jittered), cut short by a replica token appearing; True when stopped
        (worker steps: edge.remote.drive). A nudged retry that gets no chunk doubles the least the next nudged
        back-off waits (from reconnect_initial_backoff_s, never past the back-off itself; a merged chunk sets it to
        0): a replica whose token flaps, or that acknowledges and fails every session, no longer cuts every
        back-off short."""
        # jittered: a fleet that lost its replica at the same instant must not come back in lockstep
        wait = backoff_s * random.uniform(0.5, 1.0)
        started = time.monotonic()
        if (yield Wait(self.nudge, wait)):
            if self.stop.is_set():
                return True
            # a replica's token appeared (server up, or our link to the router healed): try again
            # soon, spread over a short window so a whole fleet does not open sessions in one burst
            self.counters["replica_nudges"] += 1
            soonest = max(min(wait, self.nudge_floor) - (time.monotonic() - started), 0.0)
            initial = self.cfg.reconnect_initial_backoff_s
            self.nudge_floor = max(2 * self.nudge_floor, initial)
            return (yield Wait(self.stop, soonest + random.uniform(0.0, min(initial, NUDGE_SPREAD_S))))
        return False
