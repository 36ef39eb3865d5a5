"""Figures of the control ticks: how many ran on time, late or too late, which returned None or a fallback
(and which rung), and the age of the policy actions executed."""

from __future__ import annotations

import math

import numpy as np

from bench.evidence.figures.scope import FALLBACK_SOURCES, SERIES, _ratio, _Scope, scalar
from bench.fleet.ticks import HOST_LATE, LATE, ON_TIME, TOO_LATE


def _class_count(s: _Scope, cls: int) -> int:
    return int(np.count_nonzero(s.col(s.ticks, "tick_class", np.int8) == cls))


scalar("robots")(lambda s: len(s.robots))
scalar("duration_s")(lambda s: s.data.duration_s)
scalar("ticks")(lambda s: s.n_ticks)
scalar("on_time_ticks")(lambda s: _class_count(s, ON_TIME))
scalar("late_ticks")(lambda s: _class_count(s, LATE))
scalar("too_late_ticks")(lambda s: _class_count(s, TOO_LATE))
scalar("host_late_ticks")(lambda s: _class_count(s, HOST_LATE))
scalar("late_tick_ratio")(lambda s: _ratio(_class_count(s, LATE) + _class_count(s, TOO_LATE), s.n_ticks))
scalar("host_late_tick_ratio")(lambda s: _ratio(_class_count(s, HOST_LATE), s.n_ticks))


def _none_mask(s: _Scope) -> np.ndarray:
    return s.col(s.ticks, "is_none", bool).astype(bool)


def _fallback_mask(s: _Scope) -> np.ndarray:
    source = s.col(s.ticks, "source", object)
    state = s.col(s.ticks, "engine_state", object)
    is_fb = np.isin(source, list(FALLBACK_SOURCES))
    stalled_none = _none_mask(s) & np.isin(state, ["STALLED", "RECONNECTING", "DEAD"])
    return is_fb | stalled_none


def _gating_mask(s: _Scope) -> np.ndarray:
    """None ticks on a healthy link: waiting for a session's or an episode's first chunk, not a stall."""
    state = s.col(s.ticks, "engine_state", object)
    return _none_mask(s) & ~np.isin(state, ["STALLED", "RECONNECTING", "DEAD"])


scalar("none_ticks")(lambda s: int(np.count_nonzero(_none_mask(s))))
scalar("none_tick_ratio")(lambda s: _ratio(np.count_nonzero(_none_mask(s)), s.n_ticks))
scalar("gating_ticks")(lambda s: int(np.count_nonzero(_gating_mask(s))))
scalar("gating_tick_ratio")(lambda s: _ratio(np.count_nonzero(_gating_mask(s)), s.n_ticks))
scalar("fallback_ticks")(lambda s: int(np.count_nonzero(_fallback_mask(s))))


def _rung_ticks(s: _Scope, rung: str) -> int:
    """Ticks served by one rung of the fallback ladder: `hold` is None while STALLED/RECONNECTING/DEAD."""
    if rung == "hold":
        state = s.col(s.ticks, "engine_state", object)
        return int(np.count_nonzero(_none_mask(s) & np.isin(state, ["STALLED", "RECONNECTING", "DEAD"])))
    return int(np.count_nonzero(s.col(s.ticks, "source", object) == rung))


scalar("hold_ticks")(lambda s: _rung_ticks(s, "hold"))
scalar("repeat_last_ticks")(lambda s: _rung_ticks(s, "repeat_last"))
scalar("zero_ticks")(lambda s: _rung_ticks(s, "zero"))
scalar("fallback_tick_ratio")(lambda s: _ratio(np.count_nonzero(_fallback_mask(s)), s.n_ticks))


def _policy_action_ages(s: _Scope) -> tuple[np.ndarray, np.ndarray]:
    """(ages, bound) of ticks that executed a policy action (not None, not a fallback)."""
    ages = s.col(s.ticks, "action_age_s").astype(float)
    source = s.col(s.ticks, "source", object)
    keep = ~_none_mask(s) & ~np.isin(source, list(FALLBACK_SOURCES)) & np.isfinite(ages)
    robots = s.col(s.ticks, "robot", np.int32)[keep]
    bound_by_robot = dict(zip(s.data.robots.get("robot", []), s.data.robots.get("max_action_age_s", [])))
    bounds = np.array([bound_by_robot.get(int(r), np.inf) for r in robots], float) if len(robots) else np.empty(0)
    return ages[keep], bounds


@scalar("wrong_model_actions")
def _wrong_model(s: _Scope) -> int:
    """Chunk actions executed from a session whose checkpoint differs from the robot's first one."""
    hashes = s.data.session_checkpoints
    if not hashes:
        return 0
    first: dict[int, str] = {}  # the robot's first checkpoint, over the whole run (ticks sorted by robot, time)
    for r, sid in zip(s.col(s.data.ticks, "robot", np.int32), s.col(s.data.ticks, "session_id", object)):
        if sid in hashes:
            first.setdefault(int(r), hashes[sid])
    return int(
        sum(
            1
            for r, sid, src in zip(
                s.col(s.ticks, "robot", np.int32),
                s.col(s.ticks, "session_id", object),
                s.col(s.ticks, "source", object),
            )
            if src == "chunk" and sid in hashes and hashes[sid] != first.get(int(r), hashes[sid])
        )
    )


@scalar("staleness_violations")
def _staleness(s: _Scope) -> int:
    ages, bounds = _policy_action_ages(s)
    return int(np.count_nonzero(ages > bounds + 1e-6))


@scalar("max_action_age_s")
def _max_age(s: _Scope) -> float:
    ages, _ = _policy_action_ages(s)
    return float(ages.max()) if ages.size else math.nan


SERIES["action_age_s"] = lambda s: _policy_action_ages(s)[0]
SERIES["tick_lateness_ms"] = lambda s: s.col(s.ticks, "lateness_ms").astype(float)
