"""The remote engine: the RTC loop with the thread boundary replaced by the network (design 9).

    control thread                          network worker (1 thread)                  Zenoh (its threads)
    notify_observation ──► slot (latest)    wait: qsize <= H - s (plan_execution),     action sub ──► inbox
    get_action ◄── ActionQueue ◄── merge ◄──   a new observation, active session       server token ──► lost flag
      staleness bound, fallback             idx_before + prefixes as on the obs's tick, delay
                                            encode JPEG ─► put obs ─► await chunk (timeout)
                                            accept only the outstanding seq of this epoch
                                            merge(ceil(rtt/dt), idx_before), tracker.add(rtt)

The package is cut along that pipeline, one module a stage:

    config.py    RemoteEngineConfig: each field's default, meaning and checks in one declaration; FIELD_DOCS
    handoff.py   what the control thread hands the worker: the latest observation, the episode, wake-ups
    plan.py      the execution plan: when to ask again, as pure functions of the measured delay
    link.py      the link state machine as a transition table, and the reconnect back-off
    session.py   the connection and the handshake that opens (and reopens) a session
    worker.py    the network worker: the run loop, when to ask, one request
    replies.py   the outstanding request and the chunks and events that answer it: merged or refused
    fallback.py  the fallback ladder get_action climbs down: fresh action, stale, STALLED's fallback
    engine.py    RemoteEngine, the facade (edge.engine.Engine) that wires them

Invariants (each kept in the module named):
- `get_action()` never does I/O, never raises for a network or server fault, holds locks for microseconds, and
  never returns an action whose source observation is older than `max_action_age_s` (fallback.py).
- A chunk is merged only if it answers the latest outstanding request of the current session epoch and episode
  and is sound (replies.py); a model other than the first one acknowledged is never executed (session.py: DEAD).
- DEAD is final, and is said (state, reason) before the shutdown event is set (link.py).
- Only monotonic clocks; no wall-clock instant crosses the wire.
"""

from __future__ import annotations

from edge.engine import ConfigError
from edge.remote.config import FIELD_DOCS, RemoteEngineConfig
from edge.remote.engine import RemoteEngine
from edge.remote.link import NUDGE_SPREAD_S, TRANSITIONS, Backoff, Link
from edge.remote.plan import ExecutionPlan, plan_execution

__all__ = [
    "FIELD_DOCS",
    "NUDGE_SPREAD_S",
    "TRANSITIONS",
    "Backoff",
    "ConfigError",
    "ExecutionPlan",
    "Link",
    "RemoteEngine",
    "RemoteEngineConfig",
    "plan_execution",
]
