"""The records one figure reads: a run's records as numpy columns (`RunData`), one scope of them (the whole
fleet or one group, measured window only) and the registries every figure family adds its figures to.

Invariant: only records of the measured window (t >= 0, t <= duration) count, except state sequences, which
include warmup so a robot's whole story is visible; every figure is computed by exactly one function
registered under its catalog name in `SCALARS` or `SERIES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from bench.scenario.catalog import FIGURES

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
    moves: dict[int, int] = field(default_factory=dict)  # robot -> rebalancing moves of its engine
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
                out[name] = (
                    values[codes]
                    if not enc.null_count
                    else np.where(
                        enc.is_null().to_numpy(zero_copy_only=False), None, values[np.nan_to_num(codes).astype(int)]
                    )
                )
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
