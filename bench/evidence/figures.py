"""Figures of a finished run, computed from the records every shard and server wrote.

Owns the arithmetic behind every name in bench.scenario.catalog.FIGURES, for the whole fleet and for each
group. Invariant: only records of the measured window (t >= 0, t <= duration) count, except state
sequences, which include warmup so a robot's whole story is visible; every figure is computed by
exactly one function registered under its catalog name in `SCALARS` or `SERIES`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from bench.scenario.assertions import Figures
from bench.scenario.catalog import FIGURES
from bench.fleet.ticks import HOST_LATE, LATE, ON_TIME, TOO_LATE

FALLBACK_SOURCES = {"hold", "repeat_last", "zero", "fallback"}
POLICY_SOURCES = {"chunk", "queue", "policy"}
OK_OUTCOMES = {"ok", "chunk", "merged", "success"}


# the fault log's action for a replica or router that exited while no fault held it down (bench.run.runner)
UNPLANNED_EXIT = "unplanned_exit"


@dataclass
class RunData:
    """Numpy views of one run's records, plus what the runner observed directly."""

    robots: dict[str, np.ndarray]  # robot, group, site, fps, max_action_age_s, shard
    ticks: dict[str, np.ndarray]
    requests: dict[str, np.ndarray]
    transitions: dict[str, np.ndarray]
    episodes: dict[str, np.ndarray]
    loop: dict[str, np.ndarray]
    duration_s: float
    fault_windows: list[dict] = field(default_factory=list)  # chaos.timeline log: {t_start, t_end, target, action}
    server_samples: list[dict] = field(default_factory=list)  # {t, replica, metric, value}
    cpu_samples: list[dict] = field(default_factory=list)  # {t, host_percent, processes: {name: percent}}
    final_states: dict[int, str] = field(default_factory=dict)  # robot -> engine state at stop
    engine_raises: dict[int, int] = field(default_factory=dict)  # robot -> engine calls that raised (bench.fleet.shard)
    session_checkpoints: dict[str, str] = field(default_factory=dict)  # session_id -> checkpoint hash (audit)
    seam: dict[int, tuple] = field(default_factory=dict)  # robot -> seam_inputs(...) entry
    parity: dict[int, dict] = field(default_factory=dict)  # robot -> bench.fleet.parity counts (shadow groups)
    attacks: list[dict] = field(default_factory=list)  # bench.security.attacker outcome lines (runner-resolved)
    server_crashes: int = 0  # replicas found dead when the run stopped
    security_denials: list[dict] = field(default_factory=list)  # audit lines with outcome denied:<reason>
    leftovers: dict = field(default_factory=dict)  # bench.run.usage.Leftovers.end(): processes, /dev/shm, fds


def table_to_numpy(table) -> dict[str, np.ndarray]:
    """Columns as numpy arrays. A string column becomes an object array whose rows share one str per
    distinct value (a tick's `source`, `engine_state`, `session_id` repeat, so one str object per row would hold
    most of the report phase's memory on a long run: docs/results/, "Report memory")."""
    import pyarrow as pa

    out = {}
    for name in table.column_names:
        col = table.column(name)
        try:
            if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                enc = col.combine_chunks().dictionary_encode()
                values = enc.dictionary.to_numpy(zero_copy_only=False)
                codes = enc.indices.to_numpy(zero_copy_only=False)
                out[name] = values[codes] if not enc.null_count else \
                    np.where(enc.is_null().to_numpy(zero_copy_only=False), None, values[np.nan_to_num(codes).astype(int)])
            else:
                out[name] = col.to_numpy(zero_copy_only=False)
        except Exception:
            out[name] = np.asarray(col.to_pylist(), dtype=object)
    return out


