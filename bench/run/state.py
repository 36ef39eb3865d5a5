"""One run's declared state: every field its phases (bench.run.starters, observe, faults, stop, collect, verdict)
share, each with its default, so a phase reads a field that was never written as its default, never as a probe;
its slots make writing an undeclared one an AttributeError.

`RunState` is written by the phase that owns a field and read by those after it: the starters write the children
and their addresses, `observe` the clocks and the live part (phase, t = 0, the shards' statuses), `stop` what the
children measured, `collect` the evidence the verdict reads. The live part is read by the progress thread as well.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.evidence import fidelity as fid
from bench.fleet.clock import ClockOffset
from bench.run.procset import ProcessSet
from bench.run.samplelog import SampleLog
from bench.run.usage import CpuSampler


@dataclass
class SiteLink:
    name: str
    endpoint: str  # what the site's robots connect to (the proxy's listen address)
    proxy: object = None


@dataclass(slots=True)  # a field written that is not declared here is an error, not a new attribute
class RunState:
    # --- what the run is: its scenario, where it writes, where its children run ---------------------------------
    s: Any = None  # bench.scenario.load.Scenario
    run_dir: Path = Path(".")
    logs: Path = Path("logs")
    rec_dir: Path = Path("records")
    engine_factory: str | None = None  # "module:function" for tests; None = edge's remote engine
    progress_enabled: bool = True
    # bench.run.cluster.Cluster: shards and replicas run as Ray actors' children; None = all here
    cluster: Any = None
    # what other hosts reach this one's router, proxies and control socket on (loopback when all is here)
    host: str = "127.0.0.1"
    # with --cluster: `per_node` (a router on every used node, joined to this host's; bench.run.mesh) or `driver`
    routers: str | None = None
    started_utc: str = ""
    wall0: float = 0.0

    # --- live: written by the run's thread, read by the progress line (bench.run.observe) --------------------------
    phase: str = "starting"
    t0_mono: float | None = None  # measured t = 0
    end_mono: float | None = None
    statuses: dict = field(default_factory=dict)  # shard -> latest status
    done: dict = field(default_factory=dict)  # shard -> done message
    errors: list = field(default_factory=list)

    # --- the children (bench.run.starters) ----------------------------------------------------------------------
    procs: ProcessSet = field(default_factory=ProcessSet)
    router_child: Any = None  # wire.procs.ChildProcess
    router_endpoint: str = ""
    router_rules: Path | None = None  # mtls: the router's access-control file
    pki: Any = None  # mtls: bench.security.pki.Pki under <run>/pki
    identities: dict[tuple[str, int], dict] = field(default_factory=dict)  # (group, index) -> client_uuid [+ TLS]
    proxy_servers: list = field(default_factory=list)  # one per chaos proxy process
    proxy_server: Any = None  # the first of them
    chaos: Any = None  # chaos.client.ProxyPool (bench.run.mesh.SiteFanout under per_node routers)
    network_stand_ins: dict[str, list[str]] = field(default_factory=dict)  # site -> toxics the real Toxiproxy lacks
    sites: dict[str, SiteLink] = field(default_factory=dict)
    mesh: Any = None  # bench.run.mesh.NodeMesh under per_node routers
    replica_router: dict[str, str] = field(default_factory=dict)  # replica id -> its node's router endpoint (per_node)
    servers: dict[str, dict] = field(default_factory=dict)  # replica id -> {child, manifest, health_port, audit, ...}
    control: Any = None  # bench.fleet.control.ControlServer
    n_shards: int | None = None
    request_rates: dict[str, float] = field(default_factory=dict)  # group -> requests a second one robot sends
    robot_table: list[dict] = field(default_factory=list)  # one row per robot: group, site, shard, deadline ...
    attack_log: Path | None = None
    child_nodes: dict[str, str] = field(default_factory=dict)  # child name -> its node id (kept after they stop)

    # --- clocks (bench.fleet.clock) -----------------------------------------------------------------------------
    # each shard's and replica's clock offset from this runner's, measured before the start barrier, then combined
    # with a second measurement taken CLOCK_RECHECK_BEFORE_END_S before the end
    clocks: dict[str, ClockOffset] = field(default_factory=dict)
    clocks_near_end: dict[str, ClockOffset] | None = None
    # a cluster run's nodes' wall clocks' offsets from this runner's, by node id (a Zenoh router stamps with its
    # node's wall clock: router_split), measured and combined as `clocks` are
    node_walls: dict[str, ClockOffset] = field(default_factory=dict)
    node_walls_near_end: dict[str, ClockOffset] | None = None

    # --- observed while it runs (bench.run.observe, bench.run.faults, bench.run.legs) ------------------------------
    cpu: CpuSampler = field(default_factory=CpuSampler)
    server_samples: SampleLog = field(default_factory=SampleLog)  # {t, replica, metric, value} a second per gauge
    leg_series: fid.LegErrorSeries = field(default_factory=fid.LegErrorSeries)  # each leg's delay error a second
    fault_log: list[dict] = field(default_factory=list)
    timeline: Any = None  # chaos.timeline's runner, when the scenario has faults
    stop_scrape: threading.Event = field(default_factory=threading.Event)
    speed_probe: dict = field(default_factory=dict)
    leftovers: Any = None  # bench.run.usage.Leftovers
    leg_start: dict | None = None  # each site proxy's counters at t = 0 (proxy_legs) ...
    leg_end: dict | None = None  # ... and at the end
    leg_asked: dict | None = None  # each site proxy's most asked by 100 ms (proxy_asked)
    node_leg_start: dict | None = None  # per_node routers: the same, {node id: {site: ...}}
    node_leg_end: dict | None = None
    node_asked: dict | None = None
    proxy_legs_error: str | None = None

    # --- what the children measured, read at the stop (bench.run.stop) ------------------------------------------
    server_crashes: int = 0
    cpu_split: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    kill_report: list = field(default_factory=list)
    leftover_report: dict = field(default_factory=dict)
    cluster_facts: dict | None = None

    # --- the evidence (bench.run.collect), read by the verdict ----------------------------------------------------
    audit: Any = None  # the servers' audit lines (bench.evidence.audit's table)
    unloaded: dict | None = None  # replica id -> its unloaded forward ms by batch size
    hop_split_dropped: list | None = None
    router_split_dropped: list | None = None
    router_split_error_ms: float = 0.0
    hop_floors: dict | None = None
    robot_hops: dict | None = None
    server_replay: list | None = None
    encode_floors: dict | None = None

    @classmethod
    def of(
        cls, scenario, run_dir: Path, progress: bool = True, engine_factory: str | None = None, cluster=None
    ) -> RunState:
        """A run's state before anything started: its directories named, its routers resolved (with --cluster)."""
        run_dir = Path(run_dir).resolve() if cluster is not None else Path(run_dir)
        routers = None
        if cluster is not None:
            from bench.run.mesh import resolve_routers

            routers = resolve_routers(scenario.cluster.get("routers"))
        return cls(
            s=scenario,
            run_dir=run_dir,
            logs=run_dir / "logs",
            rec_dir=run_dir / "records",
            engine_factory=engine_factory,
            progress_enabled=progress,
            cluster=cluster,
            host=cluster.host_for_endpoints() if cluster is not None else "127.0.0.1",
            routers=routers,
            started_utc=datetime.now(UTC).isoformat(timespec="seconds"),
            wall0=time.monotonic(),
        )
