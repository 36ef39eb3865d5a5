"""The sections of report.html, each a function of the run's outcome and its summary.json returning its
HTML lines (nothing where the run has nothing to show), in the order the page lists them (`SECTIONS`)."""

from __future__ import annotations

import html

from bench.evidence import svg
from bench.evidence.report.cells import _v
from bench.evidence.report.charts import _cdfs, _late_ticks_chart, _server_chart, _states_over_time, _timelines
from bench.evidence.report.fidelity import _fidelity_section
from bench.evidence.report.outcome import RunOutcome
from bench.scenario.catalog import FIGURES


def fault_windows(o: RunOutcome) -> list[tuple]:
    """(start, end, label) of every fault window of the run, an open one ending with the run."""
    return [
        (
            w["t_start"],
            w["t_end"] if w.get("t_end") is not None else o.duration_s,
            f"{w.get('action', '')} {w.get('target', '')}".strip(),
        )
        for w in (o.meta.get("faults") or [])
        if w.get("t_start") is not None
    ]


def banner(o: RunOutcome, summary: dict) -> list[str]:
    """The banner of a run whose bench host was out of its fidelity tolerances."""
    e = html.escape
    out = []
    fid = o.meta.get("fidelity") or {}
    if fid and not fid.get("valid", True):
        head = (
            "INCONCLUSIVE: an assertion failed while the bench host was out of its fidelity tolerances; the host, "
            "not the system, may have caused it."
            if o.verdict == "inconclusive"
            else "Warning: the bench host was out of its fidelity tolerances in this run (see Fidelity below)."
        )
        out.append(
            f"<div class=banner><b>{e(head)}</b><ul>"
            + "".join(f"<li>{e(x)}</li>" for x in fid.get("reasons", []))
            + "</ul></div>"
        )
    return out


def error(o: RunOutcome, summary: dict) -> list[str]:
    """The run's error, whole."""
    e = html.escape
    out = []
    if o.error:
        out.append(f"<h2>Error</h2><pre>{e(o.error)}</pre>")
    return out


def assertions(o: RunOutcome, summary: dict) -> list[str]:
    """Every assertion with its value and result and, where judged, without the bench's share."""
    e = html.escape
    out = []
    bare = any(r.without_bench for r in o.assertions)
    out.append(
        "<h2>Assertions</h2><table><tr><th class=l>expression</th><th>value</th><th>result</th>"
        + ("<th class=l>without the bench's measured share</th>" if bare else "")
        + "</tr>"
    )
    for r in o.assertions:
        cls = "good" if r.passed else "bad"
        res = "pass" if r.passed else ("error: " + r.error if r.error else "fail")
        w = (
            (
                f"<td class=l>{_v(r.without_bench['value'])}: {e(r.without_bench['result'])}</td>"
                if r.without_bench
                else "<td></td>"
            )
            if bare
            else ""
        )
        out.append(
            f"<tr class={cls}><td class=l><code>{e(r.expression)}</code></td><td>{_v(r.value)}</td>"
            f"<td class=l>{e(res)}</td>{w}</tr>"
        )
    out.append("</table>")
    if bare:
        out.append(
            "<p class=muted>A failed assertion on a figure the bench's measured share moves (the queue wait, "
            "the forward pass, the four hops at the router, the network, the round trip) is judged again on "
            "that figure less the share: each request's queue wait and forward pass beyond the replica's "
            "unloaded self (the queue replayed), its two hops between the router and the replica beyond their "
            "floor (an upper bound: the replica's own threads delay some), and its two hops between the robot "
            "and the router beyond what the site's proxy asked around its time (a lower bound; where the "
            "proxies cannot say, their p50 error) (fidelity.bench_share). A pass there says the bench's share "
            "can explain the failure; a fail says even without it the system missed.</p>"
        )

    return out