class ScopeRows:
    """The rows of one scope of a record table, a column masked each time a figure reads it, never held: a scope
    that copied every column held ~80 B a robot-tick more in the report phase (figures read 9 of a tick's 16), and
    one that kept the columns read, ~40 B more than this (a mask of a million rows costs a few ms). Reads like the
    dict of columns it stands for (`get`, `[]`, `in`, `len`, `bool`)."""

    def __init__(self, tab: dict, mask: np.ndarray | None):
        self._tab, self._mask = tab, mask

    def get(self, name: str, default=None):
        if name not in self._tab:
            return default
        return self._tab[name] if self._mask is None else self._tab[name][self._mask]

    def __getitem__(self, name: str):
        if name not in self._tab:
            raise KeyError(name)
        return self.get(name)

    def __contains__(self, name) -> bool:
        return name in self._tab

    def __len__(self) -> int:
        return len(self._tab)

    def __iter__(self):
        return iter(self._tab)

    def keys(self):
        return self._tab.keys()

    def items(self):
        return ((k, self[k]) for k in self._tab)


class _Scope:
    """The records of one scope (all robots or one group), measured window only."""

    def __init__(self, data: RunData, robot_ids: np.ndarray | None):
        self.data = data
        self.robot_ids = robot_ids

        def pick(tab: dict, windowed: bool = True) -> dict | ScopeRows:
            if not tab or "robot" not in tab:
                return tab or {}
            mask = None if robot_ids is None else np.isin(tab["robot"], robot_ids)
            if windowed and "t" in tab:
                window = (tab["t"] >= 0) & (tab["t"] <= data.duration_s + 1e-9)
                mask = window if mask is None else mask & window
            return ScopeRows(tab, mask)

        self.ticks = pick(data.ticks)
        self.requests = pick(data.requests)
        self.transitions_all = pick(data.transitions, windowed=False)
        self.transitions = pick(data.transitions)
        self.episodes = pick(data.episodes)
        self._seam_cache: dict | None = None
        all_robots = data.robots.get("robot", np.empty(0, np.int32))
        self.robots = all_robots if robot_ids is None else np.intersect1d(all_robots, robot_ids)

    def col(self, tab: dict, name: str, dtype=float) -> np.ndarray:
        v = tab.get(name)
        return np.empty(0, dtype) if v is None else v

    @property
    def n_ticks(self) -> int:
        return len(self.col(self.ticks, "t"))


SCALARS: dict[str, Callable[[_Scope], float]] = {}
SERIES: dict[str, Callable[[_Scope], np.ndarray]] = {}


def scalar(name: str):
    assert name in FIGURES, name

    def deco(fn):
        SCALARS[name] = fn
        return fn
    return deco


def series(name: str):
    assert name in FIGURES, name

    def deco(fn):
        SERIES[name] = fn
        return fn
    return deco


def _ratio(a: float, b: float) -> float:
    return float(a) / float(b) if b else 0.0


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
    return int(sum(1 for r, sid, src in zip(s.col(s.ticks, "robot", np.int32), s.col(s.ticks, "session_id", object),
                                            s.col(s.ticks, "source", object))
                   if src == "chunk" and sid in hashes and hashes[sid] != first.get(int(r), hashes[sid])))


@scalar("staleness_violations")
def _staleness(s: _Scope) -> int:
    ages, bounds = _policy_action_ages(s)
    return int(np.count_nonzero(ages > bounds + 1e-6))


@scalar("max_action_age_s")
def _max_age(s: _Scope) -> float:
    ages, _ = _policy_action_ages(s)
    return float(ages.max()) if ages.size else math.nan


def _ok_requests(s: _Scope) -> np.ndarray:
    outcome = s.col(s.requests, "outcome", object)
    return np.isin(outcome, list(OK_OUTCOMES))


scalar("requests")(lambda s: len(s.col(s.requests, "t")))
# not errors: a request the server superseded with a newer one, or one an episode reset stopped waiting for
NOT_ERRORS = ["superseded", "abandoned"]
scalar("request_errors")(lambda s: int(np.count_nonzero(~_ok_requests(s) & ~np.isin(s.col(s.requests, "outcome", object), NOT_ERRORS))))
scalar("request_error_ratio")(lambda s: _ratio(SCALARS["request_errors"](s), SCALARS["requests"](s)))


