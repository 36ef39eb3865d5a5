"""Per shard, the bench host as the control loops met it: the host-late tick ratio, the loop overrun
ratio, the worst scheduler wait of a slot, and the host's load from outside the run in the windows a drift
compares."""

from __future__ import annotations

import numpy as np

from bench.evidence.fidelity.rounding import _r
from bench.fleet.ticks import HOST_LATE


def shard_figures(data, duration_s: float) -> list[dict]:
    """Per shard: host-late ticks / ticks, overrun slots / slots, worst (wall - cpu) of a slot, ms."""
    out = []
    ticks, robots, loop = data.ticks or {}, data.robots or {}, data.loop or {}
    shard_of = {}
    if len(robots.get("robot", [])) and "shard" in robots:
        shard_of = dict(zip(np.asarray(robots["robot"]).tolist(), np.asarray(robots["shard"]).tolist()))
    t_shard = None
    if len(ticks.get("robot", [])) and shard_of:
        tm = (ticks["t"] >= 0) & (ticks["t"] <= duration_s)
        t_shard = np.array([shard_of.get(int(r), -1) for r in ticks["robot"][tm]])
        t_class = np.asarray(ticks["tick_class"][tm])
    shards = sorted(set(shard_of.values()))
    lm = None
    if len(loop.get("t", [])) and "shard" in loop:
        lm = (loop["t"] >= 0) & (loop["t"] <= duration_s)
    for k in shards:
        row = {
            "shard": int(k),
            "ticks": 0,
            "host_late_ratio": None,
            "loop_overrun_ratio": None,
            "scheduler_wait_ms_max": None,
        }
        if t_shard is not None:
            mine = t_shard == k
            row["ticks"] = int(np.count_nonzero(mine))
            if row["ticks"]:
                row["host_late_ratio"] = _r(np.count_nonzero(t_class[mine] == HOST_LATE) / row["ticks"], 5)
        if lm is not None:
            m = lm & (loop["shard"] == k)
            slots = int(np.count_nonzero(m))
            if slots:
                row["loop_overrun_ratio"] = _r(np.count_nonzero(loop["overrun"][m]) / slots, 5)
                row["scheduler_wait_ms_max"] = _r(float(np.max(loop["wall_ms"][m] - loop["cpu_ms"][m])), 2)
        out.append(row)
    return out


def other_load(cpu_samples, cores: int, duration_s: float) -> dict | None:
    """The host's CPU used outside the run (host % minus the run's own processes, as % of all cores), mean over
    the first and the last window a `_drift` figure compares, and the shift between them (points of all cores).
    A drift of the run's latency between two windows whose background load differs measures the host."""
    from bench.evidence.figures import drift_windows

    (a0, a1), (b0, b1) = drift_windows(duration_s)
    first, last, probe_first, probe_last = [], [], [], []
    for x in cpu_samples or ():
        t = x.get("t")
        if t is None or x.get("host_percent") is None:
            continue
        other = max(0.0, x["host_percent"] - sum((x.get("processes") or {}).values()) / max(cores, 1))
        probe = x.get("speed_probe_ms")
        if a0 <= t < a1:
            first.append(other)
            if probe is not None:
                probe_first.append(probe)
        elif b0 < t <= b1:
            last.append(other)
            if probe is not None:
                probe_last.append(probe)
    if not first or not last:
        return None
    f, lst = float(np.mean(first)), float(np.mean(last))
    out = {
        "first_window_s": [_r(a0, 1), _r(a1, 1)],
        "last_window_s": [_r(b0, 1), _r(b1, 1)],
        "first_percent": _r(f, 1),
        "last_percent": _r(lst, 1),
        "shift": _r((lst - f) / 100.0, 3),
    }
    if probe_first and probe_last:  # the VM's own speed (the in-run speed probe, CPU time: higher is slower)
        # the mean, not the median: the VM flips between two speeds within seconds (bench.run.usage), and a
        # window's speed is its mix of them
        pf, pl = float(np.mean(probe_first)), float(np.mean(probe_last))
        out.update(probe_first_ms=_r(pf, 1), probe_last_ms=_r(pl, 1), probe_shift=_r(pl / pf - 1.0, 3))
    return out
