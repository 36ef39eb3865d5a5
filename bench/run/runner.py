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
from bench.evidence import figures as figs
from bench.fleet import clock as clocks
from bench.fleet import records, threadcpu
from bench.evidence import report
from bench.scenario.assertions import evaluate
from bench.fleet.control import ControlServer
from bench.run.hostcpu import CpuSampler, Leftovers
from bench.run.manifests import overrides as manifest_overrides
from bench.run.manifests import plain, replica_manifest, replica_priority, replica_start_s
from bench.run.procset import ProcessSet, install_signal_handlers
from bench.run.samplelog import SampleLog
from bench.run.progress import Progress, print_verdict
from bench.scenario.schema import REPO_ROOT, Scenario, checkpoint_dir, missing_checkpoints, sweep_variants
from wire.procs import ChildProcess, free_port, start_on_picked_port, start_router

EXIT_PASS, EXIT_FAIL, EXIT_INVALID, EXIT_INCONCLUSIVE = 0, 1, 2, 3
SERVER_READY_TEXT = "policy-server ready"
SHARD_READY_TIMEOUT_S = 60.0
SHARD_DONE_TIMEOUT_S = 30.0
CLOCK_RECHECK_BEFORE_END_S = 1.0  # the clocks are measured again this long before the end: shards leave at the end


def cpu_table(samples: SampleLog):
    """The CPU samples as columns `t`, `host_percent`, `speed_probe_ms` (null but every 10th) and
    `cpu:<process>` (% of a core) for every process ever sampled: one not yet started or already gone is
    null in that row; `rss_mb:<process>` and `fds:<process>` likewise."""
    import pyarrow as pa

    cols = {f"cpu:{k}": pa.array(samples.column("processes", k), pa.float64()) for k in samples.keys("processes")}
    for key, typ in (("rss_mb", pa.float64()), ("fds", pa.int64())):  # memory and descriptors, when sampled
        for k in samples.keys(key):
            cols[f"{key}:{k}"] = pa.array(samples.column(key, k), typ)
    return pa.table({"t": samples.column("t"), "host_percent": samples.column("host_percent"),
                     "speed_probe_ms": pa.array(samples.column("speed_probe_ms"), pa.float64()), **cols})


def psutil_rss_mb() -> float:
    import psutil

    return round(psutil.Process().memory_info().rss / 2**20, 1)


HOP_SPLIT_MAX_CLOCK_ERROR = 0.25  # of a pair's median one-way hop: a split whose clocks are less sure is dropped