def baselines(o: RunOutcome, summary: dict) -> list[str]:
    """Each local group's task success beside its remote twin's."""
    e = html.escape
    out = []
    base = summary.get("baselines") or []
    if base:
        out.append(
            "<h2>Local baselines</h2><p class=muted>Task success of each <code>kind: local</code> group (the "
            "checkpoint in the shard, no network) beside its remote twin in this run: same host load, same "
            "engine settings; gap = local - remote (docs/scenarios.md \"Local baseline\").</p><table><tr>"
            "<th class=l>local</th><th class=l>remote</th><th class=l>site (profile)</th><th>paired seeds</th>"
            "<th>success local</th><th>success remote</th><th>gap</th><th>episodes local / remote</th></tr>"
        )
        for b in base:
            out.append(
                f"<tr><td class=l>{e(b['local'])}</td><td class=l>{e(b['remote'])}</td>"
                f"<td class=l>{e(str(b['site']))} ({e(str(b['profile']))})</td><td>{'yes' if b['paired_seeds'] else 'no'}</td>"
                f"<td>{_v(b['task_success_local'])}</td><td>{_v(b['task_success_remote'])}</td><td>{_v(b['gap'])}</td>"
                f"<td>{_v(b['episodes_local'])} / {_v(b['episodes_remote'])}</td></tr>"
            )
        out.append("</table>")

    return out


def state_changes(o: RunOutcome, summary: dict) -> list[str]:
    """The robots' state changes, grouped by from, to and the kind of reason."""
    e = html.escape
    out = []
    changes = summary.get("state_changes") or []
    if changes:
        out.append(
            "<h2>State changes and why</h2><p class=muted>Every robot state change of the run, warm-up "
            "included, grouped by from, to and the kind of reason (ids and numbers taken out; one example "
            "whole); the commonest, DEAD first.</p><table><tr><th class=l>from</th><th class=l>to</th>"
            "<th>changes</th><th>robots</th><th>t first..last s</th><th class=l>reason (example)</th></tr>"
        )
        for c in changes:
            out.append(
                f"<tr><td class=l>{e(c['from'])}</td><td class=l>{e(c['to'])}</td><td>{c['changes']}</td>"
                f"<td>{c['robots']}</td><td>{c['t_first']:g}..{c['t_last']:g}</td>"
                f"<td class=l>{e(c['example'])}</td></tr>"
            )
        out.append("</table>")

    return out


def attacks(o: RunOutcome, summary: dict) -> list[str]:
    """The attackers' attempts and their ground-truth outcomes."""
    e = html.escape
    out = []
    attacks = (o.meta.get("security") or {}).get("attacks") or []
    if attacks:
        out.append(
            f"<h2>Attacks</h2><p class=muted>security: {e(str(o.meta['security'].get('mode')))}; verdicts are "
            "ground truth (bench/security/attacker.py)</p><table><tr><th class=l>attacker</th><th class=l>attack</th>"
            "<th>attempts</th><th>outcome</th><th class=l>evidence</th></tr>"
        )
        for a in attacks:
            out.append(
                f"<tr><td class=l>{e(str(a['attacker']))}</td><td class=l>{e(str(a['attack']))}</td>"
                f"<td>{a['attempts']}</td><td>{e(str(a['outcome']))}</td>"
                f"<td class=l>{e(str(a['evidence'])[:300])}</td></tr>"
            )
        out.append("</table>")

    return out


