"""RemoteEngine: the facade a robot's control loop calls (edge.engine.Engine), over its parts.

It owns the lifecycle (start, stop, reset, pause, resume) and status (state, stats, records, transitions), and
wires the parts together: the handoff to the worker (edge.remote.handoff), the network worker and its session
(edge.remote.worker, edge.remote.session), the link state machine (edge.remote.link) and, on the control thread,
the fallback ladder (edge.remote.fallback). Invariant: `notify_observation` and `get_action` never do I/O.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from edge.engine import Action, Engine, EngineState, EngineStopped, register_engine
from edge.latency import LatencyTracker
from edge.queue import ActionQueue
from edge.remote.config import RemoteEngineConfig
from edge.remote.drive import Handle, WorkerPool
from edge.remote.fallback import FallbackLadder
from edge.remote.handoff import Handoff
from edge.remote.link import Link
from edge.remote.plan import ExecutionPlan, is_due
from edge.remote.worker import Worker

S = EngineState
_DEAD = S.DEAD

COUNTERS = (
    "requests",
    "chunks",
    "timeouts",
    "errors",
    "late_chunks",
    "superseded_seqs",
    "reconnects",
    "none_ticks",
    "fallback_ticks",
    "staleness_refusals",
    "discarded_chunks",
    "resets",
    "resets_acked",
    "replica_nudges",
    "rebalance_checks",
    "moves",
    "plan_warnings",
    "bad_chunks",
)


@register_engine("remote", RemoteEngineConfig)
class RemoteEngine(Engine):
    def __init__(
        self,
        config: RemoteEngineConfig,
        shutdown_event: threading.Event | None = None,
        connection=None,
        latency_override: Callable[[int], float] | None = None,
        pool: WorkerPool | None = None,
    ):
        """`pool`: run the network worker on this shared WorkerPool (a host of many engines) instead of a thread
        of its own (edge.remote.drive); the worker's code is the same."""
        if not config.client_uuid:
            config.client_uuid = f"robot-{uuid.uuid4().hex[:12]}"
        self.cfg = config
        self.latency_override = latency_override  # request seq -> seconds used instead of the rtt (parity tests)
        self.dt = 1.0 / config.fps
        self.shutdown_event = shutdown_event
        self.A = len(config.action_names)
        self.queue = ActionQueue(config.rtc_enabled, config.trim, action_dim=self.A)
        self.tracker = LatencyTracker(config.latency_window, config.latency_mode)
        self.counters = {k: 0 for k in COUNTERS}
        self._records: deque = deque(maxlen=20000)
        self._link = Link(config.client_uuid, shutdown_event)
        self._handoff = Handoff()
        self._worker = Worker(
            config,
            self.queue,
            self.tracker,
            self.counters,
            self._link,
            self._handoff,
            self._records,
            connection,
            latency_override,
        )
        self.control_timeouts = self._worker.session.control_timeouts  # the worker's; see edge.remote.session
        self._ladder = FallbackLadder(config, self.queue, self._link, self.counters)
        self._pool = pool
        self._thread: threading.Thread | Handle | None = None

    # --- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        link = self._link
        if self._handoff.stop.is_set() or link.state == S.DEAD:  # its session is closed: a new engine opens one
            raise EngineStopped("remote", link.state, link.dead_reason)
        if self._thread is not None:
            return
        w = self._worker
        w.replies.last_ok = time.monotonic()  # the offline clock starts now (anything from the server restarts it)
        w.replies.last_merged = w.replies.last_ok  # the DEGRADED clock (a merged chunk restarts it)
        link.fire("start", "start")
        name = f"remote-engine {self.cfg.client_uuid}"
        if self._pool is not None:
            self._thread = self._pool.spawn(w.steps(), name)
        else:
            self._thread = threading.Thread(target=w.run, name=name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        h = self._handoff
        h.stop.set()
        h.nudge.set()
        h.wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(5.0, self.cfg.request_timeout_s + 2))
        self._worker.session.close()
        self.queue.clear()  # the closed session's chunks are never executed (get_action checks stop as well)
        self._link.fire("stop", "stop")

    def reset(self) -> None:
        """Episode boundary: clear the queue, bump the episode; the worker sends the acked reset."""
        h = self._handoff
        self.queue.clear()
        with h.lock:  # an observation notified before the reset belongs to the finished episode
            h.episode += 1
            h.slot = None
        h.reset_pending = h.episode
        self._ladder.new_episode()
        self.counters["resets"] += 1
        h.wake.set()  # a worker waiting for the finished episode's chunk stops waiting too (see Worker.request)

    def pause(self) -> None:
        self._handoff.paused = True
        self._link.fire("pause", "pause")

    def resume(self) -> None:
        self._handoff.paused = False
        self._link.fire("resume" if self._worker.session.acked else "resume_unopened", "resume")
        self._handoff.wake.set()

    def step_once(self, timeout_s: float | None = None) -> str:
        """One request on the caller's thread (golden parity, tests): handshake if needed, send the latest
        observation, wait for its chunk. Never call it on an engine whose worker runs (start()); after stop() or
        DEAD it sends nothing ("stopped")."""
        if self._thread is not None:
            raise RuntimeError("step_once is for an engine driven by the caller; this one runs its worker")
        if self._handoff.stop.is_set() or self._link.state == S.DEAD:
            return "stopped"  # its session is closed: no new one (a driver's get_action must not raise)
        if self._link.state == S.STOPPED:
            self._worker.replies.last_ok = self._worker.replies.last_merged = time.monotonic()
            self._link.fire("step", "step_once")
        return self._worker.step(timeout_s)

    # --- control thread ----------------------------------------------------------------------------

    def notify_observation(self, obs: dict[str, Any]) -> None:
        h = self._handoff
        now = time.monotonic()
        # Taken on a tick whose action brings the queue to the buffer (or under it): a request may carry it.
        # One taken earlier may not: a worker that woke on a timer between two ticks would send an observation
        # up to a period old, and its chunk would land a tick later than the local `rtc` engine's (which infers
        # on the tick). The tick's own get_action follows, so the request leaves on the tick that reaches the
        # buffer, not one after it (a tick less of margin: with degraded_after_s = buffer_time_s every chunk
        # came late enough to flicker DEGRADED).
        # the queue as it stands on this tick, before its get_action: the request's prefix and index
        size, snapshot = self.queue.size_and_snapshot()
        due = is_due(size, self.dt, h.due_buffer_s)
        with h.lock:
            h.version += 1
            h.slot = (obs, now, h.version, h.episode, due, snapshot)
        if due and h.want_obs:  # the worker waits for exactly this; otherwise it sleeps on
            h.wake.set()

    def get_action(self) -> Action | None:
        # DEAD or stopped: nothing more from the queue, not even a queued chunk of the closed session
        closed = self._link.state == _DEAD or self._handoff.stop.is_set()
        return self._ladder.next_action(self._handoff.episode, closed, self._worker.session.session_id)

    # --- the plan ------------------------------------------------------------------------------------

    def delay_steps(self) -> int:
        """The delay estimate d in control steps (what each request ships as inference_delay_steps)."""
        return self._worker.delay_steps()

    def execution_plan(self) -> ExecutionPlan:
        """The request point for the delay measured now (edge.remote.plan.plan_execution); a plan that breaks RTC's
        d <= s <= H - d is logged once per (d, s, H)."""
        return self._worker.execution_plan()

    # --- status ----------------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._worker.ready and self._link.state not in (S.DEAD, S.STOPPED)

    @property
    def failed(self) -> bool:
        """DEAD, and said so: the visible state (set after dead_reason; the shutdown event follows at once)."""
        return self._link.visible == _DEAD

    @property
    def state(self) -> EngineState:
        return self._link.visible

    @property
    def last_error(self) -> str:
        return self._worker.replies.last_error

    @property
    def stats(self) -> dict[str, Any]:
        link = self._link
        m = self._worker.session.model  # read once: stop() may clear it meanwhile
        replica = m.replica if m is not None else None
        return {
            **self.counters,
            "state": link.visible.value,
            "time_in_state_s": link.time_in_state(),
            "qsize": self.queue.qsize(),
            "latency_max_s": self.tracker.max(),
            "session_id": self._worker.session.session_id(),
            "replica_id": replica.replica_id if replica is not None else "",
            "session_epoch": m.epoch if m is not None else 0,
            "dead_reason": link.dead_reason,
            "last_error": self.last_error,
        }

    def drain_records(self) -> list[dict]:
        out = []
        while self._records:
            out.append(self._records.popleft())
        return out

    def drain_transitions(self) -> list[tuple]:
        out = []
        transitions = self._link.transitions
        while transitions:
            out.append(transitions.popleft())
        return out
