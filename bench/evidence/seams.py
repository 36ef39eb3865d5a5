"""Seam smoothness: how much a robot's command jumps where one action chunk hands over to the next.

Input is what the robot actually executed, one row per tick, plus the ticks at which a new chunk
started executing (its first action ran at that tick). A seam step is |a_t - a_{t-1}| at such a
tick; a within step is the same difference anywhere else. Jerk is the third difference
|a_t - 3a_{t-1} + 3a_{t-2} - a_{t-3}|, counted as a seam jerk when its stencil straddles a seam.
Differences never span an episode start. Norms are L2 over action dimensions, after dividing each
dimension by `scale` (e.g. the action range) so joints and velocities weigh alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _summary(values: np.ndarray, prefix: str) -> dict[str, float]:
    if values.size == 0:
        return {f"{prefix}_median": float("nan"), f"{prefix}_p95": float("nan"), f"{prefix}_count": 0}
    return {
        f"{prefix}_median": float(np.median(values)),
        f"{prefix}_p95": float(np.percentile(values, 95)),
        f"{prefix}_count": int(values.size),
    }


def seam_metrics(
    actions: np.ndarray,
    seam_ticks: Sequence[int] | np.ndarray,
    *,
    episode_starts: Sequence[int] | np.ndarray = (0,),
    scale: np.ndarray | None = None,
) -> dict[str, float]:
    """Medians and p95 of step size and jerk at seams vs within chunks.

    Keys: seam_step_*, within_step_*, seam_jerk_*, within_jerk_* (each _median, _p95, _count) and
    step_ratio / jerk_ratio = seam median / within median (1.0 = seams are invisible; NaN when
    either side is empty; inf when within-chunk motion is perfectly constant but seams are not).
    """
    a = np.asarray(actions, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    if scale is not None:
        a = a / np.asarray(scale, dtype=np.float64)
    n = len(a)
    seam = np.zeros(n, dtype=bool)
    seams = np.asarray(seam_ticks, dtype=np.int64)
    seam[seams[(seams > 0) & (seams < n)]] = True

    # Position of each tick within its episode: a k-th difference at t is valid only if the
    # k previous ticks belong to the same episode.
    ticks = np.arange(n)
    starts = np.unique(np.concatenate([[0], np.asarray(episode_starts, dtype=np.int64)]))
    since_start = ticks - starts[np.searchsorted(starts, ticks, side="right") - 1]
    seam[since_start == 0] = False  # an episode's first chunk has nothing to be continuous with

    step = np.full(n, np.nan)
    step[1:] = row_norms(a[1:] - a[:-1])
    step_valid = since_start >= 1

    jerk = np.full(n, np.nan)
    jerk[3:] = row_norms(a[3:] - 3 * a[2:-1] + 3 * a[1:-2] - a[:-3])
    jerk_valid = since_start >= 3
    # The stencil t-3..t straddles a seam s when it holds both a_{s-1} and a_s: s in [t-2, t].
    seam_in_stencil = seam.copy()
    seam_in_stencil[1:] |= seam[:-1]
    seam_in_stencil[2:] |= seam[:-2]

    out: dict[str, float] = {"seams": int(seam.sum()), "ticks": n}
    out |= _summary(step[step_valid & seam], "seam_step")
    out |= _summary(step[step_valid & ~seam], "within_step")
    out |= _summary(jerk[jerk_valid & seam_in_stencil], "seam_jerk")
    out |= _summary(jerk[jerk_valid & ~seam_in_stencil], "within_jerk")
    out["step_ratio"] = _ratio(out["seam_step_median"], out["within_step_median"])
    out["jerk_ratio"] = _ratio(out["seam_jerk_median"], out["within_jerk_median"])
    return out


def row_norms(d: np.ndarray) -> np.ndarray:
    """Each row's L2 norm of a float array of differences, exactly as `np.linalg.norm(d, axis=1)` computes it
    (the square root of the row sums of d * d), squaring `d` in place: norm holds two more arrays of d's size (its
    conjugate and the product), a run's worth of actions in the report phase. `d` is overwritten."""
    np.multiply(d, d, out=d)
    return np.sqrt(np.add.reduce(d, axis=(1,)))


def _ratio(seam: float, within: float) -> float:
    if np.isnan(seam) or np.isnan(within):
        return float("nan")
    if within == 0:
        return float("inf") if seam > 0 else 1.0
    return seam / within