def memory(o: RunOutcome, summary: dict) -> list[str]:
    """Each process's memory and descriptors, start to end."""
    e = html.escape
    out = []
    mem = summary.get("memory") or {}
    if mem.get("processes"):
        out.append(
            "<h2>Memory and descriptors</h2><p class=muted>psutil every second, each process with its children; "
            "growth after warm-up (bench.evidence.figures.rss_growth_ratio), a restarted process from its "
            f"restart. Left at the end: {mem.get('leftover_processes')} processes, {mem.get('leftover_shm')} "
            f"/dev/shm entries; the runner's peak while building this report: "
            f"{_v((mem.get('report_phase') or {}).get('peak_rss_mb'))} MB.</p>"
        )
        out.append(
            "<table><tr><th class=l>process</th><th>RSS start MB</th><th>end</th><th>max</th><th>growth</th>"
            "<th>fds start</th><th>end</th><th>restarts</th></tr>"
        )
        for name, m in sorted(mem["processes"].items()):
            out.append(
                f"<tr><td class=l>{e(name)}</td><td>{_v(m.get('rss_mb_start'))}</td><td>{_v(m.get('rss_mb_end'))}</td>"
                f"<td>{_v(m.get('rss_mb_max'))}</td><td>{_v(m.get('rss_growth_ratio'))}</td>"
                f"<td>{_v(m.get('fds_start'))}</td><td>{_v(m.get('fds_end'))}</td><td>{_v(m.get('restarts'))}</td></tr>"
            )
        out.append("</table>")

    return out


def figures_table(o: RunOutcome, summary: dict) -> list[str]:
    """Every figure of the catalog the run computed, for the fleet and each group."""
    e = html.escape
    out = []
    f = o.figures
    out.append(
        "<h2>Figures</h2><table><tr><th class=l>figure</th><th>all</th>"
        + "".join(f"<th>{e(g)}</th>" for g in o.group_figures)
        + "<th class=l>meaning</th></tr>"
    )
    for name, (_kind, unit, doc) in FIGURES.items():
        if name not in f:
            continue
        cells = "".join(f"<td>{_v(gf.get(name))}</td>" for gf in o.group_figures.values())
        out.append(
            f"<tr><td class=l>{e(name)}{(' (' + e(unit) + ')') if unit else ''}</td><td>{_v(f.get(name))}</td>{cells}"
            f"<td class=l muted>{e(doc)}</td></tr>"
        )
    out.append("</table>")
    return out


def budget_table(o: RunOutcome, summary: dict) -> list[str]:
    """The latency budget's rows with the bench's share and the design's reference."""
    e = html.escape
    out = []
    out.append(
        "<h2>Latency budget</h2><p class=muted>Measured per request (engine records); design section 11 "
        "reference for a Pi0-class model beside it. network = rtt - queue wait - inference. <b>Of it, the "
        "bench</b>: what the twin itself added, per request where it is measured, the row's percentile less "
        "the same percentile with each request's part taken off: the forward pass beyond the replica's "
        "unloaded time and the queue wait that added (the queue replayed), the hops between the router and "
        "the replica beyond their floor (an upper bound), the hops between the robot and the router beyond "
        "what the site's proxy asked around that time (a lower bound; where the proxies cannot say, their "
        "delay beyond what the profile asked, per chunk); outside the round trip, the shard's own delays "
        "(docs/bench.md, \"The four hops split at the router\"). Blank: not separable.</p>"
    )
    out.append(
        "<table><tr><th class=l>stage</th><th>p50 ms</th><th>p95 ms</th><th>p99 ms</th><th>n</th>"
        "<th>of it, the bench p50 / p99 ms</th><th>design LAN</th><th>design WAN 50 ms</th></tr>"
    )
    for row in summary["latency_budget"]:
        bench = (
            ""
            if row.get("bench_p50_ms") is None and row.get("bench_p99_ms") is None
            else f"{_v(row.get('bench_p50_ms'))} / {_v(row.get('bench_p99_ms'))}"
        )
        out.append(
            f"<tr><td class=l>{e(row['stage'])}</td><td>{_v(row['p50_ms'])}</td><td>{_v(row['p95_ms'])}</td>"
            f"<td>{_v(row['p99_ms'])}</td><td>{row['count']}</td><td>{bench}</td><td>{e(row['design_lan'])}</td>"
            f"<td>{e(row['design_wan'])}</td></tr>"
        )
    out.append("</table>")
    split = (summary.get("clock") or {}).get("hop_split") or {}
    if split and not split.get("valid", True):  # the uplink/downlink rows above left those requests out
        out.append(
            f"<p class=banner>uplink / downlink split: {e(split.get('note', 'not valid'))} (summary.json → clock).</p>"
        )
    at_router = (summary.get("clock") or {}).get("router_split") or {}
    if at_router and not at_router.get("valid", True):  # a cluster run: the four hops' rows left those requests out
        out.append(
            f"<p class=banner>split at the router: {e(at_router.get('note', 'not valid'))} (summary.json → clock).</p>"
        )
    return out


