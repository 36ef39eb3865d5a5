"""The fidelity verdict in words: one sentence per figure out of the scenario's `fidelity:` tolerances
(`judge`), and the end-of-run table of legs, shards and replicas (`table_lines`)."""

from __future__ import annotations

from bench.evidence.fidelity.replicas import SUSPECT_REFERENCE_RATIO
from bench.evidence.fidelity.share import FAULT_SETTLE_S, ROBOT_HOPS


def judge(
    legs: list[dict], shards: list[dict], replicas: list[dict], tol: dict, background: dict | None = None
) -> list[str]:
    """Plain sentences, one per figure out of tolerance. `background` (other_load) is judged when given: the
    run asserts on a drift between its first and last windows."""
    reasons = []
    shift_tol = tol.get("other_load_shift", 0.05)
    if background and abs(background["shift"]) > shift_tol:
        w = background["first_window_s"][1] - background["first_window_s"][0]
        reasons.append(
            f"the host's load from outside the run moved between the windows a drift compares: "
            f"{background['first_percent']:.0f} % of the cores in the first {w:.0f} s, "
            f"{background['last_percent']:.0f} % in the last (tolerance {100 * shift_tol:.0f} points): "
            "a drift there measures the host, not the system"
        )
    speed_tol = tol.get("speed_shift", 0.15)
    if background and background.get("probe_shift") is not None and abs(background["probe_shift"]) > speed_tol:
        reasons.append(
            f"the host's own speed moved between the windows a drift compares: the in-run speed probe's "
            f"mean was {background['probe_first_ms']:.1f} ms in the first, {background['probe_last_ms']:.1f} "
            f"in the last ({100 * background['probe_shift']:+.0f} %, tolerance {100 * speed_tol:.0f} %): every "
            "CPU step of a round trip moved with it, so a drift there measures the host"
        )
    for s in shards:
        k = s["shard"]
        if s["host_late_ratio"] is not None and s["host_late_ratio"] > tol["host_late_ratio"]:
            reasons.append(
                f"shard {k}: {100 * s['host_late_ratio']:.2f} % of its ticks were late because of the bench "
                f"host (tolerance {100 * tol['host_late_ratio']:.2f} %)"
            )
        if s["loop_overrun_ratio"] is not None and s["loop_overrun_ratio"] > tol["loop_overrun_ratio"]:
            reasons.append(
                f"shard {k}: {100 * s['loop_overrun_ratio']:.2f} % of its loop slots overran their budget "
                f"(tolerance {100 * tol['loop_overrun_ratio']:.2f} %)"
            )
        if s["scheduler_wait_ms_max"] is not None and s["scheduler_wait_ms_max"] > tol["scheduler_wait_ms"]:
            reasons.append(
                f"shard {k}: its control loop waited up to {s['scheduler_wait_ms_max']:.0f} ms in one slot "
                f"for a core or the GIL (tolerance {tol['scheduler_wait_ms']:.0f} ms)"
            )
    for g in legs:
        where = f"site {g['site']} {g['leg']}"
        if g.get("error_ms_p99") is not None and g["error_ms_p99"] > g["tolerance_ms"]:
            reasons.append(
                f"{where}: the proxy applied up to {g['error_ms_p99']:.1f} ms (p99) more delay than the "
                f"{g['asked_ms_mean']:.1f} ms the profile asked (tolerance {g['tolerance_ms']:.1f} ms)"
            )
        bw = g.get("bandwidth")
        if bw and bw.get("ratio") is not None and bw["ratio"] < tol["bandwidth_ratio"]:
            reasons.append(
                f"{where}: delivered {bw['delivered_kBps']:.0f} kB/s while busy of the {bw['asked_kBps']:.0f} "
                f"asked ({bw['ratio']:.2f}; tolerance {tol['bandwidth_ratio']:.2f})"
            )
    excess_tol = tol.get("forward_excess_ms", 2.0)
    for r in replicas:
        # starved: slower than its unloaded self by the ratio AND by enough ms to matter (a 1.5 ms forward pass
        # doubles from one context switch on a busy host, which no round trip notices)
        if (
            r.get("forward_ratio_p50") is not None
            and r["forward_ratio_p50"] > tol["forward_ratio"]
            and (r.get("forward_excess_ms_p50") is None or r["forward_excess_ms_p50"] > excess_tol)
        ):
            reasons.append(
                f"replica {r['replica']}: its forward pass took {r['forward_ratio_p50']:.2f}x its own "
                f"unloaded time at the same batch size, {r.get('forward_excess_ms_p50')} ms more (p50; "
                f"tolerance {tol['forward_ratio']:.2f}x and {excess_tol:g} ms): starved of CPU"
            )
    return reasons


# the parts of the round trip's share the end-of-run line names: the proxies' error up and down, or, where the
# robot-side hops were split per request (those include it), the four hops
SHARE_PARTS = (
    (
        ("uplink_ms", "uplink"),
        ("downlink_ms", "downlink"),
        ("queue_wait_ms", "queue wait"),
        ("inference_ms", "inference"),
        ("uplink_from_router_ms", "router -> server"),
        ("downlink_to_router_ms", "server -> router"),
    ),
    (
        ("uplink_to_router_ms", "robot -> router"),
        ("uplink_from_router_ms", "router -> server"),
        ("queue_wait_ms", "queue wait"),
        ("inference_ms", "inference"),
        ("downlink_to_router_ms", "server -> router"),
        ("downlink_from_router_ms", "router -> robot"),
    ),
)


