"""The stop: the proxies' legs and the clocks read a last time, the fault timeline healed, every shard told to
stop and its `done` awaited, the CPU and memory split by process (with the preflight's cost model beside what this
run measured, bench.run.sizing), every child stopped, and a cluster's remote files pulled back before judging.

Invariant: the stop runs whatever the run met (from its `finally`); a timeline that cannot heal or a file not
collected is added to `run.errors`, and the run goes on to its verdict.
"""

from __future__ import annotations

import queue
import time

from bench.fleet import clock as clocks
from bench.fleet import threadcpu
from bench.run.legs import node_proxy_asked, node_proxy_legs, proxy_asked, proxy_legs
from bench.run.observe import write_clock_file
from bench.run.state import RunState
from wire.procs import ChildProcess

SHARD_DONE_TIMEOUT_S = 30.0


def shutdown(run: RunState) -> None:
    """Everything the children know read before they stop, then every child stopped (bench.run.procset), and with
    --cluster their files pulled back here. Runs from the run's `finally`: whatever failed before it."""
    if run.t0_mono is not None and time.monotonic() >= run.t0_mono:
        run.leg_end = proxy_legs(run)  # before the timeline heals and the proxy stops
        run.leg_asked = proxy_asked(run)
        run.node_leg_end, run.node_asked = node_proxy_legs(run), node_proxy_asked(run)
    run.phase = "stopping"
    end, walls_end = run.clocks_near_end, run.node_walls_near_end
    if end or walls_end:  # the clocks drift over a run: the start's and the end's measurements, combined
        run.clocks = {n: clocks.combine(o, end[n]) if n in (end or {}) else o for n, o in run.clocks.items()}
        run.node_walls = {
            n: clocks.combine(o, walls_end[n]) if n in (walls_end or {}) else o for n, o in run.node_walls.items()
        }
        write_clock_file(run)
    try:
        if run.timeline is not None:
            run.timeline.stop()
    except Exception as exc:
        run.errors.append(f"timeline stop: {exc!r}")
    if run.control is not None:
        run.control.broadcast({"type": "stop"})
        deadline = time.monotonic() + SHARD_DONE_TIMEOUT_S
        # every started shard, alive or not: a shard that finished on its own before this point has its
        # `done` (final states, loop priority) waiting in the queue
        shards = {n for n, c in run.procs.children if n.startswith("shard:")}
        while len(run.done) < len(shards) and time.monotonic() < deadline:
            try:
                link, msg = run.control.messages.get(timeout=0.5)
                if msg.get("type") == "done":
                    run.done[msg.get("shard", link.shard)] = msg
            except queue.Empty:
                if not any(c.alive() for n, c in run.procs.children if n.startswith("shard:")):
                    break
    deadline = time.monotonic() + 20.0  # an attacker still running at the end gets a moment to write
    while any(c.alive() for n, c in run.procs.children if n.startswith("attacker:")) and time.monotonic() < deadline:
        time.sleep(0.2)
    run.server_crashes = sum(
        1
        for n, c in run.procs.children
        if n.startswith("server:") and isinstance(c, ChildProcess) and c.proc is not None and not c.alive()
    )
    run.stop_scrape.set()
    run.cpu_split = run.cpu.split(0.0, run.s.duration_s)
    shard_threads = threadcpu.combine([d.get("thread_cpu") for d in run.done.values()])
    if shard_threads:  # the shards' CPU by thread role: the loop, the engines, the records writer, Zenoh
        run.cpu_split["shard_threads"] = shard_threads
    if run.cluster is None:
        run.cpu_split.update(cost_model(run, run.cpu_split))
    run.memory = run.cpu.memory(0.0, run.s.duration_s)
    run.cpu.stop()
    run.kill_report = run.procs.stop_all()
    if run.cluster is not None:  # records and logs written on other hosts come back before judging
        for child in run.cluster.children:
            try:
                child.pull_files(run.run_dir)
            except Exception as exc:
                run.errors.append(f"{child.name}: files not collected: {exc}")
        run.cluster_facts = run.cluster.describe(run.s.cluster.get("placement", "spread"))
        run.cluster_facts["routers"] = run.routers
        mesh = run.mesh.describe() if run.mesh is not None else {}
        for node in run.cluster_facts["nodes"]:  # each node's router and proxies beside its children
            node.update(mesh.get(node["node_id"], {}))
        run.cluster.close()


def cost_model(run: RunState, split: dict) -> dict:
    """The preflight's cost model (bench.run.sizing) at this run's own in-run speed probe, beside what each
    kind of process measured: how far the estimate `bench run --check` prints was from this run."""
    from bench.run.sizing import estimate, forward_costs, measured_by_kind

    probes = run.cpu.probes(0.0, run.s.duration_s)
    probe = probes.get("mean_ms") or probes.get("median_ms")  # the run's mean speed (usage.CpuSampler.probes)
    if not probe or not split.get("split"):
        return {}
    # the forward costs the preflight timed (cached): never timed now, beside a run still stopping
    est = estimate(run.s, cores=split.get("cores"), probe_ms=probe, forward=forward_costs(run.s, measure=False))
    est = est.to_json()
    measured = measured_by_kind(split["split"])
    total = sum(measured.values())
    from bench.run.usage import COST_REFERENCE_PROBE_MS

    at_reference = est["cores_needed"] * COST_REFERENCE_PROBE_MS / probe
    # the model unscaled beside it: on the 16-core machine the probe read SMT contention (a mean 1.5-1.9x the
    # reference while the work itself took 1.0-1.16x its reference cost), so the scaled ratio read 0.62-0.66
    return {
        "estimate": est,
        "by_kind": measured,
        "estimate_ratio": round(total / est["cores_needed"], 2) if est["cores_needed"] else None,
        "estimate_ratio_at_reference": round(total / at_reference, 2) if at_reference else None,
    }