def charts(o: RunOutcome, summary: dict) -> list[str]:
    """The latency, state, timeline and server charts (a run with records only)."""
    out = []
    windows = fault_windows(o)
    d = o.data
    if d is not None:
        out.append("<h2>Latency</h2><div class=grid>")
        out.append(_cdfs(d))
        out.append(_late_ticks_chart(d, windows))
        out.append("</div>")
        out.append("<h2>Robots per state</h2>")
        out.append(_states_over_time(d, windows))
        out.append(
            "<h2>Per-robot state timelines</h2><div class=legend>"
            + "".join(f"<span><i style='background:{c}'></i>{s}</span>" for s, c in svg.STATE_COLORS.items())
            + "<span><i style='background:rgba(214,39,40,0.3)'></i>fault window</span></div>"
        )
        out.append(_timelines(d, windows))
        out.append("<h2>Servers</h2><div class=grid>")
        out.append(_server_chart(d, "queue_depth", "Server queue depth", windows))
        out.append(_server_chart(d, "load", "Server load (active / max sessions)", windows))
        out.append(_server_chart(d, "active_sessions", "Active sessions per replica", windows))
        out.append("</div>")
    return out


def fidelity(o: RunOutcome, summary: dict) -> list[str]:
    """The Fidelity section (a run whose fidelity was judged only)."""
    out = []
    fid = o.meta.get("fidelity") or {}
    windows = fault_windows(o)
    if fid:
        out.append(_fidelity_section(o, fid, windows))
    return out


