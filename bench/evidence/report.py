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
"""

from __future__ import annotations

import html
import json
import math
import platform
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.evidence import svg
from bench.evidence.exitcode import Exit
from bench.scenario.assertions import AssertionResult
from bench.scenario.catalog import FIGURES
from bench.evidence.figures import RunData, state_intervals, _Scope


# Design section 11 (Pi0-class reference), shown beside the measured budget.
BUDGET_REFERENCE = {
    "client encode": ("2-9 ms", "2-9 ms"),
    "network (up + down + server overhead)": ("~4 ms", "~81 ms"),
    "uplink (tx + 1/2 RTT)": ("~2 ms", "~54 ms"),
    "uplink: robot -> router": ("most of the uplink", "most of the uplink"),
    "uplink: router -> server": ("< 1 ms (one LAN hop)", "< 1 ms (one LAN hop)"),
    "downlink (+ 1/2 RTT)": ("~2 ms", "~27 ms"),
    "downlink: server -> router": ("< 1 ms (one LAN hop)", "< 1 ms (one LAN hop)"),
    "downlink: router -> robot": ("most of the downlink", "most of the downlink"),
    "server queue wait": ("0 - 1x inference", "0 - 1x inference"),
    "inference": ("15-150 ms", "15-150 ms"),
    "server overhead (batching, reply send)": ("~0", "~0"),  # the design has no row: part of network_ms
    "total (rtt)": ("~110-175 ms", "~190-250 ms"),
    # outside the round trip, on the robot: its own computer runs one engine (the design has no row for them)
    "robot: observation -> send (outside the rtt)": ("~0", "~0"),
    "robot: arrival -> merge (outside the rtt)": ("~0", "~0"),
}
BUDGET_SERIES = [("client encode", "encode_ms"), ("network (up + down + server overhead)", "network_ms"),
                 ("uplink (tx + 1/2 RTT)", "uplink_ms"), ("uplink: robot -> router", "uplink_to_router_ms"),
                 ("uplink: router -> server", "uplink_from_router_ms"), ("downlink (+ 1/2 RTT)", "downlink_ms"),
                 ("downlink: server -> router", "downlink_to_router_ms"),
                 ("downlink: router -> robot", "downlink_from_router_ms"),
                 ("server queue wait", "queue_wait_ms"), ("inference", "inference_ms"),
                 ("server overhead (batching, reply send)", "server_overhead_ms"), ("total (rtt)", "rtt_ms"),
                 ("robot: observation -> send (outside the rtt)", "send_lag_ms"),
                 ("robot: arrival -> merge (outside the rtt)", "merge_lag_ms")]


@dataclass
class RunOutcome:
    scenario_name: str
    description: str
    run_dir: Path
    verdict: str
    started_utc: str
    wall_s: float
    duration_s: float
    robots: int
    assertions: list[AssertionResult] = field(default_factory=list)
    figures: dict = field(default_factory=dict)
    group_figures: dict = field(default_factory=dict)
    data: RunData | None = None
    meta: dict = field(default_factory=dict)
    error: str | None = None

    @property
    def exit_code(self) -> int:
        return Exit.of(self.verdict)


def verdict_of(results: list[AssertionResult], error: str | None, fidelity: dict | None = None) -> str:
    """pass, fail, error, or inconclusive: an assertion failed while the run's fidelity was out of
    tolerance, so the bench host, not the system, may have failed it. A pass stays a pass (with the warning)."""
    if error:
        return "error"
    if any(r.error for r in results):
        return "error"
    if all(r.passed for r in results):
        return "pass"
    return "inconclusive" if fidelity and not fidelity.get("valid", True) else "fail"


def latency_budget(figures: dict, fidelity: dict | None = None) -> list[dict]:
    """The budget's rows, each with what of it the bench added where that is measured (`bench_p50_ms`,
    `bench_p99_ms`: bench.evidence.fidelity.bench_share; None where it cannot be split)."""
    share = dict((fidelity or {}).get("bench_share") or {})
    up, down = share.get("uplink_ms") or {}, share.get("downlink_ms") or {}
    if (up or down) and "network_ms" not in share:
        # network = up + down: the parts' p50s and p99s added (the p99s' sum bounds the p99 from above)
        share["network_ms"] = {q: (None if up.get(q) is None and down.get(q) is None
                                   else (up.get(q) or 0.0) + (down.get(q) or 0.0)) for q in ("p50", "p99")}
    rows = []
    for stage, key in BUDGET_SERIES:
        s = figures.get(key) or {}
        ref = BUDGET_REFERENCE[stage]
        bench = share.get(key) or {}  # send_lag_ms, merge_lag_ms: the shard's whole (bench_share says why)
        rows.append({"stage": stage, "figure": key, "p50_ms": s.get("p50"), "p95_ms": s.get("p95"),
                     "p99_ms": s.get("p99"), "count": s.get("count", 0), "bench_p50_ms": bench.get("p50"),
                     "bench_p99_ms": bench.get("p99"), "design_lan": ref[0], "design_wan": ref[1]})
    return rows


def write_all(o: RunOutcome) -> dict[str, Path]:
    o.run_dir.mkdir(parents=True, exist_ok=True)
    paths = {"summary": o.run_dir / "summary.json", "junit": o.run_dir / "junit.xml", "html": o.run_dir / "report.html"}
    summary = summary_dict(o)
    paths["summary"].write_text(json.dumps(summary, indent=2, default=_json_default) + "\n")
    write_junit(o, paths["junit"])
    try:
        paths["html"].write_text(render_html(o, summary))
    except Exception as exc:  # the HTML is a convenience; the contract files are already written
        paths["html"].write_text(f"<!doctype html><title>{html.escape(o.scenario_name)}</title>"
                                 f"<p>report rendering failed: {html.escape(repr(exc))}</p>")
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
        "host": {"cores": o.meta.get("cores"), "python": platform.python_version(), "machine": platform.machine(),
                 "loop_priority": o.meta.get("loop_priority", []), "replica_priority": o.meta.get("replica_priority", []),
                 "speed_probe_ms": o.meta.get("speed_probe_ms", {})},
        "files": files,
    }


def write_junit(o: RunOutcome, path: Path) -> None:
    inconclusive = o.verdict == "inconclusive"
    why = "inconclusive: the bench host was out of its fidelity tolerances: " + "; ".join(
        (o.meta.get("fidelity") or {}).get("reasons") or [])
    failures = 0 if inconclusive else sum(1 for r in o.assertions if not r.passed and not r.error)
    skipped = sum(1 for r in o.assertions if not r.passed and not r.error) if inconclusive else 0
    errors = sum(1 for r in o.assertions if r.error) + (1 if o.error else 0)
    suite = ET.Element("testsuite", name=f"bench.{o.scenario_name}", tests=str(len(o.assertions) + (1 if o.error else 0)),
                       failures=str(failures), errors=str(errors), skipped=str(skipped), time=f"{o.wall_s:.3f}",
                       timestamp=o.started_utc)
    if o.error:
        case = ET.SubElement(suite, "testcase", classname=f"bench.{o.scenario_name}", name="run", time=f"{o.wall_s:.3f}")
        ET.SubElement(case, "error", message=o.error[:500], type="RunError").text = o.error
    for r in o.assertions:
        case = ET.SubElement(suite, "testcase", classname=f"bench.{o.scenario_name}", name=r.expression, time="0")
        if r.error:
            ET.SubElement(case, "error", message=r.error, type="AssertionError").text = f"{r.expression}\n{r.error}"
        elif not r.passed and inconclusive:
            bare = (f"\nwithout the bench's measured share: {r.without_bench['value']!r} ({r.without_bench['result']})"
                    if r.without_bench else "")
            ET.SubElement(case, "skipped", message=why[:500]).text = f"{r.expression}\nvalue: {r.value!r}{bare}\n{why}"
        elif not r.passed:
            ET.SubElement(case, "failure", message=f"value {r.value!r}", type="AssertionFailed").text = \
                f"{r.expression}\nvalue: {r.value!r}\n" + (f"(line {r.line} of the scenario)" if r.line
                                                          else "(not a line of the scenario: judged by the bench)")
        ET.SubElement(case, "system-out").text = f"value: {r.value!r}"
    suites = ET.Element("testsuites")
    suites.append(suite)
    ET.indent(suites)
    path.write_text('<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n")


# --- HTML ---------------------------------------------------------------------------------------

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


def _v(x) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.4g}"
    if isinstance(x, dict):
        return ", ".join(f"{k} {_v(v)}" for k, v in x.items() if k in ("p50", "p95", "p99", "max"))
    return html.escape(str(x))


def render_html(o: RunOutcome, summary: dict) -> str:
    e = html.escape
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(o.scenario_name)} – bench report</title>"
           f"<style>{_CSS}</style></head><body>"]
    out.append(f"<h1>{e(o.scenario_name)} <span class='verdict {o.verdict}'>{o.verdict.upper()}</span></h1>")
    out.append(f"<p>{e(o.description)}</p><p class='muted'>started {e(o.started_utc)} UTC · {o.robots} robots · "
               f"{o.duration_s:g} s measured · wall {o.wall_s:.1f} s · camera {e(str(summary.get('camera_kind')))} · "
               f"inference emulated: {e(str(summary.get('inference_emulated')))} · {e(str(o.run_dir))}</p>")
    fid = o.meta.get("fidelity") or {}
    if fid and not fid.get("valid", True):
        head = ("INCONCLUSIVE: an assertion failed while the bench host was out of its fidelity tolerances; the host, "
                "not the system, may have caused it." if o.verdict == "inconclusive" else
                "Warning: the bench host was out of its fidelity tolerances in this run (see Fidelity below).")
        out.append(f"<div class=banner><b>{e(head)}</b><ul>" + "".join(f"<li>{e(x)}</li>" for x in fid.get("reasons", []))
                   + "</ul></div>")
    if o.error:
        out.append(f"<h2>Error</h2><pre>{e(o.error)}</pre>")
    bare = any(r.without_bench for r in o.assertions)
    out.append("<h2>Assertions</h2><table><tr><th class=l>expression</th><th>value</th><th>result</th>"
               + ("<th class=l>without the bench's measured share</th>" if bare else "") + "</tr>")
    for r in o.assertions:
        cls = "good" if r.passed else "bad"
        res = "pass" if r.passed else ("error: " + r.error if r.error else "fail")
        w = (f"<td class=l>{_v(r.without_bench['value'])}: {e(r.without_bench['result'])}</td>" if r.without_bench
             else "<td></td>") if bare else ""
        out.append(f"<tr class={cls}><td class=l><code>{e(r.expression)}</code></td><td>{_v(r.value)}</td>"
                   f"<td class=l>{e(res)}</td>{w}</tr>")
    out.append("</table>")
    if bare:
        out.append("<p class=muted>A failed assertion on a figure the bench's measured share moves (the queue wait, "
                   "the forward pass, the four hops at the router, the network, the round trip) is judged again on "
                   "that figure less the share: each request's queue wait and forward pass beyond the replica's "
                   "unloaded self (the queue replayed), its two hops between the router and the replica beyond their "
                   "floor (an upper bound: the replica's own threads delay some), and its two hops between the robot "
                   "and the router beyond what the site's proxy asked around its time (a lower bound; where the "
                   "proxies cannot say, their p50 error) (fidelity.bench_share). A pass there says the bench's share "
                   "can explain the failure; a fail says even without it the system missed.</p>")

    base = summary.get("baselines") or []
    if base:
        out.append("<h2>Local baselines</h2><p class=muted>Task success of each <code>kind: local</code> group (the "
                   "checkpoint in the shard, no network) beside its remote twin in this run: same host load, same "
                   "engine settings; gap = local - remote (docs/scenarios.md \"Local baseline\").</p><table><tr>"
                   "<th class=l>local</th><th class=l>remote</th><th class=l>site (profile)</th><th>paired seeds</th>"
                   "<th>success local</th><th>success remote</th><th>gap</th><th>episodes local / remote</th></tr>")
        for b in base:
            out.append(f"<tr><td class=l>{e(b['local'])}</td><td class=l>{e(b['remote'])}</td>"
                       f"<td class=l>{e(str(b['site']))} ({e(str(b['profile']))})</td><td>{'yes' if b['paired_seeds'] else 'no'}</td>"
                       f"<td>{_v(b['task_success_local'])}</td><td>{_v(b['task_success_remote'])}</td><td>{_v(b['gap'])}</td>"
                       f"<td>{_v(b['episodes_local'])} / {_v(b['episodes_remote'])}</td></tr>")
        out.append("</table>")

    changes = summary.get("state_changes") or []
    if changes:
        out.append("<h2>State changes and why</h2><p class=muted>Every robot state change of the run, warm-up "
                   "included, grouped by from, to and the kind of reason (ids and numbers taken out; one example "
                   "whole); the commonest, DEAD first.</p><table><tr><th class=l>from</th><th class=l>to</th>"
                   "<th>changes</th><th>robots</th><th>t first..last s</th><th class=l>reason (example)</th></tr>")
        for c in changes:
            out.append(f"<tr><td class=l>{e(c['from'])}</td><td class=l>{e(c['to'])}</td><td>{c['changes']}</td>"
                       f"<td>{c['robots']}</td><td>{c['t_first']:g}..{c['t_last']:g}</td>"
                       f"<td class=l>{e(c['example'])}</td></tr>")
        out.append("</table>")

    attacks = (o.meta.get("security") or {}).get("attacks") or []
    if attacks:
        out.append(f"<h2>Attacks</h2><p class=muted>security: {e(str(o.meta['security'].get('mode')))}; verdicts are "
                   "ground truth (bench/security/attacker.py)</p><table><tr><th class=l>attacker</th><th class=l>attack</th>"
                   "<th>attempts</th><th>outcome</th><th class=l>evidence</th></tr>")
        for a in attacks:
            out.append(f"<tr><td class=l>{e(str(a['attacker']))}</td><td class=l>{e(str(a['attack']))}</td>"
                       f"<td>{a['attempts']}</td><td>{e(str(a['outcome']))}</td>"
                       f"<td class=l>{e(str(a['evidence'])[:300])}</td></tr>")
        out.append("</table>")

    mem = (summary.get("memory") or {})
    if mem.get("processes"):
        out.append("<h2>Memory and descriptors</h2><p class=muted>psutil every second, each process with its children; "
                   "growth after warm-up (bench.evidence.figures.rss_growth_ratio), a restarted process from its "
                   f"restart. Left at the end: {mem.get('leftover_processes')} processes, {mem.get('leftover_shm')} "
                   f"/dev/shm entries; the runner's peak while building this report: "
                   f"{_v((mem.get('report_phase') or {}).get('peak_rss_mb'))} MB.</p>")
        out.append("<table><tr><th class=l>process</th><th>RSS start MB</th><th>end</th><th>max</th><th>growth</th>"
                   "<th>fds start</th><th>end</th><th>restarts</th></tr>")
        for name, m in sorted(mem["processes"].items()):
            out.append(f"<tr><td class=l>{e(name)}</td><td>{_v(m.get('rss_mb_start'))}</td><td>{_v(m.get('rss_mb_end'))}</td>"
                       f"<td>{_v(m.get('rss_mb_max'))}</td><td>{_v(m.get('rss_growth_ratio'))}</td>"
                       f"<td>{_v(m.get('fds_start'))}</td><td>{_v(m.get('fds_end'))}</td><td>{_v(m.get('restarts'))}</td></tr>")
        out.append("</table>")

    f = o.figures
    out.append("<h2>Figures</h2><table><tr><th class=l>figure</th><th>all</th>"
               + "".join(f"<th>{e(g)}</th>" for g in o.group_figures) + "<th class=l>meaning</th></tr>")
    for name, (kind, unit, doc) in FIGURES.items():
        if name not in f:
            continue
        cells = "".join(f"<td>{_v(gf.get(name))}</td>" for gf in o.group_figures.values())
        out.append(f"<tr><td class=l>{e(name)}{(' (' + e(unit) + ')') if unit else ''}</td><td>{_v(f.get(name))}</td>{cells}"
                   f"<td class=l muted>{e(doc)}</td></tr>")
    out.append("</table>")

    out.append("<h2>Latency budget</h2><p class=muted>Measured per request (engine records); design section 11 "
               "reference for a Pi0-class model beside it. network = rtt - queue wait - inference. <b>Of it, the "
               "bench</b>: what the twin itself added, per request where it is measured, the row's percentile less "
               "the same percentile with each request's part taken off: the forward pass beyond the replica's "
               "unloaded time and the queue wait that added (the queue replayed), the hops between the router and "
               "the replica beyond their floor (an upper bound), the hops between the robot and the router beyond "
               "what the site's proxy asked around that time (a lower bound; where the proxies cannot say, their "
               "delay beyond what the profile asked, per chunk); outside the round trip, the shard's own delays "
               "(docs/bench.md, \"The four hops split at the router\"). Blank: not separable.</p>")
    out.append("<table><tr><th class=l>stage</th><th>p50 ms</th><th>p95 ms</th><th>p99 ms</th><th>n</th>"
               "<th>of it, the bench p50 / p99 ms</th><th>design LAN</th><th>design WAN 50 ms</th></tr>")
    for row in summary["latency_budget"]:
        bench = "" if row.get("bench_p50_ms") is None and row.get("bench_p99_ms") is None else \
            f"{_v(row.get('bench_p50_ms'))} / {_v(row.get('bench_p99_ms'))}"
        out.append(f"<tr><td class=l>{e(row['stage'])}</td><td>{_v(row['p50_ms'])}</td><td>{_v(row['p95_ms'])}</td>"
                   f"<td>{_v(row['p99_ms'])}</td><td>{row['count']}</td><td>{bench}</td><td>{e(row['design_lan'])}</td>"
                   f"<td>{e(row['design_wan'])}</td></tr>")
    out.append("</table>")
    split = (summary.get("clock") or {}).get("hop_split") or {}
    if split and not split.get("valid", True):  # the uplink/downlink rows above left those requests out
        out.append(f"<p class=banner>uplink / downlink split: {e(split.get('note', 'not valid'))} (summary.json → clock).</p>")
    at_router = (summary.get("clock") or {}).get("router_split") or {}
    if at_router and not at_router.get("valid", True):  # a cluster run: the four hops' rows left those requests out
        out.append(f"<p class=banner>split at the router: {e(at_router.get('note', 'not valid'))} (summary.json → clock).</p>")

    d = o.data
    windows = [(w["t_start"], w["t_end"] if w.get("t_end") is not None else o.duration_s,
                f"{w.get('action', '')} {w.get('target', '')}".strip())
               for w in (o.meta.get("faults") or []) if w.get("t_start") is not None]
    if d is not None:
        out.append("<h2>Latency</h2><div class=grid>")
        out.append(_cdfs(d))
        out.append(_late_ticks_chart(d, windows))
        out.append("</div>")
        out.append("<h2>Robots per state</h2>")
        out.append(_states_over_time(d, windows))
        out.append("<h2>Per-robot state timelines</h2><div class=legend>"
                   + "".join(f"<span><i style='background:{c}'></i>{s}</span>" for s, c in svg.STATE_COLORS.items())
                   + "<span><i style='background:rgba(214,39,40,0.3)'></i>fault window</span></div>")
        out.append(_timelines(d, windows))
        out.append("<h2>Servers</h2><div class=grid>")
        out.append(_server_chart(d, "queue_depth", "Server queue depth", windows))
        out.append(_server_chart(d, "load", "Server load (active / max sessions)", windows))
        out.append(_server_chart(d, "active_sessions", "Active sessions per replica", windows))
        out.append("</div>")
    if fid:
        out.append(_fidelity_section(o, fid, windows))
    cpu = summary.get("cpu") or {}
    if cpu.get("split"):
        probe = o.meta.get("speed_probe_ms") or {}
        during = probe.get("during") or {}
        speed = (f" Speed probe (ms, lower is faster): {_v(probe.get('before_ms'))} before, "
                 f"{_v(during.get('min_ms'))}-{_v(during.get('max_ms'))} during, {_v(probe.get('after_ms'))} after."
                 if probe else "")
        out.append("<h2>CPU split</h2><p class=muted>Mean over the measured window; 100 % = one core; host "
                   f"{_v(cpu.get('host_percent'))} % of all {o.meta.get('cores')} cores.{e(speed)}</p>")
        out.append(svg.hbar_chart(sorted(cpu["split"].items(), key=lambda kv: -kv[1]), "CPU per process (% of a core)", "%"))
        est, got = (cpu.get("estimate") or {}).get("split") or {}, cpu.get("by_kind") or {}
        if est and got:
            out.append("<p class=muted>The preflight's cost model (bench.run.sizing) at this run's speed probe, against what "
                       "each kind of process used (cores):</p><table><tr><th class=l>kind</th><th>estimated</th>"
                       "<th>measured</th></tr>")
            for kind in est:
                out.append(f"<tr><td class=l>{e(kind)}</td><td>{_v(est[kind])}</td><td>{_v(got.get(kind))}</td></tr>")
            out.append(f"<tr><td class=l>all</td><td>{_v(cpu['estimate'].get('cores_needed'))}</td>"
                       f"<td>{_v(round(sum(got.values()), 3))}</td></tr></table>")
            if cpu.get("estimate_ratio_at_reference") is not None:
                out.append("<p class=muted>" + e(f"Measured / estimated {_v(cpu.get('estimate_ratio'))} at this run's "
                           f"probe, {_v(cpu['estimate_ratio_at_reference'])} with the model unscaled (the reference "
                           "probe): where the two differ, the probe read a slowdown the work did not have (on the 16-core "
                           "accelerator machine, likely its SMT siblings).") + "</p>")
            forward = cpu["estimate"].get("forward_cpu_ms") or {}
            if forward:  # where each replica's forward pass was priced from: this host's timing or the constant
                out.append("<p class=muted>" + e(f"{_v(cpu['estimate'].get('requests_per_s'))} requests/s estimated; "
                           "a forward pass (ms of CPU at the reference probe): " + "; ".join(
                               f"{rid} {_v(c.get('at_1'))} at batch 1, {_v(c.get('at_max'))} at {c.get('max_batch')} "
                               f"({c.get('source')})" for rid, c in forward.items())) + "</p>")
        threads = cpu.get("shard_threads") or {}
        if threads.get("cores"):  # inside the shards: the bench's own loop and writer against the engines' work
            out.append("<p class=muted>" + e(
                f"Inside the {threads.get('shards')} shard(s), cores by thread: " + ", ".join(
                    f"{role} {_v(c)}" for role, c in sorted(threads["cores"].items(), key=lambda kv: -kv[1]) if c)
                + f". Control loop {_v(threads.get('loop_us_per_robot_tick'))} us and records writer "
                  f"{_v(threads.get('records_us_per_robot_tick'))} us a robot-tick; engine workers "
                  f"{_v(threads.get('engine_ms_per_request'))} ms and Zenoh's threads "
                  f"{_v(threads.get('zenoh_ms_per_request'))} ms a request."
                + (f" The threads account for {_v(threads['accounted'])} of the shards' process CPU "
                   f"({_v(threads.get('process_cores'))} cores)." if threads.get("accounted") is not None else ""))
                + "</p>")
        for node, facts in (cpu.get("nodes") or {}).items():  # processes on other hosts, read on their node
            out.append(f"<p class=muted>{e(node)}: host {_v(facts.get('host_percent'))} % of its {facts.get('cores')} "
                       f"cores; runs {e(', '.join(facts.get('processes') or []))}</p>")
    if windows:
        out.append("<h2>Faults</h2><table><tr><th>start s</th><th>end s</th><th class=l>fault</th><th class=l>detail</th></tr>")
        for w in o.meta.get("faults") or []:
            out.append(f"<tr><td>{_v(w.get('t_start'))}</td><td>{_v(w.get('t_end'))}</td><td class=l>{e(str(w.get('action', '')))} "
                       f"{e(str(w.get('target', '')))}</td><td class=l>{e(str(w.get('detail', '')))}</td></tr>")
        out.append("</table>")
    logs = [p for p in summary["files"] if p.startswith("logs/")]
    if logs:
        out.append("<h2>Process logs</h2><ul>" + "".join(f"<li><a href='{e(p)}'>{e(p)}</a></li>" for p in logs) + "</ul>")
    out.append("</body></html>")
    return "\n".join(out)


def _fidelity_section(o: RunOutcome, fid: dict, windows) -> str:
    """The twin's own error (bench.evidence.fidelity): tables, then per-second figures with the fault windows."""
    e = html.escape
    out = [f"<h2>Fidelity</h2><p class=muted>How far this host bent what the scenario asked for; tolerances from the "
           f"scenario's <code>fidelity:</code> (docs/bench.md \"Fidelity\"). "
           f"{'Within tolerance.' if fid.get('valid') else 'Out of tolerance.'} {e(str(fid.get('note') or ''))}</p>"]
    legs = [g for g in fid.get("legs", []) if g.get("chunks")]
    if legs:
        out.append("<table><tr><th class=l>leg</th><th>chunks</th><th>asked ms</th><th>applied - asked p50 ms</th>"
                   "<th>p99</th><th>max</th><th>tolerance</th><th>bandwidth asked / delivered kB/s</th></tr>")
        for g in legs:
            bw = g.get("bandwidth")
            bad = g.get("error_ms_p99") is not None and g["error_ms_p99"] > g["tolerance_ms"]
            out.append(f"<tr class={'bad' if bad else 'good'}><td class=l>{e(g['site'])} {e(g['leg'])}</td><td>{g['chunks']}</td>"
                       f"<td>{_v(g['asked_ms_mean'])}</td><td>{_v(g['error_ms_p50'])}</td><td>{_v(g['error_ms_p99'])}</td>"
                       f"<td>{_v(g['error_ms_max'])}</td><td>{_v(g['tolerance_ms'])}</td>"
                       f"<td>{(_v(bw['asked_kBps']) + ' / ' + _v(bw['delivered_kBps'])) if bw else '–'}</td></tr>")
        out.append("</table>")
    elif fid.get("legs"):
        out.append("<p class=muted>No toxic on any leg: the proxies forwarded bytes untouched.</p>")
    tol = fid.get("tolerances") or {}
    if fid.get("shards"):
        out.append("<table><tr><th class=l>shard</th><th>ticks</th><th>host-late</th><th>loop overrun</th>"
                   "<th>worst scheduler wait ms</th></tr>")
        for sh in fid["shards"]:
            bad = ((sh["host_late_ratio"] or 0) > tol.get("host_late_ratio", 1) or
                   (sh["loop_overrun_ratio"] or 0) > tol.get("loop_overrun_ratio", 1) or
                   (sh["scheduler_wait_ms_max"] or 0) > tol.get("scheduler_wait_ms", 1e9))
            out.append(f"<tr class={'bad' if bad else 'good'}><td class=l>{sh['shard']}</td><td>{sh['ticks']}</td>"
                       f"<td>{_v(sh['host_late_ratio'])}</td><td>{_v(sh['loop_overrun_ratio'])}</td>"
                       f"<td>{_v(sh['scheduler_wait_ms_max'])}</td></tr>")
        out.append("</table>")
    if fid.get("replicas"):
        out.append("<table><tr><th class=l>replica</th><th>requests</th><th>forward p50 ms</th><th>x unloaded p50</th>"
                   "<th>p99</th><th class=l>unloaded ms by batch size</th></tr>")
        for r in fid["replicas"]:
            bad = (r.get("forward_ratio_p50") or 0) > tol.get("forward_ratio", 1e9) \
                and (r.get("forward_excess_ms_p50") or 0) > tol.get("forward_excess_ms", 2.0)
            out.append(f"<tr class={'bad' if bad else 'good'}><td class=l>{e(r['replica'])}</td><td>{r['requests']}</td>"
                       f"<td>{_v(r['forward_ms_p50'])}</td><td>{_v(r['forward_ratio_p50'])}</td>"
                       f"<td>{_v(r['forward_ratio_p99'])}</td><td class=l>{e(str(r.get('unloaded_ms') or r.get('note')))}</td></tr>")
        out.append("</table>")
    rtt_share = (fid.get("bench_share") or {}).get("rtt_ms") or {}
    steady, near = rtt_share.get("steady") or {}, rtt_share.get("around_faults") or {}
    if steady.get("requests") and near.get("requests"):
        from bench.evidence.fidelity import FAULT_SETTLE_S

        out.append(f"<p>The bench's share of the round trip, p50 / p99 ms: {_v(rtt_share.get('p50'))} / "
                   f"{_v(rtt_share.get('p99'))} over the run; {_v(steady.get('p50'))} / {_v(steady.get('p99'))} for the "
                   f"{steady['requests']} requests away from the faults; {_v(near.get('p50'))} / {_v(near.get('p99'))} "
                   f"for the {near['requests']} sent in a fault window or the {FAULT_SETTLE_S:g} s after it "
                   f"(reconnects and restarts load the host too)"
                   + "".join(f"; {e(b['fault'])} at t {b['t_start']:g} s: {_v(b.get('p50'))} / {_v(b.get('p99'))} "
                             f"({b['requests']} requests)" for b in rtt_share.get("by_fault") or [])
                   + ".</p>")
    if fid.get("queue_replay"):
        out.append("<p class=muted>Each replica's queue replayed on the requests it answered (bench.evidence.replay): "
                   "the queue wait it reported, the same replayed with the host's load as it was (against the "
                   "reported: the replay's own error) and replayed on an unloaded host. A request's wait less its "
                   "bench part is its unloaded replay's.</p><table><tr><th class=l>replica</th><th>requests</th>"
                   "<th>reported p50 / p99 ms</th><th>replayed p50 / p99</th><th>replay error p50 / p99</th>"
                   "<th>unloaded p50 / p99</th><th class=l>note</th></tr>")
        for q in fid["queue_replay"]:
            pair = lambda k: f"{_v(q.get(k + '_p50'))} / {_v(q.get(k + '_p99'))}"  # noqa: E731
            out.append(f"<tr><td class=l>{e(str(q.get('replica', '')))}</td><td>{q.get('requests', '–')}</td>"
                       f"<td>{pair('queue_wait_ms')}</td><td>{pair('replayed_ms')}</td><td>{pair('replay_error_ms')}</td>"
                       f"<td>{pair('unloaded_ms')}</td><td class=l>{e(str(q.get('note') or ''))}</td></tr>")
        out.append("</table>")
    d = o.data
    charts = []
    if d is not None:
        charts.append(_shard_fidelity_chart(d, windows))
        charts.append(_sched_wait_chart(d, windows))
    charts.append(_leg_error_chart(o.meta.get("leg_series") or {}, o.duration_s, windows))
    charts.append(_forward_ratio_chart(o.meta.get("forward_series") or {}, o.duration_s, windows))
    out.append("<div class=grid>" + "".join(charts) + "</div>")
    return "\n".join(out)


