"""`bench run`: start every process of a scenario on 127.0.0.1, drive it, judge it, tear it down.

    router (wire.transport) ◄── servers (policy-server, one per replica, direct)
        ▲
        └── chaos proxy: one proxy per site, the site's profile as toxics
                 ▲
                 └── fleet shards (python -m bench.fleet.shard): N robots each, one engine and one
                     Zenoh session per robot, all through their site's proxy

Phases: preflight (checkpoints, packages) → start router, proxy, servers, shards → start barrier
→ warmup → measured window (fault timeline runs, progress line, samplers) → stop → aggregate
records → figures → assertions → summary.json, junit.xml, report.html.

`Run` is the sequencer: each phase is a function over the run's declared state (bench.run.state), in a module of
its own: bench.run.preflight, starters (the registry of process starters, with specs), drive (with observe, faults
and legs), stop, collect, verdict. Owns the run directory reports/<scenario>/<UTC timestamp>/ and the exit code (0 pass, 1 an
assertion failed, 2 invalid scenario/environment or the run errored, 3 inconclusive: an assertion
failed while the run's own fidelity was out of tolerance, so the host may have caused it). Invariant: every process it
starts is registered in a `ProcessSet` the moment it exists, and a `finally` stops the set in
reverse order, so Ctrl-C, a crash or a failed assertion leaves no orphan and no bound port.
"""

from __future__ import annotations

import functools
import json
import sys
import traceback
from datetime import UTC, datetime
from pathlib import Path

from bench.evidence import report
from bench.evidence.exitcode import Exit, worse
from bench.evidence.figures import UNPLANNED_EXIT
from bench.run.drive import drive, snapshot
from bench.run.faults import exit_words, is_system_process  # noqa: F401  (imported from here)
from bench.run.manifests import plain
from bench.run.preflight import EnvironmentInvalid, cuda_problems, preflight, reports_problems  # noqa: F401
from bench.run.procset import install_signal_handlers
from bench.run.progress import Progress, print_verdict
from bench.run.specs import rtc_budget_s as _rtc_budget_s  # noqa: F401  (imported from here)
from bench.run.starters import start_processes
from bench.run.state import RunState, SiteLink  # noqa: F401  (imported from here)
from bench.run.stop import shutdown
from bench.run.usage import Leftovers
from bench.run.verdict import judge
from bench.scenario.load import Scenario, sweep_variants


def utc_stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def run_scenario(
    scenario: Scenario,
    reports_dir: Path = Path("reports"),
    progress: bool = True,
    stamp: str | None = None,
    cluster: str | None = None,
) -> int:
    """Run the scenario (every sweep variant); print where the reports are; return the exit code.

    `cluster`: None runs every process here (the default, nothing to install); "ray" or "ray://HOST:PORT"
    places shards and replicas on a Ray cluster (bench.run.cluster, docs/cluster.md)."""
    install_signal_handlers()
    problems = reports_problems(reports_dir) or preflight(scenario)
    variants = [v for _, v in sweep_variants(scenario)] or [scenario]
    if not problems and cluster is None:  # one host holds every robot's sockets
        from bench.run.sizing import open_files_problem

        problems = [p for p in map(open_files_problem, variants) if p][:1]
    if not problems:  # a run whose report cannot fit in memory would be lost at its end
        from bench.run.sizing import report_memory

        memory = max((report_memory(v) for v in variants), key=lambda m: m.needed_mb)
        if not memory.fits:
            problems = [memory.line(scenario)]
        elif memory.available_mb is not None and memory.needed_mb > 0.5 * memory.available_mb:
            print(f"bench: {memory.line(scenario)}", file=sys.stderr)
    if problems:
        for p in problems:
            print(f"bench: {p}", file=sys.stderr)
        return Exit.INVALID
    if cluster is None:  # the estimate is of this host; a cluster's nodes are another matter
        from bench.run.sizing import estimate

        for line in estimate(scenario).lines():
            print(f"bench: {line}", file=sys.stderr)
    ray_cluster = None
    if cluster is not None:
        from bench.run.cluster import ClusterError, connect
        from bench.run.mesh import resolve_routers

        try:
            resolve_routers(scenario.cluster.get("routers"))
        except ValueError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return Exit.INVALID

        try:
            ray_cluster = connect(None if cluster == "ray" else cluster)
        except ClusterError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return Exit.INVALID
    try:
        return _run_variants(scenario, reports_dir, progress, stamp, ray_cluster)
    finally:
        if ray_cluster is not None:
            ray_cluster.close()


