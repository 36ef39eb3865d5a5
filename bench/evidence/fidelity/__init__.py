"""The twin's own error: how far this run's bench host bent what the scenario asked for.

Owns `summary.json` → `fidelity`: per network leg (site x direction) the delay each site's proxy
applied against the delay its toxics asked (chaos.toxiproxy.fidelity) and the bandwidth it delivered
against the rate asked; per shard the host-late tick ratio, the loop overrun ratio and the worst
scheduler wait (slot wall time - its CPU time); per replica the forward pass against the same
replica's unloaded forward at the same batch size, measured when it started. Each figure is judged
against the scenario's `fidelity:` tolerances; `valid` is false when any is out, and `reasons` says
which, in a sentence naming the shard, leg or replica. Invariant: a figure that could not be measured
is reported as null with a note and never makes a run invalid.

One module per part: `legs`, `shards` (and the host's outside load), `replicas`, `share` (the bench's share
of each request's figures), `judge` (the reasons and the end-of-run table); `rounding` writes a figure down.
This module assembles them (`compute`) and re-exports what the runner and the report read.
"""

from __future__ import annotations

from bench.evidence.fidelity.judge import SHARE_PARTS, _pct, judge, table_lines
from bench.evidence.fidelity.legs import (
    LEG_DIRECTIONS,
    LEG_NAMES,
    MIN_SHAPED_S,
    LegErrorSeries,
    _percentile,
    leg_figures,
)
from bench.evidence.fidelity.replicas import (
    SUSPECT_REFERENCE_RATIO,
    UNLOADED_RE,
    _at_batch,
    _forward_columns,
    forward_series,
    replica_figures,
    unloaded_forward,
)
from bench.evidence.fidelity.rounding import _r
from bench.evidence.fidelity.shards import other_load, shard_figures
from bench.evidence.fidelity.share import (
    FAULT_SETTLE_S,
    HOP_FLOOR_MIN_REQUESTS,
    HOP_FLOOR_QUANTILE,
    ROBOT_HOPS,
    SERVER_HOPS,
    asked_around,
    bench_share,
    beyond_floor,
    encode_excess,
    hop_excess,
    near_faults,
    robot_hop_excess,
)

__all__ = [
    "FAULT_SETTLE_S",
    "HOP_FLOOR_MIN_REQUESTS",
    "HOP_FLOOR_QUANTILE",
    "LEG_DIRECTIONS",
    "LEG_NAMES",
    "MIN_SHAPED_S",
    "ROBOT_HOPS",
    "SERVER_HOPS",
    "SHARE_PARTS",
    "SUSPECT_REFERENCE_RATIO",
    "UNLOADED_RE",
    "LegErrorSeries",
    "_at_batch",
    "_forward_columns",
    "_pct",
    "_percentile",
    "_r",
    "asked_around",
    "beyond_floor",
    "bench_share",
    "compute",
    "encode_excess",
    "forward_series",
    "hop_excess",
    "judge",
    "leg_figures",
    "near_faults",
    "other_load",
    "replica_figures",
    "robot_hop_excess",
    "shard_figures",
    "table_lines",
    "unloaded_forward",
]


def compute(
    data,
    duration_s: float,
    tol: dict,
    proxy_legs: dict | None,
    audit,
    unloaded: dict[str, dict | None],
    window_ms: tuple[float, float],
    proxy_note: str | None = None,
    cores: int = 1,
    judge_drift: bool = False,
    queue_replay: list[dict] | None = None,
    hop_floors: dict[str, dict[str, float]] | None = None,
    robot_hops: dict[str, dict[str, dict]] | None = None,
    encode_floors: dict[str, float] | None = None,
) -> dict:
    """The `fidelity` mapping of summary.json. `proxy_legs`: site -> the proxy's window counters
    ({"edges_ms", "upstream", "downstream"}), None when the proxy cannot say (real Toxiproxy). `judge_drift`:
    the scenario asserts on a `_drift` figure, so the host's outside load in its two windows is judged."""
    legs = []
    for site, snap in sorted((proxy_legs or {}).items()):
        for d in ("upstream", "downstream"):
            if d in snap:
                legs.append(leg_figures(site, d, snap[d], snap.get("edges_ms") or [], tol))
    shards = shard_figures(data, duration_s) if data is not None else []
    replicas = replica_figures(audit, unloaded, window_ms)
    background = other_load(getattr(data, "cpu_samples", None), cores, duration_s) if data is not None else None
    reasons = judge(legs, shards, replicas, tol, background if judge_drift else None)
    out = {
        "valid": not reasons,
        "reasons": reasons,
        "tolerances": dict(tol),
        "legs": legs,
        "shards": shards,
        "replicas": replicas,
        "other_load": background,
        "bench_share": bench_share(
            proxy_legs,
            replicas,
            getattr(data, "requests", None),
            hop_floors,
            duration_s,
            robot_hops,
            encode_floors,
            getattr(data, "fault_windows", None),
        ),
        "queue_replay": list(queue_replay or []),
    }
    if proxy_note:
        out["note"] = proxy_note
    return out
