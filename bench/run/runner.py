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

Owns the run directory reports/<scenario>/<UTC timestamp>/ and the exit code (0 pass, 1 an
assertion failed, 2 invalid scenario/environment or the run errored, 3 inconclusive: an assertion
failed while the run's own fidelity was out of tolerance, so the host may have caused it). Invariant: every process it
starts is registered in a `ProcessSet` the moment it exists, and a `finally` stops the set in
reverse order, so Ctrl-C, a crash or a failed assertion leaves no orphan and no bound port.
"""

from __future__ import annotations

import json
import math
import os
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bench.evidence import fidelity as fid
from bench.evidence import report
from bench.evidence.figures import UNPLANNED_EXIT
from bench.fleet import clock as clocks
from bench.fleet import threadcpu
from bench.fleet.control import ControlServer
from bench.run.collect import Collecting
from bench.run.hostcpu import CpuSampler, Leftovers
from bench.run.manifests import overrides as manifest_overrides
from bench.run.manifests import plain, replica_manifest, replica_priority, replica_start_s
from bench.run.mesh import proxy_name
from bench.run.procset import ProcessSet, install_signal_handlers
from bench.run.progress import Progress, print_verdict
from bench.run.samplelog import SampleLog
from bench.run.verdict import Judging
from bench.scenario.schema import REPO_ROOT, Scenario, missing_checkpoints, sweep_variants
from wire.procs import ChildProcess, free_port, start_on_picked_port, start_router

EXIT_PASS, EXIT_FAIL, EXIT_INVALID, EXIT_INCONCLUSIVE = 0, 1, 2, 3
SERVER_READY_TEXT = "policy-server ready"
SHARD_READY_TIMEOUT_S = 60.0
SHARD_DONE_TIMEOUT_S = 30.0
OBSERVATION_RATE_FACTOR = 10  # a router's cap on a link's observations, times the fleet's fastest fps
CLOCK_RECHECK_BEFORE_END_S = 1.0  # the clocks are measured again this long before the end: shards leave at the end


def exit_words(returncode: int | None) -> str:
    """How a local child ended, for a person: `exited with 3`, `killed by SIGSEGV (exit -11)`."""
    import signal

    if returncode is None or returncode >= 0:
        return f"exited with {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        return f"exited with {returncode}"
    why = " from outside the run (the kernel's OOM killer? see `dmesg`)" if name == "SIGKILL" else ""
    return f"killed by {name}{why} (exit {returncode})"


def is_system_process(name: str) -> bool:
    """A process of the system under test (a policy-server replica, a Zenoh router): its unplanned exit is a finding
    the run records and goes on through (figure `unplanned_exits`). The bench's own processes (shards, chaos
    proxies) and a lost cluster node are the bench failing: those end the run as an error."""
    return name.startswith(("server:", "router"))






class EnvironmentInvalid(RuntimeError):
    """The machine or the checkout cannot run this scenario (missing package, checkpoint...)."""


def cuda_problems(scenario: Scenario) -> list[str]:
    """A replica whose manifest puts the model on CUDA cannot run on a host without a CUDA device."""
    wants = []
    for replica in scenario.replicas:
        model = manifest_overrides(scenario, replica).get("model") or {}
        if str(model.get("device", "cpu")).startswith("cuda"):
            wants.append(f"{replica.id} (model.device: {model['device']})")
    if not wants:
        return []
    try:
        import torch

        if torch.cuda.is_available():
            return []
        why = f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is false)"
    except ImportError:
        why = "torch is not installed"
    return [f"scenario {scenario.name!r} needs a CUDA GPU: replicas {', '.join(wants)} serve on CUDA, but on this "
            f"host {why}. It measures real GPU inference, which a CPU cannot stand in for: run it on a GPU host"]


def worse(a: int, b: int) -> int:
    """The worse of two exit codes: error (2) > fail (1) > inconclusive (3) > pass (0)."""
    rank = {EXIT_PASS: 0, EXIT_INCONCLUSIVE: 1, EXIT_FAIL: 2, EXIT_INVALID: 3}
    return a if rank.get(a, 3) >= rank.get(b, 3) else b


def utc_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def run_scenario(scenario: Scenario, reports_dir: Path = Path("reports"), progress: bool = True,
                 stamp: str | None = None, cluster: str | None = None) -> int:
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
        return EXIT_INVALID
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
            return EXIT_INVALID

        try:
            ray_cluster = connect(None if cluster == "ray" else cluster)
        except ClusterError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return EXIT_INVALID
    try:
        return _run_variants(scenario, reports_dir, progress, stamp, ray_cluster)
    finally:
        if ray_cluster is not None:
            ray_cluster.close()


def _run_variants(scenario: Scenario, reports_dir: Path, progress: bool, stamp: str | None, ray_cluster) -> int:
    base = Path(reports_dir) / scenario.name / (stamp or utc_stamp())
    worst = EXIT_PASS
    variants = sweep_variants(scenario)
    sweep = scenario.sweep or {}
    labels, rows, group = [], [], None
    for (label, variant), value in zip(variants, sweep.get("values") or [None]):
        run_dir = base / label if label else base
        if ray_cluster is None and label:  # a variant serving another checkpoint: timed before its processes start
            from bench.run.sizing import forward_costs

            forward_costs(variant)
        outcome = Run(variant, run_dir, progress=progress, cluster=ray_cluster).execute()
        print_verdict(f"bench: {variant.name}{(' [' + label + ']') if label else ''}: {outcome.verdict.upper()} "
                      f"-> {outcome.run_dir}/summary.json", outcome.assertions, outcome.error)
        for w in [f for f in outcome.meta.get("faults") or [] if f.get("action") == UNPLANNED_EXIT][:5]:
            print(f"  EXIT  {w['target']} at t {w['t_start']:g} s with no fault on it: {w['detail']}", file=sys.stderr)
        for r in (outcome.meta.get("engine_raises") or [])[:3]:
            first = r["first"].splitlines()
            print(f"  RAISE robot {r['robot']}: {r['count']} engine calls raised; the first: {first[0] if first else ''} "
                  f"{first[-1] if len(first) > 1 else ''}", file=sys.stderr)
        dead = [c for c in outcome.meta.get("state_changes") or [] if c["to"] == "DEAD"]
        for c in dead[:3]:  # why robots died, before the host's fidelity: the first thing to read of a collapse
            print(f"  DEAD  {c['robots']} robots {c['from']} -> DEAD at t {c['t_first']:g}..{c['t_last']:g} s: "
                  f"{c['example']}", file=sys.stderr)
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
            if outcome.exit_code == EXIT_INVALID:
                break  # an errored run ends the sweep: the knee is read only off completed runs
            if outcome.exit_code != EXIT_PASS and sweep.get("stop_after_failure"):
                break
    if sweep:
        worst = finish_sweep(scenario, base, labels, rows, group, worst)
    return worst


def finish_sweep(scenario: Scenario, base: Path, labels: list[str], rows: list[dict], group, worst: int) -> int:
    """sweep.json, the perf_analyzer-style table and, in capacity mode, the knee and its verdict."""
    from bench.evidence import capacity
    from bench.scenario.sweeps import evaluate_sweep_assertions

    sweep = scenario.sweep
    print(f"bench: sweep {sweep['key']}:\n" + capacity.format_table(rows) + "\n" + capacity.format_group_table(rows),
          file=sys.stderr)
    cap, results = None, []
    if sweep.get("mode") == "capacity" and group is not None:
        horizon = int(group.engine.get("execution_horizon", 10))
        cap = capacity.capacity_report(rows, horizon, 1.0 / group.fps, sweep.get("formula"))
        print(capacity.format_capacity(cap), file=sys.stderr)
        results = evaluate_sweep_assertions(sweep.get("assertions") or [], cap["figures"])
        for r in results:
            print(f"  {r['result'].upper():5} {r['expression']}  (value: {r['value']!r}"
                  f"{'; ' + r['error'] if r['error'] else ''})", file=sys.stderr)
        # load steps past the knee fail by design: the verdict is the sweep's own assertions
        if not rows or any(r["verdict"] == "error" for r in rows):
            worst = EXIT_INVALID
        else:
            worst = EXIT_FAIL if any(r["result"] != "pass" for r in results) else EXIT_PASS
    path = capacity.write_sweep(base, scenario, labels, rows, cap, results)
    print(f"bench: sweep -> {path}", file=sys.stderr)
    return worst


def reports_problems(reports_dir: Path) -> list[str]:
    """Whether the reports root can be written, found before any process starts (a run that makes its directory
    there at its start would fail with a traceback, exit 1, as if the system had failed): a file made and removed
    in it, or in its nearest existing parent where it is still to be made (nothing is left behind)."""
    import tempfile

    where = Path(reports_dir).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        if not where.is_dir():
            raise NotADirectoryError(f"{where} is a file")
        with tempfile.NamedTemporaryFile(dir=where, prefix=".bench-write-check-"):
            pass
    except OSError as exc:
        return [f"reports: cannot write under {str(reports_dir)!r} ({exc}); give --reports a directory you can write"]
    return []


def preflight(scenario: Scenario) -> list[str]:
    """Everything that makes a run impossible, found before any process starts."""
    cuda = cuda_problems(scenario)
    if cuda:  # nothing else matters on a host that cannot run the scenario at all
        return cuda
    out = list(missing_checkpoints(scenario))
    for mod, why in (("zenoh", "eclipse-zenoh"), ("edge", "the edge engine (edge/)"), ("server", "the policy server"),
                     ("chaos", "the chaos proxy (chaos/)"), ("pyarrow", "pyarrow (pip install -e .[sim])")):
        try:
            __import__(mod)
        except Exception as exc:
            out.append(f"environment: cannot import {mod} ({why}): {exc}")
    try:
        from edge import make_engine  # noqa: F401
    except Exception as exc:
        out.append(f"environment: edge.make_engine is not available: {exc}")
    from bench.run.sizing import forced_proxy_processes

    for check in (replica_priority, forced_proxy_processes):  # the environment's knobs, read as the run will
        try:
            check()
        except ValueError as exc:
            out.append(f"environment: {exc}")
    return out


@dataclass
class SiteLink:
    name: str
    endpoint: str  # what the site's robots connect to (the proxy's listen address)
    proxy: object = None


@dataclass
class RunState:
    phase: str = "starting"
    t0_mono: float | None = None  # measured t = 0
    end_mono: float | None = None
    statuses: dict = field(default_factory=dict)  # shard -> latest status
    done: dict = field(default_factory=dict)  # shard -> done message
    errors: list = field(default_factory=list)


class Run(Collecting, Judging):
    def __init__(self, scenario: Scenario, run_dir: Path, progress: bool = True, engine_factory: str | None = None,
                 cluster=None):
        self.s = scenario
        self.engine_factory = engine_factory  # "module:function" for tests; None = edge's remote engine
        # bench.run.cluster.Cluster: shards and replicas run as Ray actors' children; None = all here
        self.cluster = cluster
        # what other hosts reach this one's router, proxies and control socket on (loopback when all is here)
        self.host = cluster.host_for_endpoints() if cluster is not None else "127.0.0.1"
        self.run_dir = Path(run_dir).resolve() if cluster is not None else Path(run_dir)
        self.logs = self.run_dir / "logs"
        self.rec_dir = self.run_dir / "records"
        self.procs = ProcessSet()
        self.state = RunState()
        self.progress_enabled = progress
        self.sites: dict[str, SiteLink] = {}
        self.servers: dict[str, dict] = {}  # replica id -> {child, manifest, health_port, audit}
        self.identities: dict[tuple[str, int], dict] = {}  # (group, index) -> client_uuid [+ TLS files]
        self.control: ControlServer | None = None
        # each shard's and replica's clock offset from this runner's (bench.fleet.clock), measured before the start
        # barrier, then combined with a second measurement taken CLOCK_RECHECK_BEFORE_END_S before the end
        self.clocks: dict[str, clocks.ClockOffset] = {}
        self.clocks_near_end: dict[str, clocks.ClockOffset] | None = None
        # a cluster run's nodes' wall clocks' offsets from this runner's, by node id (a Zenoh router stamps with
        # its node's wall clock: router_split), measured and combined as `clocks` are
        self.node_walls: dict[str, clocks.ClockOffset] = {}
        self.node_walls_near_end: dict[str, clocks.ClockOffset] | None = None
        self.child_nodes: dict[str, str] = {}  # child name -> its node id (kept after the children stop)
        self.cpu = CpuSampler()
        self.server_samples = SampleLog()  # {t, replica, metric, value} a second per replica and gauge
        self.leg_series = fid.LegErrorSeries()  # each leg's mean delay error, every second of the run
        self.fault_log: list[dict] = []
        self.timeline = None
        self.router_child: ChildProcess | None = None
        self.router_endpoint = ""
        # with --cluster: `per_node` (a router on every used node, joined to this host's; bench.run.mesh) or `driver`
        self.routers = None
        if cluster is not None:
            from bench.run.mesh import resolve_routers

            self.routers = resolve_routers(scenario.cluster.get("routers"))
        self.mesh = None  # bench.run.mesh.NodeMesh under per_node routers
        self.replica_router: dict[str, str] = {}  # replica id -> its node's router endpoint (per_node)
        self._stop_scrape = threading.Event()
        self.started_utc = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.wall0 = time.monotonic()

    # --- the whole run -------------------------------------------------------------------------

    def execute(self) -> report.RunOutcome:
        for d in (self.logs, self.rec_dir, self.run_dir / "manifests"):
            d.mkdir(parents=True, exist_ok=True)
        import yaml

        # the scenario as run: after --set overrides and the sweep value, as plain YAML
        (self.run_dir / "scenario.yaml").write_text(yaml.safe_dump(plain(self.s.raw), sort_keys=False))
        error, interrupted = None, False
        from bench.run.hostcpu import speed_probe_ms

        self.speed_probe = {"before_ms": round(speed_probe_ms(), 1)}
        self.leftovers = Leftovers.begin()
        prog = Progress(self._snapshot, enabled=self.progress_enabled)
        try:
            self.start_processes()
            prog.start()
            self.drive()
        except KeyboardInterrupt:
            error, interrupted = "interrupted (Ctrl-C or SIGTERM): the run was stopped early", True
        except EnvironmentInvalid as exc:
            error = f"environment: {exc}"
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        finally:
            prog.stop()
            self.shutdown()
            self.leftover_report = self.leftovers.end()
        self.speed_probe["after_ms"] = round(speed_probe_ms(), 1)
        during = self.cpu.probes(0.0, self.s.duration_s)
        if during:  # every second of the run, in CPU time (bench.run.hostcpu.IN_RUN_PROBE_FRACTION)
            self.speed_probe["during"] = during
        outcome = self.judge(error)
        outcome.meta["interrupted"] = interrupted
        if isinstance(error, str) and error.startswith("environment:"):
            outcome.meta["environment_invalid"] = True
        return outcome

    # --- start ---------------------------------------------------------------------------------

    def write_process_table(self) -> None:
        """processes.json: every child's name, pid (= its process group) and log, for people and tests. Written
        beside and renamed into place, so a reader polling for it never reads it half-written (a CI test that
        killed a node's router once it appeared read an empty file)."""
        rows = [{"name": n, "pid": c.pid, "log": str(getattr(c, "log_path", ""))} for n, c in self.procs.children if c.pid]
        for i, server in enumerate(getattr(self, "proxy_servers", [])):
            if getattr(server, "pid", None):
                rows.append({"name": proxy_name(i), "pid": server.pid, "log": str(self.logs / f"{proxy_name(i)}.log")})
        tmp = self.run_dir / "processes.json.tmp"
        tmp.write_text(json.dumps(rows, indent=1))
        tmp.replace(self.run_dir / "processes.json")

    def start_processes(self) -> None:
        self.cpu.start()
        self.assign_identities()
        if self.s.security == "mtls":
            router, self.router_endpoint = self.start_secure_router()
        else:
            router, self.router_endpoint = start_router(None, self.logs / "router.log", host=self.host,
                                                        extra_args=self.router_args())
        self.router_child = self.procs.add("router", router)
        self.cpu.track("router", lambda: router.pid)  # a router restart (fault) changes the pid
        self.start_proxy()
        if self.routers == "per_node":
            self.start_mesh()
        self.start_servers()
        self.start_shards()
        self.write_process_table()

    def start_proxy(self) -> None:
        from chaos import client as chaos_client
        from chaos import launch as chaos_launch
        from chaos import profiles as chaos_profiles

        from bench.run.mesh import proxy_priority
        from bench.run.sizing import proxy_processes

        # one event loop per proxy process: sites are dealt over as many as the load and the host call for
        self.proxy_servers = []
        for i in range(proxy_processes(self.s)):
            server = chaos_launch.start_proxy_server(log_path=self.logs / f"{proxy_name(i)}.log",
                                                     priority=proxy_priority())
            self.procs.on_stop(proxy_name(i), server.stop)
            self.cpu.track(proxy_name(i), getattr(server, "pid", None))
            self.proxy_servers.append(server)
        proxy_server = self.proxy_server = self.proxy_servers[0]
        api = chaos_client.ProxyPool([chaos_client.ChaosClient(s.api_url) for s in self.proxy_servers])
        self.chaos = api
        router_hostport = self.router_endpoint.split("/", 1)[1]
        real = bool(getattr(proxy_server, "real_toxiproxy", False))
        self.network_stand_ins: dict[str, list[str]] = {}  # site -> toxics the real Toxiproxy lacks (replaced)
        for name, site in self.s.sites.items():
            proxy = api.create_proxy(f"site-{name}", upstream=router_hostport, listen=f"{self.host}:0")
            toxics = chaos_profiles.profile_toxics(site.profile, site.overrides)
            if real:  # the Go binary has no `loss`: send its stand-in and say so in the summary
                if any(t["type"] == "loss" for t in toxics):
                    self.network_stand_ins[name] = ["loss"]
                toxics = chaos_profiles.real_toxiproxy_equivalent(toxics)
            for toxic in toxics:
                api.add_toxic(f"site-{name}", **toxic)
            scheme = "tls" if self.s.security == "mtls" else "tcp"
            self.sites[name] = SiteLink(name, f"{scheme}/{proxy['listen']}", proxy)

    def start_mesh(self) -> None:
        """Per-node routers and site proxies (bench.run.mesh): started as shards and replicas find their nodes."""
        from chaos import profiles as chaos_profiles

        from bench.run.mesh import NodeMesh, SiteFanout

        def register(name: str, child) -> None:
            self.procs.add(name, child)
            child.locate()  # where it runs decides how its CPU is read
            if self._local(child, for_cpu=True):  # this host's /proc; the lambda reads the pid once started
                self.cpu.track(name, lambda c=child: c.pid)
            else:  # another host: through its actor, as a shard or replica there (bench.run.hostcpu)
                self.track_remote_cpu(name, child)

        toxics = {name: chaos_profiles.profile_toxics(site.profile, site.overrides) for name, site in self.s.sites.items()}
        security = None
        if self.s.security == "mtls":  # each node router: its own certificate, the hub's access rules
            from bench.run.mesh import MeshSecurity

            security = MeshSecurity(self.pki, self.router_rules)
        self.mesh = NodeMesh(self.cluster, self.router_endpoint, self.host, self.logs, lambda: toxics, register,
                             security, self.router_args())
        self.chaos = SiteFanout(self.chaos, self.mesh)

    def manifest_for(self, replica) -> dict:
        port = free_port()
        audit = self.logs / f"audit-{replica.id}.jsonl"
        run_keys = {
            "model_id": replica.model_id,
            "replica_id": replica.id,
            "max_sessions": replica.max_sessions,
            "zenoh": {"connect_endpoints": [self.replica_router.get(replica.id, self.router_endpoint)]},
            "health_port": port,
            "audit_path": str(audit),
            # normal unless BENCH_REPLICA_PRIORITY says otherwise (docs/bench.md "The replicas' priority")
            "dispatch_priority": replica_priority(),
        }
        if self.host != "127.0.0.1":
            # nodes on other hosts: the replica's node is not known yet, so its health server listens on every
            # address and the scraper reads it at the node's address (`_health_url`)
            run_keys["health_host"] = "0.0.0.0"
        if self.s.security == "mtls":
            f = self.pki.server(replica.id)
            run_keys["zenoh"]["tls"] = {"root_ca_certificate": f.ca, "connect_certificate": f.cert,
                                        "connect_private_key": f.key}
        return replica_manifest(self.s, replica, run_keys)

    # --- security: identities, PKI, router rules, attackers (docs/security.md) ------------------------

    def assign_identities(self) -> None:
        """Fixed client uuids (GROUP-INDEX) when certificates or attackers need to name robots; with mtls,
        a run PKI under <run>/pki (keys 0600) and each robot's certificate (CN = its uuid)."""
        self.identities: dict[tuple[str, int], dict] = {}
        if self.s.security != "mtls" and not self.s.attackers:
            return
        if self.s.security == "mtls":
            from bench.security.pki import Pki

            self.pki = Pki(self.run_dir / "pki")
        for g in self.s.groups:
            for i in range(g.count):
                uuid = g.engine.get("client_uuid") if g.count == 1 and g.engine.get("client_uuid") else f"{g.name}-{i}"
                ident = {"client_uuid": uuid}
                if self.s.security == "mtls":
                    f = self.pki.robot(uuid)
                    ident.update(tls_ca=f.ca, tls_cert=f.cert, tls_key=f.key)
                self.identities[(g.name, i)] = ident

    def start_secure_router(self) -> tuple[ChildProcess, str]:
        from wire.acl import FleetIdentities, router_access_control

        robots = [v["client_uuid"] for v in self.identities.values()]
        robots += [a["name"] for a in self.s.attackers if a["credentials"] == "own_cert"]  # enrolled, then rogue
        peers: tuple[str, ...] = ()
        if self.routers == "per_node":  # the hub and every node router accept each other (bench.run.mesh), by role
            from bench.run.mesh import peer_router_cns

            peers = peer_router_cns()
        acl = router_access_control(FleetIdentities(tuple(robots), tuple(r.id for r in self.s.replicas),
                                                    monitors=("bench-monitor",), routers=peers))
        rules = self.router_rules = self.run_dir / "router-access-control.json"
        rules.write_text(json.dumps({"access_control": acl}, indent=1))
        # on the run's host address: a cluster's node routers and replicas reach it there (loopback without one)
        r = self.pki.router(hosts=(self.host,))
        return start_router(None, self.logs / "router.log", host=self.host, scheme="tls", env={"PYTHONPATH": _pythonpath()},
                            extra_args=["--tls-ca", r.ca, "--tls-cert", r.cert, "--tls-key", r.key,
                                        "--access-control", str(rules), *self.router_args()])

    def router_args(self) -> list[str]:
        """wire.transport flags every router of this run gets: sessions sized from the fleet, and observations a link
        capped at OBSERVATION_RATE_FACTOR times the fleet's fastest control rate (a robot sends at most one a tick:
        a flooding one is shed at the router, as docs/security.md advises), except under per-node routers (the cap
        is per link, and a link between two routers carries a node's robots)."""
        from bench.run.sizing import router_max_sessions

        args = ["--max-sessions", str(router_max_sessions(self.s))]
        if self.routers == "per_node":
            return args
        fastest = max(g.fps for g in self.s.groups)
        return args + ["--max-observation-rate-hz", f"{OBSERVATION_RATE_FACTOR * fastest:g}"]

    def attacker_spec(self, a: dict, start_unix: float) -> dict:
        from bench.robots.core import robot_type

        gname, _, idx = a["target"].partition("/")
        g = self.s.group(gname)
        cls = robot_type(g.robot)
        replica = next((r for r in self.s.replicas if r.model_id == g.model_id), self.s.replicas[0])
        manifest = manifest_overrides(self.s, replica)
        sec = manifest.get("security", {}) or {}
        lim = manifest.get("limits", {}) or {}
        from wire.keys import task_slug

        spec = {"name": a["name"], "credentials": a["credentials"], "attacks": a["attacks"], "start_unix": start_unix,
                "uuid": a["name"], "victim_uuid": self.identities[(gname, int(idx))]["client_uuid"],
                "victim_task": task_slug(g.task), "model_id": g.model_id, "replica_id": replica.id,
                "fps": g.fps, "action_names": list(cls.action_names), "state_dim": len(cls.state_names),
                "cameras": list(g.cameras.names) if g.cameras else [], "cam_h": g.cameras.height if g.cameras else 0,
                "cam_w": g.cameras.width if g.cameras else 0, "flood_hz": a["flood_hz"], "flood_s": a["flood_s"],
                "rate_limit_hz": sec.get("max_request_rate_hz", 100.0), "rate_burst": sec.get("request_burst"),
                "max_observation_bytes": sec.get("max_observation_bytes") or lim.get("max_message_bytes"),
                "endpoint": self.sites[g.site].endpoint}
        if spec["rate_burst"] is None:
            spec["rate_burst"] = spec["rate_limit_hz"]
        if self.s.security == "mtls":
            from bench.security.pki import Pki

            mon = self.pki.issue("bench-monitor")
            spec["monitor_tls"] = {"ca": mon.ca, "cert": mon.cert, "key": mon.key}
            if a["credentials"] == "own_cert":
                f = self.pki.robot(a["name"])
                spec["tls"] = {"ca": f.ca, "cert": f.cert, "key": f.key}
            elif a["credentials"] == "none":
                spec["tls"] = {"ca": self.pki.ca_cert_path.as_posix()}
            else:
                f = Pki(self.run_dir / "pki-foreign", ca_name="foreign-ca").robot(a["name"])
                spec["tls"] = {"ca": self.pki.ca_cert_path.as_posix(), "cert": f.cert, "key": f.key}
        return spec

    def start_attackers(self) -> None:
        self.attack_log = self.run_dir / "attacks.jsonl"
        for a in self.s.attackers:
            start_unix = time.time() + (self.state.t0_mono + float(a["at"]) - time.monotonic())
            path = self.run_dir / "manifests" / f"attacker-{a['name']}.json"
            path.write_text(json.dumps(self.attacker_spec(a, start_unix), indent=1))
            child = ChildProcess([sys.executable, "-m", "bench.security.attacker", "--spec", str(path), "--out",
                                  str(self.attack_log)], self.logs / f"attacker-{a['name']}.log",
                                 name=f"attacker-{a['name']}", env={"PYTHONPATH": _pythonpath()})
            self.procs.add(f"attacker:{a['name']}", child)
            child.start()
            self.cpu.track(f"attacker:{a['name']}", child.pid)  # on this host the attackers share the CPU: show it

    def collect_attacks(self, audit) -> list[dict]:
        """attacks.jsonl, with the `audit_forged` verdicts resolved from the servers' audit lines (`audit`:
        bench.evidence.audit's table)."""
        from bench.evidence.audit import at_least, equals

        path = getattr(self, "attack_log", None)
        rows = []
        if path is not None and path.is_file():
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for r in rows:
            if r.get("judge") == "audit_forged":
                served = int(np.count_nonzero(equals(audit, "client_uuid", r["victim"]) & equals(audit, "outcome", "ok")
                                              & at_least(audit, "seq_id", r["seq_base"])))
                r["outcome"] = "breached" if served else "denied"
                r["evidence"] += f"; the server served {served} of them (audit)"
        started = {a["name"] for a in self.s.attackers}
        finished = {r["attacker"] for r in rows}
        for name in sorted(started - finished):  # an attacker that died or never ran must not read as "all denied"
            rows.append({"attacker": name, "attack": "*", "attempts": 0, "outcome": "error",
                         "evidence": f"attacker {name} wrote no results; see logs/attacker-{name}.log"})
        return rows

    def start_servers(self) -> None:
        import yaml

        threads, errors = [], []
        for replica in self.s.replicas:
            path = self.run_dir / "manifests" / f"{replica.id}.yaml"
            if self.cluster is not None:
                model = manifest_overrides(self.s, replica).get("model") or {}
                cuda = str(model.get("device", "cpu")).startswith("cuda")
                c = self.s.cluster
                skew = os.environ.get(clocks.REPLICA_TEST_SKEW_ENV)  # tests only: the replica's node on another clock
                child = self.cluster.place(f"server:{replica.id}", server_argv(path, test_skew=bool(skew)),
                                           self.logs / f"server-{replica.id}.log",
                                           env={clocks.TEST_SKEW_ENV: skew} if skew else None,
                                           ready_text=SERVER_READY_TEXT, num_cpus=c.get("replica_cpus", 1.0),
                                           num_gpus=c.get("replica_gpus", 1.0) if cuda else 0.0,
                                           placement=c.get("placement", "spread"))
                if self.mesh is not None:  # its node's router, started there if the node has none yet
                    self.replica_router[replica.id] = self.mesh.links(child.locate(), proxies=0).router_endpoint
            manifest = self.manifest_for(replica)
            path.write_text(yaml.safe_dump(manifest, sort_keys=False))
            if self.cluster is not None:
                tls = (manifest["zenoh"].get("tls") or {}).values() if self.s.security == "mtls" else ()
                child.files = _files([str(path), *tls])  # its certificate too, where the node has no shared disk
            else:
                child = ChildProcess(server_argv(path), self.logs / f"server-{replica.id}.log",
                                     ready_text=SERVER_READY_TEXT, name=f"server-{replica.id}")
            self.procs.add(f"server:{replica.id}", child)
            self.servers[replica.id] = {"child": child, "manifest": path, "health_port": manifest["health_port"],
                                        "audit": Path(manifest.get("audit_path", "")),
                                        "start_s": replica_start_s(manifest)}  # its start and a restart's

            def start(c=child, rid=replica.id, path=path, manifest=manifest):
                try:
                    if self.cluster is None:
                        self._start_local_replica(rid, path, manifest)
                    else:
                        c.start(timeout_s=self.servers[rid]["start_s"])
                except Exception as exc:
                    errors.append(str(exc))
            t = threading.Thread(target=start, daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError("a server replica did not start:\n" + "\n".join(errors))
        for rid, info in self.servers.items():
            if self._local(info["child"], for_cpu=True):
                self.cpu.track(f"server:{rid}", lambda c=info["child"]: c.pid)  # a restart changes the pid
            else:
                self.track_remote_cpu(f"server:{rid}", info["child"])

    def _start_local_replica(self, rid: str, path: Path, manifest: dict) -> None:
        """Start a local replica; the health port picked for it and taken by another process before the replica
        binds it (its torch import takes seconds) is picked again, its manifest rewritten (start_on_picked_port)."""
        import yaml

        info = self.servers[rid]

        def make(port: int):
            manifest["health_port"] = info["health_port"] = port
            path.write_text(yaml.safe_dump(manifest, sort_keys=False))
            return info["child"]  # the same child, started again: the run's process set holds it

        start_on_picked_port(make, None, timeout_s=info["start_s"], first=int(manifest["health_port"]))

    def shard_specs(self) -> list[dict]:
        """Deal robots round-robin over the shards (each group spread over all shards)."""
        from bench.fleet.shard import robot_spec
        from bench.run.sizing import group_request_rates, shard_count

        # `auto` sized from robots, fps and the cores (the cluster's, with --cluster); an integer as written
        self.n_shards = shard_count(self.s, self.cluster.cpus() if self.cluster is not None else None)
        # requests a second one robot of each group sends (a cluster node's proxies are sized by its robots')
        self.request_rates = dict(zip((g.name for g in self.s.groups), group_request_rates(self.s)))
        specs = [{"shard": k, "robots": [], "records_dir": str(self.rec_dir), "seed": self.s.seed,
                  "engine_factory": self.engine_factory} for k in range(self.n_shards)]
        rid = 0
        self.robot_table: list[dict] = []
        group_index = {g.name: gi for gi, g in enumerate(self.s.groups)}
        for gi, g in enumerate(self.s.groups):
            for i in range(g.count):
                shard = rid % self.n_shards
                spec = robot_spec(rid, gi, i, g, self.s.seed, self.sites[g.site].endpoint,
                                  seed_group_index=group_index.get(g.seeds_of) if g.seeds_of else None)
                spec["engine"].update(self.identities.get((g.name, i), {}))
                specs[shard]["robots"].append(spec)
                self.robot_table.append({"robot": rid, "group": g.name, "engine": g.engine_kind, "index": i,
                                         "site": g.site, "shard": shard,
                                         "robot_type": g.robot, "fps": g.fps,
                                         "max_action_age_s": spec["engine"].get("max_action_age_s", math.inf),
                                         "deadline_s": _rtc_budget_s(spec["engine"], g.fps)})
                rid += 1
        return specs

    def node_proxy_processes(self, specs: list[dict], placed: dict) -> dict[str, int]:
        """Chaos proxy processes for each node that got shards (`placed`: shard -> its child): the requests of
        the robots on the node's shards, within its CPUs beyond its router and what Ray reserved there for the
        run's shards and replicas (bench.run.sizing.node_proxy_processes)."""
        from collections import Counter

        from bench.run.sizing import node_proxy_processes

        c = self.s.cluster
        cpus = {n["node_id"]: n["cpus"] for n in self.cluster.nodes()}
        requests: Counter = Counter()
        reserved: Counter = Counter()
        for spec in specs:
            node = placed[spec["shard"]].locate()["node_id"]
            reserved[node] += c.get("shard_cpus", 1.0)
            requests[node] += sum(self.request_rates[self.robot_table[robot["robot"]]["group"]] for robot in spec["robots"])
        for info in self.servers.values():
            node = info["child"].locate()["node_id"]  # placed and located before the shards (start_servers)
            if node in requests:
                reserved[node] += c.get("replica_cpus", 1.0)
        return {node: node_proxy_processes(n, len(self.s.sites), cpus.get(node, 1), reserved[node])
                for node, n in requests.items()}

    def start_shards(self) -> None:
        self.control = ControlServer(None if self.host == "127.0.0.1" else self.host)
        self.procs.on_stop("control", self.control.close)
        specs = self.shard_specs()
        paths = {spec["shard"]: self.run_dir / "manifests" / f"shard-{spec['shard']}.json" for spec in specs}
        argvs = {k: [sys.executable, "-m", "bench.fleet.shard", "--spec", str(path), "--control", self.control.path]
                 for k, path in paths.items()}
        placed: dict[int, object] = {}
        if self.cluster is not None:  # every shard placed first: a node's proxies are sized by all its shards' robots
            c = self.s.cluster
            env = {"PYTHONPATH": _pythonpath()}
            if os.environ.get(clocks.TEST_SKEW_ENV):  # tests only: a node's child does not inherit this env
                env[clocks.TEST_SKEW_ENV] = os.environ[clocks.TEST_SKEW_ENV]
            for k, argv in argvs.items():
                placed[k] = self.cluster.place(f"shard:{k}", argv, self.logs / f"shard-{k}.log",
                                               env=env, num_cpus=c.get("shard_cpus", 1.0),
                                               placement=c.get("placement", "spread"))
            node_proxies = self.node_proxy_processes(specs, placed) if self.mesh is not None else {}
        for spec in specs:
            k = spec["shard"]
            path, argv = paths[k], argvs[k]
            if self.cluster is not None:
                child = placed[k]
                if self.mesh is not None:  # each robot connects to its site's proxy on the shard's own node
                    node = child.locate()
                    sites = self.mesh.links(node, proxies=node_proxies[node["node_id"]]).sites
                    for robot in spec["robots"]:
                        robot["engine"]["connect_endpoints"] = [sites[self.robot_table[robot["robot"]]["site"]]]
                path.write_text(json.dumps(spec, indent=1))
                tls = [r["engine"][k] for r in spec["robots"] for k in ("tls_ca", "tls_cert", "tls_key")
                       if r["engine"].get(k)]
                child.files = _files([str(path), *tls])  # its robots' certificates too
            else:
                path.write_text(json.dumps(spec, indent=1))
                child = ChildProcess(argv, self.logs / f"shard-{k}.log", name=f"shard-{k}", env={"PYTHONPATH": _pythonpath()})
            self.procs.add(f"shard:{k}", child)
            child.start()
            if self._local(child, for_cpu=True):
                self.cpu.track(f"shard:{k}", child.pid)
            else:
                self.track_remote_cpu(f"shard:{k}", child)
        deadline = time.monotonic() + SHARD_READY_TIMEOUT_S + 0.2 * self.s.robots
        ready: set[int] = set()
        while len(ready) < len(specs):
            msg = self._next_message(deadline, "shards to start their robots")
            if msg.get("type") == "ready":
                ready.add(msg["shard"])
        self.clocks = self.measure_clocks()
        if self.cluster is not None:
            self.node_walls = self.measure_node_walls()

    def measure_node_walls(self) -> dict[str, clocks.ClockOffset]:
        """Each cluster node's wall clock offset from this runner's, by node id, timed through one of its children's
        actors; a node on this host shares its wall clock (exactly 0). A node that does not answer is left out
        (the requests whose hops its clock would split are not split)."""
        out: dict[str, clocks.ClockOffset] = {}
        for name, child in list(self.procs.children):
            node_id = (getattr(child, "node", None) or {}).get("node_id")
            measure = getattr(child, "measure_wall_clock", None)
            if node_id:
                self.child_nodes[name] = node_id
            if not node_id or node_id in out or measure is None:
                continue
            try:
                out[node_id] = clocks.settle(measure(), self._local(child))
            except (TimeoutError, ProcessLookupError):
                continue
        return out

    def measure_clocks(self, strict: bool = True, only: set[str] | None = None) -> dict[str, clocks.ClockOffset]:
        """Each shard's clock offset (ping/pong on its control link) and each replica's (a replica here shares this
        clock; one on a cluster node is timed through its actor); `only` these names when given. `strict`: a shard
        that does not answer is an error (its start barrier would be wrong); at the end it keeps its start
        measurement instead."""
        out: dict[str, clocks.ClockOffset] = {}
        for name, child in list(self.procs.children):
            if only is not None and name not in only:
                continue
            try:
                if name.startswith("shard:"):
                    link = self.control.link(int(name.split(":", 1)[1])) if self.control is not None else None
                    if link is None:
                        raise TimeoutError(f"{name} has no control link")
                    offset = link.measure_clock(timeout_s=5.0 if strict else 1.0)
                elif name.startswith("server:"):
                    measure = getattr(child, "measure_clock", None)
                    offset = measure() if measure is not None else clocks.SAME_CLOCK
                else:
                    continue
            except (TimeoutError, ProcessLookupError) as exc:
                if strict:
                    raise RuntimeError(f"cannot measure {name}'s clock: {exc}") from None
                continue
            out[name] = clocks.settle(offset, self._local(child))
        return out

    def _next_message(self, deadline: float, waiting_for: str) -> dict:
        """Next control message; raises if a shard died or the deadline passes."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"timed out waiting for {waiting_for}; see {self.logs}/shard-*.log")
            try:
                link, msg = self.control.messages.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                self._check_children()
                continue
            self._handle(link, msg)
            return msg

    def _handle(self, link, msg: dict) -> None:
        kind = msg.get("type")
        shard = msg.get("shard", link.shard)
        if kind == "status":
            self.state.statuses[shard] = msg
        elif kind == "done":
            self.state.done[shard] = msg
            self.state.statuses[shard] = msg.get("status", self.state.statuses.get(shard, {}))
        elif kind == "error":
            self.state.errors.append(f"shard {shard}: {msg.get('error')}")
            raise RuntimeError(f"shard {shard} failed: {msg.get('error')}")

    def _check_children(self) -> None:
        for name, child in list(self.procs.children):
            if name.startswith("attacker:"):
                continue  # attackers end when their attacks are done
            if not isinstance(child, ChildProcess) or child.proc is None:
                continue
            if child.alive():
                self._back_up(name)
                continue
            if is_system_process(name) and self._held_down(name):
                continue
            if name.startswith("shard:") and child.proc.returncode == 0 and (
                    name.split(":", 1)[1] in {str(k) for k in self.state.done}
                    or time.monotonic() >= (self.state.end_mono or math.inf) - 1.0):
                continue  # finished: its loop ends at its last slot due before the end, maybe before we look
            if is_system_process(name) and name in self._open_exits():
                continue  # recorded once per exit
            how = child.exit_text() if hasattr(child, "exit_text") else exit_words(child.proc.returncode)
            if is_system_process(name) and not getattr(child, "lost", None):
                self._unplanned_exit(name, child, how)  # the system failed: the run goes on and shows what followed
                continue
            raise RuntimeError(f"{name} {how}; log {child.log_path}:\n{child.tail(15)}")

    def _unplanned_exit(self, name: str, child, how: str) -> None:
        """A replica or router exited while no fault held it: an `unplanned_exit` window in the fault log, open
        until the process is back (a later `restart` fault) or the run ends."""
        exited = getattr(child, "exited_mono", None)  # when it exited, not when the runner's poll saw it
        t = round((exited or time.monotonic()) - (self.state.t0_mono or time.monotonic()), 3)
        log = Path(child.log_path)
        log = log.relative_to(self.run_dir) if log.is_relative_to(self.run_dir) else log
        self.fault_log.append({"index": None, "target": name, "action": UNPLANNED_EXIT, "params": {}, "at": t,
                               "duration": None, "t_start": t, "t_end": None, "error": None,
                               "detail": f"{how}; log {log}", "log_tail": child.tail(15)})

    def _open_exits(self) -> dict[str, dict]:
        """Process name -> its `unplanned_exit` window still open (the process not back)."""
        return {w["target"]: w for w in self.fault_log if w.get("action") == UNPLANNED_EXIT and w.get("t_end") is None}

    def _back_up(self, name: str) -> None:
        """`name` runs again: its open `unplanned_exit` window (if any) ends now."""
        w = self._open_exits().get(name)
        if w is not None:
            w["t_end"] = round(time.monotonic() - (self.state.t0_mono or time.monotonic()), 3)

    def _health_url(self, info: dict) -> str:
        """A replica's health server: on this host at loopback, on another host at its node's address."""
        host = "127.0.0.1"
        if self.host != "127.0.0.1":
            node = getattr(info["child"], "node", None) or {}
            host = node.get("ip") or host
        return f"http://{host}:{info['health_port']}"

    def _local(self, child, for_cpu: bool = False) -> bool:
        """Whether `child` runs on this host (its pid means something to this host's CPU sampler). `for_cpu` with
        BENCH_TEST_CPU_REMOTE=1 (tests only): a cluster child is sampled through its actor even on this host."""
        import socket

        if for_cpu and hasattr(child, "node") and os.environ.get("BENCH_TEST_CPU_REMOTE") == "1":
            return False
        return not hasattr(child, "node") or child.node.get("hostname") == socket.gethostname()

    def track_remote_cpu(self, name: str, child) -> None:
        """A child on another host: the CPU sampler pulls its readings from its node (bench.run.hostcpu)."""
        self.cpu.track_remote(name, child.where())
        self.cpu.remote_usage = lambda names: self.cluster.usage({n: self.procs.get(n) for n in names})

    def _held_down(self, name: str) -> bool:
        """A fault keeps replica or router `name` down on purpose: a window of it still open, or its last fault a
        `kill`/`term` with no duration (down for good). A `router` fault acts on every router (a node's too,
        bench.run.mesh), a `router:hub` fault on the driver's router (`router`) alone."""
        if self.state.phase == "stopping":
            return True
        targets = {name}
        if name.startswith("router"):
            targets = {"router", "router:hub"} if name == "router" else {"router"}
        planned = [w for w in self.fault_log if w.get("target") in targets and w.get("action") != UNPLANNED_EXIT]
        if any(w.get("t_end") is None for w in planned):
            return True
        return bool(planned) and planned[-1].get("action") in ("kill", "term") and planned[-1].get("duration") is None

    # --- drive ---------------------------------------------------------------------------------

    def drive(self) -> None:
        start_at = time.monotonic() + 0.3
        self.state.t0_mono = start_at + self.s.warmup_s
        self.state.end_mono = self.state.t0_mono + self.s.duration_s
        self.write_clock_file()
        self.cpu.t0 = self.state.t0_mono
        for link in list(self.control.links):  # the barrier, t = 0 and the end, each on the shard's own clock
            offset = self.clocks.get(f"shard:{link.shard}", clocks.SAME_CLOCK)
            link.send({"type": "start", "start_mono": offset.to_child(start_at),
                       "t0_mono": offset.to_child(self.state.t0_mono), "end_mono": offset.to_child(self.state.end_mono),
                       "clock_offset_s": offset.offset_s})
        if self.s.attackers:
            self.start_attackers()
        self.state.phase = "warmup"
        threading.Thread(target=self._scrape_servers, name="scrape", daemon=True).start()
        timeline_started = False
        while True:
            now = time.monotonic()
            if now >= self.state.end_mono:
                break
            if now >= self.state.end_mono - CLOCK_RECHECK_BEFORE_END_S and self.clocks_near_end is None:
                # while every shard still answers; a child on this runner's clock cannot drift from it
                self.clocks_near_end = self.measure_clocks(strict=False, only={n for n, o in self.clocks.items()
                                                                               if not o.same_clock})
                if self.cluster is not None:
                    self.node_walls_near_end = self.measure_node_walls()
            if not timeline_started and now >= self.state.t0_mono:
                self.leg_start = self.proxy_legs()  # the measured window's legs start here (warmup excluded)
                self.node_leg_start = self.node_proxy_legs()
                self.state.phase = "run"
                self.start_timeline()
                timeline_started = True
            wake = self.state.t0_mono if not timeline_started else self.state.end_mono
            try:
                link, msg = self.control.messages.get(timeout=max(0.01, min(0.5, wake - now)))
                self._handle(link, msg)
            except queue.Empty:
                pass
            self._check_children()
            self._check_timeline()

    def write_clock_file(self) -> None:
        """clock.json: t = 0 on this runner's monotonic clock (records say t, servers' audit lines mono_ms: this
        joins them, bench incident) and every child's clock offset from it (bench.fleet.clock)."""
        (self.run_dir / "clock.json").write_text(json.dumps(
            {"t0_mono_ms": self.state.t0_mono * 1e3, "offsets": {n: o.to_json() for n, o in sorted(self.clocks.items())},
             **({"node_walls": {n: o.to_json() for n, o in sorted(self.node_walls.items())}} if self.node_walls else {})},
            indent=1))

    def start_timeline(self) -> None:
        if not self.s.faults:
            return
        from bench.run.faults import start_timeline

        self.timeline = start_timeline(self)

    def _check_timeline(self) -> None:
        err = getattr(self.timeline, "error", None)
        if err and self._after_unplanned_exit():
            self.timeline.error = None  # its entry keeps the error; a later failure is judged afresh
            return
        if err:
            raise RuntimeError(f"fault timeline failed: {err}")

    def _after_unplanned_exit(self) -> bool:
        """Every failed fault acted on a process the system had already lost (an open `unplanned_exit` window on
        it, or on any router for `router`): a kill of a dead replica fails because the system failed first. That is
        the run's finding (`unplanned_exits`), not the bench erring."""
        down = set(self._open_exits())
        failed = [w for w in self.fault_log if w.get("error") and w.get("action") != UNPLANNED_EXIT]

        def lost(target: str) -> bool:
            if target == "router":
                return any(n.startswith("router") for n in down)
            return (target if target != "router:hub" else "router") in down
        return bool(failed) and all(lost(str(w.get("target"))) for w in failed)

    def _scrape_servers(self) -> None:
        import urllib.request

        from bench.run.prom import parse_prometheus

        wanted = {"policy_server_queue_depth": "queue_depth", "policy_server_load": "load",
                  "policy_server_active_sessions": "active_sessions", "policy_server_active_clients": "active_clients"}
        query = "&".join(f"name[]={n}" for n in wanted)  # only these families: a full scrape costs the server
        while not self._stop_scrape.wait(1.0):
            t = time.monotonic() - (self.state.t0_mono or time.monotonic())
            if t >= -1.0 and self.state.phase == "run":
                legs = self.proxy_legs()  # the report's per-second leg error (one small GET per site)
                if legs:
                    self.leg_series.add(t, legs)
            for rid, info in list(self.servers.items()):
                try:
                    with urllib.request.urlopen(f"{self._health_url(info)}/metrics?{query}", timeout=0.5) as r:
                        text = r.read().decode()
                except Exception:
                    continue  # a restarting replica has no endpoint for a while
                for name, _labels, value in parse_prometheus(text):
                    if name in wanted:
                        self.server_samples.append({"t": t, "replica": rid, "metric": wanted[name], "value": value})

    def _snapshot(self):
        total = self.s.duration_s
        t0 = self.state.t0_mono
        elapsed = (time.monotonic() - t0) if t0 else 0.0
        merged: dict = {"states": {}}
        rtt50, rtt99 = [], []
        for st in list(self.state.statuses.values()):
            for k, v in (st.get("states") or {}).items():
                merged["states"][k] = merged["states"].get(k, 0) + v
            for k in ("ticks", "none_ticks", "late_ticks", "host_late_ticks"):
                merged[k] = merged.get(k, 0) + int(st.get(k, 0))
            if st.get("rtt_ms_p50") is not None:
                rtt50.append(st["rtt_ms_p50"])
                rtt99.append(st.get("rtt_ms_p99", st["rtt_ms_p50"]))
        if rtt50:
            merged["rtt_ms_p50"], merged["rtt_ms_p99"] = float(np.mean(rtt50)), float(np.max(rtt99))
        merged["unplanned_exits"] = [w["target"] for w in list(self.fault_log) if w.get("action") == UNPLANNED_EXIT]
        return elapsed, total, self.state.phase, merged, self.cpu.latest()

    # --- stop ----------------------------------------------------------------------------------

    def _cost_model(self, split: dict) -> dict:
        """The preflight's cost model (bench.run.sizing) at this run's own in-run speed probe, beside what each
        kind of process measured: how far the estimate `bench run --check` prints was from this run."""
        from bench.run.sizing import estimate, forward_costs, measured_by_kind

        probes = self.cpu.probes(0.0, self.s.duration_s)
        probe = probes.get("mean_ms") or probes.get("median_ms")  # the run's mean speed (hostcpu.CpuSampler.probes)
        if not probe or not split.get("split"):
            return {}
        # the forward costs the preflight timed (cached): never timed now, beside a run still stopping
        est = estimate(self.s, cores=split.get("cores"), probe_ms=probe, forward=forward_costs(self.s, measure=False))
        est = est.to_json()
        measured = measured_by_kind(split["split"])
        total = sum(measured.values())
        from bench.run.hostcpu import COST_REFERENCE_PROBE_MS

        at_reference = est["cores_needed"] * COST_REFERENCE_PROBE_MS / probe
        # the model unscaled beside it: on the 16-core machine the probe read SMT contention (a mean 1.5-1.9x the
        # reference while the work itself took 1.0-1.16x its reference cost), so the scaled ratio read 0.62-0.66
        return {"estimate": est, "by_kind": measured,
                "estimate_ratio": round(total / est["cores_needed"], 2) if est["cores_needed"] else None,
                "estimate_ratio_at_reference": round(total / at_reference, 2) if at_reference else None}

    def proxy_legs(self) -> dict | None:
        """Every site proxy's fidelity counters now (chaos.toxiproxy.fidelity); None if the proxy cannot say."""
        chaos = getattr(self, "chaos", None)
        if chaos is None or getattr(getattr(self, "proxy_server", None), "real_toxiproxy", False):
            return None
        try:
            return {name: chaos.fidelity(f"site-{name}") for name in self.sites}
        except Exception as exc:  # an old or foreign proxy: the legs go unmeasured, the run goes on
            self.proxy_legs_error = f"the chaos proxy gave no fidelity counters: {exc}"
            return None

    def proxy_asked(self) -> dict | None:
        """Every site proxy's most asked of a chunk in each 100 ms (chaos.toxiproxy.fidelity.LegStats.asked_json
        per direction) on this host's clock: a local run's, or a cluster run's with the driver's router (its robots
        cross the driver's proxies); None where the proxies cannot say, and with per_node routers
        (node_proxy_asked)."""
        chaos = getattr(self, "chaos", None)
        if getattr(self, "mesh", None) is not None or not hasattr(chaos, "fidelity_asked") \
                or getattr(getattr(self, "proxy_server", None), "real_toxiproxy", False):
            return None
        try:
            return {name: chaos.fidelity_asked(f"site-{name}") for name in self.sites}
        except Exception:  # an old proxy: each request's hop is bounded by the whole run's most asked instead
            return None

    def node_proxy_legs(self) -> dict | None:
        """A cluster run's site proxies on each node (`routers: per_node`: its robots' proxies), their fidelity
        counters now, {node id: {site: snapshot}}; None elsewhere or if they cannot say."""
        if self.mesh is None:
            return None
        try:
            out: dict[str, dict] = {}
            for site in self.sites:
                for node_id, client in self.mesh.clients_by_node(f"site-{site}").items():
                    out.setdefault(node_id, {})[site] = client.fidelity(f"site-{site}")
            return out
        except Exception:  # a node gone: its robots' hops are bounded by the legs summed over the nodes instead
            return None

    def node_proxy_asked(self) -> dict:
        """A cluster run's site proxies on each node, their most asked of a chunk in each 100 ms (proxy_asked) on
        that node's monotonic clock, and the node's clock offset from this runner's, ms (timed through its
        router's actor): {node id: {"offset_ms", "asked": {site: {direction: LegStats.asked_json}}}}. A node that
        cannot say is left out (its robots' hops are bounded by the run's most asked)."""
        out: dict[str, dict] = {}
        if self.mesh is None:
            return out
        by_site = {site: self.mesh.clients_by_node(f"site-{site}") for site in self.sites}
        for node_id in {n for clients in by_site.values() for n in clients}:
            router = self.mesh.router_of(node_id)
            try:
                asked = {site: clients[node_id].fidelity_asked(f"site-{site}") for site, clients in by_site.items()
                         if node_id in clients}
                offset = clocks.settle(router.measure_clock(), self._local(router))
            except Exception:  # an old proxy, a node gone
                continue
            out[node_id] = {"offset_ms": offset.offset_s * 1e3, "asked": asked}
        return out

    def shutdown(self) -> None:
        if self.state.t0_mono is not None and time.monotonic() >= self.state.t0_mono:
            self.leg_end = self.proxy_legs()  # before the timeline heals and the proxy stops
            self.leg_asked = self.proxy_asked()
            self.node_leg_end, self.node_asked = self.node_proxy_legs(), self.node_proxy_asked()
        self.state.phase = "stopping"
        end, walls_end = self.clocks_near_end, self.node_walls_near_end
        if end or walls_end:  # the clocks drift over a run: the start's and the end's measurements, combined
            self.clocks = {n: clocks.combine(o, end[n]) if n in (end or {}) else o for n, o in self.clocks.items()}
            self.node_walls = {n: clocks.combine(o, walls_end[n]) if n in (walls_end or {}) else o
                               for n, o in self.node_walls.items()}
            self.write_clock_file()
        try:
            if self.timeline is not None:
                self.timeline.stop()
        except Exception as exc:
            self.state.errors.append(f"timeline stop: {exc!r}")
        if self.control is not None:
            self.control.broadcast({"type": "stop"})
            deadline = time.monotonic() + SHARD_DONE_TIMEOUT_S
            # every started shard, alive or not: a shard that finished on its own before this point has its
            # `done` (final states, loop priority) waiting in the queue
            shards = {n for n, c in self.procs.children if n.startswith("shard:")}
            while len(self.state.done) < len(shards) and time.monotonic() < deadline:
                try:
                    link, msg = self.control.messages.get(timeout=0.5)
                    if msg.get("type") == "done":
                        self.state.done[msg.get("shard", link.shard)] = msg
                except queue.Empty:
                    if not any(c.alive() for n, c in self.procs.children if n.startswith("shard:")):
                        break
        deadline = time.monotonic() + 20.0  # an attacker still running at the end gets a moment to write
        while any(c.alive() for n, c in self.procs.children if n.startswith("attacker:")) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.server_crashes = sum(1 for n, c in self.procs.children if n.startswith("server:")
                                  and isinstance(c, ChildProcess) and c.proc is not None and not c.alive())
        self._stop_scrape.set()
        self.cpu_split = self.cpu.split(0.0, self.s.duration_s)
        shard_threads = threadcpu.combine([d.get("thread_cpu") for d in self.state.done.values()])
        if shard_threads:  # the shards' CPU by thread role: the loop, the engines, the records writer, Zenoh
            self.cpu_split["shard_threads"] = shard_threads
        if self.cluster is None:
            self.cpu_split.update(self._cost_model(self.cpu_split))
        self.memory = self.cpu.memory(0.0, self.s.duration_s)
        self.cpu.stop()
        self.kill_report = self.procs.stop_all()
        if self.cluster is not None:  # records and logs written on other hosts come back before judging
            for child in self.cluster.children:
                try:
                    child.pull_files(self.run_dir)
                except Exception as exc:
                    self.state.errors.append(f"{child.name}: files not collected: {exc}")
            self.cluster_facts = self.cluster.describe(self.s.cluster.get("placement", "spread"))
            self.cluster_facts["routers"] = self.routers
            mesh = self.mesh.describe() if self.mesh is not None else {}
            for node in self.cluster_facts["nodes"]:  # each node's router and proxies beside its children
                node.update(mesh.get(node["node_id"], {}))
            self.cluster.close()

    # --- judge ---------------------------------------------------------------------------------



# --- helpers -----------------------------------------------------------------------------------


def server_argv(manifest: Path, test_skew: bool = False) -> list[str]:
    """policy-server through this interpreter (no reliance on PATH). `test_skew` (tests only): its monotonic clock
    shifted by BENCH_TEST_MONO_SKEW_S before the server's modules load (bench.fleet.clock.apply_test_skew)."""
    skew = "from bench.fleet.clock import apply_test_skew; apply_test_skew(); " if test_skew else ""
    return [sys.executable, "-c", f"import sys; {skew}from server.cli import main; sys.exit(main())", "--manifest",
            str(manifest)]


def _rtc_budget_s(engine: dict, fps: float) -> float:
    """A request's deadline for goodput. With an RTC prefix: the latency budget H*dt/2 (design P10). Without one
    (rtc off or execution_horizon 0, where H*dt/2 is 0 and no request could meet it): buffer_time_s, the
    playback the queue had left when the engine asked, so an answer within it arrives before the queue runs dry
    (0.5 s where the engine derives its buffer from the delay it measures)."""
    import dataclasses

    from edge import RemoteEngineConfig

    defaults = {f.name: f.default for f in dataclasses.fields(RemoteEngineConfig)}
    horizon = int(engine.get("execution_horizon", defaults["execution_horizon"]))
    if engine.get("rtc_enabled", defaults["rtc_enabled"]) and horizon > 0:
        return horizon / float(fps) / 2.0
    buffer = engine.get("buffer_time_s", defaults["buffer_time_s"])
    # a derived buffer depends on the delay measured at run time: 0.5 s, the old fixed default
    return 0.5 if buffer is None else float(buffer)


def _files(paths: list[str]) -> dict[str, bytes]:
    """What a cluster child reads, for its actor's `put_files` (each path once)."""
    return {p: Path(p).read_bytes() for p in dict.fromkeys(paths)}


def _pythonpath() -> str:
    existing = os.environ.get("PYTHONPATH", "")
    return str(REPO_ROOT) + (os.pathsep + existing if existing else "")
