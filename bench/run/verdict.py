"""A run's verdict: the figures computed from its records, the scenario's assertions judged on them (and again
on the figures less the bench's measured share, where one failed), the bench host's fidelity, and every report file
(summary.json, junit.xml, report.html) written through bench.evidence.report.

`judge` is the run's last phase, after it stopped: it reads the run's state (bench.run.state) and its collected
records (bench.run.collect). Invariant: a verdict is always written; what could not be computed (the
figures, the fidelity, the share) is said in it, and an assertion never evaluated is failed with the reason. A
replica or router that exited while no fault held it down, an engine call that raised into a robot's control loop, a
stale or wrong-model action executed: each fails the run, asked or not (IMPLICIT_CHECKS).
"""

from __future__ import annotations

import os
import sys
import time
import traceback

from bench.evidence import fidelity as fid
from bench.evidence import figures as figs
from bench.evidence import report
from bench.run.collect import audit_table, clock_facts, collect, unloaded_forward
from bench.run.legs import window_legs
from bench.run.mesh import proxy_name
from bench.run.state import RunState
from bench.scenario.assertions import evaluate, figure_names
from server.priority import DISPATCH_PRIORITY_LOG_TEXT


def psutil_rss_mb() -> float:
    import psutil

    return round(psutil.Process().memory_info().rss / 2**20, 1)


# The system's own contracts, judged without being asked (implicit_checks): a replica or router does not die
# with no fault on it; the edge engine never raises into the robot's control loop, never executes a policy action
# older than the robot's max_action_age_s, and never one of a checkpoint other than the one its session began with.
UNPLANNED_EXITS_CHECK = "unplanned_exits == 0"
ENGINE_RAISES_CHECK = "engine_raises == 0"
IMPLICIT_CHECKS = (UNPLANNED_EXITS_CHECK, ENGINE_RAISES_CHECK, "staleness_violations == 0", "wrong_model_actions == 0")
# figures no slow host can move (a crash, a raise, an attack that got through): a failed assertion that reads only
# these, the implicit unplanned_exits / engine_raises checks among them, fails the run however slow the host was
HOST_INDEPENDENT_FIGURES = frozenset({"unplanned_exits", "engine_raises", "attacks_breached"})


def never_excused(r) -> bool:
    """A failed result the host's fidelity cannot excuse: one whose assertion reads only host-independent figures."""
    names = figure_names(r.expression)
    return not r.passed and bool(names) and names <= HOST_INDEPENDENT_FIGURES