def _goodput(s: _Scope, rtt: np.ndarray | None = None) -> tuple[int, int]:
    """(requests answered within their robot's deadline, requests answered); `rtt`: the round trips to judge
    (without_bench's, less the bench's share), else the recorded ones."""
    ok = _ok_requests(s)
    rtt = s.col(s.requests, "rtt_ms").astype(float) if rtt is None else rtt
    robots = s.col(s.requests, "robot", np.int32)
    deadline_by_robot = dict(zip(s.data.robots.get("robot", []), s.data.robots.get("deadline_s", [])))
    deadline_ms = np.array([deadline_by_robot.get(int(r), np.inf) for r in robots], float) * 1e3
    answered = ok & np.isfinite(rtt)
    return int(np.count_nonzero(answered & (rtt <= deadline_ms))), int(np.count_nonzero(answered))


scalar("goodput_requests")(lambda s: _goodput(s)[0])
scalar("goodput_ratio")(lambda s: _ratio(*_goodput(s)))


# The figure keeps its scenario-facing name `superseded` (assertions and sweeps say it); the count it sums is the
# wire's `superseded_seqs`, which the edge counter and the requests column carry under that same name.
@scalar("superseded")
def _superseded(s: _Scope) -> int:
    sup = s.col(s.requests, "superseded_seqs", np.int32)
    outcome = s.col(s.requests, "outcome", object)
    return int(np.count_nonzero(outcome == "superseded")) + int(np.nansum(np.clip(sup, 0, None)))


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


def _seam_result(s: _Scope) -> dict:
    """bench.evidence.seams over the scope's robots: each robot's executed runs, concatenated with an
    episode start at every run boundary so no difference spans two robots, episodes or None gaps."""
    if s._seam_cache is not None:
        return s._seam_cache
    from bench.evidence.seams import seam_metrics

    parts, seams, starts, offset = [], [], [], 0
    members = None if s.robot_ids is None else set(s.robot_ids.tolist())
    for r, (a, seam_ticks, run_starts) in s.data.seam.items():
        if members is not None and r not in members or not len(a):
            continue
        parts.append(a)
        seams.append(seam_ticks + offset)
        starts.append(run_starts + offset)
        offset += len(a)
    if not parts:
        s._seam_cache = {}
        return s._seam_cache
    width = max(p.shape[1] for p in parts)
    a = np.concatenate([p if p.shape[1] == width else np.pad(p, ((0, 0), (0, width - p.shape[1]))) for p in parts])
    s._seam_cache = seam_metrics(a, np.concatenate(seams), episode_starts=np.concatenate(starts))
    return s._seam_cache


def _seam(key: str):
    return lambda s: float(_seam_result(s).get(key, math.nan))


scalar("seam_step_p95")(_seam("seam_step_p95"))
scalar("seam_jerk_p95")(_seam("seam_jerk_p95"))
scalar("seam_step_ratio")(_seam("step_ratio"))
scalar("seam_jerk_ratio")(_seam("jerk_ratio"))


def _attack_count(*outcomes: str):
    return lambda s: float(sum(1 for a in s.data.attacks if a.get("outcome") in outcomes))


scalar("attacks")(lambda s: float(len(s.data.attacks)))
scalar("attack_attempts")(lambda s: float(sum(int(a.get("attempts", 0)) for a in s.data.attacks)))
scalar("attacks_denied")(_attack_count("denied"))
scalar("attacks_contained")(_attack_count("denied", "contained"))
scalar("attacks_breached")(_attack_count("breached"))
scalar("attack_errors")(_attack_count("error", "pending"))
scalar("server_crashes")(lambda s: float(s.data.server_crashes))
scalar("unplanned_exits")(lambda s: float(sum(1 for w in s.data.fault_windows if w.get("action") == UNPLANNED_EXIT)))
scalar("security_denials")(lambda s: float(sum(int(r.get("denied_count") or 1) for r in s.data.security_denials)))


