"""Figures of a long run's drift: the round trip's p99 drift, the processes and shared memory left over, and
each process's memory and descriptor growth after warm-up."""

from __future__ import annotations

import math

import numpy as np

from bench.evidence.figures.requests import _ok_requests
from bench.evidence.figures.scope import RunData, _Scope, scalar


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
    base = float(np.median(rss[w : w + k]))
    return round(float(np.median(rss[-k:])) / base - 1.0, 4) if base > 0 else math.nan


def process_samples(data: RunData) -> dict[str, list[tuple[float, float, int | None, int | None]]]:
    """Per process, its (t, rss_mb, fds, pid) samples in the measured window."""
    out: dict[str, list] = {}
    for x in data.cpu_samples:
        if not 0 <= x["t"] <= data.duration_s:
            continue
        for name, rss in (x.get("rss_mb") or {}).items():
            out.setdefault(name, []).append(
                (x["t"], rss, (x.get("fds") or {}).get(name), (x.get("pids") or {}).get(name))
            )
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
