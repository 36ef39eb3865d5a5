"""How a value is written in a cell of report.html: a dash for none, four significant digits for a float,
the percentiles of a summarized series."""

from __future__ import annotations

import html


def _v(x) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.4g}"
    if isinstance(x, dict):
        return ", ".join(f"{k} {_v(v)}" for k, v in x.items() if k in ("p50", "p95", "p99", "max"))
    return html.escape(str(x))