def judge(run: RunState, error: str | None) -> report.RunOutcome:
    import resource

    rss_before_report = psutil_rss_mb()
    data = None
    figures_json: dict = {}
    group_json: dict = {}
    results = []
    top = None
    try:
        data = collect(run)
        top, _groups = figs.compute(data)
        figures_json = figs.json_figures(top)
        group_json = {g: figs.json_figures(f) for g, f in top.groups.items()}
        if error is None:
            results = [evaluate(a.expression, top, [g.name for g in run.s.groups], a.line) for a in run.s.assertions]
            results += implicit_checks(run, top)
    except Exception as exc:
        error = (error + "\n" if error else "") + f"aggregation failed: {exc!r}\n{traceback.format_exc()}"
    if error is not None and not results:
        results = [
            report.AssertionResult(
                a.expression, False, None, error="not evaluated: the run did not complete", line=a.line
            )
            for a in run.s.assertions
        ]
    fidelity = fidelity_of(run, data)
    if data is not None and error is None:
        without_bench(run, data, top, results, fidelity)
    verdict = report.verdict_of(results, error, fidelity)
    if verdict == "inconclusive" and any(never_excused(r) for r in results):
        verdict = "fail"  # a dead replica, a raising engine, a breach: the system failing, however slow the host
    # what collecting the records and computing figures held: the runner's peak, read before the report is
    # written (ru_maxrss is the peak of the runner's life; the run itself holds little, so it is this phase's)
    report_phase = {
        "rss_before_mb": rss_before_report,
        "rss_after_figures_mb": psutil_rss_mb(),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    meta = {
        "cpu": run.cpu_split,
        "memory": {"processes": run.memory, **run.leftover_report, "report_phase": report_phase},
        "cores": os.cpu_count(),
        "camera_kind": sorted({g.cameras.kind for g in run.s.groups if g.cameras}) or None,
        "inference_emulated": any(r.emulated_latency is not None for r in run.s.replicas),
        "faults": run.fault_log,
        "processes": [{"name": n, "log": str(p.relative_to(run.run_dir))} for n, p in process_logs(run)],
        "kill_report": run.kill_report,
        "loop_priority": sorted({str(d.get("loop_priority", "normal")) for d in run.done.values()}),
        "replica_priority": replica_priorities(run),
        "speed_probe_ms": run.speed_probe,
        "security": {
            "mode": run.s.security,
            "attacks": [
                {k: a.get(k) for k in ("attacker", "attack", "attempts", "outcome", "evidence")}
                for a in (getattr(data, "attacks", None) or [])
            ],
        }
        if (run.s.security != "tcp" or run.s.attackers)
        else {},
        # shadow groups: per robot, the comparison counts and the first mismatch, in words
        "parity": {str(r): c for r, c in sorted((data.parity if data is not None else {}).items())},
        "cluster": run.cluster_facts or {"kind": "local", "nodes": 1},
        "clock": clock_facts(run),
        "chaos_proxy": {
            "processes": len(run.proxy_servers),
            "site_process": {n: run.chaos.server_of(f"site-{n}") for n in run.sites}
            if hasattr(run.chaos, "server_of")
            else {},
            "real_toxiproxy": bool(getattr(run.proxy_server, "real_toxiproxy", False)),
            "priority": proxy_priorities(run),
            "stand_ins": run.network_stand_ins,
        },
        "fidelity": fidelity,
        "leg_series": run.leg_series.to_json(),
        "forward_series": forward_series(run),
        "shards": run.n_shards,
        "group_engines": {g.name: g.engine_kind for g in run.s.groups},
        "baselines": figs.baselines(run.s.groups, group_json, run.s.sites),
        "state_changes": figs.state_changes(data.transitions if data is not None else {}),
        "engine_raises": engine_raise_examples(run),
    }
    if meta["camera_kind"] and len(meta["camera_kind"]) == 1:
        meta["camera_kind"] = meta["camera_kind"][0]
    outcome = report.RunOutcome(
        scenario_name=run.s.name,
        description=run.s.description,
        run_dir=run.run_dir,
        verdict=verdict,
        started_utc=run.started_utc,
        wall_s=time.monotonic() - run.wall0,
        duration_s=run.s.duration_s,
        robots=run.s.robots,
        assertions=results,
        figures=figures_json,
        group_figures=group_json,
        data=data,
        meta=meta,
        error=error,
    )
    report.write_all(outcome)
    return outcome


def implicit_checks(run: RunState, top) -> list:
    """Each of IMPLICIT_CHECKS that failed, where no assertion of the scenario names its figure (one that does
    decides instead: a scenario may expect a crash). Otherwise a run whose server died, or whose engines raised
    into the loop, could pass on the figures the rest kept. A check that holds adds nothing to the results."""
    out = []
    for check in IMPLICIT_CHECKS:
        figure = check.split()[0]
        if any(figure in a.expression for a in run.s.assertions):
            continue
        result = evaluate(check, top, [g.name for g in run.s.groups], 0)
        if not result.passed and not result.error:
            out.append(result)
    return out


def engine_raise_examples(run: RunState) -> list[dict]:
    """summary.json `engine_raises`: per robot whose engine raised, how often and the first call's traceback."""
    out = []
    for msg in run.done.values():
        for robot, raised in (msg.get("engine_raises") or {}).items():
            out.append({"robot": int(robot), "count": int(raised["count"]), "first": raised.get("first", "")})
    return sorted(out, key=lambda r: r["robot"])


def without_bench(run: RunState, data, top, results: list, fidelity: dict) -> None:
    """Each failed assertion, judged again on its figures less the bench's measured share (figs.without_bench):
    its `without_bench` {value, result} where that moves its value."""
    failed = [(r, a) for r, a in zip(results, run.s.assertions) if not r.passed and not r.error]
    if top is None or not failed:
        return
    try:
        network = (fidelity.get("bench_share") or {}).get("network_ms_taken_off") or 0.0
        bare = figs.without_bench(data, top, network)
        for r, a in failed:
            alt = evaluate(a.expression, bare, [g.name for g in run.s.groups], a.line)
            if not alt.error and repr(alt.value) != repr(r.value):
                r.without_bench = {"value": alt.value, "result": "pass" if alt.passed else "fail"}
    except Exception as exc:  # a reading of the evidence: the verdict stands without it
        print(f"bench: the assertions without the bench's share could not be judged: {exc!r}", file=sys.stderr)


def fidelity_of(run: RunState, data) -> dict:
    """summary.json's `fidelity`: the bench host's own error in this run, judged by `fidelity:` tolerances."""
    tol = dict(run.s.fidelity) if run.s.fidelity else None
    if not tol:
        from bench.scenario.model import Fidelity

        tol = Fidelity().model_dump()
    legs, note = window_legs(run), run.proxy_legs_error
    if legs is None and getattr(run.proxy_server, "real_toxiproxy", False):
        note = "the real Toxiproxy ran the network: it cannot say what delay it applied; legs not measured"
    unloaded = unloaded_forward(run)
    t0 = (run.t0_mono or 0.0) * 1e3
    try:
        drift = any("_drift" in a.expression for a in run.s.assertions)
        return fid.compute(
            data,
            run.s.duration_s,
            tol,
            legs,
            audit_table(run),
            unloaded,
            (t0, t0 + run.s.duration_s * 1e3),
            note,
            cores=run.cpu.cores,
            judge_drift=drift,
            queue_replay=run.server_replay,
            hop_floors=run.hop_floors,
            robot_hops=run.robot_hops,
            encode_floors=run.encode_floors,
        )
    except Exception as exc:  # the verdict must still be written; say what could not be measured
        return {
            "valid": True,
            "reasons": [],
            "tolerances": tol,
            "legs": [],
            "shards": [],
            "replicas": [],
            "note": f"fidelity could not be computed: {exc!r}",
        }


def forward_series(run: RunState) -> dict:

    try:
        unloaded = unloaded_forward(run)
        return fid.forward_series(audit_table(run), unloaded, (run.t0_mono or 0.0) * 1e3, run.s.duration_s)
    except Exception:
        return {}  # a report figure only; fidelity itself says what it could not measure


def proxy_priorities(run: RunState) -> list[str]:
    """How the run's chaos proxies were scheduled: each local one read from its process once ready, each one a
    cluster node ran (per_node routers) from the line its log says it with (chaos.launch.priority_in_log)."""
    from chaos.launch import priority_in_log

    got = {getattr(s, "priority", "normal") for s in run.proxy_servers}
    local = {f"{proxy_name(i)}.log" for i in range(len(run.proxy_servers))}
    for log in sorted(run.logs.glob("chaos-proxy*.log")):
        if log.name not in local:
            got.add(priority_in_log(log) or "unknown")
    return sorted(got)


# the words before a replica's dispatch priority in its log (server.priority imports nothing: no torch for judging)
REPLICA_PRIORITY_LOG_TEXT = DISPATCH_PRIORITY_LOG_TEXT


def replica_priorities(run: RunState) -> list[str]:
    """How the replicas' dispatch loops were scheduled, from each one's log line (server.service)."""
    from chaos.launch import priority_in_log

    got = {priority_in_log(run.logs / f"server-{rid}.log", REPLICA_PRIORITY_LOG_TEXT) for rid in run.servers}
    return sorted(p or "unknown" for p in got)


def process_logs(run: RunState):
    return [(p.stem, p) for p in sorted(run.logs.glob("*.log"))]