def _run_variants(scenario: Scenario, reports_dir: Path, progress: bool, stamp: str | None, ray_cluster) -> int:
    base = Path(reports_dir) / scenario.name / (stamp or utc_stamp())
    worst = Exit.PASS
    variants = sweep_variants(scenario)
    sweep = scenario.sweep or {}
    labels, rows, group = [], [], None
    for (label, variant), value in zip(variants, sweep.get("values") or [None]):
        run_dir = base / label if label else base
        if ray_cluster is None and label:  # a variant serving another checkpoint: timed before its processes start
            from bench.run.sizing import forward_costs

            forward_costs(variant)
        outcome = Run(variant, run_dir, progress=progress, cluster=ray_cluster).execute()
        print_verdict(
            f"bench: {variant.name}{(' [' + label + ']') if label else ''}: {outcome.verdict.upper()} "
            f"-> {outcome.run_dir}/summary.json",
            outcome.assertions,
            outcome.error,
        )
        for w in [f for f in outcome.meta.get("faults") or [] if f.get("action") == UNPLANNED_EXIT][:5]:
            print(f"  EXIT  {w['target']} at t {w['t_start']:g} s with no fault on it: {w['detail']}", file=sys.stderr)
        for r in (outcome.meta.get("engine_raises") or [])[:3]:
            first = r["first"].splitlines()
            print(
                f"  RAISE robot {r['robot']}: {r['count']} engine calls raised; the first: {first[0] if first else ''} "
                f"{first[-1] if len(first) > 1 else ''}",
                file=sys.stderr,
            )
        dead = [c for c in outcome.meta.get("state_changes") or [] if c["to"] == "DEAD"]
        for c in dead[:3]:  # why robots died, before the host's fidelity: the first thing to read of a collapse
            print(
                f"  DEAD  {c['robots']} robots {c['from']} -> DEAD at t {c['t_first']:g}..{c['t_last']:g} s: "
                f"{c['example']}",
                file=sys.stderr,
            )
        if outcome.meta.get("fidelity"):
            from bench.evidence.fidelity import table_lines

            print("\n".join(table_lines(outcome.meta["fidelity"])), file=sys.stderr)
        worst = worse(worst, outcome.exit_code)
        if outcome.meta.get("interrupted"):
            break
        if label:
            from bench.evidence import capacity

            labels.append(label)
            rows.append(capacity.step_row(value, json.loads((run_dir / "summary.json").read_text())))
            group = variant.groups[0]  # the load steps' engine settings feed the formula
            if outcome.exit_code == Exit.INVALID:
                break  # an errored run ends the sweep: the knee is read only off completed runs
            if outcome.exit_code != Exit.PASS and sweep.get("stop_after_failure"):
                break
    if sweep:
        worst = finish_sweep(scenario, base, labels, rows, group, worst)
    return worst


