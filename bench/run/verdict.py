"""A run's verdict: the figures computed from its records, the scenario's assertions judged on them (and again
on the figures less the bench's measured share, where one failed), the bench host's fidelity, and every report file
(summary.json, junit.xml, report.html) written through bench.evidence.report.

`Judging` is the part of `bench.run.runner.Run` that does it, after the run stopped: it reads the run's state and
its collected records (bench.run.collect). Invariant: a verdict is always written; what could not be computed (the
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
from bench.run.mesh import proxy_name
from bench.scenario.assertions import evaluate


def psutil_rss_mb() -> float:
    import psutil

    return round(psutil.Process().memory_info().rss / 2**20, 1)


# The system's own contracts, judged without being asked (Judging.implicit_checks): a replica or router does not die
# with no fault on it; the edge engine never raises into the robot's control loop, never executes a policy action
# older than the robot's max_action_age_s, and never one of a checkpoint other than the one its session began with.
UNPLANNED_EXITS_CHECK = "unplanned_exits == 0"
ENGINE_RAISES_CHECK = "engine_raises == 0"
IMPLICIT_CHECKS = (UNPLANNED_EXITS_CHECK, ENGINE_RAISES_CHECK, "staleness_violations == 0", "wrong_model_actions == 0")
# a crash or a raise is no host's doing: failed, these fail the run even while the host was out of its tolerances
NEVER_EXCUSED = (UNPLANNED_EXITS_CHECK, ENGINE_RAISES_CHECK)


class Judging:
    """`Run`'s verdict (module docstring); mixed into `Run`, whose state and records it reads."""

    def judge(self, error: str | None) -> report.RunOutcome:
        import resource

        rss_before_report = psutil_rss_mb()
        data = None
        figures_json: dict = {}
        group_json: dict = {}
        results = []
        top = None
        try:
            data = self.collect()
            top, _groups = figs.compute(data)
            figures_json = figs.json_figures(top)
            group_json = {g: figs.json_figures(f) for g, f in top.groups.items()}
            if error is None:
                results = [evaluate(a.expression, top, [g.name for g in self.s.groups], a.line) for a in self.s.assertions]
                results += self.implicit_checks(top)
        except Exception as exc:
            error = (error + "\n" if error else "") + f"aggregation failed: {exc!r}\n{traceback.format_exc()}"
        if error is not None and not results:
            results = [report.AssertionResult(a.expression, False, None, error="not evaluated: the run did not complete",
                                              line=a.line) for a in self.s.assertions]
        fidelity = self.fidelity(data)
        if data is not None and error is None:
            self.without_bench(data, top, results, fidelity)
        verdict = report.verdict_of(results, error, fidelity)
        if verdict == "inconclusive" and any(r.expression in NEVER_EXCUSED and not r.passed for r in results):
            verdict = "fail"  # a dead replica or a raising engine is the system failing, however slow the host was
        # what collecting the records and computing figures held: the runner's peak, read before the report is
        # written (ru_maxrss is the peak of the runner's life; the run itself holds little, so it is this phase's)
        report_phase = {"rss_before_mb": rss_before_report, "rss_after_figures_mb": psutil_rss_mb(),
                        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
        meta = {
            "cpu": getattr(self, "cpu_split", {}),
            "memory": {"processes": getattr(self, "memory", {}), **getattr(self, "leftover_report", {}),
                       "report_phase": report_phase},
            "cores": os.cpu_count(),
            "camera_kind": sorted({g.cameras.kind for g in self.s.groups if g.cameras}) or None,
            "inference_emulated": any(r.emulated_latency is not None for r in self.s.replicas),
            "faults": self.fault_log,
            "processes": [{"name": n, "log": str(p.relative_to(self.run_dir))} for n, p in self._logs()],
            "kill_report": getattr(self, "kill_report", []),
            "loop_priority": sorted({str(d.get("loop_priority", "normal")) for d in self.state.done.values()}),
            "replica_priority": self.replica_priorities(),
            "speed_probe_ms": getattr(self, "speed_probe", {}),
            "security": {"mode": self.s.security, "attacks": [
                {k: a.get(k) for k in ("attacker", "attack", "attempts", "outcome", "evidence")}
                for a in (getattr(data, "attacks", None) or [])]} if (self.s.security != "tcp" or self.s.attackers) else {},
            # shadow groups: per robot, the comparison counts and the first mismatch, in words
            "parity": {str(r): c for r, c in sorted((data.parity if data is not None else {}).items())},
            "cluster": getattr(self, "cluster_facts", None) or {"kind": "local", "nodes": 1},
            "clock": self.clock_facts(),
            "chaos_proxy": {"processes": len(getattr(self, "proxy_servers", [])),
                            "site_process": {n: self.chaos.server_of(f"site-{n}") for n in self.sites}
                            if hasattr(getattr(self, "chaos", None), "server_of") else {},
                            "real_toxiproxy": bool(getattr(getattr(self, "proxy_server", None), "real_toxiproxy", False)),
                            "priority": self.proxy_priorities(),
                            "stand_ins": getattr(self, "network_stand_ins", {})},
            "fidelity": fidelity,
            "leg_series": self.leg_series.to_json(),
            "forward_series": self._forward_series(),
            "shards": getattr(self, "n_shards", None),
            "group_engines": {g.name: g.engine_kind for g in self.s.groups},
            "baselines": figs.baselines(self.s.groups, group_json, self.s.sites),
            "state_changes": figs.state_changes(data.transitions if data is not None else {}),
            "engine_raises": self.engine_raise_examples(),
        }
        if meta["camera_kind"] and len(meta["camera_kind"]) == 1:
            meta["camera_kind"] = meta["camera_kind"][0]
        outcome = report.RunOutcome(
            scenario_name=self.s.name, description=self.s.description, run_dir=self.run_dir, verdict=verdict,
            started_utc=self.started_utc, wall_s=time.monotonic() - self.wall0, duration_s=self.s.duration_s,
            robots=self.s.robots, assertions=results, figures=figures_json, group_figures=group_json, data=data,
            meta=meta, error=error)
        report.write_all(outcome)
        return outcome

    def implicit_checks(self, top) -> list:
        """Each of IMPLICIT_CHECKS that failed, where no assertion of the scenario names its figure (one that does
        decides instead: a scenario may expect a crash). Otherwise a run whose server died, or whose engines raised
        into the loop, could pass on the figures the rest kept. A check that holds adds nothing to the results."""
        out = []
        for check in IMPLICIT_CHECKS:
            figure = check.split()[0]
            if any(figure in a.expression for a in self.s.assertions):
                continue
            result = evaluate(check, top, [g.name for g in self.s.groups], 0)
            if not result.passed and not result.error:
                out.append(result)
        return out

    def engine_raise_examples(self) -> list[dict]:
        """summary.json `engine_raises`: per robot whose engine raised, how often and the first call's traceback."""
        out = []
        for msg in self.state.done.values():
            for robot, raised in (msg.get("engine_raises") or {}).items():
                out.append({"robot": int(robot), "count": int(raised["count"]), "first": raised.get("first", "")})
        return sorted(out, key=lambda r: r["robot"])

    def without_bench(self, data, top, results: list, fidelity: dict) -> None:
        """Each failed assertion, judged again on its figures less the bench's measured share (figs.without_bench):
        its `without_bench` {value, result} where that moves its value."""
        failed = [(r, a) for r, a in zip(results, self.s.assertions) if not r.passed and not r.error]
        if top is None or not failed:
            return
        try:
            network = (fidelity.get("bench_share") or {}).get("network_ms_taken_off") or 0.0
            bare = figs.without_bench(data, top, network)
            for r, a in failed:
                alt = evaluate(a.expression, bare, [g.name for g in self.s.groups], a.line)
                if not alt.error and repr(alt.value) != repr(r.value):
                    r.without_bench = {"value": alt.value, "result": "pass" if alt.passed else "fail"}
        except Exception as exc:  # a reading of the evidence: the verdict stands without it
            print(f"bench: the assertions without the bench's share could not be judged: {exc!r}", file=sys.stderr)

    def fidelity(self, data) -> dict:
        """summary.json's `fidelity`: the bench host's own error in this run, judged by `fidelity:` tolerances."""
        tol = dict(self.s.fidelity) if self.s.fidelity else None
        if not tol:
            from bench.scenario.model import Fidelity

            tol = Fidelity().model_dump()
        legs, note = self.window_legs(), getattr(self, "proxy_legs_error", None)
        if legs is None and getattr(getattr(self, "proxy_server", None), "real_toxiproxy", False):
            note = "the real Toxiproxy ran the network: it cannot say what delay it applied; legs not measured"
        unloaded = self.unloaded_forward()
        t0 = (self.state.t0_mono or 0.0) * 1e3
        try:
            drift = any("_drift" in a.expression for a in self.s.assertions)
            return fid.compute(data, self.s.duration_s, tol, legs, self._audit(), unloaded,
                               (t0, t0 + self.s.duration_s * 1e3), note, cores=self.cpu.cores, judge_drift=drift,
                               queue_replay=getattr(self, "server_replay", None),
                               hop_floors=getattr(self, "hop_floors", None),
                               robot_hops=getattr(self, "robot_hops", None),
                               encode_floors=getattr(self, "encode_floors", None))
        except Exception as exc:  # the verdict must still be written; say what could not be measured
            return {"valid": True, "reasons": [], "tolerances": tol, "legs": [], "shards": [], "replicas": [],
                    "note": f"fidelity could not be computed: {exc!r}"}

    def window_legs(self, start: dict | None = None, end: dict | None = None) -> dict | None:
        """Each site's proxy counters over the measured window (the end's less the start's; by default the run's
        summed over the nodes, `leg_start`/`leg_end`), None when the proxies could not say (a real Toxiproxy, a run
        that never reached its end)."""
        from chaos.toxiproxy.fidelity import subtract

        if end is None:
            start, end = getattr(self, "leg_start", None), getattr(self, "leg_end", None)
        if not end:
            return None
        return {site: {"edges_ms": snap.get("edges_ms"),
                       **{d: subtract(snap[d], ((start or {}).get(site) or {}).get(d)) for d in ("upstream", "downstream")}}
                for site, snap in end.items()}

    def _forward_series(self) -> dict:

        try:
            unloaded = self.unloaded_forward()
            return fid.forward_series(self._audit(), unloaded, (self.state.t0_mono or 0.0) * 1e3, self.s.duration_s)
        except Exception:
            return {}  # a report figure only; fidelity itself says what it could not measure

    def proxy_priorities(self) -> list[str]:
        """How the run's chaos proxies were scheduled: each local one read from its process once ready, each one a
        cluster node ran (per_node routers) from the line its log says it with (chaos.launch.priority_in_log)."""
        from chaos.launch import priority_in_log

        got = {getattr(s, "priority", "normal") for s in getattr(self, "proxy_servers", [])}
        local = {f"{proxy_name(i)}.log" for i in range(len(getattr(self, "proxy_servers", [])))}
        for log in sorted(self.logs.glob("chaos-proxy*.log")):
            if log.name not in local:
                got.add(priority_in_log(log) or "unknown")
        return sorted(got)

    def replica_priorities(self) -> list[str]:
        """How the replicas' dispatch loops were scheduled, from each one's log line (server.service)."""
        from chaos.launch import priority_in_log
        from server.service import DISPATCH_PRIORITY_LOG_TEXT

        got = {priority_in_log(self.logs / f"server-{rid}.log", DISPATCH_PRIORITY_LOG_TEXT) for rid in self.servers}
        return sorted(p or "unknown" for p in got)

    def _logs(self):
        return [(p.stem, p) for p in sorted(self.logs.glob("*.log"))]
