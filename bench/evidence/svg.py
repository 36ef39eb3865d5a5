"""Tiny inline-SVG charts for report.html: line/CDF charts, state timelines, horizontal bars.

Owns drawing only (no figures are computed here). Invariant: every function returns one
self-contained ``<svg>`` string (no scripts, no external references) whose text is escaped.
"""

from __future__ import annotations

import html
import math

import numpy as np

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]
STATE_COLORS = {
    "CONNECTING": "#9ecae1",
    "STREAMING": "#31a354",
    "DEGRADED": "#fdae6b",
    "STALLED": "#e6550d",
    "RECONNECTING": "#756bb1",
    "DEAD": "#000000",
    "PAUSED": "#bdbdbd",
    "STOPPED": "#d9d9d9",
}
FAULT_FILL = "rgba(214,39,40,0.13)"

_esc = html.escape


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not math.isfinite(lo) or not math.isfinite(hi) or hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=raw)
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step) + 1)]


def _fmt(v: float) -> str:
    if abs(v) >= 1000 or v == int(v):
        return f"{v:.0f}"
    return f"{v:.3g}"


class _Frame:
    def __init__(self, width, height, x0, x1, y0, y1, logx=False, left=54, right=12, top=26, bottom=34):
        self.w, self.h = width, height
        self.left, self.right, self.top, self.bottom = left, right, top, bottom
        self.logx = logx
        if logx:
            x0, x1 = math.log10(max(x0, 1e-3)), math.log10(max(x1, 1e-3 * 1.01))
        self.x0, self.x1 = x0, x1 if x1 > x0 else x0 + 1
        self.y0, self.y1 = y0, y1 if y1 > y0 else y0 + 1

    def X(self, x):
        if self.logx:
            x = math.log10(max(x, 1e-3))
        return self.left + (x - self.x0) / (self.x1 - self.x0) * (self.w - self.left - self.right)

    def Y(self, y):
        return self.h - self.bottom - (y - self.y0) / (self.y1 - self.y0) * (self.h - self.top - self.bottom)

    def axes(self, title, xlabel, ylabel, yticks=None) -> list[str]:
        p = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.w}" height="{self.h}" '
            f'viewBox="0 0 {self.w} {self.h}" font-family="sans-serif" font-size="11">',
            f'<text x="{self.w / 2}" y="15" text-anchor="middle" font-weight="bold" font-size="12">{_esc(title)}</text>',
        ]
        xb, yb = self.h - self.bottom, self.left
        p.append(f'<line x1="{yb}" y1="{xb}" x2="{self.w - self.right}" y2="{xb}" stroke="#444"/>')
        p.append(f'<line x1="{yb}" y1="{self.top}" x2="{yb}" y2="{xb}" stroke="#444"/>')
        if self.logx:
            xt = [10**e for e in range(math.floor(self.x0), math.ceil(self.x1) + 1)]
        else:
            xt = _nice_ticks(self.x0, self.x1)
        for t in xt:
            x = self.X(t)
            if self.left - 1 <= x <= self.w - self.right + 1:
                p.append(
                    f'<line x1="{x:.1f}" y1="{xb}" x2="{x:.1f}" y2="{xb + 4}" stroke="#444"/>'
                    f'<text x="{x:.1f}" y="{xb + 15}" text-anchor="middle">{_fmt(t)}</text>'
                )
        for t in yticks if yticks is not None else _nice_ticks(self.y0, self.y1, 4):
            y = self.Y(t)
            p.append(
                f'<line x1="{yb}" y1="{y:.1f}" x2="{self.w - self.right}" y2="{y:.1f}" stroke="#eee"/>'
                f'<text x="{yb - 4}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>'
            )
        p.append(
            f'<text x="{(self.left + self.w - self.right) / 2}" y="{self.h - 4}" text-anchor="middle">{_esc(xlabel)}</text>'
        )
        p.append(
            f'<text x="12" y="{(self.top + xb) / 2}" text-anchor="middle" transform="rotate(-90 12 {(self.top + xb) / 2})">{_esc(ylabel)}</text>'
        )
        return p


def _legend(names: list[str], colors: list[str], x: float, y: float) -> list[str]:
    out = []
    for i, (n, c) in enumerate(zip(names, colors)):
        out.append(
            f'<rect x="{x}" y="{y + i * 14 - 8}" width="10" height="10" fill="{c}"/>'
            f'<text x="{x + 14}" y="{y + i * 14 + 1}">{_esc(n)}</text>'
        )
    return out


