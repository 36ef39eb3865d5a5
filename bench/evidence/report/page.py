"""The page frame of report.html: the head with its inline CSS, the title line with the verdict, then every
section of bench.evidence.report.sections in order; self-contained (inline SVG and CSS, no JS)."""

from __future__ import annotations

import html

from bench.evidence.report.outcome import RunOutcome
from bench.evidence.report.sections import SECTIONS

_CSS = """
body{font-family:sans-serif;margin:24px;color:#222;max-width:1200px}
h1{margin-bottom:4px} h2{border-bottom:1px solid #ddd;padding-bottom:3px;margin-top:28px}
.verdict{display:inline-block;padding:4px 12px;border-radius:4px;color:#fff;font-weight:bold}
.pass{background:#2ca02c}.fail{background:#d62728}.error{background:#7f7f7f}.inconclusive{background:#e6a100}
.banner{border:2px solid #e6a100;background:#fff6dd;padding:8px 12px;margin:10px 0}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right} th{background:#f4f4f4}
td.l,th.l{text-align:left} tr.bad td{background:#fde0e0} tr.good td{background:#e6f5e6}
.grid{display:flex;flex-wrap:wrap;gap:12px} .muted{color:#777;font-size:12px}
.legend span{display:inline-block;margin-right:10px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
pre{background:#f7f7f7;padding:8px;overflow:auto;font-size:12px}
"""


def render_html(o: RunOutcome, summary: dict) -> str:
    e = html.escape
    out = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{e(o.scenario_name)} – bench report</title>"
        f"<style>{_CSS}</style></head><body>"
    ]
    out.append(f"<h1>{e(o.scenario_name)} <span class='verdict {o.verdict}'>{o.verdict.upper()}</span></h1>")
    out.append(
        f"<p>{e(o.description)}</p><p class='muted'>started {e(o.started_utc)} UTC · {o.robots} robots · "
        f"{o.duration_s:g} s measured · wall {o.wall_s:.1f} s · camera {e(str(summary.get('camera_kind')))} · "
        f"inference emulated: {e(str(summary.get('inference_emulated')))} · {e(str(o.run_dir))}</p>"
    )
    for section in SECTIONS:
        out += section(o, summary)
    out.append("</body></html>")
    return "\n".join(out)
