"""How big a bench this host needs for a scenario: `fleet.shards: auto` and the preflight estimate.

Owns the shard rule and the real-time estimate printed by `bench run --check` and before every run.
Invariant: an explicit `fleet.shards` integer is never changed; `auto` always resolves to >= 1, and
to the same count for the same scenario on a host with the same core count.

The rule (evidence in docs/bench.md "Sizing the bench to the host"): a shard's control loop shares its
process's GIL with every engine thread of that shard, so a shard carries at most the CPU work of 100 reacher
robots at 30 Hz (its ticks, requests and physics: `shard_ms_per_s`), and a quarter of that on a host with cores
to spare. The same costs give the preflight estimate, which summary.json keeps beside the measured split.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from types import SimpleNamespace

# CPU per unit of work at the reference speed probe (COST_REFERENCE_PROBE_MS), ms of one core:
# - shards: a robot-tick's loop, engine and records (SHARD_TICK_MS), a request's encode, send and merge
#   (SHARD_REQUEST_MS), and the robot's physics: substeps a tick (bench.robots.models.substeps_for, 1 for the
#   reacher at 30 Hz, 100 at 1 Hz) x its type's step (PHYSICS_STEP_US) + PHYSICS_TICK_US. Fitted on the 2-core VM,
#   2026-11-26: 100 robots at 30 Hz and 300 at 10 Hz (both 3,000 robot-ticks/s, 4 shards, 8 replicas), physics from
#   benchmarks.robot_step at 1 and 30 Hz (docs/bench.md "Sizing the bench to the host").
# - replicas: a forward pass (REPLICA_FORWARD_MS, the reacher MLP with its RTC guidance at small batches) and a
#   request's decode, validation and reply (REPLICA_REQUEST_MS); a replica's forward passes a second follow from
#   its request rate and its batch window (`forwards_per_s`).
# - proxy and router: per answered request (the headline, 2026-11-23 09:35 run, 382 requests/s).
SHARD_TICK_MS = 0.050
SHARD_REQUEST_MS = 1.2
PHYSICS_STEP_US = {"reacher": 9.6, "arm": 3.6, "base": 4.0}
PHYSICS_STEP_US_DEFAULT = 10.0  # a robot type not measured yet: the dearest measured step, rounded up
PHYSICS_TICK_US = 5.0
REPLICA_FORWARD_MS = 4.8
REPLICA_REQUEST_MS = 0.76
COST_PER_REQUEST_MS = {"proxy": 0.3, "router": 0.3}
COST_REFERENCE_PROBE_MS = 29.6
# Requests a robot sends a second: the reacher checkpoints' chunks hold 1 s of actions (30 rows at 30 Hz); with
# buffer_time_s 0.3-0.4 a robot asked every 23.6 ticks at 30 Hz (the headline, 9000 robot-ticks/s : 382 requests/s),
# and at a low rate not more than every other tick (a request waits for a tick's observation and its chunk for the
# next tick: a 1 Hz robot sent 0.5 a second, measured).
REQUESTS_PER_ROBOT_S = 30.0 / 23.6
TICKS_PER_REQUEST_MIN = 2.0
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
    """Requests the fleet sends a second (every group's robots, at most one every other tick)."""
    return robots_requests_per_s((g.count, g.fps) for g in scenario.groups)


def robots_requests_per_s(robots) -> float:
    """Requests a second of `robots`, (count, fps) pairs: a group, or its robots on one node."""
    return float(sum(count * _requests_per_robot_s(fps) for count, fps in robots))


def _requests_per_robot_s(fps: float) -> float:
    return min(fps / TICKS_PER_REQUEST_MIN, REQUESTS_PER_ROBOT_S)


def physics_ms_per_tick(robot: str, fps: float) -> float:
    """CPU (ms, reference speed) one robot's physics takes a control tick: its substeps at `fps`, each at its
    type's measured step cost, plus the batch's per-robot Python."""
    from bench.robots.core import robot_type
    from bench.robots.models import substeps_for

    try:
        cls = robot_type(robot)
        n, _ = substeps_for(fps, cls.nominal_physics_dt, getattr(cls, "max_physics_dt", None))
    except (ValueError, AttributeError):
        n = 1
    return (n * PHYSICS_STEP_US.get(robot, PHYSICS_STEP_US_DEFAULT) + PHYSICS_TICK_US) / 1e3


def shard_ms_per_s(group) -> float:
    """CPU (ms a second, reference speed) a group costs the shards: its ticks, requests and physics."""
    ticks = group.count * group.fps
    return (ticks * (SHARD_TICK_MS + physics_ms_per_tick(group.robot, group.fps))
            + group.count * _requests_per_robot_s(group.fps) * SHARD_REQUEST_MS)


def shard_budget_ms(robots: int = SHARD_BUDGET_ROBOTS) -> float:
    """What one shard carries (ms of CPU a second): the work of `robots` reacher robots at 30 Hz."""
    return shard_ms_per_s(SimpleNamespace(count=robots, fps=30.0, robot="reacher"))


def shard_count(scenario, cores: int | None = None) -> int:
    """`fleet.shards` as this host will run it: enough shards that none carries more than SHARD_BUDGET_ROBOTS
    reacher-at-30-Hz robots' work (physics and requests included: a 1 Hz reacher's 100 substeps a tick cost more
    than its tick), and smaller ones where the host has cores to spare."""
    if scenario.shards != "auto":
        return int(scenario.shards)
    cores = cores or os.cpu_count() or 1
    load = sum(shard_ms_per_s(g) for g in scenario.groups)
    needed = max(1, math.ceil(load / shard_budget_ms() - 1e-9))
    spare = cores - 2 - len(scenario.replicas)  # router and proxy, a core each under load; one per replica
    wanted = max(1, math.ceil(load / shard_budget_ms(SPARE_SHARD_ROBOTS) - 1e-9))
    return max(needed, min(spare, wanted, scenario.robots))


PROXY_BUSY_SHARE = 0.25  # keep each chaos proxy process's event loop below this share of a core


def proxy_processes(scenario, cores: int | None = None) -> int:
    """Chaos proxy processes for the run's sites on this host (`proxy_processes_for`): only while the host
    has a core for each beyond the router, the replicas and the fewest shards that carry the fleet."""
    cores = cores or os.cpu_count() or 1
    # (shard_count's spare-core shards are smaller for comfort; a proxy that applies delay late corrupts every leg)
    fewest = max(1, math.ceil(sum(shard_ms_per_s(g) for g in scenario.groups) / shard_budget_ms() - 1e-9))
    spare = cores - 1 - fewest - len(scenario.replicas)
    return proxy_processes_for(requests_per_s(scenario), len(scenario.sites), spare)


def node_proxy_processes(robots, sites: int, node_cpus: float, reserved_cpus: float) -> int:
    """Chaos proxy processes for one cluster node's copy of the sites (`cluster.routers: per_node`): sized by the
    requests of the robots its shards carry (`robots`: (count, fps) pairs), within the node's CPUs (Ray's
    resources) beyond its router and what Ray reserved there for the run's shards and replicas."""
    return proxy_processes_for(robots_requests_per_s(robots), sites, node_cpus - 1 - reserved_cpus)


def proxy_processes_for(requests: float, sites: int, spare_cores: float) -> int:
    """The proxy sizing rule: one event loop carries its sites' chunks, and the delay it applies is late by
    however long the loop waits, so a loop past ~25 % busy (queueing delay grows with load: ~0.3 ms of proxy CPU
    per answered request, docs/bench.md) gets help, one site per process at most, and one process per spare
    core at most; always at least one."""
    busy = requests * COST_PER_REQUEST_MS["proxy"] / 1e3
    wanted = max(1, math.ceil(busy / PROXY_BUSY_SHARE))
    return max(1, min(sites, wanted, math.floor(spare_cores + 1e-9)))


def forwards_per_s(requests: float, window_ms: float, max_batch: int) -> float:
    """Forward passes a replica runs a second for `requests` a second: a batch opens on its first request and
    closes after the window (or full), so it holds ~1 + requests x window of them."""
    if requests <= 0:
        return 0.0
    return requests / min(max(1, max_batch), 1.0 + requests * window_ms / 1e3)


def replica_ms_per_s(scenario) -> float:
    """CPU (ms a second, reference speed) of every replica together, the fleet's requests dealt evenly."""
    n = max(1, len(scenario.replicas))
    per = requests_per_s(scenario) / n
    total = 0.0
    for r in scenario.replicas or [None]:
        manifest = {**scenario.server_manifest, **(dict(r.manifest) if r is not None else {})}
        sched = manifest.get("scheduling") or {}
        window = float(sched.get("batch_window_ms", SERVER_BATCH_WINDOW_MS))
        fwd = forwards_per_s(per, window, int(sched.get("max_batch", 1)))
        total += fwd * REPLICA_FORWARD_MS + per * REPLICA_REQUEST_MS
    return total


@dataclass
class Estimate:
    shards: int
    cores: int
    probe_ms: float
    cores_needed: float
    real_time: bool
    split: dict

    def lines(self) -> list[str]:
        split = ", ".join(f"{k} {v:.2f}" for k, v in self.split.items())
        verdict = ("fits in real time here" if self.real_time else
                   f"will NOT run in real time here: needs ~{math.ceil(self.cores_needed / REAL_TIME_SHARE)} cores "
                   f"(at this host's speed), has {self.cores}; expect host-late ticks and an inconclusive verdict")
        return [f"preflight: {self.shards} shard(s); speed probe {self.probe_ms:.1f} ms (reference "
                f"{COST_REFERENCE_PROBE_MS} ms); estimated CPU {self.cores_needed:.2f} of {self.cores} cores "
                f"({split}): {verdict}"]

    def to_json(self) -> dict:
        """What summary.json keeps beside the measured split (cores of this host, by process kind)."""
        return {"cores_needed": round(self.cores_needed, 3), "probe_ms": round(self.probe_ms, 1),
                "split": {k: round(v, 3) for k, v in self.split.items()}}


def estimate(scenario, cores: int | None = None, probe_ms: float | None = None) -> Estimate:
    """Cores the scenario needs on this host: the fleet's ticks, requests and physics and the replicas' forward
    passes times their measured costs, scaled by a speed probe timed in CPU time (a busy host reads as busy,
    not as slow). Takes ~0.1-0.5 s."""
    cores = cores or os.cpu_count() or 1
    if probe_ms is None:
        from bench.run.hostcpu import speed_probe_cpu_ms

        probe_ms = min(speed_probe_cpu_ms(0.5) for _ in range(3))
    scale = probe_ms / COST_REFERENCE_PROBE_MS
    requests = requests_per_s(scenario)
    split = {"shards": sum(shard_ms_per_s(g) for g in scenario.groups), "replicas": replica_ms_per_s(scenario),
             **{k: requests * ms for k, ms in COST_PER_REQUEST_MS.items()}}
    split = {k: v / 1e3 * scale for k, v in split.items()}
    need = sum(split.values())
    return Estimate(shard_count(scenario, cores), cores, probe_ms, need, need <= REAL_TIME_SHARE * cores, split)


def measured_by_kind(split: dict) -> dict:
    """A run's measured CPU split (% of one core per process: hostcpu's names) as cores by the estimate's kinds."""
    out = {"shards": 0.0, "replicas": 0.0, "proxy": 0.0, "router": 0.0}
    for name, pct in split.items():
        kind = ("proxy" if name.startswith("chaos-proxy") else
                {"shard": "shards", "server": "replicas", "router": "router"}.get(name.split(":", 1)[0]))
        if kind:
            out[kind] += pct / 100.0
    return {k: round(v, 3) for k, v in out.items()}