def _per_second(t: np.ndarray, duration_s: float) -> np.ndarray:
    return np.arange(0, math.ceil(duration_s) + 1)


def _shard_fidelity_chart(d: RunData, windows) -> str:
    """Host-late ticks per second as a share of each shard's ticks."""
    tk, rb = d.ticks, d.robots
    if not tk or not len(tk.get("t", [])) or "shard" not in rb:
        return svg.empty_chart("Host-late ticks per shard", "no ticks recorded")
    shard_of = dict(zip(np.asarray(rb["robot"]).tolist(), np.asarray(rb["shard"]).tolist()))
    t = tk["t"]
    m = (t >= 0) & (t <= d.duration_s)
    sh = np.array([shard_of.get(int(r), -1) for r in tk["robot"][m]])
    tt, cls = t[m], np.asarray(tk["tick_class"][m])
    bins = _per_second(tt, d.duration_s)
    lines = {}
    for k in sorted(set(sh.tolist())):
        all_, _ = np.histogram(tt[sh == k], bins=bins)
        late, _ = np.histogram(tt[(sh == k) & (cls == 3)], bins=bins)
        lines[f"shard {k}"] = (bins[:-1], 100.0 * late / np.maximum(all_, 1))
    return svg.line_chart(lines, "Host-late ticks per shard", "time since t=0 (s)", "% of the shard's ticks", windows,
                          x_range=(0, d.duration_s))


