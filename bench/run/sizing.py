"""How big a bench this host needs for a scenario: `fleet.shards: auto` and the preflight estimate.

Owns the shard rule, the request rate a robot's engine keeps (`requests_per_robot_s`) and the real-time estimate
printed by `bench run --check` and before every run. Invariant: an explicit `fleet.shards` integer is never
changed; `auto` always resolves to >= 1, and to the same count for the same scenario on a host with the same core
count (it reads checkpoint configs and network profiles, never a timing, but for a gym env's tick: a generic env's
cost is known only by stepping it, bench.robots.gymenv).

The rule (evidence in docs/bench.md "Sizing the bench to the host"): a shard's control loop shares its process's GIL
with every engine thread of that shard, so a shard carries at most the CPU work of 100 reacher robots at 30 Hz (its
ticks, requests and physics: `shard_ms_per_s`), and a quarter of that on a host with cores to spare. The same costs
give the preflight estimate, which summary.json keeps beside the measured split; a replica's forward pass is priced
from the checkpoint it serves, timed on this host (bench.run.forwardcost).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from types import SimpleNamespace

from bench.run.manifests import replica_manifest
from bench.run.usage import COST_REFERENCE_PROBE_MS

# CPU per unit of work at the reference speed probe (COST_REFERENCE_PROBE_MS), ms of one core:
# - shards: a robot-tick's loop, engine calls and records (SHARD_TICK_MS), a request's encode, send, wait and merge
#   in the engine's worker and Zenoh's threads (SHARD_REQUEST_MS), and the robot's physics: substeps a tick
#   (bench.robots.models.substeps_for, 1 for the reacher at 30 Hz, 100 at 1 Hz) x its type's step (PHYSICS_STEP_US)
#   + PHYSICS_TICK_US. Fitted on the 2-core VM (docs/results/2026-11-26-shard-cost-refit.md) from the shards' threads
#   (summary cpu.shard_threads) of three unsaturated runs: 100 robots at 30 Hz, 150 at 10 Hz, 60 at 30 Hz in one
#   shard; physics from benchmarks.robot_step at 1 and 30 Hz (docs/bench.md "Sizing the bench to the host").
# - replicas: a forward pass, timed on this host from the checkpoint the replica serves at batch 1 and at its
#   max_batch (bench.run.forwardcost; REPLICA_FORWARD_MS, the reacher MLP's pass with its RTC guidance at small
#   batches, where it cannot be timed), plus what a pass costs the replica around the policy
#   (REPLICA_PASS_MS: scheduling, stacking, the dispatch thread), and a request's decode, validation and reply
#   (REPLICA_REQUEST_MS); a replica's forward passes a second follow from its request rate and its batch window
#   (`batch_size`).
# - proxy and router: per answered request, from four fault-free runs of the headline's shape (docs/results/2026-11-26-proxy-costs.md,
#   473-498 requests/s, the proxy SCHED_FIFO: bench.run.mesh.proxy_priority): proxy 0.335-0.349 ms, router
#   0.213-0.241 (at normal priority the proxy read 0.27-0.28: it now wakes for each chunk instead of catching several
#   a wake-up). Small fleets cost more a request (keep-alives and
#   sessions a robot, unmodelled).
SHARD_TICK_MS = 0.035
# 0.8 as fitted with a thread per engine; the shared worker pool (edge.remote.drive, fleet.engine_workers: pool)
# takes a request's engine and Zenoh CPU to 0.78x of that, side by side in one session (headline without faults,
# medians of two runs each: 1.64 against 2.09 ms; docs/results/2026-12-03-engine-worker-pool.md)
SHARD_REQUEST_MS = 0.62
PHYSICS_STEP_US = {"reacher": 9.6, "arm": 3.6, "base": 4.0}
PHYSICS_STEP_US_DEFAULT = 10.0  # a robot type not measured yet: the dearest measured step, rounded up
PHYSICS_TICK_US = 5.0
# The policy's own pass where it cannot be timed: runs A and D fitted 4.8 ms a pass all-in, before REPLICA_PASS_MS was
# priced apart, so 4.8 less it (the reacher's timed pass: 2.3 at batch 1, ~2.7 at the few a pass its replicas batch)
REPLICA_FORWARD_MS = 2.8
REPLICA_PASS_MS = (
    2.0  # least squares over 12 runs (docs/results/2026-11-26-cost-model-fit-runs.md), their own passes, 0.76 a request
)
REPLICA_REQUEST_MS = 0.76
COST_PER_REQUEST_MS = {"proxy": 0.34, "router": 0.23}
# The shard budget's reference robot is the headline's (its 300 robots, 100 a shard, are what the budget was measured
# on): at `requests_per_robot_s` its eu and us robots (buffer_time_s 0.3) ask every 20 ticks and its ap ones (0.4)
# every 15, so the mean robot asks 5/3 a second.
BUDGET_REQUESTS_PER_ROBOT_S = (30.0 / 20 + 30.0 / 20 + 30.0 / 15) / 3
REAL_TIME_SHARE = 0.85  # above this share of the cores the headline's host-late ticks rose past 1 %
SERVER_BATCH_WINDOW_MS = 2.0  # server.manifest's default scheduling.batch_window_ms
# A shard's control loop shares its process's GIL with every engine thread of that shard: it carries at most the
# work of 100 reacher robots at 30 Hz (at 150 its loop waited for the GIL in 6-10 % of its slots, at 100 in 1-3 %),
# and a quarter of that where the host has cores to spare (25 robots at 30 Hz: 300 robots on 16 cores read 4.1 %
# host-late ticks in 3 shards, 0.33 % in 12).
SHARD_BUDGET_ROBOTS, SPARE_SHARD_ROBOTS = 100, 25


def robot_ticks_per_s(scenario) -> float:
    return float(sum(g.count * g.fps for g in scenario.groups))


def requests_per_s(scenario) -> float:
    """Requests the fleet sends a second (every remote group's robots at `requests_per_robot_s`)."""
    return sum(g.count * r for g, r in zip(scenario.groups, group_request_rates(scenario)))


def group_request_rates(scenario) -> list[float]:
    """Requests one robot of each group sends a second, in `scenario.groups` order: its engine against the chunk
    of the checkpoint its model's replicas serve, over its site's round trip; a `local` group sends none."""
    from chaos.profiles import expected_rtt_ms

    rates = []
    for g in scenario.groups:
        if getattr(g, "engine_kind", "remote") == "local":
            rates.append(0.0)
            continue
        site = (getattr(scenario, "sites", None) or {}).get(g.site) if hasattr(g, "site") else None
        try:
            network_ms = expected_rtt_ms(site.profile, site.overrides) if site is not None else 0.0
        except (ValueError, AttributeError):
            network_ms = 0.0
        served = _serving(scenario, g)
        manifest = replica_manifest(scenario, served[0]) if served else {}
        window = float((manifest.get("scheduling") or {}).get("batch_window_ms", SERVER_BATCH_WINDOW_MS))
        emulated = _emulated_ms(manifest.get("emulated_latency"))
        rates.append(
            requests_per_robot_s(
                g.fps,
                getattr(g, "episode_s", None) or math.inf,
                _chunk_size(served[0]) if served else None,
                getattr(g, "engine", {}) or {},
                (network_ms + window + emulated) / 1e3,
            )
        )
    return rates


def requests_per_robot_s(fps: float, episode_s: float, chunk_size: int | None, engine: dict, rtt_s: float) -> float:
    """Requests a second one robot's remote engine sends (edge.remote), walked through one episode in ticks:

    - an episode's first tick asks (the engine's reset cleared the queue); its chunk lands d = ceil(rtt / dt) ticks
      later, untrimmed under `trim: consumed` (nothing was executed meanwhile), by d rows under `real_delay`;
    - a chunk whose row 0 is tick T (every later one: trimmed by what was consumed) brings the queue to the buffer,
      less the tick's own action (edge.remote.plan.is_due), on tick T + ceil(H - 1 - buffer_steps), where H is the
      chunk and the buffer `plan_execution`'s (`buffer_time_s`, or derived from d); in append mode
      (`rtc_enabled: false`) every chunk adds H rows, so the queue falls to the buffer every H ticks;
    - unless its rows go stale first: ticks past `max_action_age_s` from its observation are dropped whole, and the
      empty queue asks on the next tick; one request in flight at a time, so never sooner than d ticks.
    A 1 Hz reacher with 2 s episodes asks once an episode (0.5 a second); a 10 Hz one with max_action_age_s 1.5 twice
    (its 30-row chunk stale after 15 ticks); a 30 Hz one with buffer_time_s 0.3 every 20 ticks (runs: docs/bench.md).
    `chunk_size` None: the engine's own assumption before a session, 1 s of rows."""
    import dataclasses

    from edge.remote import RemoteEngineConfig, plan_execution

    cfg = {f.name: f.default for f in dataclasses.fields(RemoteEngineConfig) if f.default is not dataclasses.MISSING}
    cfg.update(engine)
    dt = 1.0 / fps
    big_h = max(1, int(chunk_size or round(fps)))
    d = max(1, math.ceil(rtt_s * fps - 1e-9))
    rtc = bool(cfg["rtc_enabled"])
    plan = plan_execution(d, big_h, dt, cfg["buffer_time_s"], rtc)
    to_buffer = max(1, math.ceil(big_h - 1 - plan.buffer_s / dt - 1e-9))
    stale = math.ceil(float(cfg["max_action_age_s"]) * fps - 1e-9) + 1  # the tick after its rows go stale
    first_trim = d if rtc and cfg["trim"] == "real_delay" else 0
    first = max(d, min(d + to_buffer - first_trim, stale))
    every = max(d, min(to_buffer if rtc else big_h, stale))
    episode = max(1, round(episode_s * fps)) if math.isfinite(episode_s) else None
    if episode is None:
        return fps / every
    asks = 1 + (0 if first >= episode else 1 + (episode - 1 - first) // every)
    return asks * fps / episode


def _serving(scenario, group) -> list:
    """The replicas that serve the group's model (all of them where the scenario does not say)."""
    replicas = list(getattr(scenario, "replicas", None) or [])
    model = getattr(group, "model_id", None)
    return [r for r in replicas if getattr(r, "model_id", model) == model] or replicas


def _chunk_size(replica) -> int | None:
    from bench.scenario.load import checkpoint_config

    try:
        return int(checkpoint_config(replica.checkpoint)["chunk_size"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _emulated_ms(value) -> float:
    """The mean of a manifest's `emulated_latency` (ms, or a mapping with mean_ms); 0 without one."""
    if value is None:
        return 0.0
    if isinstance(value, (int, float)):
        return float(value)
    return float((value.get("mean_ms") if isinstance(value, dict) else getattr(value, "mean_ms", 0.0)) or 0.0)


def physics_ms_per_tick(robot: str, fps: float) -> float:
    """CPU (ms, reference speed) one robot's physics takes a control tick: its substeps at `fps`, each at its
    type's measured step cost, plus the batch's per-robot Python."""
    from bench.robots.core import robot_type
    from bench.robots.models import substeps_for

    try:
        cls = robot_type(robot)
        # a gym env's tick, timed on this host when its scenario loaded (bench.robots.gymenv): taken as the
        # reference speed's, so a gym group's shard count may differ between hosts and loads
        measured = getattr(cls, "tick_us", None)
        if measured is not None:
            return measured / 1e3
        n, _ = substeps_for(fps, cls.nominal_physics_dt, getattr(cls, "max_physics_dt", None))
    except (ValueError, AttributeError):
        n = 1
    return (n * PHYSICS_STEP_US.get(robot, PHYSICS_STEP_US_DEFAULT) + PHYSICS_TICK_US) / 1e3


def shard_ms_per_s(group, requests_per_robot: float) -> float:
    """CPU (ms a second, reference speed) a group costs the shards: its ticks, requests and physics."""
    ticks = group.count * group.fps
    return (
        ticks * (SHARD_TICK_MS + physics_ms_per_tick(group.robot, group.fps))
        + group.count * requests_per_robot * SHARD_REQUEST_MS
    )


def shards_ms_per_s(scenario) -> float:
    """CPU (ms a second, reference speed) the whole fleet costs the shards."""
    return sum(shard_ms_per_s(g, r) for g, r in zip(scenario.groups, group_request_rates(scenario)))


def shard_budget_ms(robots: int = SHARD_BUDGET_ROBOTS) -> float:
    """What one shard carries (ms of CPU a second): the work of `robots` reacher robots at 30 Hz."""
    return shard_ms_per_s(SimpleNamespace(count=robots, fps=30.0, robot="reacher"), BUDGET_REQUESTS_PER_ROBOT_S)


def shard_count(scenario, cores: int | None = None) -> int:
    """`fleet.shards` as this host will run it: enough shards that none carries more than SHARD_BUDGET_ROBOTS
    reacher-at-30-Hz robots' work (physics and requests included: a 1 Hz reacher's 100 substeps a tick cost more
    than its tick), and smaller ones where the host has cores to spare."""
    if scenario.shards != "auto":
        return int(scenario.shards)
    cores = cores or os.cpu_count() or 1
    load = shards_ms_per_s(scenario)
    needed = max(1, math.ceil(load / shard_budget_ms() - 1e-9))
    spare = cores - 2 - len(scenario.replicas)  # router and proxy, a core each under load; one per replica
    wanted = max(1, math.ceil(load / shard_budget_ms(SPARE_SHARD_ROBOTS) - 1e-9))
    return max(needed, min(spare, wanted, scenario.robots))


PROXY_BUSY_SHARE = 0.25  # keep each chaos proxy process's event loop below this share of a core


# The other processes' estimated cores (at the reference speed) times this, when a local run counts the cores its
# proxies may spread over: on the H200 machine's 16 cores the 1,000-robot run's shards, replicas and router took
# 6.1 cores against 5.1 estimated (1.2x), and its speed probe read 1.1-2.2x the reference during the run
PROXY_SPARE_MARGIN = 1.5


PROXY_PROCESSES_ENV = "BENCH_PROXY_PROCESSES"  # a count that overrides the rule (a host it misjudges; tests)


def forced_proxy_processes() -> int | None:
    """The count PROXY_PROCESSES_ENV asks for, None where unset; ValueError (naming it) for anything but a whole
    number (bench run's preflight says so, exit 2)."""
    forced = os.environ.get(PROXY_PROCESSES_ENV, "").strip()
    if not forced:
        return None
    if not forced.isdigit():
        raise ValueError(
            f"{PROXY_PROCESSES_ENV}={forced!r}: expected a whole number of chaos proxy processes "
            "(unset it for the bench's own sizing)"
        )
    return int(forced)


def proxy_processes(scenario, cores: int | None = None) -> int:
    """Chaos proxy processes for the run's sites on this host (`proxy_processes_for`): as many as the cores left
    beyond one for the runner and the host and the estimated work of the shards, replicas and router (with
    PROXY_SPARE_MARGIN) allow. (A whole core per shard and replica left the 1,000-robot run on 16 cores one proxy loop, its downlink
    late at p99: docs/results/2026-11-27-1000-robots-16-cores.md.)"""
    forced = forced_proxy_processes()
    if forced is not None:
        return max(1, min(len(scenario.sites), forced))
    cores = cores or os.cpu_count() or 1
    requests = requests_per_s(scenario)
    others_ms = (
        shards_ms_per_s(scenario)
        + replica_ms_per_s(scenario, forward_costs(scenario, measure=False))
        + requests * COST_PER_REQUEST_MS["router"]
    )
    spare = cores - 1 - PROXY_SPARE_MARGIN * others_ms / 1e3
    return proxy_processes_for(requests, len(scenario.sites), spare)


def node_proxy_processes(requests: float, sites: int, node_cpus: float, reserved_cpus: float) -> int:
    """Chaos proxy processes for one cluster node's copy of the sites (`cluster.routers: per_node`): sized by the
    `requests` a second of the robots its shards carry, within the node's CPUs (Ray's resources) beyond its
    router and what Ray reserved there for the run's shards and replicas."""
    return proxy_processes_for(requests, sites, node_cpus - 1 - reserved_cpus)


def proxy_processes_for(requests: float, sites: int, spare_cores: float) -> int:
    """The proxy sizing rule: one event loop carries its sites' chunks, and the delay it applies is late by
    however long the loop waits, so a loop past ~25 % busy (queueing delay grows with load: ~0.34 ms of proxy CPU
    per answered request, docs/bench.md) gets help, one site per process at most, and one process per spare
    core at most; always at least one."""
    busy = requests * COST_PER_REQUEST_MS["proxy"] / 1e3
    wanted = max(1, math.ceil(busy / PROXY_BUSY_SHARE))
    return max(1, min(sites, wanted, math.floor(spare_cores + 1e-9)))


def batch_size(requests: float, window_ms: float, max_batch: int, busy_ms: float = 0.0) -> float:
    """Requests a replica's forward pass holds at `requests` a second: a batch opens on its first request and
    closes after the window (or full), ~1 + requests x window; a pass that keeps the dispatch thread `busy_ms`
    (its own time, or an emulated accelerator's) lets the next batch's requests queue meanwhile,
    ~requests x (window + busy)."""
    if requests <= 0:
        return 1.0
    return min(max(1, max_batch), max(1.0 + requests * window_ms / 1e3, requests * (window_ms + busy_ms) / 1e3))


def forward_costs(scenario, measure: bool = True) -> dict:
    """Each replica's ForwardCost (bench.run.forwardcost) by replica id: its checkpoint timed on this host (once per
    checkpoint and host, then cached), or REPLICA_FORWARD_MS with the reason."""
    from bench.run.forwardcost import constant, forward_cost

    out = {}
    for r in getattr(scenario, "replicas", None) or []:
        if not getattr(r, "checkpoint", None):
            out[r.id] = constant(REPLICA_FORWARD_MS, "no checkpoint")
            continue
        out[r.id] = forward_cost(replica_manifest(scenario, r), REPLICA_FORWARD_MS, measure=measure)
    return out


def replica_ms_per_s(scenario, forward: dict | None = None) -> float:
    """CPU (ms a second, reference speed) of every replica together: each group's requests dealt evenly over the
    replicas that serve its model, each replica's forward passes at its own checkpoint's cost (`forward`: replica
    id -> ForwardCost; REPLICA_FORWARD_MS for a replica it lacks)."""
    from bench.run.forwardcost import constant

    forward = forward or {}
    replicas = list(getattr(scenario, "replicas", None) or [])
    load = {id(r): 0.0 for r in replicas}
    for g, rate in zip(scenario.groups, group_request_rates(scenario)):
        served = _serving(scenario, g)
        for r in served:
            load[id(r)] += g.count * rate / len(served)
    total = 0.0
    for r in replicas:
        per = load[id(r)]
        manifest = replica_manifest(scenario, r)
        sched = manifest.get("scheduling") or {}
        window = float(sched.get("batch_window_ms", SERVER_BATCH_WINDOW_MS))
        cost = forward.get(getattr(r, "id", None)) or constant(REPLICA_FORWARD_MS, "not given")
        emulated = _emulated_ms(manifest.get("emulated_latency"))
        batch = 1.0
        for _ in range(8):  # a pass holds the dispatch thread for its own time, which grows with its batch
            batch = batch_size(per, window, int(sched.get("max_batch", 1)), max(emulated, cost.ms(batch)))
        if per > 0:
            total += per / batch * (cost.ms(batch) + REPLICA_PASS_MS) + per * REPLICA_REQUEST_MS
    return total


@dataclass
class Estimate:
    shards: int
    cores: int
    probe_ms: float
    cores_needed: float
    real_time: bool
    split: dict
    requests_per_s: float = 0.0
    forward: dict = field(default_factory=dict)  # replica id -> ForwardCost

    def lines(self) -> list[str]:
        split = ", ".join(f"{k} {v:.2f}" for k, v in self.split.items())
        verdict = (
            "fits in real time here"
            if self.real_time
            else f"will NOT run in real time here: needs ~{math.ceil(self.cores_needed / REAL_TIME_SHARE)} cores "
            f"(at this host's speed), has {self.cores}; expect host-late ticks and an inconclusive verdict"
        )
        lines = [
            f"preflight: {self.shards} shard(s); speed probe {self.probe_ms:.1f} ms (reference "
            f"{COST_REFERENCE_PROBE_MS} ms); {self.requests_per_s:.0f} requests/s; estimated CPU "
            f"{self.cores_needed:.2f} of {self.cores} cores ({split}): {verdict}"
        ]
        if self.forward:
            lines.append(
                "preflight: a forward pass, ms of CPU at the reference probe: "
                + "; ".join(
                    f"{rid} {c.at_1:.2f} at batch 1, {c.at_max:.2f} at {c.max_batch} ({c.source})"
                    if c.max_batch > 1
                    else f"{rid} {c.at_1:.2f} ({c.source})"
                    for rid, c in self.forward.items()
                )
            )
        return lines

    def to_json(self) -> dict:
        """What summary.json keeps beside the measured split (cores of this host, by process kind)."""
        return {
            "cores_needed": round(self.cores_needed, 3),
            "probe_ms": round(self.probe_ms, 1),
            "split": {k: round(v, 3) for k, v in self.split.items()},
            "requests_per_s": round(self.requests_per_s, 1),
            "forward_cpu_ms": {
                rid: {"at_1": c.at_1, "at_max": c.at_max, "max_batch": c.max_batch, "source": c.source}
                for rid, c in self.forward.items()
            },
        }


def estimate(
    scenario, cores: int | None = None, probe_ms: float | None = None, forward: dict | None = None
) -> Estimate:
    """Cores the scenario needs on this host: the fleet's ticks, requests and physics and the replicas' forward
    passes times their measured costs, scaled by a speed probe timed in CPU time (a busy host reads as busy,
    not as slow). `forward`: replica id -> ForwardCost, else `forward_costs` (cached per checkpoint and host;
    a checkpoint not timed here yet costs a few seconds once). Takes ~0.1-0.5 s."""
    cores = cores or os.cpu_count() or 1
    if forward is None:
        forward = forward_costs(scenario)
    if probe_ms is None:
        from bench.run.usage import speed_probe_cpu_ms

        probe_ms = min(speed_probe_cpu_ms(0.5) for _ in range(3))
    scale = probe_ms / COST_REFERENCE_PROBE_MS
    requests = requests_per_s(scenario)
    split = {
        "shards": shards_ms_per_s(scenario),
        "replicas": replica_ms_per_s(scenario, forward),
        **{k: requests * ms for k, ms in COST_PER_REQUEST_MS.items()},
    }
    split = {k: v / 1e3 * scale for k, v in split.items()}
    need = sum(split.values())
    return Estimate(
        shard_count(scenario, cores), cores, probe_ms, need, need <= REAL_TIME_SHARE * cores, split, requests, forward
    )


def measured_by_kind(split: dict) -> dict:
    """A run's measured CPU split (% of one core per process: usage's names) as cores by the estimate's kinds."""
    out = {"shards": 0.0, "replicas": 0.0, "proxy": 0.0, "router": 0.0}
    for name, pct in split.items():
        kind = (
            "proxy"
            if name.startswith("chaos-proxy")
            else {"shard": "shards", "server": "replicas", "router": "router"}.get(name.split(":", 1)[0])
        )
        if kind:
            out[kind] += pct / 100.0
    return {k: round(v, 3) for k, v in out.items()}


# The report phase (bench.run.collect.collect, bench.evidence.figures) holds every record of the run at once.
# Least squares over 109 run directories on the 2-core VM (docs/results/2026-11-26-report-memory.md), up to the 30-minute soak's 2.84 M tick rows
# and 187 k requests (peak 1.82 GB): the runner's peak RSS grows 310 B a robot-tick (warm-up included) and 4.5 KB a
# request (the edge's record, the server's audit row, their joins), on top of ~120-195 MB it holds already; the runs
# above 400 k ticks read 0.93-1.16 of it. Since, the audit rows are Arrow columns, not a dict each
# (bench.evidence.audit): replaying two of those runs' whole report phase with and without that change, its peak fell
# 2.7 KB a request (the soak: 1.91 -> 1.42 GB) and 2.4 KB (a 120 s headline: 0.71 -> 0.57 GB); 2.6 KB in the
# synthetic benchmark (3.65 -> 1.01 KB a request). So 4.5 KB less the smallest of those savings, rounded up; not yet
# re-fitted over new runs. `python -m benchmarks.report_memory --baseline <checkout before it> [--replay RUN_DIR]`
# reproduces it (docs/bench.md "Memory for the report").
# The ticks, since: figures mask a tick column when they read it instead of copying all 16 per scope, the seam inputs
# come from the sorted numpy columns (no filtered Arrow copy), Arrow's pool hands freed pages back before figures
# allocate. Replaying the same two runs' whole report phase with and without that change (3 processes each, medians),
# the peak over the RSS before fell 576 -> 356 MB (the headline, 1.21 M ticks, 64 k requests) and 1412 -> 825 MB (the
# soak, 2.84 M ticks, 187 k requests); less 2.1 KB a request, that leaves 197 and 166 B a robot-tick. The synthetic
# `--ticks 300000 1200000` slope fell 0.57x (493 -> 282 B; it reads heavier than real runs in both trees), and 310 B x
# 0.57 = 177 B. So the largest of those, rounded up: 200 B; not re-fitted over new runs either. The peak was then the
# sort of the tick table (its unsorted and sorted Arrow copies at once).
# Since, the robot-keyed records are sorted a robot range at a time into buffers allocated once
# (bench.fleet.records.collect_sorted): `--ticks 300000 1200000` 282 -> 175 B a robot-tick (0.62x); `--replay` the
# soak 825 -> 683 MB (52 B a robot-tick saved) and a 60 s headline (300_robots_wan, 675 k ticks,
# 37 k requests) 214 -> 186 MB (44 B; its processes read 179-186 MB) (the 2-core VM, load 1.3-9.0, 3 processes each,
# medians). Less 2.1 KB a request, 173 B (the headline) and 114 B (the soak) a
# robot-tick are left, and 310 x 175/493 = 110 B: the largest, rounded up, 180 B.
# `python -m benchmarks.report_memory --ticks 300000 1200000 --baseline <checkout before it>` and `--replay RUN_DIR`.
REPORT_BYTES_PER_TICK = 180
REPORT_BYTES_PER_REQUEST = 2100
REPORT_BASE_MB = 200
REPORT_MEMORY_SHARE = 0.9  # of the memory available before the run: more, and the report would swap or be killed


@dataclass
class ReportMemory:
    needed_mb: float
    available_mb: float | None  # None: unknown (psutil missing)

    @property
    def fits(self) -> bool:
        return self.available_mb is None or self.needed_mb <= REPORT_MEMORY_SHARE * self.available_mb

    def line(self, scenario) -> str:
        have = f" of {self.available_mb / 1024:.1f} GB available" if self.available_mb is not None else ""
        if self.fits:
            return f"preflight: the report phase will hold ~{self.needed_mb / 1024:.1f} GB{have}"
        per_s = max(self.needed_mb - REPORT_BASE_MB, 1.0) / max(scenario.duration_s + scenario.warmup_s, 1e-9)
        # named rounded down, so the duration named fits
        longest = max((REPORT_MEMORY_SHARE * self.available_mb - REPORT_BASE_MB) / per_s - scenario.warmup_s, 0.0)
        return (
            f"the report of this run would hold ~{self.needed_mb / 1024:.1f} GB at once (every robot-tick and "
            f"request of the run: {REPORT_BYTES_PER_TICK} B a robot-tick, {REPORT_BYTES_PER_REQUEST / 1000:g} KB a "
            f"request), and this host has {self.available_mb / 1024:.1f} GB available: it would be killed or swap "
            f"after the run. Shorten duration_s to {math.floor(longest)} s or less, run fewer robots, or run on a host "
            f"with more memory"
        )


def report_memory(scenario, available_mb: float | None = None) -> ReportMemory:
    """What the run's report phase will hold at once, against the memory available now (before any process)."""
    seconds = scenario.duration_s + scenario.warmup_s
    ticks = sum(g.count * g.fps for g in scenario.groups) * seconds
    need = (
        REPORT_BASE_MB
        + (ticks * REPORT_BYTES_PER_TICK + requests_per_s(scenario) * seconds * REPORT_BYTES_PER_REQUEST) / 2**20
        + recorded_mb(scenario, seconds)
    )
    if available_mb is None:
        try:
            import psutil

            available_mb = psutil.virtual_memory().available / 2**20
        except Exception:  # noqa: BLE001 - unknown: the check says nothing rather than refuse
            available_mb = None
    return ReportMemory(need, available_mb)


def recorded_mb(scenario, seconds: float) -> float:
    """What `record.dataset` adds to the report phase (bench.run.dataset): each tick's state and command, and each
    camera frame raw, held twice (the collected table, then the parquet file read back to convert); 0 when off."""
    record = getattr(scenario, "record", None) or {}
    if not record.get("dataset"):
        return 0.0
    from bench.robots import robot_type

    total = 0.0
    for g in scenario.groups:
        cls = robot_type(g.robot)
        per_tick = 64 + 4 * (len(cls.state_names) + len(cls.action_names))
        if record.get("cameras", True) and g.cameras is not None:
            per_tick += 3 * g.cameras.height * g.cameras.width * len(g.cameras.names)
        total += 2 * per_tick * g.count * g.fps * seconds
    return total / 2**20


def router_clients(scenario) -> int:
    """Zenoh sessions a run's router must hold at once: every robot and attacker, every replica, and a margin for
    the bench's own (its monitor, a cluster's node routers and actors)."""
    robots = sum(int(g.count) for g in getattr(scenario, "groups", None) or [])
    return (
        robots + len(getattr(scenario, "attackers", None) or []) + len(getattr(scenario, "replicas", None) or []) + 16
    )


def router_max_sessions(scenario) -> int:
    """The router's `--max-sessions` for a scenario: twice its clients (a reconnecting robot or a restarted
    replica opens its new session before the router's lease ends the old one, and a partition's end sends a
    whole site back at once), never below wire.transport.ROUTER_MAX_SESSIONS. Zenoh refuses a session beyond it
    as if no router listened."""
    from wire.transport import ROUTER_MAX_SESSIONS

    return max(ROUTER_MAX_SESSIONS, 2 * router_clients(scenario))


def open_files_needed(scenario) -> int:
    """Open files the busiest process of a local run holds: the chaos proxy, two sockets for each robot's
    connection (its side and the router's), plus its own. bench.run.runner.run_scenario compares it with the hard
    limit (`ulimit -Hn`): the router and the proxy raise their soft limit to it (wire.procs.raise_fd_limit)."""
    return 2 * router_clients(scenario) + 256


def open_files_problem(scenario) -> str | None:
    """Why this host cannot hold a local run's sockets (`open_files_needed` above its hard limit), or None."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = open_files_needed(scenario)
    if hard == resource.RLIM_INFINITY or hard >= need:
        return None
    return (
        f"host: scenario '{scenario.name}' needs about {need} open files in its chaos proxy ({router_clients(scenario)} "
        f"Zenoh clients, two sockets each), but this host allows {hard} (ulimit -Hn): raise the hard limit "
        f"(e.g. `ulimit -Hn {need}` as root, or nofile in /etc/security/limits.conf), or spread the fleet over "
        f"hosts with --cluster ray"
    )