def hop_split(sent_ns: np.ndarray, t_recv_s: np.ndarray, audit,
              robot_offset_ms: np.ndarray | None = None, robot_uncertainty_ms: np.ndarray | None = None,
              robot_shard: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """Each answered request's uplink and downlink, ms: `uplink_ms` from the robot stamping it (`sent_ns`, its
    header's client_mono_ns) to the server receiving it (audit `received_mono_ms`), `downlink_ms` from the server
    handing the chunk to Zenoh (audit `sent_mono_ms`) to the robot receiving it (`t_recv_s`, monotonic seconds).
    `audit`: the servers' audit lines (bench.evidence.audit's table).

    Clocks (bench.fleet.clock): `t_recv_s` and the audit rows are on the runner's clock (collect_audit shifts a
    replica on another clock, and gives its rows `clock_uncertainty_ms`); `sent_ns` is the robot's, moved onto
    the runner's by `robot_offset_ms` (its shard's offset, per row; none = the same clock). Their sum,
    `network_ms`, needs no offset; the split does. Per (shard, replica) pair: when its two clocks' combined
    uncertainty exceeds HOP_SPLIT_MAX_CLOCK_ERROR of the pair's median one-way hop ((uplink + downlink) / 2), all
    of its requests get NaN (all, not the long hops only, which would bias what is left). Joined on
    client_mono_ns (the raw stamp, echoed); NaN where no audit line matches. Returns (uplink, downlink, the
    dropped pairs: {shard, replica, requests, clock_error_ms, hop_ms_p50})."""
    from bench.evidence.audit import equals, floats, integers, strings

    key, has_key = integers(audit, "client_mono_ns")
    received_all, sent_all = floats(audit, "received_mono_ms"), floats(audit, "sent_mono_ms")
    known = equals(audit, "outcome", "ok") & has_key & (key != 0) & ~np.isnan(received_all) & ~np.isnan(sent_all)
    error_all = np.nan_to_num(floats(audit, "clock_uncertainty_ms"), nan=0.0)
    replica_all = strings(audit, "replica")[known]
    _, replica_code = np.unique(replica_all, return_inverse=True)
    # by stamp, then by the other fields: of two lines with one stamp, the join takes the first in this order
    order = np.lexsort((replica_code, error_all[known], sent_all[known], received_all[known], key[known]))
    keys, received, sent = key[known][order], received_all[known][order], sent_all[known][order]
    server_error, replicas = error_all[known][order], replica_all[order]
    up = np.full(len(sent_ns), np.nan, dtype=np.float32)
    down = np.full(len(sent_ns), np.nan, dtype=np.float32)
    if not len(keys) or not len(sent_ns):
        return up, down, []
    sent_ns = np.asarray(sent_ns, dtype=np.int64)
    at = np.clip(np.searchsorted(keys, sent_ns), 0, len(keys) - 1)
    hit = (keys[at] == sent_ns) & (sent_ns > 0)
    robot_ms = sent_ns / 1e6
    if robot_offset_ms is not None:
        robot_ms = robot_ms - np.asarray(robot_offset_ms, dtype=float)
    u = received[at] - robot_ms
    d = np.asarray(t_recv_s, dtype=float) * 1e3 - sent[at]
    robot_error = np.zeros(len(sent_ns)) if robot_uncertainty_ms is None else np.asarray(robot_uncertainty_ms, float)
    shards = np.full(len(sent_ns), -1) if robot_shard is None else np.asarray(robot_shard)
    error = server_error[at] + robot_error
    keep = hit.copy()
    dropped = []
    for shard, replica in sorted({(int(a), str(b)) for a, b in zip(shards[hit], replicas[at][hit])}):
        rows = hit & (shards == shard) & (replicas[at] == replica)
        err = float(np.max(error[rows]))
        hop = float(np.median((u[rows] + d[rows]) / 2.0))
        if err > 0 and not err <= HOP_SPLIT_MAX_CLOCK_ERROR * hop:
            keep &= ~rows
            dropped.append({"shard": shard, "replica": replica, "requests": int(rows.sum()),
                            "clock_error_ms": round(err, 3), "hop_ms_p50": round(hop, 3)})
    up[keep] = u[keep]
    down[keep] = d[keep]
    return up, down, dropped


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
    problems = preflight(scenario)
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


class Run:
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
        """processes.json: every child's name, pid (= its process group) and log, for people and tests."""
        rows = [{"name": n, "pid": c.pid, "log": str(getattr(c, "log_path", ""))} for n, c in self.procs.children if c.pid]
        for i, server in enumerate(getattr(self, "proxy_servers", [])):
            if getattr(server, "pid", None):
                rows.append({"name": _proxy_name(i), "pid": server.pid, "log": str(self.logs / f"{_proxy_name(i)}.log")})
        (self.run_dir / "processes.json").write_text(json.dumps(rows, indent=1))

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
            server = chaos_launch.start_proxy_server(log_path=self.logs / f"{_proxy_name(i)}.log",
                                                     priority=proxy_priority())
            self.procs.on_stop(_proxy_name(i), server.stop)
            self.cpu.track(_proxy_name(i), getattr(server, "pid", None))
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
        """wire.transport flags every router of this run gets: sessions sized from the fleet."""
        from bench.run.sizing import router_max_sessions

        return ["--max-sessions", str(router_max_sessions(self.s))]

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
            if isinstance(child, ChildProcess) and child.proc is not None and not child.alive():
                if name.startswith("server:") and self._restarting(name):
                    continue
                if name.startswith("router") and self._restarting("router"):
                    continue  # a `router` fault holds every router (a node's too, bench.run.mesh) down on purpose
                if name == "router" and self._restarting("router:hub"):
                    continue  # a `router:hub` fault holds the driver's router down, the node routers carry on
                if name.startswith("shard:") and child.proc.returncode == 0 and (
                        name.split(":", 1)[1] in {str(k) for k in self.state.done}
                        or time.monotonic() >= (self.state.end_mono or math.inf) - 1.0):
                    continue  # finished: its loop ends at its last slot due before the end, maybe before we look
                how = child.exit_text() if hasattr(child, "exit_text") else f"exited with {child.proc.returncode}"
                raise RuntimeError(f"{name} {how}; log {child.log_path}:\n{child.tail(15)}")

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

    def _restarting(self, name: str) -> bool:
        """A server may be down on purpose while a fault holds it down."""
        return any(w.get("target") == name and w.get("t_end") is None for w in self.fault_log) or self.state.phase == "stopping"

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
        if err:
            raise RuntimeError(f"fault timeline failed: {err}")

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
        except Exception as exc:
            error = (error + "\n" if error else "") + f"aggregation failed: {exc!r}\n{traceback.format_exc()}"
        if error is not None and not results:
            results = [report.AssertionResult(a.expression, False, None, error="not evaluated: the run did not complete",
                                              line=a.line) for a in self.s.assertions]
        fidelity = self.fidelity(data)
        if data is not None and error is None:
            self.without_bench(data, top, results, fidelity)
        verdict = report.verdict_of(results, error, fidelity)
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
        local = {f"{_proxy_name(i)}.log" for i in range(len(getattr(self, "proxy_servers", [])))}
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

    def _audit(self):
        """The audit table `collect` read (an empty one before it ran)."""
        import pyarrow as pa

        audit = getattr(self, "audit", None)
        return audit if audit is not None else pa.table({})

    def collect(self) -> figs.RunData:
        """Merge every shard's Arrow streams into parquet files; return numpy views for figures."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from bench.evidence.audit import checkpoints_by_session, rows_with_prefix

        self.audit = audit = self.collect_audit()
        tables = {}
        for kind in records.SCHEMAS:
            if kind in ("ticks", "requests", "transitions"):  # a robot's rows together, in time
                t = records.collect_sorted(self.rec_dir, kind)  # never the unsorted whole beside the sorted one
            else:
                t = records.collect(self.rec_dir, kind)
            if kind == "requests":
                t_recv = t.column("t").to_numpy() + float(getattr(self.state, "t0_mono", 0.0) or 0.0)
                offset_ms, error_ms, shard = self.robot_clocks(t.column("robot").to_numpy())
                up, down, self.hop_split_dropped = hop_split(t.column("sent_ns").to_numpy(), t_recv, audit,
                                                             offset_ms, error_ms, shard)
                t = t.append_column("uplink_ms", pa.array(up)).append_column("downlink_ms", pa.array(down))
                sent_ms = t.column("sent_ns").to_numpy() / 1e6  # the robots' stamps, on the runner's clock
                if offset_ms is not None:
                    sent_ms = sent_ms - np.asarray(offset_ms, dtype=float)
                split = self.router_split(audit, t.column("sent_ns").to_numpy(), sent_ms, up, down,
                                          t.column("downlink_from_router_ms").to_numpy(), t.column("robot").to_numpy())
                for name, values in split.items():
                    if name in t.column_names:
                        t = t.set_column(t.column_names.index(name), name, pa.array(values))
                    else:
                        t = t.append_column(name, pa.array(values))
                qw_bench, inf_bench = self.server_bench_share(audit, t.column("sent_ns").to_numpy())
                t = t.append_column("queue_wait_bench_ms", pa.array(qw_bench)) \
                    .append_column("inference_bench_ms", pa.array(inf_bench))
                try:  # a figure of the evidence: the run's records must be written whatever it meets
                    hops = {**self.hop_bench_share(audit, t.column("sent_ns").to_numpy(), split),
                            **self.robot_hop_bench_share(t.column("robot").to_numpy(), split, sent_ms, t_recv)}
                except Exception as exc:
                    print(f"bench: the hops' bench share could not be split: {exc!r}", file=sys.stderr)
                    hops = {h[:-3] + "_bench_ms": np.full(t.num_rows, np.nan, np.float32)
                            for h in fid.SERVER_HOPS + tuple(h for h, _ in fid.ROBOT_HOPS)}
                for name, values in hops.items():
                    t = t.append_column(name, pa.array(values))
                encode_bench, self.encode_floors = fid.encode_excess(
                    t.column("encode_ms").to_numpy(), self.per_robot(t.column("robot").to_numpy(), "group", ""))
                t = t.append_column("encode_bench_ms", pa.array(encode_bench))
            pq.write_table(t, self.run_dir / f"{kind}.parquet")
            tables[kind] = t
        robots_tab = pa.Table.from_pylist(getattr(self, "robot_table", []) or [], schema=None) \
            if getattr(self, "robot_table", None) else pa.table({"robot": pa.array([], pa.int32())})
        pq.write_table(robots_tab, self.run_dir / "robots.parquet")
        if audit.num_rows:
            pq.write_table(audit, self.run_dir / "server_requests.parquet")
        if self.server_samples:
            pq.write_table(pa.Table.from_pylist(list(self.server_samples)), self.run_dir / "server_metrics.parquet")
        if self.cpu.samples:
            pq.write_table(cpu_table(self.cpu.samples), self.run_dir / "cpu.parquet")
        for p in self.rec_dir.glob("*.arrow"):
            p.unlink()  # merged into the parquet files above
        try:
            self.rec_dir.rmdir()
        except OSError:
            pass
        ticks = figs.table_to_numpy(tables["ticks"].drop_columns(["action"])) if tables["ticks"].num_rows else {}
        final_states, parity = {}, {}
        for msg in self.state.done.values():
            for r, st in (msg.get("final_states") or {}).items():
                final_states[int(r)] = st
            for r, counts in (msg.get("parity") or {}).items():
                parity[int(r)] = counts
        data = figs.RunData(
            robots={k: np.asarray(v) for k, v in figs.table_to_numpy(robots_tab).items()},
            ticks=ticks, requests=figs.table_to_numpy(tables["requests"]),
            transitions=figs.table_to_numpy(tables["transitions"]), episodes=figs.table_to_numpy(tables["episodes"]),
            loop=figs.table_to_numpy(tables["loop"]), duration_s=self.s.duration_s,
            fault_windows=[w for w in self.fault_log if w.get("t_start") is not None],
            server_samples=self.server_samples, cpu_samples=self.cpu.samples, final_states=final_states, parity=parity,
            session_checkpoints=checkpoints_by_session(audit),
            attacks=self.collect_attacks(audit), server_crashes=getattr(self, "server_crashes", 0),
            leftovers=getattr(self, "leftover_report", {}),
            security_denials=rows_with_prefix(audit, "outcome", "denied:"))
        if data.attacks:
            (self.run_dir / "attacks.json").write_text(json.dumps(data.attacks, indent=1))
        if tables["ticks"].num_rows:
            from bench.robots import robot_type

            scale = {}
            for row in getattr(self, "robot_table", []):
                cls = robot_type(row["robot_type"])
                scale[row["robot"]] = np.asarray(cls.action_high, float) - np.asarray(cls.action_low, float)
            data.seam = figs.measured_seam_inputs(ticks, ListRows(tables["ticks"].column("action")), scale)
        del tables, t  # what figures need is in `data` now (its numeric columns still views of Arrow buffers)
        pa.default_memory_pool().release_unused()
        return data

    def unloaded_forward(self) -> dict[str, dict | None]:
        """Each replica's unloaded forward ms by batch size, from its log (read once)."""
        if getattr(self, "_unloaded", None) is None:
            self._unloaded = {rid: fid.unloaded_forward(self.logs / f"server-{rid}.log") for rid in self.servers}
        return self._unloaded

    def router_split(self, audit, sent_ns: np.ndarray, sent_ms: np.ndarray, up: np.ndarray, down: np.ndarray,
                     down_from_router: np.ndarray, robots: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Each request's uplink and downlink split at the first router routing it, by that router's timestamp (a
        Zenoh router stamps what it routes, by default): `uplink_to_router_ms` from the robot's stamp (`sent_ms`, on
        the runner's clock; `sent_ns` the raw stamp, the join key) to the router (the robot's send, the site's proxy,
        the router's receive; audit `routed_mono_ms`) and
        `uplink_from_router_ms` the rest of the uplink (the router's forwarding, the server's receive up to its
        callback); `downlink_to_router_ms` (the server's send, the router's receive) and `downlink_from_router_ms`
        (the router's forwarding, the proxy, the robot's receive: the engine's record). NaN where unstamped.

        The stamp is the router's wall clock, read as an age against the receiver's (the replica's for the
        observation, the robot's for the chunk). In a cluster run the two may be other hosts' clocks: each request's
        parts are moved by the measured offset between the stamping router's node and the receiver's
        (cluster_stamp_error; `robots`: each request's robot); a (shard, replica) pair whose wall clocks are
        unsure by more than HOP_SPLIT_MAX_CLOCK_ERROR of its one-way hop gets NaN, as in hop_split
        (`self.router_split_dropped`)."""
        from bench.evidence.audit import by_stamp, equals, floats

        (routed,) = by_stamp(audit, equals(audit, "outcome", "ok"), sent_ns, [floats(audit, "routed_mono_ms")])
        down_from = np.asarray(down_from_router, dtype=float)
        self.router_split_dropped = []
        if self.cluster is not None:
            up_err, down_err, keep = self.cluster_stamp_error(audit, sent_ns, robots, up, down)
            routed, down_from = routed - up_err, down_from + down_err
            routed[~keep], down_from[~keep] = np.nan, np.nan
        up_to = routed - sent_ms
        up_to[np.isnan(np.asarray(up, dtype=float))] = np.nan  # a pair hop_split left out: its clocks too unsure
        return {"uplink_to_router_ms": up_to.astype(np.float32), "uplink_from_router_ms": (up - up_to).astype(np.float32),
                "downlink_to_router_ms": (down - down_from).astype(np.float32),
                "downlink_from_router_ms": down_from.astype(np.float32)}

    def cluster_stamp_error(self, audit, sent_ns: np.ndarray, robots: np.ndarray | None, up: np.ndarray,
                            down: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per request of a cluster run, ms: how far its observation's router stamp, read on its replica's node, is
        off (the stamping router's node's wall clock minus the replica's node's: `routed_mono_ms` is that much
        late), and its chunk's, read on its robot's node (the stamping node's minus the robot's:
        `downlink_from_router_ms` is that much short), and which requests keep a split (the largest combined
        uncertainty of two offsets among those kept to `self.router_split_error_ms`). The stamping routers
        (bench.run.mesh): with `per_node` routers the robot's node's for the observation and the replica's node's
        for the chunk; with the driver's, the hub's for both (this host, offset 0). Nodes' offsets:
        `self.node_walls` (measured at the start and near the end, combined). NaN and not kept where a node or its
        offset is unknown; a (shard, replica) pair unsure by more than HOP_SPLIT_MAX_CLOCK_ERROR of its median
        one-way hop ((uplink + downlink) / 2) is not kept, all of it (`self.router_split_dropped`)."""
        from bench.evidence.audit import by_stamp, equals, strings

        n = len(sent_ns)
        robots = np.full(n, -1) if robots is None else np.asarray(robots)
        shard = self.per_robot(robots, "shard", -1).astype(np.int64)
        (row,) = by_stamp(audit, equals(audit, "outcome", "ok"), sent_ns, [np.arange(audit.num_rows, dtype=float)])
        found = np.isfinite(row)
        replica = np.full(n, "", dtype=object)
        replica[found] = strings(audit, "replica")[row[found].astype(np.int64)]

        def apart(a: clocks.ClockOffset, b: clocks.ClockOffset) -> tuple[float, float]:
            """Clock a less clock b, ms, and how unsure that is (none for one clock)."""
            return (a.offset_s - b.offset_s) * 1e3, (0.0 if a is b else (a.uncertainty_s + b.uncertainty_s) * 1e3)

        node = self.child_nodes.get
        hub = clocks.SAME_CLOCK  # the driver's router runs on this host
        walls = self.node_walls
        up_err, down_err = np.full(n, np.nan), np.full(n, np.nan)
        keep = np.zeros(n, dtype=bool)
        self.router_split_error_ms = 0.0
        for k, rid in sorted({(int(a), str(b)) for a, b in zip(shard, replica)}):
            rows = (shard == k) & (replica == rid)
            robot_node, replica_node = node(f"shard:{k}"), node(f"server:{rid}")
            if k < 0 or not rid or robot_node not in walls or replica_node not in walls:
                continue
            robot_wall, replica_wall = walls[robot_node], walls[replica_node]
            up_stamp, down_stamp = (robot_wall, replica_wall) if self.routers == "per_node" else (hub, hub)
            (ue, uu), (de, du) = apart(up_stamp, replica_wall), apart(down_stamp, robot_wall)
            up_err[rows], down_err[rows] = ue, de
            hop = float(np.nanmedian((np.asarray(up, float)[rows] + np.asarray(down, float)[rows]) / 2.0)) \
                if np.isfinite(np.asarray(up, float)[rows]).any() else float("nan")
            err = max(uu, du)
            if err > 0 and not err <= HOP_SPLIT_MAX_CLOCK_ERROR * hop:
                self.router_split_dropped.append({"shard": k, "replica": rid, "requests": int(rows.sum()),
                                                  "clock_error_ms": round(err, 3), "hop_ms_p50": round(hop, 3)})
                continue
            keep |= rows
            self.router_split_error_ms = max(self.router_split_error_ms, err)
        return up_err, down_err, keep

    def hop_bench_share(self, audit, sent_ns: np.ndarray, split: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Per request, each hop between the router and the replica (fid.SERVER_HOPS, from `split`: router_split's)
        beyond its replica's floor for it (fid.hop_excess), as `<hop>_bench_ms`; the floors by replica to
        `self.hop_floors` (summary.json `fidelity.bench_share`)."""
        from bench.evidence.audit import by_stamp, equals, strings

        (row,) = by_stamp(audit, equals(audit, "outcome", "ok"), sent_ns, [np.arange(audit.num_rows, dtype=float)])
        found = np.isfinite(row)
        replica = np.full(len(sent_ns), "", dtype=object)
        replica[found] = strings(audit, "replica")[row[found].astype(np.int64)]
        out, self.hop_floors = {}, {}
        for name in fid.SERVER_HOPS:
            out[name[:-3] + "_bench_ms"], floors = fid.hop_excess(split[name], replica)
            for rid, floor in floors.items():
                self.hop_floors.setdefault(rid, {})[name] = floor
        return out

    def robot_hop_bench_share(self, robots: np.ndarray, split: dict[str, np.ndarray], sent_ms: np.ndarray,
                              t_recv: np.ndarray) -> dict[str, np.ndarray]:
        """Per request (`robots`: its robot; `sent_ms`, `t_recv`: its send, ms, and its answer's arrival, s, on the
        runner's monotonic clock), each hop between the robot and the router (fid.ROBOT_HOPS, from `split`) beyond what its
        site's proxy asked around its time (fid.robot_hop_excess), as `<hop>_bench_ms`; what was used, by hop and
        site, to `self.robot_hops` (summary.json `fidelity.bench_share`). A cluster run with per_node routers keys them
        by site and node (by_site_and_node): a robot's chunks cross its own node's copy of its site's proxy, whose
        maxima by 100 ms are on that node's clock."""
        site = self.per_robot(robots, "site", "")
        legs = self.window_legs()
        asked = getattr(self, "leg_asked", None) or {}
        recv_ms = np.asarray(t_recv, dtype=float) * 1e3
        shift = np.zeros(len(site))  # the runner's clock to the proxy's
        node_start, node_end = getattr(self, "node_leg_start", None) or {}, getattr(self, "node_leg_end", None)
        node_legs = {n: self.window_legs(node_start.get(n) or {}, end) for n, end in node_end.items()} \
            if node_end else None
        if node_legs is not None:  # cluster, per_node routers: each robot's hops through its node's copy of its site
            site, legs, asked, shift = self.by_site_and_node(robots, site, node_legs)
        windows = {"uplink_to_router_ms": (sent_ms + shift, sent_ms + split["uplink_to_router_ms"] + shift),
                   "downlink_from_router_ms": (recv_ms - split["downlink_from_router_ms"] + shift, recv_ms + shift)}
        out, self.robot_hops = {}, {}
        for name, direction in fid.ROBOT_HOPS:
            by_s = {site: (legs_asked or {}).get(direction) for site, legs_asked in asked.items()}
            out[name[:-3] + "_bench_ms"], self.robot_hops[name] = fid.robot_hop_excess(
                split[name], site, legs, direction, by_s, windows[name])
        return out

    def by_site_and_node(self, robots: np.ndarray, site: np.ndarray, node_legs: dict) -> tuple:
        """A cluster run's robot-side hops per site and node (`per_node` routers: a robot's chunks cross its own
        node's copy of its site's proxy): each request's key `site@node` (the node id's first 12 characters), the
        legs and the maxima by 100 ms under those keys (`node_legs`: the window's legs per node and site,
        `self.node_asked`), and each request's shift from the runner's clock to its node's, ms (NaN where the
        node's clock is unknown: bounded by the run's most asked)."""
        parts = getattr(self, "node_asked", None) or {}
        node = [self.child_nodes.get(f"shard:{k}") or "" for k in self.per_robot(robots, "shard", -1)]
        keyed = np.array([f"{s}@{n[:12]}" if s and n else "" for s, n in zip(site, node)], dtype=object)
        legs = {f"{s}@{n[:12]}": snap for n, by_site in node_legs.items() for s, snap in by_site.items()}
        asked = {f"{s}@{n[:12]}": a for n, p in parts.items() for s, a in (p.get("asked") or {}).items()}
        shift = np.array([(parts.get(n) or {}).get("offset_ms", np.nan) for n in node], dtype=float)
        return keyed, legs, asked, shift

    def server_bench_share(self, audit, sent_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per request (`sent_ns`: its stamp), the queue wait and the forward pass the bench host added on its
        replica (bench.evidence.replay), NaN where not measured; the replicas' replay figures to
        `self.server_replay` (summary.json `fidelity.queue_replay`)."""
        import yaml

        from bench.evidence import replay
        from bench.evidence.audit import by_stamp, equals

        sched = {}
        for rid, info in self.servers.items():
            try:
                manifest = yaml.safe_load(Path(info["manifest"]).read_text())
            except (KeyError, OSError, yaml.YAMLError, TypeError):
                continue  # its dispatch rule unknown: server_share says it was not replayed
            sched[rid] = replay.Scheduling.of_manifest(manifest, (manifest or {}).get("model_id"))
        try:
            qw, inf, self.server_replay = replay.server_share(audit, self.unloaded_forward(), sched)
        except Exception as exc:  # a figure of the evidence: the run's records must still be written
            self.server_replay = [{"note": f"the queue replay failed: {exc!r}"}]
            return np.full(len(sent_ns), np.nan, np.float32), np.full(len(sent_ns), np.nan, np.float32)
        return tuple(by_stamp(audit, equals(audit, "outcome", "ok"), sent_ns, [qw, inf]))

    def per_robot(self, robots: np.ndarray, field: str, default) -> np.ndarray:
        """Each row's robot's `field` in the run's robot table (`default` where the robot or its field is unknown):
        a numpy array of objects."""
        of = {r["robot"]: r.get(field) for r in getattr(self, "robot_table", [])}
        out = [of.get(int(r)) for r in robots]
        return np.array([default if v is None or v == "" else v for v in out], dtype=object)

    def robot_clocks(self, robots: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray]:
        """Per record row: its robot's shard's clock offset and uncertainty, ms (None, None: all on this clock), and
        the shard."""
        shard = self.per_robot(robots, "shard", -1).astype(np.int64)
        by_shard = {k: self.clocks.get(f"shard:{k}", clocks.SAME_CLOCK)
                    for k in {r["shard"] for r in getattr(self, "robot_table", [])}}
        if all(o.same_clock for o in by_shard.values()):
            return None, None, shard
        offsets = np.array([by_shard[k].offset_s * 1e3 if k in by_shard else np.nan for k in shard])
        errors = np.array([by_shard[k].uncertainty_s * 1e3 if k in by_shard else np.inf for k in shard])
        return offsets, errors, shard

    def clock_facts(self) -> dict:
        """summary.json's `clock`: each child's offset and whether the uplink/downlink split could be trusted."""
        pairs = getattr(self, "hop_split_dropped", None) or []
        dropped = sum(p["requests"] for p in pairs)
        split = {"valid": not pairs, "requests_dropped": dropped, "dropped_pairs": pairs,
                 "max_clock_error_of_hop": HOP_SPLIT_MAX_CLOCK_ERROR}
        if pairs:
            split["note"] = (f"{dropped} answered requests have no uplink_ms/downlink_ms: " + "; ".join(
                f"shard {p['shard']} -> {p['replica']}: clocks unsure by {p['clock_error_ms']:.2f} ms, over "
                f"{HOP_SPLIT_MAX_CLOCK_ERROR:.0%} of the {p['hop_ms_p50']:.2f} ms one-way hop" for p in pairs))
        facts = {"children": {n: o.to_json() for n, o in sorted(self.clocks.items())}, "hop_split": split}
        if self.cluster is not None:  # the router stamps' split across the nodes' wall clocks (cluster_stamp_error)
            facts["node_walls"] = {n: o.to_json() for n, o in sorted(self.node_walls.items())}
            facts["router_split"] = self.router_split_facts()
        return facts

    def router_split_facts(self) -> dict:
        """summary.json's `clock.router_split` in a cluster run: whether every request's hops could be split at the
        router across its nodes' wall clocks, the largest clock error of those split, and the pairs left unsplit."""
        pairs = getattr(self, "router_split_dropped", None) or []
        dropped = sum(p["requests"] for p in pairs)
        out = {"valid": not pairs, "requests_dropped": dropped, "dropped_pairs": pairs,
               "clock_error_ms": round(float(getattr(self, "router_split_error_ms", 0.0)), 3),
               "max_clock_error_of_hop": HOP_SPLIT_MAX_CLOCK_ERROR}
        if pairs:
            out["note"] = f"{dropped} answered requests have no hops split at the router: " + "; ".join(
                f"shard {p['shard']} -> {p['replica']}: the nodes' wall clocks unsure by {p['clock_error_ms']:.2f} ms, "
                f"over {HOP_SPLIT_MAX_CLOCK_ERROR:.0%} of the {p['hop_ms_p50']:.2f} ms one-way hop" for p in pairs)
        return out

    def collect_audit(self):
        """Every replica's audit log as one table (bench.evidence.audit), each on this runner's clock."""
        from bench.evidence import audit

        return audit.read((rid, info["audit"], self.clocks.get(f"server:{rid}", clocks.SAME_CLOCK))
                          for rid, info in self.servers.items() if info.get("audit") and Path(info["audit"]).is_file())


class ListRows:
    """Row i of an Arrow list column as a numpy slice, without a Python list per row: `to_pylist` of a 30-minute,
    52-robot run's 2.8 M tick actions is millions of small lists held at once in the report phase."""

    def __init__(self, column):
        arr = column.combine_chunks() if hasattr(column, "combine_chunks") else column
        self.offsets = arr.offsets.to_numpy()
        # the values as recorded (float32, a view of the column): seam_inputs widens one robot's rows at a time
        self.values = arr.values.to_numpy(zero_copy_only=False)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i]:self.offsets[i + 1]]


# --- helpers -----------------------------------------------------------------------------------


def _proxy_name(i: int) -> str:
    """Process name of chaos proxy server `i` (the first keeps the name runs always had)."""
    return "chaos-proxy" if i == 0 else f"chaos-proxy-{i}"


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