def _server_max(s: _Scope, metric: str) -> float:
    vals = [x["value"] for x in s.data.server_samples if x["metric"] == metric and 0 <= x["t"] <= s.data.duration_s]
    return float(max(vals)) if vals else math.nan


scalar("server_load_max")(lambda s: _server_max(s, "load"))
scalar("server_queue_depth_max")(lambda s: _server_max(s, "queue_depth"))


@scalar("host_cpu_percent")
def _host_cpu(s: _Scope) -> float:
    vals = [x["host_percent"] for x in s.data.cpu_samples if 0 <= x["t"] <= s.data.duration_s]
    return float(np.mean(vals)) if vals else math.nan


@scalar("loop_overrun_ratio")
def _overrun(s: _Scope) -> float:
    lp = s.data.loop
    if not lp or not len(lp.get("t", [])):
        return math.nan
    m = (lp["t"] >= 0) & (lp["t"] <= s.data.duration_s)
    return _ratio(np.count_nonzero(lp["overrun"][m]), np.count_nonzero(m))


def _parity(key: str):
    def fn(s: _Scope) -> float:
        members = None if s.robot_ids is None else set(s.robot_ids.tolist())
        vals = [c.get(key, 0) for r, c in s.data.parity.items() if members is None or r in members]
        return float(sum(vals)) if vals else math.nan  # no shadow engine in scope: no data
    return fn


for _key in ("queue_checks", "queue_mismatches", "action_checks", "action_mismatches", "request_failures"):
    SCALARS[f"parity_{_key}"] = _parity(_key)


def _req_col(name: str):
    def fn(s: _Scope) -> np.ndarray:
        v = s.col(s.requests, name).astype(float)
        ok = _ok_requests(s)
        v = v[ok] if v.size == ok.size else v
        return v[np.isfinite(v)]
    return fn


for _name in ("rtt_ms", "inference_ms", "queue_wait_ms", "network_ms", "server_overhead_ms", "uplink_ms", "downlink_ms",
              "uplink_to_router_ms", "uplink_from_router_ms", "downlink_to_router_ms", "downlink_from_router_ms",
              "encode_ms", "send_lag_ms", "merge_lag_ms"):
    SERIES[_name] = _req_col(_name)
SERIES["delay_steps"] = lambda s: s.col(s.requests, "delay_steps").astype(float)

SERIES["execution_steps"] = lambda s: s.col(s.requests, "execution_steps").astype(float)
SERIES["action_age_s"] = lambda s: _policy_action_ages(s)[0]
SERIES["tick_lateness_ms"] = lambda s: s.col(s.ticks, "lateness_ms").astype(float)

# what the bench host added to a request's figure, per request (bench.evidence.replay, and the four hops split at
# the router: bench.evidence.fidelity.hop_excess, robot_hop_excess; NaN: not measured, taken as none): a series
# minus these is what it would read on hosts of its own
_HOPS = ("uplink_to_router_ms", "uplink_from_router_ms", "downlink_to_router_ms", "downlink_from_router_ms")
_UP, _DOWN = tuple(h[:-3] + "_bench_ms" for h in _HOPS[:2]), tuple(h[:-3] + "_bench_ms" for h in _HOPS[2:])
BENCH_PARTS = {"queue_wait_ms": ("queue_wait_bench_ms",), "inference_ms": ("inference_bench_ms",),
               **{hop: (hop[:-3] + "_bench_ms",) for hop in _HOPS},
               "uplink_ms": _UP, "downlink_ms": _DOWN, "network_ms": _UP + _DOWN,
               "rtt_ms": ("queue_wait_bench_ms", "inference_bench_ms") + _UP + _DOWN,
               "encode_ms": ("encode_bench_ms",)}


