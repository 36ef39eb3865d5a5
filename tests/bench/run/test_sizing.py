"""The bench's cost model (bench.run.sizing): shard count and preflight estimate from ticks, requests,
physics substeps and the replicas' forward passes."""

from __future__ import annotations

from types import SimpleNamespace as NS

from hypothesis import given
from hypothesis import strategies as st

from bench.run.sizing import (estimate, forwards_per_s, measured_by_kind, physics_ms_per_tick, shard_budget_ms,
                              shard_count)


def _scenario(count: int, fps: float, robot: str = "reacher", replicas: int = 3, manifest: dict | None = None):
    return NS(groups=[NS(count=count, fps=fps, robot=robot)], robots=count, sites={"lab": None},
              replicas=[NS(manifest={}) for _ in range(replicas)], server_manifest=manifest or {}, shards="auto")


def test_physics_follows_the_substeps_a_tick_not_the_tick():
    # the reacher steps its MJCF's 10 ms 100 times a tick at 1 Hz and once (a 33 ms step) at 30 Hz
    assert physics_ms_per_tick("reacher", 1.0) > 50 * physics_ms_per_tick("reacher", 30.0)
    assert physics_ms_per_tick("no-such-robot", 30.0) > 0  # an unmeasured type gets the default step cost


def test_a_slow_fleet_gets_shards_for_its_physics():
    # 1,000 reacher robots at 1 Hz tick 1,000 times a second, a third of one shard's 3,000 at 30 Hz, but their
    # physics (100 substeps a tick) is several shards' work: the tick rule alone gave one shard
    assert shard_count(_scenario(1000, 1.0), cores=2) >= 5
    assert shard_count(_scenario(300, 30.0), cores=2) == 3  # the headline is unchanged
    assert shard_count(_scenario(100, 30.0), cores=2) == 1
    est = estimate(_scenario(1000, 1.0), cores=2, probe_ms=29.6)
    assert not est.real_time and est.split["shards"] > 1.5


@given(requests=st.floats(0.1, 5000), window=st.floats(0, 200), max_batch=st.integers(1, 256))
def test_forward_passes_are_between_one_per_batch_and_one_per_request(requests, window, max_batch):
    fwd = forwards_per_s(requests, window, max_batch)
    assert requests / max_batch - 1e-9 <= fwd <= requests + 1e-9


def test_many_lightly_loaded_replicas_cost_more_than_few_busy_ones():
    # the same fleet's requests over 8 replicas batch less (measured here: 0.50 of a core for 8, 100 robots)
    batching = {"scheduling": {"max_batch": 64, "batch_window_ms": 50.0}}
    few = estimate(_scenario(300, 30.0, replicas=3, manifest=batching), cores=2, probe_ms=29.6).split["replicas"]
    many = estimate(_scenario(300, 30.0, replicas=8, manifest=batching), cores=2, probe_ms=29.6).split["replicas"]
    unbatched = estimate(_scenario(300, 30.0, replicas=3), cores=2, probe_ms=29.6).split["replicas"]
    assert many > few and unbatched > few


def test_the_estimate_scales_with_the_speed_probe():
    s = _scenario(300, 30.0)
    fast, slow = (estimate(s, cores=2, probe_ms=p).cores_needed for p in (29.6, 59.2))
    assert abs(slow - 2 * fast) < 1e-9
    assert shard_budget_ms(100) == 4 * shard_budget_ms(25)


def test_the_measured_split_is_summed_by_kind():
    split = {"shard:0": 50.0, "shard:1": 30.0, "server:r0": 10.0, "chaos-proxy": 6.0, "chaos-proxy-1": 4.0,
             "router": 5.0, "runner": 2.0}
    assert measured_by_kind(split) == {"shards": 0.8, "replicas": 0.1, "proxy": 0.1, "router": 0.05}


def test_a_nodes_proxy_processes_follow_its_robots_requests_and_its_spare_cpus():
    from bench.run.sizing import node_proxy_processes, proxy_processes

    busy = [(3000, 30.0)]  # ~3,800 requests/s, ~1.1 cores of proxy work: more than four loops' 25 % each
    # 16 CPUs, 3 shards reserved and its router: cores for one loop per site
    assert node_proxy_processes(busy, sites=3, node_cpus=16, reserved_cpus=3.0) == 3
    # the same load on a node whose CPUs its shards and router take: one loop, as a local run with no core to spare
    assert node_proxy_processes(busy, sites=3, node_cpus=4, reserved_cpus=3.0) == 1
    assert node_proxy_processes(busy, sites=3, node_cpus=6, reserved_cpus=3.0) == 2  # as many as spare CPUs
    assert node_proxy_processes(busy, sites=1, node_cpus=64, reserved_cpus=3.0) == 1  # never more than sites
    assert node_proxy_processes([(100, 30.0)], sites=3, node_cpus=64, reserved_cpus=1.0) == 1  # a small node
    # 3,000 robots split over groups and rates: the requests a node's robots send, not its robot count
    assert node_proxy_processes([(2000, 30.0), (1000, 1.0)], sites=3, node_cpus=16, reserved_cpus=3.0) == 3
    assert node_proxy_processes([(3000, 1.0)], sites=3, node_cpus=16, reserved_cpus=3.0) == 2  # 0.5 req/s each
    # one rule: a node carrying the whole fleet with the host's spare cores sizes as the local run does
    scenario = NS(groups=[NS(count=1000, fps=30.0, robot="reacher") for _ in range(3)], robots=3000,
                  sites={"a": None, "b": None, "c": None}, replicas=[None] * 3, shards="auto")
    assert proxy_processes(scenario, cores=64) == node_proxy_processes(busy, 3, 64, 3.0) == 3