def cdf_chart(series: dict[str, np.ndarray], title: str, xlabel: str, width=520, height=260, logx=True) -> str:
    data = {k: np.sort(np.asarray(v, float)[np.isfinite(np.asarray(v, float))]) for k, v in series.items()}
    data = {k: v for k, v in data.items() if v.size}
    if not data:
        return empty_chart(title, "no data", width, height)
    lo = min(max(v[0], 0.01) for v in data.values())
    hi = max(v[-1] for v in data.values())
    f = _Frame(width, height, lo, hi * 1.05, 0, 1, logx=logx)
    p = f.axes(title, xlabel, "fraction ≤ x", yticks=[0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0])
    for i, (_name, v) in enumerate(data.items()):
        n = v.size
        idx = np.unique(np.linspace(0, n - 1, min(n, 400)).astype(int))
        pts = " ".join(f"{f.X(v[j]):.1f},{f.Y((j + 1) / n):.1f}" for j in idx)
        p.append(f'<polyline fill="none" stroke="{PALETTE[i % len(PALETTE)]}" stroke-width="1.6" points="{pts}"/>')
    p += _legend(
        [f"{k} (p99 {np.percentile(v, 99):.1f})" for k, v in data.items()],
        [PALETTE[i % len(PALETTE)] for i in range(len(data))],
        f.left + 10,
        f.top + 10,
    )
    p.append("</svg>")
    return "\n".join(p)