def _less_bench(s: _Scope, name: str, network_ms: float) -> np.ndarray:
    """Every request's `name` less its measured bench parts (one value a request, unfiltered)."""
    v = s.col(s.requests, name).astype(float)
    for part in BENCH_PARTS[name]:
        b = s.col(s.requests, part).astype(float)
        if b.size == v.size:
            v = v - np.nan_to_num(b, nan=0.0)
    if name in ("rtt_ms", "network_ms"):
        v = v - network_ms
    return v


def _without_bench(name: str, network_ms: float):
    def fn(s: _Scope) -> np.ndarray:
        v = _less_bench(s, name, network_ms)
        ok = _ok_requests(s)
        v = v[ok] if v.size == ok.size else v
        return v[np.isfinite(v)]
    return fn


def without_bench(data: RunData, top: Figures, network_ms: float = 0.0) -> Figures:
    """`top` (compute's) with the series of BENCH_PARTS less the bench's measured share per request, the round
    trip also less `network_ms` (the proxies' error, p50 up + down), and the goodput judged on those round
    trips: what an assertion would read had every process had a host of its own, as far as the bench measures
    its share. Every other figure is `top`'s."""
    def corrected(f: Figures, scope: _Scope) -> Figures:
        out = Figures(scalars=dict(f.scalars), series=dict(f.series), states=f.states)
        for name in BENCH_PARTS:
            out.series[name] = _without_bench(name, network_ms)(scope)
        good, answered = _goodput(scope, _less_bench(scope, "rtt_ms", network_ms))
        out.scalars["goodput_requests"], out.scalars["goodput_ratio"] = good, _ratio(good, answered)
        return out

    groups = data.robots.get("group", np.empty(0, object))
    robot_ids = data.robots.get("robot", np.empty(0, np.int32))
    out = corrected(top, _Scope(data, None))
    out.groups = {g: corrected(f, _Scope(data, robot_ids[groups == g])) for g, f in top.groups.items()}
    return out



