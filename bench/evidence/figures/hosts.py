"""Figures of the fleet's processes at work: the servers' load and queue depth, the host's CPU, the shard
loop's overruns and the shadow engines' parity counts."""

from __future__ import annotations

import math

import numpy as np

from bench.evidence.figures.scope import SCALARS, _ratio, _Scope, scalar


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