def cpu_split(o: RunOutcome, summary: dict) -> list[str]:
    """The CPU split by process, the cost model against it, and inside the shards by thread."""
    e = html.escape
    out = []
    cpu = summary.get("cpu") or {}
    if cpu.get("split"):
        probe = o.meta.get("speed_probe_ms") or {}
        during = probe.get("during") or {}
        speed = (
            f" Speed probe (ms, lower is faster): {_v(probe.get('before_ms'))} before, "
            f"{_v(during.get('min_ms'))}-{_v(during.get('max_ms'))} during, {_v(probe.get('after_ms'))} after."
            if probe
            else ""
        )
        out.append(
            "<h2>CPU split</h2><p class=muted>Mean over the measured window; 100 % = one core; host "
            f"{_v(cpu.get('host_percent'))} % of all {o.meta.get('cores')} cores.{e(speed)}</p>"
        )
        out.append(
            svg.hbar_chart(sorted(cpu["split"].items(), key=lambda kv: -kv[1]), "CPU per process (% of a core)", "%")
        )
        est, got = (cpu.get("estimate") or {}).get("split") or {}, cpu.get("by_kind") or {}
        if est and got:
            out.append(
                "<p class=muted>The preflight's cost model (bench.run.sizing) at this run's speed probe, against what "
                "each kind of process used (cores):</p><table><tr><th class=l>kind</th><th>estimated</th>"
                "<th>measured</th></tr>"
            )
            for kind in est:
                out.append(f"<tr><td class=l>{e(kind)}</td><td>{_v(est[kind])}</td><td>{_v(got.get(kind))}</td></tr>")
            out.append(
                f"<tr><td class=l>all</td><td>{_v(cpu['estimate'].get('cores_needed'))}</td>"
                f"<td>{_v(round(sum(got.values()), 3))}</td></tr></table>"
            )
            if cpu.get("estimate_ratio_at_reference") is not None:
                out.append(
                    "<p class=muted>"
                    + e(
                        f"Measured / estimated {_v(cpu.get('estimate_ratio'))} at this run's "
                        f"probe, {_v(cpu['estimate_ratio_at_reference'])} with the model unscaled (the reference "
                        "probe): where the two differ, the probe read a slowdown the work did not have (on the 16-core "
                        "accelerator machine, likely its SMT siblings)."
                    )
                    + "</p>"
                )
            forward = cpu["estimate"].get("forward_cpu_ms") or {}
            if forward:  # where each replica's forward pass was priced from: this host's timing or the constant
                out.append(
                    "<p class=muted>"
                    + e(
                        f"{_v(cpu['estimate'].get('requests_per_s'))} requests/s estimated; "
                        "a forward pass (ms of CPU at the reference probe): "
                        + "; ".join(
                            f"{rid} {_v(c.get('at_1'))} at batch 1, {_v(c.get('at_max'))} at {c.get('max_batch')} "
                            f"({c.get('source')})"
                            for rid, c in forward.items()
                        )
                    )
                    + "</p>"
                )
        threads = cpu.get("shard_threads") or {}
        if threads.get("cores"):  # inside the shards: the bench's own loop and writer against the engines' work
            out.append(
                "<p class=muted>"
                + e(
                    f"Inside the {threads.get('shards')} shard(s), cores by thread: "
                    + ", ".join(
                        f"{role} {_v(c)}" for role, c in sorted(threads["cores"].items(), key=lambda kv: -kv[1]) if c
                    )
                    + f". Control loop {_v(threads.get('loop_us_per_robot_tick'))} us and records writer "
                    f"{_v(threads.get('records_us_per_robot_tick'))} us a robot-tick; engine workers "
                    f"{_v(threads.get('engine_ms_per_request'))} ms and Zenoh's threads "
                    f"{_v(threads.get('zenoh_ms_per_request'))} ms a request."
                    + (
                        f" The threads account for {_v(threads['accounted'])} of the shards' process CPU "
                        f"({_v(threads.get('process_cores'))} cores)."
                        if threads.get("accounted") is not None
                        else ""
                    )
                )
                + "</p>"
            )
        for node, facts in (cpu.get("nodes") or {}).items():  # processes on other hosts, read on their node
            out.append(
                f"<p class=muted>{e(node)}: host {_v(facts.get('host_percent'))} % of its {facts.get('cores')} "
                f"cores; runs {e(', '.join(facts.get('processes') or []))}</p>"
            )
    return out


def faults(o: RunOutcome, summary: dict) -> list[str]:
    """The fault windows of the run."""
    e = html.escape
    out = []
    windows = fault_windows(o)
    if windows:
        out.append(
            "<h2>Faults</h2><table><tr><th>start s</th><th>end s</th><th class=l>fault</th><th class=l>detail</th></tr>"
        )
        for w in o.meta.get("faults") or []:
            out.append(
                f"<tr><td>{_v(w.get('t_start'))}</td><td>{_v(w.get('t_end'))}</td><td class=l>{e(str(w.get('action', '')))} "
                f"{e(str(w.get('target', '')))}</td><td class=l>{e(str(w.get('detail', '')))}</td></tr>"
            )
        out.append("</table>")
    return out


def logs(o: RunOutcome, summary: dict) -> list[str]:
    """Links to the processes' logs."""
    e = html.escape
    out = []
    logs = [p for p in summary["files"] if p.startswith("logs/")]
    if logs:
        out.append(
            "<h2>Process logs</h2><ul>" + "".join(f"<li><a href='{e(p)}'>{e(p)}</a></li>" for p in logs) + "</ul>"
        )
    return out


SECTIONS = (
    banner,
    error,
    assertions,
    baselines,
    state_changes,
    attacks,
    memory,
    figures_table,
    budget_table,
    charts,
    fidelity,
    cpu_split,
    faults,
    logs,
)
