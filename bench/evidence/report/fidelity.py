"""The Fidelity section of report.html: the twin's own error as tables of legs, shards and replicas, the
bench's share of the round trip, the queue replay, and per-second charts with the fault windows."""

from __future__ import annotations

import html
import math

import numpy as np

from bench.evidence import svg
from bench.evidence.figures import RunData
from bench.evidence.report.cells import _v
from bench.evidence.report.outcome import RunOutcome


def _fidelity_section(o: RunOutcome, fid: dict, windows) -> str:
    """The twin's own error (bench.evidence.fidelity): tables, then per-second figures with the fault windows."""
    e = html.escape
    out = [
        f"<h2>Fidelity</h2><p class=muted>How far this host bent what the scenario asked for; tolerances from the "
        f"scenario's <code>fidelity:</code> (docs/bench.md \"Fidelity\"). "
        f"{'Within tolerance.' if fid.get('valid') else 'Out of tolerance.'} {e(str(fid.get('note') or ''))}</p>"
    ]
    legs = [g for g in fid.get("legs", []) if g.get("chunks")]
    if legs:
        out.append(
            "<table><tr><th class=l>leg</th><th>chunks</th><th>asked ms</th><th>applied - asked p50 ms</th>"
            "<th>p99</th><th>max</th><th>tolerance</th><th>bandwidth asked / delivered kB/s</th></tr>"
        )
        for g in legs:
            bw = g.get("bandwidth")
            bad = g.get("error_ms_p99") is not None and g["error_ms_p99"] > g["tolerance_ms"]
            out.append(
                f"<tr class={'bad' if bad else 'good'}><td class=l>{e(g['site'])} {e(g['leg'])}</td><td>{g['chunks']}</td>"
                f"<td>{_v(g['asked_ms_mean'])}</td><td>{_v(g['error_ms_p50'])}</td><td>{_v(g['error_ms_p99'])}</td>"
                f"<td>{_v(g['error_ms_max'])}</td><td>{_v(g['tolerance_ms'])}</td>"
                f"<td>{(_v(bw['asked_kBps']) + ' / ' + _v(bw['delivered_kBps'])) if bw else '–'}</td></tr>"
            )
        out.append("</table>")
    elif fid.get("legs"):
        out.append("<p class=muted>No toxic on any leg: the proxies forwarded bytes untouched.</p>")
    tol = fid.get("tolerances") or {}
    if fid.get("shards"):
        out.append(
            "<table><tr><th class=l>shard</th><th>ticks</th><th>host-late</th><th>loop overrun</th>"
            "<th>worst scheduler wait ms</th></tr>"
        )
        for sh in fid["shards"]:
            bad = (
                (sh["host_late_ratio"] or 0) > tol.get("host_late_ratio", 1)
                or (sh["loop_overrun_ratio"] or 0) > tol.get("loop_overrun_ratio", 1)
                or (sh["scheduler_wait_ms_max"] or 0) > tol.get("scheduler_wait_ms", 1e9)
            )
            out.append(
                f"<tr class={'bad' if bad else 'good'}><td class=l>{sh['shard']}</td><td>{sh['ticks']}</td>"
                f"<td>{_v(sh['host_late_ratio'])}</td><td>{_v(sh['loop_overrun_ratio'])}</td>"
                f"<td>{_v(sh['scheduler_wait_ms_max'])}</td></tr>"
            )
        out.append("</table>")
    if fid.get("replicas"):
        out.append(
            "<table><tr><th class=l>replica</th><th>requests</th><th>forward p50 ms</th><th>x unloaded p50</th>"
            "<th>p99</th><th class=l>unloaded ms by batch size</th></tr>"
        )
        for r in fid["replicas"]:
            bad = (r.get("forward_ratio_p50") or 0) > tol.get("forward_ratio", 1e9) and (
                r.get("forward_excess_ms_p50") or 0
            ) > tol.get("forward_excess_ms", 2.0)
            out.append(
                f"<tr class={'bad' if bad else 'good'}><td class=l>{e(r['replica'])}</td><td>{r['requests']}</td>"
                f"<td>{_v(r['forward_ms_p50'])}</td><td>{_v(r['forward_ratio_p50'])}</td>"
                f"<td>{_v(r['forward_ratio_p99'])}</td><td class=l>{e(str(r.get('unloaded_ms') or r.get('note')))}</td></tr>"
            )
        out.append("</table>")
    rtt_share = (fid.get("bench_share") or {}).get("rtt_ms") or {}
    steady, near = rtt_share.get("steady") or {}, rtt_share.get("around_faults") or {}
    if steady.get("requests") and near.get("requests"):
        from bench.evidence.fidelity import FAULT_SETTLE_S

        out.append(
            f"<p>The bench's share of the round trip, p50 / p99 ms: {_v(rtt_share.get('p50'))} / "
            f"{_v(rtt_share.get('p99'))} over the run; {_v(steady.get('p50'))} / {_v(steady.get('p99'))} for the "
            f"{steady['requests']} requests away from the faults; {_v(near.get('p50'))} / {_v(near.get('p99'))} "
            f"for the {near['requests']} sent in a fault window or the {FAULT_SETTLE_S:g} s after it "
            f"(reconnects and restarts load the host too)"
            + "".join(
                f"; {e(b['fault'])} at t {b['t_start']:g} s: {_v(b.get('p50'))} / {_v(b.get('p99'))} "
                f"({b['requests']} requests)"
                for b in rtt_share.get("by_fault") or []
            )
            + ".</p>"
        )
    if fid.get("queue_replay"):
        out.append(
            "<p class=muted>Each replica's queue replayed on the requests it answered (bench.evidence.replay): "
            "the queue wait it reported, the same replayed with the host's load as it was (against the "
            "reported: the replay's own error) and replayed on an unloaded host. A request's wait less its "
            "bench part is its unloaded replay's.</p><table><tr><th class=l>replica</th><th>requests</th>"
            "<th>reported p50 / p99 ms</th><th>replayed p50 / p99</th><th>replay error p50 / p99</th>"
            "<th>unloaded p50 / p99</th><th class=l>note</th></tr>"
        )
        for q in fid["queue_replay"]:
            pair = lambda k: f"{_v(q.get(k + '_p50'))} / {_v(q.get(k + '_p99'))}"  # noqa: E731
            out.append(
                f"<tr><td class=l>{e(str(q.get('replica', '')))}</td><td>{q.get('requests', '–')}</td>"
                f"<td>{pair('queue_wait_ms')}</td><td>{pair('replayed_ms')}</td><td>{pair('replay_error_ms')}</td>"
                f"<td>{pair('unloaded_ms')}</td><td class=l>{e(str(q.get('note') or ''))}</td></tr>"
            )
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