def _sched_wait_chart(d: RunData, windows) -> str:
    """Each shard's worst scheduler wait (slot wall - CPU time) per second."""
    lp = d.loop
    if not lp or not len(lp.get("t", [])) or "shard" not in lp:
        return svg.empty_chart("Worst scheduler wait per shard", "no loop slots recorded")
    m = (lp["t"] >= 0) & (lp["t"] <= d.duration_s)
    bins = _per_second(lp["t"], d.duration_s)
    lines = {}
    wait = (lp["wall_ms"] - lp["cpu_ms"]).astype(float)
    for k in sorted(set(np.asarray(lp["shard"][m]).tolist())):
        mk = m & (lp["shard"] == k)
        idx = np.clip(np.digitize(lp["t"][mk], bins) - 1, 0, len(bins) - 2)
        worst = np.zeros(len(bins) - 1)
        np.maximum.at(worst, idx, wait[mk])
        lines[f"shard {k}"] = (bins[:-1], worst)
    return svg.line_chart(lines, "Worst scheduler wait per shard", "time since t=0 (s)", "ms (slot wall - CPU)", windows,
                          x_range=(0, d.duration_s))


def _leg_error_chart(series: dict, duration_s: float, windows) -> str:
    """Mean (applied - asked) delay per second of each leg (bench.evidence.fidelity.LegErrorSeries.to_json)."""
    lines = {k: (np.asarray(v.get("t", []), dtype=float), np.asarray(v.get("error_ms", []), dtype=float))
             for k, v in (series or {}).items() if len(v.get("t", []))}
    if not lines:
        return svg.empty_chart("Network legs: applied - asked delay", "no toxic on any leg, or no samples")
    return svg.line_chart(lines, "Network legs: applied - asked delay", "time since t=0 (s)", "mean ms per second", windows,
                          x_range=(0, duration_s))


