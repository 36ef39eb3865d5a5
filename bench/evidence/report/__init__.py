"""The outputs of a run: summary.json (the contract), junit.xml, report.html.

Owns the shape of summary.json, which CI and users parse: keep keys additive. Invariant: the three
files are written for every run that got as far as a run directory, including runs that ended in
`error` (then with the error and whatever figures exist), so a reader always finds a verdict.

    summary.json  {scenario, verdict, exit_code, duration_s, robots, ticks, assertions[], figures{},
                   groups{}, latency_budget[], cpu{}, memory{}, camera_kind, inference_emulated, faults[],
                   engine_raises[],
                   cluster{}, clock{children, hop_split}, files{}}
    junit.xml     one <testcase> per assertion (failure/error with value and expression)
    report.html   self-contained: inline SVG, inline CSS, no JS

One module per output and part: `outcome` (RunOutcome, the verdict, the exit codes), `budget` (the latency
budget), `junit`, and report.html's `page` frame over its `sections`, `charts`, `fidelity` section and
`cells`. This module writes the three files and re-exports what the runner and the tests read.
"""

from __future__ import annotations

import html
import json
import math
import platform
from pathlib import Path

import numpy as np

from bench.evidence.report.budget import BUDGET_REFERENCE, BUDGET_SERIES, latency_budget
from bench.evidence.report.fidelity import (
    _fidelity_section,
    _forward_ratio_chart,
    _leg_error_chart,
    _sched_wait_chart,
    _shard_fidelity_chart,
)
from bench.evidence.report.junit import write_junit
from bench.evidence.report.outcome import RunOutcome, verdict_of
from bench.evidence.report.page import render_html
from bench.scenario.assertions import AssertionResult

__all__ = [
    "BUDGET_REFERENCE",
    "BUDGET_SERIES",
    "AssertionResult",
    "RunOutcome",
    "_fidelity_section",
    "_forward_ratio_chart",
    "_leg_error_chart",
    "_sched_wait_chart",
    "_shard_fidelity_chart",
    "latency_budget",
    "render_html",
    "summary_dict",
    "verdict_of",
    "write_all",
    "write_junit",
]


def write_all(o: RunOutcome) -> dict[str, Path]:
    o.run_dir.mkdir(parents=True, exist_ok=True)
    paths = {"summary": o.run_dir / "summary.json", "junit": o.run_dir / "junit.xml", "html": o.run_dir / "report.html"}
    summary = summary_dict(o)
    paths["summary"].write_text(json.dumps(summary, indent=2, default=_json_default) + "\n")
    write_junit(o, paths["junit"])
    try:
        paths["html"].write_text(render_html(o, summary))
    except Exception as exc:  # the HTML is a convenience; the contract files are already written
        paths["html"].write_text(
            f"<!doctype html><title>{html.escape(o.scenario_name)}</title>"
            f"<p>report rendering failed: {html.escape(repr(exc))}</p>"
        )
    return paths


def _json_default(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, Path):
        return str(v)
    return str(v)


def summary_dict(o: RunOutcome) -> dict:
    files = sorted(str(p.relative_to(o.run_dir)) for p in o.run_dir.rglob("*") if p.is_file())
    f = o.figures
    return {
        "scenario": o.scenario_name,
        "description": o.description,
        "verdict": o.verdict,
        "exit_code": o.exit_code,
        "error": o.error,
        "started_utc": o.started_utc,
        "wall_s": round(o.wall_s, 3),
        "duration_s": o.duration_s,
        "robots": o.robots,
        "ticks": f.get("ticks", 0),
        "assertions": [r.to_json() for r in o.assertions],
        "figures": f,
        "groups": o.group_figures,
        "group_engines": o.meta.get("group_engines", {}),
        "baselines": o.meta.get("baselines", []),
        "state_changes": o.meta.get("state_changes", []),
        "engine_raises": o.meta.get("engine_raises", []),
        "latency_budget": latency_budget(f, o.meta.get("fidelity")),
        "cpu": o.meta.get("cpu", {}),
        "memory": o.meta.get("memory", {}),
        "camera_kind": o.meta.get("camera_kind"),
        "inference_emulated": o.meta.get("inference_emulated"),
        "faults": o.meta.get("faults", []),
        "security": o.meta.get("security", {}),
        "chaos_proxy": o.meta.get("chaos_proxy", {}),
        "cluster": o.meta.get("cluster", {"kind": "local", "nodes": 1}),
        "clock": o.meta.get("clock", {}),
        "fidelity": o.meta.get("fidelity"),
        "shards": o.meta.get("shards"),
        "parity": o.meta.get("parity", {}),
        "processes": o.meta.get("processes", []),
        "host": {
            "cores": o.meta.get("cores"),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "loop_priority": o.meta.get("loop_priority", []),
            "replica_priority": o.meta.get("replica_priority", []),
            "speed_probe_ms": o.meta.get("speed_probe_ms", {}),
        },
        "files": files,
    }
