"""The run's charts in report.html: the request latency CDF, late and None ticks per second, robots per
state, the per-robot state timelines and the servers' samples over time."""

from __future__ import annotations

import math

import numpy as np

from bench.evidence import svg
from bench.evidence.figures import RunData, _Scope, state_intervals


def _cdfs(d: RunData) -> str:
    req = d.requests
    if not req or not len(req.get("t", [])):
        return svg.empty_chart("Request latency CDF", "no requests recorded")
    m = (req["t"] >= 0) & (req["t"] <= d.duration_s)
    ok = np.isin(req["outcome"], ["ok", "chunk", "merged", "success"]) & m
    series = {k: req[k][ok] for k in ("rtt_ms", "network_ms", "queue_wait_ms", "inference_ms") if k in req}
    return svg.cdf_chart(series, "Request latency CDF", "ms (log scale)")


def _late_ticks_chart(d: RunData, windows) -> str:
    tk = d.ticks
    if not tk or not len(tk.get("t", [])):
        return svg.empty_chart("Late ticks per second", "no ticks recorded")
    t = tk["t"]
    m = (t >= 0) & (t <= d.duration_s)
    bins = np.arange(0, math.ceil(d.duration_s) + 1)
    lines = {}
    for name, cls in (("late (SUT)", 1), ("too late (SUT)", 2), ("host late", 3)):
        h, _ = np.histogram(t[m & (tk["tick_class"] == cls)], bins=bins)
        lines[name] = (bins[:-1], h)
    none = m & tk["is_none"].astype(bool)
    stalled = np.isin(tk.get("engine_state", np.full(len(t), "", object)), ["STALLED", "RECONNECTING", "DEAD"])
    for name, sel in (
        ("None ticks while stalled", none & stalled),
        ("gating (awaiting a first chunk)", none & ~stalled),
    ):
        h, _ = np.histogram(t[sel], bins=bins)
        lines[name] = (bins[:-1], h)
    return svg.line_chart(
        lines, "Late and None ticks per second", "time since t=0 (s)", "ticks / s", windows, x_range=(0, d.duration_s)
    )


def _timeline_rows(d: RunData) -> list[tuple[str, list]]:
    scope = _Scope(d, None)
    rows = []
    groups = d.robots.get("group", [])
    idx_in_group: dict[str, int] = {}
    for r, g in zip(d.robots.get("robot", []), groups):
        i = idx_in_group.get(g, 0)
        idx_in_group[g] = i + 1
        rows.append((f"{g}/{i}", state_intervals(scope, int(r), d.duration_s + 1e-6)))
    return rows


def _timelines(d: RunData, windows) -> str:
    rows = _timeline_rows(d)
    if not rows:
        return svg.empty_chart("Engine state per robot", "no robots")
    t0 = -min(5.0, max(0.0, -min((s[0][0] for _, s in rows if s), default=0.0)))
    return svg.state_timeline(rows, t0, d.duration_s, windows)


def _states_over_time(d: RunData, windows) -> str:
    rows = _timeline_rows(d)
    if not rows:
        return svg.empty_chart("Robots per state", "no robots")
    grid = np.arange(0, d.duration_s + 1e-9, max(d.duration_s / 300, 0.1))
    counts: dict[str, np.ndarray] = {}
    for _, segs in rows:
        for a, b, st in segs:
            c = counts.setdefault(st, np.zeros(len(grid)))
            c[(grid >= a) & (grid < b)] += 1
    order = [st for st in svg.STATE_COLORS if st in counts] + [st for st in counts if st not in svg.STATE_COLORS]
    return svg.line_chart(
        {k: (grid, counts[k]) for k in order},
        "Robots per engine state",
        "time since t=0 (s)",
        "robots",
        windows,
        width=900,
        x_range=(0, d.duration_s),
        colors=svg.STATE_COLORS,
    )


# the runner scrapes each replica once a second (bench.run.drive.scrape_servers): samples further apart than
# this are a replica that was down, restarting or unreachable, and its line breaks there
SCRAPE_GAP_S = 2.5


def _server_chart(d: RunData, metric: str, title: str, windows) -> str:
    by_replica: dict[str, list] = {}
    for s in d.server_samples:
        if s["metric"] == metric:
            by_replica.setdefault(s["replica"], []).append((s["t"], s["value"]))
    lines = {r: (np.array([a for a, _ in v]), np.array([b for _, b in v])) for r, v in sorted(by_replica.items())}
    lines = {r: (x[np.argsort(x, kind="stable")], y[np.argsort(x, kind="stable")]) for r, (x, y) in lines.items()}
    return svg.line_chart(
        lines,
        title,
        "time since t=0 (s)",
        metric,
        windows,
        x_range=(min(0.0, *[line[0].min() for line in lines.values()]) if lines else 0, d.duration_s),
        gap=SCRAPE_GAP_S,
    )