# a once-a-second series with no sample for longer than this (a replica restarting, a leg without traffic; the
# runner's sampling loop can slip by a timeout) breaks its line there instead of drawing across what was not measured
PER_SECOND_GAP_S = 2.5


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
        share = np.where(all_ > 0, 100.0 * late / np.maximum(all_, 1), np.nan)  # no ticks: not measured
        lines[f"shard {k}"] = (bins[:-1], share)
    return svg.line_chart(
        lines,
        "Host-late ticks per shard",
        "time since t=0 (s)",
        "% of the shard's ticks",
        windows,
        x_range=(0, d.duration_s),
    )


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
        worst = np.full(len(bins) - 1, -np.inf)
        np.maximum.at(worst, idx, wait[mk])
        worst[np.isneginf(worst)] = np.nan  # a second without a slot (the shard down or stalled): not drawn
        lines[f"shard {k}"] = (bins[:-1], worst)
    return svg.line_chart(
        lines,
        "Worst scheduler wait per shard",
        "time since t=0 (s)",
        "ms (slot wall - CPU)",
        windows,
        x_range=(0, d.duration_s),
    )


def _leg_error_chart(series: dict, duration_s: float, windows) -> str:
    """Mean (applied - asked) delay per second of each leg (bench.evidence.fidelity.LegErrorSeries.to_json)."""
    lines = {
        k: (np.asarray(v.get("t", []), dtype=float), np.asarray(v.get("error_ms", []), dtype=float))
        for k, v in (series or {}).items()
        if len(v.get("t", []))
    }
    if not lines:
        return svg.empty_chart("Network legs: applied - asked delay", "no toxic on any leg, or no samples")
    return svg.line_chart(
        lines,
        "Network legs: applied - asked delay",
        "time since t=0 (s)",
        "mean ms per second",
        windows,
        x_range=(0, duration_s),
        gap=PER_SECOND_GAP_S,
    )


def _forward_ratio_chart(series: dict, duration_s: float, windows) -> str:
    """Each replica's forward time over its unloaded time at the same batch size, median per second."""
    lines = {f"replica {rid}": (np.asarray(t), np.asarray(r)) for rid, (t, r) in series.items() if len(t)}
    if not lines:
        return svg.empty_chart("Replica forward time / unloaded", "no forward times, or no unloaded reference")
    return svg.line_chart(
        lines,
        "Replica forward time / unloaded",
        "time since t=0 (s)",
        "ratio (median per second)",
        windows,
        x_range=(0, duration_s),
        gap=PER_SECOND_GAP_S,
    )
