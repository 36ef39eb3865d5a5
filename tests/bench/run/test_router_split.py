"""A cluster run's hops split at the router across nodes' wall clocks: a Zenoh router stamps with its node's wall
clock and the receiver reads the stamp against its own, so each part is moved by the measured offset between
the two nodes (bench.run.collect.cluster_stamp_error), and a pair of nodes whose clocks are too unsure for its hop is left
unsplit, named in the summary's `clock.router_split`."""

import numpy as np
import pyarrow as pa
import pytest

from bench.fleet.clock import ClockOffset
from bench.run.collect import robot_hop_bench_share, router_split, router_split_facts
from bench.run.state import RunState

WALLS = {"node-a": ClockOffset(0.004, 0.0002, 0.0004), "node-b": ClockOffset(-0.003, 0.0001, 0.0002)}
SHARD_NODE = {0: "node-a", 1: "node-b"}  # robot 0 on node A, robot 1 on node B; the replica on node B


def _runner(routers: str, walls: dict) -> RunState:
    run = RunState()
    run.cluster, run.routers, run.node_walls = object(), routers, walls
    run.robot_table = [{"robot": 0, "shard": 0, "site": "eu"}, {"robot": 1, "shard": 1, "site": "eu"}]
    run.child_nodes = {f"shard:{k}": n for k, n in SHARD_NODE.items()} | {"server:r0": "node-b"}
    return run


def _wall(node: str | None) -> float:  # ms; None: the driver's host (the hub router), this runner's clock
    return 0.0 if node is None else WALLS[node].offset_s * 1e3


def _requests(routers: str, n: int = 40):
    """Each request's true split and what the replica's audit and the robot's record read of it."""
    rng = np.random.default_rng(1)
    robots = np.arange(n) % 2
    sent_ns = (np.arange(n, dtype=np.int64) + 1) * 50_000_000
    sent_ms = sent_ns / 1e6
    to_router, from_router = rng.uniform(20, 30, n), rng.uniform(1, 3, n)  # uplink's parts, ms
    down_to, down_from = rng.uniform(1, 3, n), rng.uniform(20, 30, n)  # downlink's parts
    routed_audit, down_from_read = np.empty(n), np.empty(n)
    for i, r in enumerate(robots):
        robot_node = SHARD_NODE[int(r)]
        up_stamp, down_stamp = (robot_node, "node-b") if routers == "per_node" else (None, None)
        routed_audit[i] = sent_ms[i] + to_router[i] + (_wall(up_stamp) - _wall("node-b"))  # read on the replica's node
        down_from_read[i] = down_from[i] - (_wall(down_stamp) - _wall(robot_node))  # read on the robot's node
    audit = pa.table(
        {"outcome": ["ok"] * n, "client_mono_ns": sent_ns, "routed_mono_ms": routed_audit, "replica": ["r0"] * n}
    )
    up, down = to_router + from_router, down_to + down_from
    truth = {
        "uplink_to_router_ms": to_router,
        "uplink_from_router_ms": from_router,
        "downlink_to_router_ms": down_to,
        "downlink_from_router_ms": down_from,
    }
    return audit, robots, sent_ns, sent_ms, up, down, down_from_read, truth


@pytest.mark.parametrize("routers", ["per_node", "driver"])
def test_each_part_is_moved_by_the_offset_between_the_stamping_node_and_the_reader(routers):
    audit, robots, sent_ns, sent_ms, up, down, down_from_read, truth = _requests(routers)
    run = _runner(routers, WALLS)
    split = router_split(run, audit, sent_ns, sent_ms, up, down, down_from_read, robots)
    for name, want in truth.items():
        np.testing.assert_allclose(split[name], want, atol=1e-3, err_msg=name)
    facts = router_split_facts(run)
    assert facts["valid"] and facts["requests_dropped"] == 0
    # per_node: node A's and node B's uncertainties, 0.2 + 0.1 ms; driver: the hub's (this host, 0) and node A's
    assert facts["clock_error_ms"] == pytest.approx(0.3 if routers == "per_node" else 0.2)


def test_without_the_correction_robot_0s_parts_would_read_7_ms_off():
    """The case the correction exists for (per_node: node A's router stamps, node B's replica reads, 7 ms apart)."""
    audit, robots, sent_ns, sent_ms, up, down, down_from_read, truth = _requests("per_node")
    same = {n: ClockOffset(0.0, 0.0, 0.0) for n in WALLS}
    split = router_split(_runner("per_node", same), audit, sent_ns, sent_ms, up, down, down_from_read, robots)
    off = split["uplink_to_router_ms"] - truth["uplink_to_router_ms"]
    np.testing.assert_allclose(off[robots == 0], 7.0, atol=1e-3)
    np.testing.assert_allclose(off[robots == 1], 0.0, atol=1e-3)