def _forward_ratio_chart(series: dict, duration_s: float, windows) -> str:
    """Each replica's forward time over its unloaded time at the same batch size, median per second."""
    lines = {f"replica {rid}": (np.asarray(t), np.asarray(r)) for rid, (t, r) in series.items() if len(t)}
    if not lines:
        return svg.empty_chart("Replica forward time / unloaded", "no forward times, or no unloaded reference")
    return svg.line_chart(lines, "Replica forward time / unloaded", "time since t=0 (s)", "ratio (median per second)",
                          windows, x_range=(0, duration_s))


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
    for name, sel in (("None ticks while stalled", none & stalled), ("gating (awaiting a first chunk)", none & ~stalled)):
        h, _ = np.histogram(t[sel], bins=bins)
        lines[name] = (bins[:-1], h)
    return svg.line_chart(lines, "Late and None ticks per second", "time since t=0 (s)", "ticks / s", windows,
                          x_range=(0, d.duration_s))


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
    return svg.line_chart({k: (grid, counts[k]) for k in order}, "Robots per engine state", "time since t=0 (s)",
                          "robots", windows, width=900, x_range=(0, d.duration_s), colors=svg.STATE_COLORS)


def _server_chart(d: RunData, metric: str, title: str, windows) -> str:
    by_replica: dict[str, list] = {}
    for s in d.server_samples:
        if s["metric"] == metric:
            by_replica.setdefault(s["replica"], []).append((s["t"], s["value"]))
    lines = {r: (np.array([a for a, _ in v]), np.array([b for _, b in v])) for r, v in by_replica.items()}
    return svg.line_chart(lines, title, "time since t=0 (s)", metric, windows, x_range=(min(0.0, *[l[0].min() for l in lines.values()]) if lines else 0, d.duration_s))