def finish_sweep(scenario: Scenario, base: Path, labels: list[str], rows: list[dict], group, worst: int) -> int:
    """sweep.json, the perf_analyzer-style table and, in capacity mode, the knee and its verdict."""
    from bench.evidence import capacity
    from bench.scenario.sweeps import evaluate_sweep_assertions

    sweep = scenario.sweep
    print(
        f"bench: sweep {sweep['key']}:\n" + capacity.format_table(rows) + "\n" + capacity.format_group_table(rows),
        file=sys.stderr,
    )
    cap, results = None, []
    if sweep.get("mode") == "capacity" and group is not None:
        horizon = int(group.engine.get("execution_horizon", 10))
        cap = capacity.capacity_report(rows, horizon, 1.0 / group.fps, sweep.get("formula"))
        print(capacity.format_capacity(cap), file=sys.stderr)
        results = evaluate_sweep_assertions(sweep.get("assertions") or [], cap["figures"])
        for r in results:
            print(
                f"  {r['result'].upper():5} {r['expression']}  (value: {r['value']!r}"
                f"{'; ' + r['error'] if r['error'] else ''})",
                file=sys.stderr,
            )
        # load steps past the knee fail by design: the verdict is the sweep's own assertions
        if not rows or any(r["verdict"] == "error" for r in rows):
            worst = Exit.INVALID
        else:
            worst = Exit.FAIL if any(r["result"] != "pass" for r in results) else Exit.PASS
    path = capacity.write_sweep(base, scenario, labels, rows, cap, results)
    print(f"bench: sweep -> {path}", file=sys.stderr)
    return worst


class Run:
    """One scenario's run (one sweep variant): its phases in order over its declared state (`state`)."""

    def __init__(
        self, scenario: Scenario, run_dir: Path, progress: bool = True, engine_factory: str | None = None, cluster=None
    ):
        self.state = RunState.of(scenario, run_dir, progress, engine_factory, cluster)

    def execute(self) -> report.RunOutcome:
        run = self.state
        prepare(run)
        error, interrupted = None, False
        prog = Progress(functools.partial(snapshot, run), enabled=run.progress_enabled)
        try:
            start_processes(run)
            prog.start()
            drive(run)
        except KeyboardInterrupt:
            error, interrupted = "interrupted (Ctrl-C or SIGTERM): the run was stopped early", True
        except EnvironmentInvalid as exc:
            error = f"environment: {exc}"
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        finally:
            prog.stop()
            shutdown(run)
            run.leftover_report = run.leftovers.end()
        from bench.run.usage import speed_probe_ms

        run.speed_probe["after_ms"] = round(speed_probe_ms(), 1)
        during = run.cpu.probes(0.0, run.s.duration_s)
        if during:  # every second of the run, in CPU time (bench.run.usage.IN_RUN_PROBE_FRACTION)
            run.speed_probe["during"] = during
        outcome = judge(run, error)
        if run.s.record.get("dataset") and (run.run_dir / "ticks.parquet").is_file():
            record_datasets(run)
        outcome.meta["interrupted"] = interrupted
        if isinstance(error, str) and error.startswith("environment:"):
            outcome.meta["environment_invalid"] = True
        return outcome


def record_datasets(run: RunState) -> None:
    """The run's episodes as LeRobotDatasets (`record.dataset`, bench.run.dataset), after its verdict: a
    dataset that cannot be written is said, and leaves the verdict and the records as they are."""
    from bench.run.dataset import DatasetError, write_datasets

    out = Path(run.s.record["dir"]) if run.s.record.get("dir") else run.run_dir / "dataset"
    try:
        for line in write_datasets(run.run_dir, out):
            print(f"bench: dataset {line}", file=sys.stderr)
    except DatasetError as exc:
        print(f"bench: no dataset written: {exc}", file=sys.stderr)
    except Exception as exc:  # LeRobot's own refusal: said, and the run's verdict and records stay as they are
        print(f"bench: no dataset written: LeRobot failed: {exc!r}\n{traceback.format_exc()}", file=sys.stderr)


def prepare(run: RunState) -> None:
    """The run directory, the scenario as run, the host's speed before it, what the host holds before it."""
    for d in (run.logs, run.rec_dir, run.run_dir / "manifests"):
        d.mkdir(parents=True, exist_ok=True)
    import yaml

    # the scenario as run: after --set overrides and the sweep value, as plain YAML
    (run.run_dir / "scenario.yaml").write_text(yaml.safe_dump(plain(run.s.raw), sort_keys=False))
    from bench.run.usage import speed_probe_ms

    run.speed_probe = {"before_ms": round(speed_probe_ms(), 1)}
    run.leftovers = Leftovers.begin()
