"""Figures of a finished run, computed from the records every shard and server wrote.

Owns the arithmetic behind every name in bench.scenario.catalog.FIGURES, for the whole fleet and for each
group. Invariant: only records of the measured window (t >= 0, t <= duration) count, except state
sequences, which include warmup so a robot's whole story is visible; every figure is computed by
exactly one function registered under its catalog name in `SCALARS` or `SERIES`.

Each family of figures is one module of this package, registering its figures when imported: `scope` (the
records a figure reads, the registries), `ticks`, `requests`, `states`, `seams`, `faults`, `hosts`, `soak`,
`balance`.
This module imports every family, so the registries are whole wherever `compute` is reached from.
"""

from __future__ import annotations

import math

import numpy as np

# every family registers its figures when imported
from bench.evidence.figures import balance, faults, hosts, requests, seams, soak, states, ticks  # noqa: F401
from bench.evidence.figures.requests import BENCH_PARTS, NOT_ERRORS, without_bench
from bench.evidence.figures.scope import (
    FALLBACK_SOURCES,
    OK_OUTCOMES,
    POLICY_SOURCES,
    SCALARS,
    SERIES,
    UNPLANNED_EXIT,
    RunData,
    ScopeRows,
    _Scope,
    scalar,
    series,
    table_to_numpy,
)
from bench.evidence.figures.seams import measured_seam_inputs, seam_inputs
from bench.evidence.figures.soak import drift_windows, process_figures, process_samples, rss_growth_ratio
from bench.evidence.figures.states import reason_class, state_changes, state_intervals, state_sequences
from bench.scenario.assertions import Figures
from bench.scenario.catalog import FIGURES

__all__ = [
    "BENCH_PARTS",
    "FALLBACK_SOURCES",
    "NOT_ERRORS",
    "OK_OUTCOMES",
    "POLICY_SOURCES",
    "SCALARS",
    "SERIES",
    "UNPLANNED_EXIT",
    "RunData",
    "ScopeRows",
    "_Scope",
    "baselines",
    "compute",
    "drift_windows",
    "json_figures",
    "measured_seam_inputs",
    "process_figures",
    "process_samples",
    "reason_class",
    "rss_growth_ratio",
    "scalar",
    "seam_inputs",
    "series",
    "state_changes",
    "state_intervals",
    "state_sequences",
    "summarize_series",
    "table_to_numpy",
    "without_bench",
]

# the registries in catalog order, whichever family registered a figure first: compute and summary.json follow it
for _registry in (SCALARS, SERIES):
    for _name in [n for n in FIGURES if n in _registry]:
        _registry[_name] = _registry.pop(_name)


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
    return {
        "count": int(v.size),
        "p50": float(np.percentile(v, 50)),
        "p95": float(np.percentile(v, 95)),
        "p99": float(np.percentile(v, 99)),
        "max": float(v.max()),
        "mean": float(v.mean()),
    }


def json_figures(f: Figures) -> dict:
    out = {}
    for name, v in f.scalars.items():
        if name.startswith("_"):
            out[name] = v
            continue
        v = float(v) if isinstance(v, (int, float, np.number)) else v
        if isinstance(v, float) and not math.isfinite(v):
            v = None if math.isnan(v) else "inf"
        elif (
            isinstance(v, float)
            and v.is_integer()
            and FIGURES.get(name, ("", "", ""))[1] == ""
            and "ratio" not in name
            and "rate" not in name
        ):
            v = int(v)
        out[name] = v
    for name, arr in f.series.items():
        out[name] = summarize_series(arr)
    return out


def baselines(groups, group_figures: dict, sites: dict | None = None) -> list[dict]:
    """summary.json's `baselines`: each `kind: local` group beside the remote group(s) it is the baseline of
    (its `seeds_of`, else every remote group of the same robot type and policy), with both task success
    rates and the gap (local − remote: what the network, router and server process cost in this run)."""
    out = []
    remote = [g for g in groups if getattr(g, "engine_kind", "remote") != "local"]
    for loc in groups:
        if getattr(loc, "engine_kind", "remote") != "local":
            continue
        twins = (
            [g for g in remote if g.name == loc.seeds_of]
            if loc.seeds_of
            else [g for g in remote if g.robot == loc.robot and g.policy == loc.policy]
        )
        lf = group_figures.get(loc.name) or {}
        for g in twins:
            rf = group_figures.get(g.name) or {}
            a, b = lf.get("task_success_rate"), rf.get("task_success_rate")
            gap = a - b if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None
            site = (sites or {}).get(g.site)
            out.append(
                {
                    "local": loc.name,
                    "remote": g.name,
                    "site": g.site,
                    "profile": getattr(site, "profile", None),
                    "paired_seeds": loc.seeds_of == g.name,
                    "task_success_local": a,
                    "task_success_remote": b,
                    "gap": gap,
                    "episodes_local": lf.get("episodes"),
                    "episodes_remote": rf.get("episodes"),
                }
            )
    return out