def table_lines(f: dict) -> list[str]:
    """The end-of-run table (stderr): one line per leg, shard and replica, then the verdict on the twin."""
    if not f.get("legs") and not f.get("shards"):  # no tick ran (a run that failed to start): nothing was judged
        return ["  fidelity: not judged (no robot ticked)"]
    lines = [f"  fidelity: {'VALID' if f.get('valid') else 'OUT OF TOLERANCE'}"]
    for g in f.get("legs", []):
        if g.get("error_ms_p99") is None:
            continue
        bw = g.get("bandwidth")
        lines.append(
            f"    leg {g['site']}/{g['leg']:8} asked {g['asked_ms_mean']:7.1f} ms  applied-asked p50 "
            f"{g['error_ms_p50']:6.1f} p99 {g['error_ms_p99']:7.1f} ms (tol {g['tolerance_ms']:.1f})"
            + (f"  bw {bw['delivered_kBps']}/{bw['asked_kBps']:.0f} kB/s" if bw else "")
        )
    for s in f.get("shards", []):
        lines.append(
            f"    shard {s['shard']}: host-late {_pct(s['host_late_ratio'])}  overrun {_pct(s['loop_overrun_ratio'])}"
            f"  worst wait {s['scheduler_wait_ms_max']} ms"
        )
    for r in f.get("replicas", []):
        if r.get("forward_ms_p50") is None:  # it answered nothing (it did not start, or the run ended first)
            continue
        lines.append(
            f"    replica {r['replica']}: forward p50 {r['forward_ms_p50']} ms, {r['forward_ratio_p50']}x "
            f"unloaded (p99 {r['forward_ratio_p99']}x)"
            + (
                f"; faster than its unloaded reference {r['unloaded_ms']}: that reference is suspect, and "
                "the bench's share read against it comes out below zero"
                if r["forward_ratio_p50"] < SUSPECT_REFERENCE_RATIO
                else ""
            )
        )
    bg = f.get("other_load")
    if bg:
        lines.append(
            f"    host outside the run: {bg['first_percent']:.0f} % of the cores in the first window, "
            f"{bg['last_percent']:.0f} % in the last"
            + (
                f"; speed probe {bg['probe_first_ms']:.1f} -> {bg['probe_last_ms']:.1f} ms"
                if bg.get("probe_shift") is not None
                else ""
            )
        )
    share = f.get("bench_share") or {}
    if (share.get("rtt_ms") or {}).get("p50") is not None:
        parts = [
            f"{name} {share[k]['p50']:.1f}"
            for k, name in SHARE_PARTS[1 if share.get(ROBOT_HOPS[0][0]) else 0]
            if (share.get(k) or {}).get("p50") is not None
        ]
        p99 = share["rtt_ms"].get("p99")
        lines.append(
            f"    the bench's share of the round trip: ~{share['rtt_ms']['p50']:.1f} ms at p50"
            + (f", ~{p99:.1f} at p99" if p99 is not None else "")
            + f" ({', '.join(parts)} at p50)"
        )
        steady, near = share["rtt_ms"].get("steady") or {}, share["rtt_ms"].get("around_faults") or {}
        if steady.get("p99") is not None and near.get("requests"):
            lines.append(
                f"      away from the faults ({steady['requests']} requests) ~{steady['p50']:.1f} / ~"
                f"{steady['p99']:.1f} ms at p50 / p99; in their windows and {FAULT_SETTLE_S:g} s after "
                f"({near['requests']}) "
                + (f"~{near['p50']:.1f} / ~{near['p99']:.1f} ms" if near.get("p99") is not None else "unmeasured")
            )
            for b in share["rtt_ms"].get("by_fault") or []:
                if b.get("p99") is not None:
                    lines.append(
                        f"        {b['fault']} at t {b['t_start']:g} s ({b['requests']} requests): "
                        f"~{b['p50']:.1f} / ~{b['p99']:.1f} ms"
                    )
    for q in f.get("queue_replay") or []:
        if q.get("replay_error_ms_p50") is not None:
            lines.append(
                f"    replica {q['replica']} queue replayed: wait p50 {q['queue_wait_ms_p50']} / p99 "
                f"{q['queue_wait_ms_p99']} ms, replay {q['replayed_ms_p50']} / {q['replayed_ms_p99']}, unloaded "
                f"{q['unloaded_ms_p50']} / {q['unloaded_ms_p99']}"
            )
    lags = [
        f"{name} p50 {share[k]['p50']:.1f} / p99 {share[k]['p99']:.1f} ms"
        for k, name in (("send_lag_ms", "observation -> send"), ("merge_lag_ms", "arrival -> merge"))
        if share.get(k)
    ]
    enc = share.get("encode_ms") or {}
    if enc.get("p50") is not None and enc.get("p99") is not None:
        lags.append(f"client encode beyond its floor p50 {enc['p50']:.1f} / p99 {enc['p99']:.1f} ms")
    if lags:
        lines.append(f"    the shards' own delay outside the round trip: {'; '.join(lags)}")
    lines += [f"    ! {x}" for x in f.get("reasons", [])]
    return lines


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.2f} %"
