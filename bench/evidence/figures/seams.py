"""Figures of the seams between action chunks (bench.evidence.seams over a scope's executed runs) and the
per-robot seam inputs the collector builds from tick records."""

from __future__ import annotations

import math

import numpy as np

from bench.evidence.figures.scope import _Scope, scalar


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


def seam_inputs(
    robots: np.ndarray,
    seqs: np.ndarray,
    episodes: np.ndarray,
    is_none: np.ndarray,
    actions: list,
    scale_by_robot: dict[int, np.ndarray],
) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
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
