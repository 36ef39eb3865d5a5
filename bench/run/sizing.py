"""How big a bench this host needs for a scenario: `fleet.shards: auto` and the preflight estimate.

Owns the shard rule and the real-time estimate printed by `bench run --check` and before every run.
Invariant: an explicit `fleet.shards` integer is never changed; `auto` always resolves to >= 1, and
to the same count for the same scenario on a host with the same core count.

The rule (evidence in docs/bench.md "Sizing the bench to the host"):
- a shard's control loop shares its process's GIL with every engine thread of that shard; at 100
  engines at 30 Hz (3000 robot-ticks a second) the loop waited for the GIL in 1-3 % of its slots,
  at 150 in 6-10 %: a shard carries at most `SHARD_TICK_BUDGET` robot-ticks a second;
- on a host with cores to spare (after router, proxy and replicas), more and smaller shards cut the
  GIL wait further: 300 robots on 16 cores read 4.1 % host-late in 3 shards, 0.33 % in 12; a shard
  is then given `SPARE_SHARD_TICKS` robot-ticks a second, within the spare cores.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

SHARD_TICK_BUDGET = 3000.0  # robot-ticks/s one shard carries (100 robots at 30 Hz)
SPARE_SHARD_TICKS = 750.0  # robot-ticks/s a shard gets when cores are free (25 robots at 30 Hz)

# CPU cost per answered request across the whole bench, ms of one core, measured on the 2-core VM at
# 382 requests/s (headline, 2026-11-23 09:35 run, in-run probe median 29.6 ms): shards 2.2 (with
# their loops), replicas 1.4, proxy 0.3, router 0.3. Scaled by this host's speed probe.
COST_PER_REQUEST_MS = {"shards": 2.2, "replicas": 1.4, "proxy": 0.3, "router": 0.3}
COST_REFERENCE_PROBE_MS = 29.6
TICKS_PER_REQUEST = 23.6  # 9000 robot-ticks/s : 382 requests/s in the same run (trim consumed, horizon 10)
REAL_TIME_SHARE = 0.85  # above this share of the cores the headline's host-late ticks rose past 1 %


def robot_ticks_per_s(scenario) -> float:
    return float(sum(g.count * g.fps for g in scenario.groups))


def shard_count(scenario, cores: int | None = None) -> int:
    """`fleet.shards` as this host will run it."""
    if scenario.shards != "auto":
        return int(scenario.shards)
    cores = cores or os.cpu_count() or 1
    load = robot_ticks_per_s(scenario)
    needed = max(1, math.ceil(load / SHARD_TICK_BUDGET))
    spare = cores - 2 - len(scenario.replicas)  # router and proxy, a core each under load; one per replica
    wanted = max(1, math.ceil(load / SPARE_SHARD_TICKS))
    return max(needed, min(spare, wanted, scenario.robots))


PROXY_BUSY_SHARE = 0.25  # keep each chaos proxy process's event loop below this share of a core


def proxy_processes(scenario, cores: int | None = None) -> int:
    """Chaos proxy processes for the run's sites: one event loop carries every site's chunks, and the
    delay it applies is late by however long the loop waits, so a loop past ~25 % busy (queueing delay
    grows with load: ~0.3 ms of proxy CPU per answered request, docs/bench.md) gets help, one site per
    process at most, and only while the host has a core for each beyond shards and replicas."""
    cores = cores or os.cpu_count() or 1
    requests = robot_ticks_per_s(scenario) / TICKS_PER_REQUEST
    busy = requests * COST_PER_REQUEST_MS["proxy"] / 1e3
    wanted = max(1, math.ceil(busy / PROXY_BUSY_SHARE))
    # cores beyond the router, the replicas and the fewest shards that carry the fleet (shard_count's
    # spare-core shards are smaller for comfort; a proxy that applies delay late corrupts every leg)
    spare = cores - 1 - max(1, math.ceil(robot_ticks_per_s(scenario) / SHARD_TICK_BUDGET)) - len(scenario.replicas)
    return max(1, min(len(scenario.sites), wanted, spare))


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


def estimate(scenario, cores: int | None = None, probe_ms: float | None = None) -> Estimate:
    """Cores the scenario needs on this host: requests/s x the measured cost per request, scaled by a
    speed probe timed in CPU time (a busy host reads as busy, not as slow). Takes ~0.1-0.5 s."""
    cores = cores or os.cpu_count() or 1
    if probe_ms is None:
        from bench.run.hostcpu import speed_probe_cpu_ms

        probe_ms = min(speed_probe_cpu_ms(0.5) for _ in range(3))
    requests = robot_ticks_per_s(scenario) / TICKS_PER_REQUEST
    scale = probe_ms / COST_REFERENCE_PROBE_MS
    split = {k: requests * ms / 1e3 * scale for k, ms in COST_PER_REQUEST_MS.items()}
    need = sum(split.values())
    return Estimate(shard_count(scenario, cores), cores, probe_ms, need, need <= REAL_TIME_SHARE * cores, split)
