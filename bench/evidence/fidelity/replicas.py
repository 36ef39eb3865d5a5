"""Per replica: its forward pass in the run against its own unloaded forward at the same batch size,
measured when it started (read from its log), as figures and as a per-second series."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from bench.evidence.fidelity.rounding import _r

UNLOADED_RE = re.compile(r"unloaded forward ms by batch size: (\{.*\})")
SUSPECT_REFERENCE_RATIO = 0.8  # loaded passes at p50 this much faster than the replica's unloaded time at the same
# batch size: the reference, not the run, is off (an H100 replica's reference timed raw frames stacked on the host
# and the previous pass's GPU tail, its loaded passes neither: 0.65x at 64 sessions, the bench's share -11 ms at p50)


def unloaded_forward(log_path: Path) -> dict[int, float] | None:
    """A replica's own unloaded forward ms by batch size, from the first start's log line (server.service)."""
    try:
        with open(log_path, errors="replace") as f:
            for line in f:
                m = UNLOADED_RE.search(line)
                if m:
                    return {int(k): float(v) for k, v in json.loads(m.group(1)).items()}
    except OSError:
        return None
    return None


def _at_batch(ref: dict[int, float], b: np.ndarray) -> np.ndarray:
    """The unloaded time at batch size b: linear between measured sizes, extrapolated past the largest. A larger
    batch never runs faster, so the measured sizes are first read as their lower envelope from the right (each the
    fastest of it and every larger size: a size measured while a neighbour started up reads slow), and the slope
    past the largest is never below zero."""
    xs = np.array(sorted(ref), dtype=float)
    ys = np.minimum.accumulate(np.array([ref[int(x)] for x in xs])[::-1])[::-1]
    out = np.interp(b, xs, ys)
    if len(xs) >= 2:
        slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
        beyond = b > xs[-1]
        out[beyond] = ys[-1] + slope * (b[beyond] - xs[-1])
    return np.maximum(out, 1e-3)


def replica_figures(audit, unloaded: dict[str, dict | None], window_ms: tuple[float, float]) -> list[dict]:
    """Per replica of `unloaded`: its answered requests' forward pass (`audit`: bench.evidence.audit's table) in
    `window_ms` (runner's monotonic clock), against its own unloaded time at the same batch size."""
    replica, fwd_all, batch_all, mono, answered = _forward_columns(audit)
    in_window = answered & (window_ms[0] <= mono) & (mono <= window_ms[1])
    out = []
    for rid in sorted(unloaded):
        ref = unloaded[rid]
        rows = in_window & (replica == rid)
        n = int(rows.sum())
        row = {
            "replica": rid,
            "requests": n,
            "unloaded_ms": ref,
            "forward_ms_p50": None,
            "forward_ratio_p50": None,
            "forward_ratio_p99": None,
            "forward_excess_ms_p50": None,
        }
        if not ref:
            row["note"] = "no unloaded forward time in its log (warmup_inferences: 0?): not judged"
        elif n:
            fwd = fwd_all[rows]
            base = _at_batch(ref, batch_all[rows])
            ratio = fwd / base
            row.update(
                forward_ms_p50=_r(np.percentile(fwd, 50)),
                forward_ratio_p50=_r(np.percentile(ratio, 50)),
                forward_ratio_p99=_r(np.percentile(ratio, 99)),
                forward_excess_ms_p50=_r(np.percentile(fwd - base, 50)),
            )
        out.append(row)
    return out


def _forward_columns(audit):
    """replica, forward_ms, batch, mono_ms of every audit row, and which rows are answered requests that carry
    all three numbers (a batch of 0 or null: not a forward pass)."""
    from bench.evidence.audit import equals, floats, strings

    fwd, batch, mono = floats(audit, "forward_ms"), floats(audit, "batch"), floats(audit, "mono_ms")
    answered = equals(audit, "outcome", "ok") & ~np.isnan(fwd) & ~np.isnan(batch) & (batch != 0) & ~np.isnan(mono)
    return strings(audit, "replica"), fwd, batch, mono, answered


def forward_series(
    audit, unloaded: dict[str, dict | None], t0_ms: float, duration_s: float
) -> dict[str, tuple[list, list]]:
    """Per replica, per second of the run: the median forward / unloaded ratio (the report's figure)."""
    replica, fwd, batch, mono, answered = _forward_columns(audit)
    out = {}
    for rid, ref in unloaded.items():
        if not ref:
            continue
        rows = answered & (replica == rid)
        if not rows.any():
            continue
        t = (mono[rows] - t0_ms) / 1e3
        ratio = fwd[rows] / _at_batch(ref, batch[rows])
        m = (t >= 0) & (t <= duration_s)
        sec = np.floor(t[m]).astype(int)
        xs, ys = [], []
        for k in np.unique(sec):
            xs.append(float(k))
            ys.append(float(np.median(ratio[m][sec == k])))
        out[rid] = (xs, ys)
    return out
