"""The measured window: the start barrier sent to every shard on its own clock, warmup, t = 0 (the proxies'
legs read, the fault timeline started, bench.run.faults), the clocks measured again just before the end, and
every control message, child and fault checked until the end (bench.run.observe). Beside it, a thread scrapes the
replicas' gauges and the proxies' legs once a second; the progress line reads `snapshot`.
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np

from bench.evidence.figures import UNPLANNED_EXIT
from bench.fleet import clock as clocks
from bench.run.faults import check_timeline, start_timeline
from bench.run.legs import node_proxy_legs, proxy_legs
from bench.run.observe import check_children, handle, measure_clocks, measure_node_walls, write_clock_file
from bench.run.starters import STARTERS
from bench.run.state import RunState

CLOCK_RECHECK_BEFORE_END_S = 1.0  # the clocks are measured again this long before the end: shards leave at the end


def drive(run: RunState) -> None:
    """The start barrier, warmup and the measured window: returns at its end, raises if a child failed."""
    start_at = time.monotonic() + 0.3
    run.t0_mono = start_at + run.s.warmup_s
    run.end_mono = run.t0_mono + run.s.duration_s
    write_clock_file(run)
    run.cpu.t0 = run.t0_mono
    for link in list(run.control.links):  # the barrier, t = 0 and the end, each on the shard's own clock
        offset = run.clocks.get(f"shard:{link.shard}", clocks.SAME_CLOCK)
        link.send(
            {
                "type": "start",
                "start_mono": offset.to_child(start_at),
                "t0_mono": offset.to_child(run.t0_mono),
                "end_mono": offset.to_child(run.end_mono),
                "clock_offset_s": offset.offset_s,
            }
        )
    if run.s.attackers:
        STARTERS["attacker"](run)
    run.phase = "warmup"
    threading.Thread(target=scrape_servers, args=(run,), name="scrape", daemon=True).start()
    timeline_started = False
    while True:
        now = time.monotonic()
        if now >= run.end_mono:
            break
        if now >= run.end_mono - CLOCK_RECHECK_BEFORE_END_S and run.clocks_near_end is None:
            # while every shard still answers; a child on this runner's clock cannot drift from it
            run.clocks_near_end = measure_clocks(
                run, strict=False, only={n for n, o in run.clocks.items() if not o.same_clock}
            )
            if run.cluster is not None:
                run.node_walls_near_end = measure_node_walls(run)
        if not timeline_started and now >= run.t0_mono:
            run.leg_start = proxy_legs(run)  # the measured window's legs start here (warmup excluded)
            run.node_leg_start = node_proxy_legs(run)
            run.phase = "run"
            if run.s.faults:
                run.timeline = start_timeline(run)
            timeline_started = True
        wake = run.t0_mono if not timeline_started else run.end_mono
        try:
            link, msg = run.control.messages.get(timeout=max(0.01, min(0.5, wake - now)))
            handle(run, link, msg)
        except queue.Empty:
            pass
        check_children(run)
        check_timeline(run)


def snapshot(run: RunState):
    """What the progress line shows now (bench.run.progress): elapsed, phase, the shards' merged statuses."""
    total = run.s.duration_s
    t0 = run.t0_mono
    elapsed = (time.monotonic() - t0) if t0 else 0.0
    merged: dict = {"states": {}}
    rtt50, rtt99 = [], []
    for st in list(run.statuses.values()):
        for k, v in (st.get("states") or {}).items():
            merged["states"][k] = merged["states"].get(k, 0) + v
        for k in ("ticks", "none_ticks", "late_ticks", "host_late_ticks"):
            merged[k] = merged.get(k, 0) + int(st.get(k, 0))
        if st.get("rtt_ms_p50") is not None:
            rtt50.append(st["rtt_ms_p50"])
            rtt99.append(st.get("rtt_ms_p99", st["rtt_ms_p50"]))
    if rtt50:
        merged["rtt_ms_p50"], merged["rtt_ms_p99"] = float(np.mean(rtt50)), float(np.max(rtt99))
    merged["unplanned_exits"] = [w["target"] for w in list(run.fault_log) if w.get("action") == UNPLANNED_EXIT]
    return elapsed, total, run.phase, merged, run.cpu.latest()


def scrape_servers(run: RunState) -> None:
    """Every replica's gauges and every site proxy's legs, once a second until the stop (its own thread)."""
    import urllib.request

    from bench.run.prom import parse_prometheus

    wanted = {
        "policy_server_queue_depth": "queue_depth",
        "policy_server_load": "load",
        "policy_server_active_sessions": "active_sessions",
        "policy_server_active_clients": "active_clients",
    }
    query = "&".join(f"name[]={n}" for n in wanted)  # only these families: a full scrape costs the server
    while not run.stop_scrape.wait(1.0):
        t = time.monotonic() - (run.t0_mono or time.monotonic())
        if t >= -1.0 and run.phase == "run":
            legs = proxy_legs(run)  # the report's per-second leg error (one small GET per site)
            if legs:
                run.leg_series.add(t, legs)
        for rid, info in list(run.servers.items()):
            try:
                with urllib.request.urlopen(f"{health_url(run, info)}/metrics?{query}", timeout=0.5) as r:
                    text = r.read().decode()
            except Exception:
                continue  # a restarting replica has no endpoint for a while
            for name, _labels, value in parse_prometheus(text):
                if name in wanted:
                    run.server_samples.append({"t": t, "replica": rid, "metric": wanted[name], "value": value})


def health_url(run: RunState, info: dict) -> str:
    """A replica's health server: on this host at loopback, on another host at its node's address."""
    host = "127.0.0.1"
    if run.host != "127.0.0.1":
        node = getattr(info["child"], "node", None) or {}
        host = node.get("ip") or host
    return f"http://{host}:{info['health_port']}"