def test_a_pair_whose_clocks_are_too_unsure_for_its_hop_is_left_unsplit_and_named():
    audit, robots, sent_ns, sent_ms, up, down, down_from_read, truth = _requests("per_node")
    unsure = dict(WALLS, **{"node-a": ClockOffset(0.004, 0.008, 0.016)})  # ±8 ms: over a quarter of a ~27 ms hop
    run = _runner("per_node", unsure)
    split = router_split(run, audit, sent_ns, sent_ms, up, down, down_from_read, robots)
    for name, want in truth.items():
        assert np.isnan(split[name][robots == 0]).all(), name
        np.testing.assert_allclose(split[name][robots == 1], want[robots == 1], atol=1e-3)  # node B's own: exact
    facts = router_split_facts(run)
    assert not facts["valid"] and facts["requests_dropped"] == 20
    assert facts["dropped_pairs"][0]["shard"] == 0 and facts["dropped_pairs"][0]["clock_error_ms"] == pytest.approx(8.1)
    assert "shard 0 -> r0" in facts["note"]


def test_a_node_whose_wall_clock_was_not_measured_leaves_its_requests_unsplit():
    audit, robots, sent_ns, sent_ms, up, down, down_from_read, truth = _requests("per_node")
    run = _runner("per_node", {"node-b": WALLS["node-b"]})  # node A never answered
    split = router_split(run, audit, sent_ns, sent_ms, up, down, down_from_read, robots)
    assert np.isnan(split["uplink_to_router_ms"][robots == 0]).all()
    np.testing.assert_allclose(
        split["uplink_to_router_ms"][robots == 1], truth["uplink_to_router_ms"][robots == 1], atol=1e-3
    )


def _proxy_leg(records):
    from chaos.toxiproxy.fidelity import LegStats

    leg = LegStats()
    for now_s, asked_ms in records:  # the proxy's monotonic clock, s
        leg.record(100, asked_ms / 1e3, asked_ms / 1e3, now_s)
    return leg


def test_a_robot_s_hops_are_bounded_by_its_own_node_s_proxy_around_its_time_on_that_node_s_clock():
    """per_node routers: robot 0's chunks cross node A's copy of site ap's proxy, whose clock is 1 s ahead of the
    runner's; its maxima by 100 ms are read at the request's time moved onto that clock. Node B's copy asked 25 ms
    throughout."""
    from chaos.toxiproxy.fidelity import EDGES_MS

    burst = _proxy_leg([(100.02, 25.0), (100.15, 600.0), (100.31, 24.0)])  # node A: a burst's queue at 100.1 s
    steady = _proxy_leg([(100.02 + 0.1 * i, 25.0) for i in range(4)])
    quiet = _proxy_leg([])
    run = RunState()
    run.cluster, run.routers = object(), "per_node"
    run.robot_table = [{"robot": r, "shard": r % 2, "site": "ap"} for r in range(62)]
    run.child_nodes = {"shard:0": "node-a" * 3, "shard:1": "node-b" * 3}
    run.node_leg_start = None
    run.node_leg_end = {
        n: {"ap": {"edges_ms": list(EDGES_MS), "downstream": leg.to_json(), "upstream": quiet.to_json()}}
        for n, leg in (("node-a" * 3, burst), ("node-b" * 3, steady))
    }
    run.node_asked = {
        "node-a" * 3: {"offset_ms": 1000.0, "asked": {"ap": {"downstream": burst.asked_json()}}},
        "node-b" * 3: {"offset_ms": 0.0, "asked": {"ap": {"downstream": steady.asked_json()}}},
    }
    robots = np.arange(62)
    hop = np.where(robots < 60, 25.5, 95.0)  # robots 60 (node A) and 61 (node B) stalled
    t_recv_s = np.full(62, 99.380)  # on the runner's clock: 100.38 s on node A's, in its 100.3 s bucket (24 asked)
    split = {"uplink_to_router_ms": np.full(62, np.nan), "downlink_from_router_ms": hop}
    out = robot_hop_bench_share(run, robots, split, np.zeros(62), t_recv_s)
    info = run.robot_hops["downlink_from_router_ms"]
    a, b = "ap@" + ("node-a" * 3)[:12], "ap@" + ("node-b" * 3)[:12]
    assert set(info) == {a, b} and info[a]["asked_by_time"] and info[a]["asked_ms_max"] == 600.0
    part = out["downlink_from_router_bench_ms"]
    assert part[60] == pytest.approx(95.0 - 24.0 - info[a]["floor_ms"], abs=1e-3)  # not the 600 of 100.1 s
    # node B's proxy never saw t = 99.3 s on its clock (it started at 100 s): nothing asked then, so all of it
    assert part[61] == pytest.approx(95.0 - info[b]["floor_ms"], abs=1e-3)
    # without node A's clock its request is bounded by the most node A's copy asked over the run: all of it explained
    run.node_asked["node-a" * 3].pop("offset_ms")
    unshifted = robot_hop_bench_share(run, robots, split, np.zeros(62), t_recv_s)["downlink_from_router_bench_ms"]
    assert unshifted[60] == pytest.approx(info[a]["error_ms_p50"], abs=1e-3)
