"""Figures of the robots' engine states and episodes: reconnects, raises, dead and unrecovered robots, the
recovery after a fault window, episodes and task success, and the state sequences and changes a summary shows."""

from __future__ import annotations

import math
import re

import numpy as np

from bench.evidence.figures.scope import _Scope, scalar

scalar("reconnects")(lambda s: int(np.count_nonzero(s.col(s.transitions, "to_state", object) == "RECONNECTING")))


def _last_states(s: _Scope) -> dict[int, str]:
    out = {}
    tr = s.transitions_all
    if tr and len(tr.get("t", [])):
        order = np.argsort(tr["t"], kind="stable")
        for r, st in zip(tr["robot"][order], tr["to_state"][order]):
            out[int(r)] = st
    members = None if s.robot_ids is None else set(s.robot_ids.tolist())
    for r, st in s.data.final_states.items():
        if members is None or r in members:
            out[int(r)] = st
    return out


@scalar("engine_raises")
def _engine_raises(s: _Scope) -> int:
    members = None if s.robot_ids is None else set(s.robot_ids.tolist())
    return sum(n for r, n in s.data.engine_raises.items() if members is None or r in members)


@scalar("dead_robots")
def _dead(s: _Scope) -> int:
    last = _last_states(s)
    return sum(1 for r in s.robots if last.get(int(r)) == "DEAD")


@scalar("unrecovered_robots")
def _unrecovered(s: _Scope) -> int:
    last = _last_states(s)
    return sum(1 for r in s.robots if last.get(int(r)) != "STREAMING")


def state_intervals(s: _Scope, robot: int, end: float) -> list[tuple[float, float, str]]:
    tr = s.transitions_all
    if not tr or not len(tr.get("t", [])):
        return []
    m = tr["robot"] == robot
    ts, to = tr["t"][m], tr["to_state"][m]
    order = np.argsort(ts, kind="stable")
    ts, to = ts[order], to[order]
    out = []
    for i in range(len(ts)):
        t1 = ts[i + 1] if i + 1 < len(ts) else end
        out.append((float(ts[i]), float(t1), str(to[i])))
    return out


@scalar("recovered_within_s")
def _recovered_within(s: _Scope) -> float:
    """Worst (over fault windows and robots) time from a window's end until the robot streams."""
    if not s.data.fault_windows:
        return 0.0
    worst = 0.0
    end_of_run = s.data.duration_s
    for w in s.data.fault_windows:
        e = float(w["t_end"] if w.get("t_end") is not None else end_of_run)
        for r in s.robots:
            iv = state_intervals(s, int(r), end_of_run + 1e9)
            state_at_end = "STREAMING"
            for a, b, st in iv:
                if a <= e < b:
                    state_at_end = st
            if state_at_end == "STREAMING":
                continue
            back = next((a for a, _b, st in iv if a > e and st == "STREAMING"), None)
            if back is None:
                return math.inf
            worst = max(worst, back - e)
    return worst


@scalar("episodes")
def _episodes(s: _Scope) -> int:
    return len(s.col(s.episodes, "t"))


@scalar("task_success_rate")
def _success(s: _Scope) -> float:
    succ = s.col(s.episodes, "success", bool)
    return float(np.mean(succ.astype(float))) if succ.size else math.nan


def state_sequences(s: _Scope) -> list[list[str]]:
    out = []
    tr = s.transitions_all
    for r in s.robots:
        seq: list[str] = []
        if tr and len(tr.get("t", [])):
            m = tr["robot"] == r
            order = np.argsort(tr["t"][m], kind="stable")
            frm, to = tr["from_state"][m][order], tr["to_state"][m][order]
            if len(frm) and frm[0]:
                seq.append(str(frm[0]))
            for st in to:
                if not seq or seq[-1] != st:
                    seq.append(str(st))
        out.append(seq)
    return out


_REASON_IDS = re.compile(r"\b(?:robot-)?[0-9a-f]{12,}\b|\b[0-9a-f]{8}-[0-9a-f-]{27}\b")
_REASON_NUMBERS = re.compile(r"(?<![A-Za-z_])\d+(?:\.\d+)*")


def reason_class(reason: str) -> str:
    """A transition's reason with the ids and numbers that differ robot to robot taken out, so the reasons of a
    fleet group into a few kinds ("session 3f2a… on r1" and "session 9c0b… on r1" are one kind)."""
    text = _REASON_IDS.sub("<id>", str(reason or ""))
    return _REASON_NUMBERS.sub("N", text)[:300]


def state_changes(transitions: dict, most: int = 20) -> list[dict]:
    """summary.json's `state_changes`: every robot state change of the run (warm-up included), grouped by from,
    to and the kind of reason: how many changes and robots, and when the first and last were (s). The `most`
    commonest kinds, DEAD ones first; a fleet that collapses says why in a few lines."""
    if not transitions or not len(transitions.get("t", [])):
        return []
    groups: dict[tuple, list] = {}
    for t, robot, a, b, why in zip(
        transitions["t"],
        transitions["robot"],
        transitions["from_state"],
        transitions["to_state"],
        transitions["reason"],
    ):
        key = (str(a), str(b), reason_class(why))
        g = groups.get(key)
        if g is None:
            groups[key] = g = [0, set(), float(t), float(t), str(why)]
        g[0] += 1
        g[1].add(int(robot))
        g[2], g[3] = min(g[2], float(t)), max(g[3], float(t))
    rows = [
        {
            "from": a,
            "to": b,
            "reason": kind,
            "example": g[4][:300],
            "changes": g[0],
            "robots": len(g[1]),
            "t_first": round(g[2], 2),
            "t_last": round(g[3], 2),
        }
        for (a, b, kind), g in groups.items()
    ]
    rows.sort(key=lambda r: (r["to"] != "DEAD", -r["changes"]))
    return rows[:most]