def drift_windows(duration_s: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """The first and the last window a `_drift` figure compares: 5 minutes each, or a sixth of a shorter run."""
    w = min(300.0, duration_s / 6.0)
    return (0.0, w), (duration_s - w, duration_s)


@scalar("rtt_ms_p99_drift")
def _rtt_drift(s: _Scope) -> float:
    t = s.col(s.requests, "t").astype(float)
    rtt = s.col(s.requests, "rtt_ms").astype(float)
    ok = _ok_requests(s)
    if t.size != rtt.size or ok.size != rtt.size:
        return math.nan
    t, rtt = t[ok], rtt[ok]
    (a0, a1), (b0, b1) = drift_windows(s.data.duration_s)
    first = rtt[(t >= a0) & (t < a1) & np.isfinite(rtt)]
    last = rtt[(t > b0) & (t <= b1) & np.isfinite(rtt)]
    if not first.size or not last.size:
        return math.nan
    return float(np.percentile(last, 99) / np.percentile(first, 99) - 1.0)


scalar("leftover_processes")(lambda s: float(s.data.leftovers.get("leftover_processes", math.nan)))
scalar("leftover_shm")(lambda s: float(s.data.leftovers.get("leftover_shm", math.nan)))


def rss_growth_ratio(rss: list[float], warmup_fraction: float = 0.2, tail_fraction: float = 0.1) -> float:
    """How much a process grew after its warm-up: the median of its last `tail_fraction` of samples over the
    median of the `tail_fraction` right after the first `warmup_fraction`, minus 1. NaN below 10 samples."""
    n = len(rss)
    if n < 10:
        return math.nan
    k = max(1, int(n * tail_fraction))
    w = int(n * warmup_fraction)
    base = float(np.median(rss[w:w + k]))
    return round(float(np.median(rss[-k:])) / base - 1.0, 4) if base > 0 else math.nan


def process_samples(data: RunData) -> dict[str, list[tuple[float, float, int | None, int | None]]]:
    """Per process, its (t, rss_mb, fds, pid) samples in the measured window."""
    out: dict[str, list] = {}
    for x in data.cpu_samples:
        if not 0 <= x["t"] <= data.duration_s:
            continue
        for name, rss in (x.get("rss_mb") or {}).items():
            out.setdefault(name, []).append((x["t"], rss, (x.get("fds") or {}).get(name), (x.get("pids") or {}).get(name)))
    return out


def process_figures(data: RunData) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """(scalars, series) keyed `figure[process]`: rss_mb, open_fds, rss_growth_ratio and fds_growth of the last
    incarnation (a restarted replica is judged from its restart), and rss_growth_ratio_max."""
    scalars, series = {}, {}
    growth = {}
    for name, pts in process_samples(data).items():
        series[f"rss_mb[{name}]"] = np.array([p[1] for p in pts], float)
        series[f"open_fds[{name}]"] = np.array([p[2] for p in pts if p[2] is not None], float)
        last = [p for p in pts if p[3] == pts[-1][3]]
        g = rss_growth_ratio([p[1] for p in last])
        scalars[f"rss_growth_ratio[{name}]"] = growth[name] = g
        fds = [p[2] for p in last if p[2] is not None]
        scalars[f"fds_growth[{name}]"] = float(fds[-1] - fds[int(len(fds) * 0.2)]) if len(fds) >= 10 else math.nan
    judged = [v for n, v in growth.items() if n != "runner" and math.isfinite(v)]
    scalars["rss_growth_ratio_max"] = max(judged) if judged else math.nan
    return scalars, series


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


def compute(data: RunData) -> tuple[Figures, dict[str, dict]]:
    """(Figures for assertions, JSON-ready scalars per scope: {"all": {...}, "group:eu": {...}})."""
    groups = data.robots.get("group", np.empty(0, object))
    robot_ids = data.robots.get("robot", np.empty(0, np.int32))

    def figures_of(scope: _Scope) -> Figures:
        f = Figures()
        for name, fn in SCALARS.items():
            try:
                f.scalars[name] = fn(scope)
            except Exception as exc:  # one broken figure must not hide the others
                f.scalars[name] = math.nan
                f.scalars.setdefault("_errors", []).append(f"{name}: {exc!r}")  # type: ignore[arg-type]
        for name, fn in SERIES.items():
            f.series[name] = fn(scope)
        return f

    top = figures_of(_Scope(data, None))
    p_scalars, p_series = process_figures(data)  # the fleet's processes: no per-group view
    top.scalars.update(p_scalars)
    top.series.update(p_series)
    top.states["*"] = state_sequences(_Scope(data, None))
    for g in dict.fromkeys(groups.tolist()):
        scope = _Scope(data, robot_ids[groups == g])
        top.groups[g] = figures_of(scope)
        top.states[g] = state_sequences(scope)
    return top, top.groups


def summarize_series(values: np.ndarray) -> dict:
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    if not v.size:
        return {"count": 0, "p50": None, "p95": None, "p99": None, "max": None, "mean": None}
    return {"count": int(v.size), "p50": float(np.percentile(v, 50)), "p95": float(np.percentile(v, 95)),
            "p99": float(np.percentile(v, 99)), "max": float(v.max()), "mean": float(v.mean())}


def json_figures(f: Figures) -> dict:
    out = {}
    for name, v in f.scalars.items():
        if name.startswith("_"):
            out[name] = v
            continue
        v = float(v) if isinstance(v, (int, float, np.number)) else v
        if isinstance(v, float) and not math.isfinite(v):
            v = None if math.isnan(v) else "inf"
        elif isinstance(v, float) and v.is_integer() and FIGURES.get(name, ("", "", ""))[1] == "" and "ratio" not in name and "rate" not in name:
            v = int(v)
        out[name] = v
    for name, arr in f.series.items():
        out[name] = summarize_series(arr)
    return out


def seam_inputs(robots: np.ndarray, seqs: np.ndarray, episodes: np.ndarray, is_none: np.ndarray, actions: list,
                scale_by_robot: dict[int, np.ndarray]) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per robot (executed actions scaled by the action range, seam ticks, run starts) from tick
    records sorted by (robot, t). A run is a stretch of non-None ticks within one episode; a seam is
    a tick whose action comes from a different chunk (seq) than the tick before."""
    out = {}
    for r in np.unique(robots):
        idx = np.nonzero((robots == r) & ~is_none)[0]
        if len(idx) < 2:
            continue
        a = np.array([actions[i] for i in idx], dtype=float)
        scale = scale_by_robot.get(int(r))
        if scale is not None and len(scale) == a.shape[1]:
            a = a / np.where(scale > 0, scale, 1.0)
        seq, ep = seqs[idx], episodes[idx]
        gap = np.diff(idx) > 1
        new_run = np.concatenate([[True], gap | (ep[1:] != ep[:-1])])
        seam = np.concatenate([[False], (seq[1:] != seq[:-1]) & ~new_run[1:]])
        out[int(r)] = (a, np.nonzero(seam)[0], np.nonzero(new_run)[0])
    return out


def measured_seam_inputs(ticks: dict[str, np.ndarray], actions, scale_by_robot: dict[int, np.ndarray]) -> dict:
    """`seam_inputs` of the measured window's ticks (t >= 0) of tick columns sorted by (robot, t), without a
    filtered copy of them: a robot's warm-up is a prefix of its rows, so counting those rows as None leaves every
    run and seam as the filtered rows have them. `actions[i]` is row i's action."""
    skipped = np.asarray(ticks["is_none"], bool) | ~(ticks["t"] >= 0)
    return seam_inputs(ticks["robot"], ticks["seq"], ticks["robot_episode"], skipped, actions, scale_by_robot)


def baselines(groups, group_figures: dict, sites: dict | None = None) -> list[dict]:
    """summary.json's `baselines`: each `kind: local` group beside the remote group(s) it is the baseline of
    (its `seeds_of`, else every remote group of the same robot type and policy), with both task success
    rates and the gap (local − remote: what the network, router and server process cost in this run)."""
    out = []
    remote = [g for g in groups if getattr(g, "engine_kind", "remote") != "local"]
    for loc in groups:
        if getattr(loc, "engine_kind", "remote") != "local":
            continue
        twins = [g for g in remote if g.name == loc.seeds_of] if loc.seeds_of else \
            [g for g in remote if g.robot == loc.robot and g.policy == loc.policy]
        lf = group_figures.get(loc.name) or {}
        for g in twins:
            rf = group_figures.get(g.name) or {}
            a, b = lf.get("task_success_rate"), rf.get("task_success_rate")
            gap = a - b if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None
            site = (sites or {}).get(g.site)
            out.append({"local": loc.name, "remote": g.name, "site": g.site,
                        "profile": getattr(site, "profile", None), "paired_seeds": loc.seeds_of == g.name,
                        "task_success_local": a, "task_success_remote": b, "gap": gap,
                        "episodes_local": lf.get("episodes"), "episodes_remote": rf.get("episodes")})
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
    for t, robot, a, b, why in zip(transitions["t"], transitions["robot"], transitions["from_state"],
                                   transitions["to_state"], transitions["reason"]):
        key = (str(a), str(b), reason_class(why))
        g = groups.get(key)
        if g is None:
            groups[key] = g = [0, set(), float(t), float(t), str(why)]
        g[0] += 1
        g[1].add(int(robot))
        g[2], g[3] = min(g[2], float(t)), max(g[3], float(t))
    rows = [{"from": a, "to": b, "reason": kind, "example": g[4][:300], "changes": g[0], "robots": len(g[1]),
             "t_first": round(g[2], 2), "t_last": round(g[3], 2)} for (a, b, kind), g in groups.items()]
    rows.sort(key=lambda r: (r["to"] != "DEAD", -r["changes"]))
    return rows[:most]