def segments(x: np.ndarray, y: np.ndarray, gap: float | None, max_points: int = 1500) -> list[tuple]:
    """The runs of a series to draw as lines: split at every non-finite y and, with `gap`, where consecutive x
    lie more than `gap` apart; thinned to `max_points` in all (a break between thinned points is kept)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if not len(x):
        return []
    ok = np.isfinite(y)
    new = np.ones(len(x), bool)
    new[1:] = ~ok[:-1]
    if gap is not None:
        new[1:] |= np.diff(x) > gap
    seg = np.cumsum(new)[ok]
    x, y = x[ok], y[ok]
    if len(x) > max_points:
        k = np.unique(np.linspace(0, len(x) - 1, max_points).astype(int))
        x, y, seg = x[k], y[k], seg[k]
    cuts = np.flatnonzero(np.diff(seg)) + 1
    return list(zip(np.split(x, cuts), np.split(y, cuts)))


def line_chart(
    lines: dict[str, tuple[np.ndarray, np.ndarray]],
    title: str,
    xlabel: str,
    ylabel: str,
    windows: list[tuple[float, float, str]] = (),
    width=520,
    height=240,
    x_range=None,
    colors: dict[str, str] | None = None,
    gap: float | None = None,
) -> str:
    """One polyline per series; a series breaks (no line drawn) at a non-finite y and, with `gap`, wherever
    consecutive x are more than `gap` apart: what was not measured is not drawn. A lone point is a dot."""
    lines = {k: (np.asarray(x, float), np.asarray(y, float)) for k, (x, y) in lines.items() if len(x)}
    if not lines:
        return empty_chart(title, "no data", width, height)
    xs = np.concatenate([x for x, _ in lines.values()])
    ys = np.concatenate([y for _, y in lines.values()])
    ys = ys[np.isfinite(ys)]
    x0, x1 = x_range or (float(xs.min()), float(xs.max()))
    legend_w = 8 + 7 * max(len(k) for k in lines) + 16
    f = _Frame(width, height, x0, x1, 0, float(ys.max()) * 1.1 if ys.size and ys.max() > 0 else 1, right=12 + legend_w)
    p = f.axes(title, xlabel, ylabel)
    p += _windows(f, windows)
    color = [(colors or {}).get(name, PALETTE[i % len(PALETTE)]) for i, name in enumerate(lines)]
    for i, (_name, (x, y)) in enumerate(lines.items()):
        for sx, sy in segments(x, y, gap):
            if len(sx) == 1:
                p.append(f'<circle cx="{f.X(sx[0]):.1f}" cy="{f.Y(sy[0]):.1f}" r="1.6" fill="{color[i]}"/>')
                continue
            pts = " ".join(f"{f.X(a):.1f},{f.Y(b):.1f}" for a, b in zip(sx, sy))
            p.append(f'<polyline fill="none" stroke="{color[i]}" stroke-width="1.4" points="{pts}"/>')
    p += _legend(list(lines), color, f.w - legend_w, f.top + 10)
    p.append("</svg>")
    return "\n".join(p)


def _windows(f: _Frame, windows) -> list[str]:
    out = []
    for a, b, label in windows:
        xa, xb = f.X(a), f.X(max(b, a + (f.x1 - f.x0) / 300))
        out.append(
            f'<rect x="{xa:.1f}" y="{f.top}" width="{max(xb - xa, 1.5):.1f}" height="{f.h - f.top - f.bottom}" '
            f'fill="{FAULT_FILL}"><title>{_esc(label)}</title></rect>'
            f'<text x="{xa + 2:.1f}" y="{f.top + 9}" font-size="9" fill="#a00">{_esc(label[:28])}</text>'
        )
    return out


def state_timeline(
    rows: list[tuple[str, list[tuple[float, float, str]]]],
    t0: float,
    t1: float,
    windows: list[tuple[float, float, str]] = (),
    width=900,
    row_h: float | None = None,
    title="Engine state per robot",
) -> str:
    """One row per robot, coloured by engine state; fault windows shaded across all rows (Jepsen style)."""
    n = max(len(rows), 1)
    row_h = row_h or max(1.0, min(10.0, 600.0 / n))
    label_w = 90 if row_h >= 7 else 60
    height = int(40 + n * row_h + 40)
    f = _Frame(width, height, t0, t1, 0, 1, left=label_w, top=26, bottom=40)
    p = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'font-family="sans-serif" font-size="10">',
        f'<text x="{width / 2}" y="15" text-anchor="middle" font-weight="bold" font-size="12">{_esc(title)}</text>',
    ]
    previous_group = None
    for i, (label, segs) in enumerate(rows):
        y = f.top + i * row_h
        group = label.split("/")[0]
        if row_h < 7 and group != previous_group:  # rows too thin to label: name each group once
            p.append(
                f'<line x1="{label_w - 4}" y1="{y:.1f}" x2="{width - f.right}" y2="{y:.1f}" stroke="#fff" stroke-width="1"/>'
                f'<text x="{label_w - 4}" y="{y + 10:.1f}" text-anchor="end">{_esc(group)}</text>'
            )
        previous_group = group
        for a, b, st in segs:
            a, b = max(a, t0), min(b, t1)
            if b <= a:
                continue
            p.append(
                f'<rect x="{f.X(a):.1f}" y="{y:.1f}" width="{max(f.X(b) - f.X(a), 0.5):.1f}" '
                f'height="{max(row_h - (0.5 if row_h > 2 else 0), 0.8):.1f}" fill="{STATE_COLORS.get(st, "#888")}"/>'
            )
        if row_h >= 7:
            p.append(f'<text x="{label_w - 4}" y="{y + row_h - 1:.1f}" text-anchor="end">{_esc(label)}</text>')
    bottom = f.top + n * row_h
    for a, b, label in windows:
        xa, xb = f.X(max(a, t0)), f.X(min(max(b, a + (t1 - t0) / 300), t1))
        p.append(
            f'<rect x="{xa:.1f}" y="{f.top - 4}" width="{max(xb - xa, 1.5):.1f}" height="{bottom - f.top + 8:.1f}" '
            f'fill="{FAULT_FILL}" stroke="#d62728" stroke-dasharray="3,2"><title>{_esc(label)}</title></rect>'
        )
    for t in _nice_ticks(t0, t1, 8):
        x = f.X(t)
        p.append(
            f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 4}" stroke="#444"/>'
            f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">{_fmt(t)}</text>'
        )
    p.append(f'<text x="{(label_w + width) / 2}" y="{bottom + 26}" text-anchor="middle">time since t=0 (s)</text>')
    # the states' legend is in the report's HTML beside the chart, not drawn here
    p.append("</svg>")
    return "\n".join(p)


def hbar_chart(items: list[tuple[str, float]], title: str, unit: str, width=520, bar_h=18) -> str:
    if not items:
        return empty_chart(title, "no data", width, 80)
    height = 30 + len(items) * (bar_h + 6) + 10
    vmax = max(v for _, v in items) or 1
    label_w = 170
    p = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<text x="{width / 2}" y="15" text-anchor="middle" font-weight="bold" font-size="12">{_esc(title)}</text>',
    ]
    for i, (label, v) in enumerate(items):
        y = 26 + i * (bar_h + 6)
        w = (width - label_w - 70) * (v / vmax)
        p.append(
            f'<text x="{label_w - 6}" y="{y + bar_h - 5}" text-anchor="end">{_esc(label)}</text>'
            f'<rect x="{label_w}" y="{y}" width="{max(w, 0.5):.1f}" height="{bar_h}" fill="{PALETTE[i % len(PALETTE)]}"/>'
            f'<text x="{label_w + w + 4:.1f}" y="{y + bar_h - 5}">{v:.1f} {_esc(unit)}</text>'
        )
    p.append("</svg>")
    return "\n".join(p)


def empty_chart(title: str, message: str, width=520, height=120) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'font-family="sans-serif" font-size="12"><text x="{width / 2}" y="18" text-anchor="middle" font-weight="bold">'
        f'{_esc(title)}</text><text x="{width / 2}" y="{height / 2 + 6}" text-anchor="middle" fill="#888">{_esc(message)}'
        f'</text></svg>'
    )
