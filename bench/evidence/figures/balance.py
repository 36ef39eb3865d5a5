"""Figures of how the fleet's sessions spread over the replicas: the engines' rebalancing moves, the spread of
load across replicas at the end of the run, and how long a restarted or added replica takes to carry its share.

The spread and the share read the servers' scraped `active_sessions` and `load` (once a second per replica,
bench.run.drive.scrape_servers): the run's replicas are taken as one pool (a scenario whose replicas serve
several models judges them per model with its own assertions on `server_load_max` and the like).
"""

from __future__ import annotations

import math

import numpy as np

from bench.evidence.figures.scope import _Scope, scalar

FAIR_SHARE_FRACTION = 0.75  # "carries its share": at least this much of total sessions / replicas
END_WINDOW_S = 10.0  # the spread at the end: the last seconds of the measured window
# process faults after which a replica comes back (kill: with a duration) or joins (start: a scale-up)
RETURNING = ("restart", "restart_with", "kill", "start")


def _members(s: _Scope):
    return None if s.robot_ids is None else set(s.robot_ids.tolist())


@scalar("moves")
def _moves(s: _Scope) -> float:
    members = _members(s)
    return float(sum(n for r, n in s.data.moves.items() if members is None or r in members))


@scalar("max_moves_per_robot")
def _max_moves(s: _Scope) -> float:
    members = _members(s)
    vals = [n for r, n in s.data.moves.items() if members is None or r in members]
    return float(max(vals)) if vals else 0.0


def _per_second(s: _Scope, metric: str) -> dict[str, dict[int, float]]:
    """replica -> {second: value} of one scraped gauge (the last sample in each second)."""
    out: dict[str, dict[int, float]] = {}
    for x in s.data.server_samples:
        if x["metric"] == metric:
            out.setdefault(x["replica"], {})[int(math.floor(x["t"]))] = float(x["value"])
    return out


@scalar("replica_load_spread")
def _spread(s: _Scope) -> float:
    """Median over the last END_WINDOW_S seconds of (max - min) load across the replicas scraped in a second."""
    loads = _per_second(s, "load")
    if len(loads) < 2:
        return math.nan
    end = int(math.floor(s.data.duration_s))
    spreads = []
    for sec in range(max(0, end - int(END_WINDOW_S)), end + 1):
        vals = [v[sec] for v in loads.values() if sec in v]
        if len(vals) == len(loads):  # every replica answered in that second
            spreads.append(max(vals) - min(vals))
    return float(np.median(spreads)) if spreads else math.nan


def returns(s: _Scope) -> list[tuple[str, float]]:
    """(replica, second it was scraped again) for every replica that a fault took down and brought back, or
    started mid-run: its first sample at or after the fault's end (a restart or a start ends once the replica
    is ready; a kill with a duration at its restart)."""
    active = _per_second(s, "active_sessions")
    out = []
    for w in s.data.fault_windows:
        target, t_end = str(w.get("target") or ""), w.get("t_end")
        if not target.startswith("server:") or w.get("action") not in RETURNING or t_end is None:
            continue
        rid = target.split(":", 1)[1]
        seen = [sec for sec in sorted(active.get(rid, {})) if sec >= math.ceil(float(t_end))]
        if seen:
            out.append((rid, float(seen[0])))
    return out


@scalar("rejoin_s")
def _rejoin(s: _Scope) -> float:
    """Worst, over the replicas that returned or joined, of the seconds from their return until they held at
    least FAIR_SHARE_FRACTION of a fair share (total sessions / replicas scraped); inf if one never did."""
    active = _per_second(s, "active_sessions")
    back = returns(s)
    if not back:
        return math.nan
    worst = 0.0
    for rid, t_back in back:
        took = math.inf
        for sec in sorted(x for x in active.get(rid, {}) if x >= t_back):
            peers = [v[sec] for v in active.values() if sec in v]
            fair = sum(peers) / len(peers) if peers else 0.0
            if fair > 0 and active[rid][sec] >= FAIR_SHARE_FRACTION * fair:
                took = sec - t_back
                break
        worst = max(worst, took)
    return worst
