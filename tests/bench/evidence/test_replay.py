"""The replicas' queues replayed (bench.evidence.replay): the dispatch rule, the split of the bench's share of the
queue wait, what is not replayed and why, and the assertions judged again without the bench's share."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.evidence import audit as audit_table
from bench.evidence import replay
from bench.evidence.fidelity import _at_batch, bench_share, hop_excess
from bench.evidence.figures import RunData, compute, without_bench
from bench.scenario.assertions import evaluate


def constant(ms):
    return lambda b, t: ms


# ---- the dispatch rule ---------------------------------------------------------------------------------


def test_an_idle_loop_picks_each_request_as_it_arrives():
    a = np.array([0.0, 100.0, 250.0])
    assert replay.replay(a, constant(5.0), max_batch=8, window_ms=0.0).tolist() == a.tolist()


def test_a_busy_loop_queues_one_at_a_time_without_batching():
    picks = replay.replay(np.array([0.0, 1.0, 2.0]), constant(10.0), max_batch=1, window_ms=0.0)
    assert picks.tolist() == [0.0, 10.0, 20.0]


def test_what_queued_while_busy_goes_as_one_batch_up_to_max_batch():
    picks = replay.replay(np.array([0.0, 1.0, 2.0, 3.0]), constant(10.0), max_batch=2, window_ms=0.0)
    assert picks.tolist() == [0.0, 10.0, 10.0, 20.0]


def test_the_window_waits_for_arrivals_and_picks_when_it_runs_out():
    picks = replay.replay(np.array([0.0, 2.0, 9.0]), constant(1.0), max_batch=4, window_ms=5.0)
    assert picks.tolist() == [5.0, 5.0, 14.0]


def test_the_window_closes_early_when_the_batch_is_full():
    picks = replay.replay(np.array([0.0, 1.0, 3.0]), constant(1.0), max_batch=2, window_ms=50.0)
    assert picks.tolist() == [1.0, 1.0, 53.0]


def test_the_window_does_not_wait_for_sessions_the_batch_already_holds():
    picks = replay.replay(np.array([0.0, 100.0]), constant(1.0), max_batch=8, window_ms=50.0, live=lambda t: 1)
    assert picks.tolist() == [0.0, 100.0]
    # two live sessions: the first waits for the second, then no longer
    picks = replay.replay(np.array([0.0, 10.0, 200.0]), constant(1.0), max_batch=8, window_ms=50.0, live=lambda t: 2)
    assert picks.tolist() == [10.0, 10.0, 250.0]


def test_picks_come_back_in_the_order_of_the_arrivals_given():
    picks = replay.replay(np.array([20.0, 0.0, 10.0]), constant(15.0), max_batch=1, window_ms=0.0)
    assert picks.tolist() == [30.0, 0.0, 15.0]


def test_live_sessions_counts_from_first_request_to_the_linger_after_the_last():
    count = replay.live_sessions(np.array([0.0, 50.0, 20.0]), np.array(["a", "a", "b"], object), linger_ms=10.0)
    assert [count(t) for t in (-1.0, 0.0, 25.0, 30.0, 31.0, 60.0, 61.0)] == [0, 1, 2, 2, 1, 1, 0]


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(st.floats(0.0, 30.0), min_size=1, max_size=60),
    busy=st.floats(0.5, 40.0),
    max_batch=st.integers(1, 8),
    window=st.sampled_from([0.0, 2.0, 20.0]),
)
def test_replay_invariants(gaps, busy, max_batch, window):
    a = np.cumsum(gaps)
    picks = replay.replay(a, constant(busy), max_batch, window)
    assert (picks >= a - 1e-9).all()  # nothing runs before it arrives
    assert (np.diff(picks) >= -1e-9).all()  # first come, first picked
    _, sizes = np.unique(picks, return_counts=True)
    assert sizes.max() <= max_batch
    # two batches are at least one busy time apart; a request waits at most its window beyond the backlog
    assert (np.diff(np.unique(picks)) >= busy - 1e-9).all()
    assert (picks - a <= window + busy * len(a) + 1e-9).all()
    assert np.allclose(replay.replay(a, constant(0.0), max_batch, 0.0), a)  # no work, no window: no wait


# ---- the split of one replica's wait ---------------------------------------------------------------------

UNLOADED = {1: 2.0, 2: 2.5, 4: 3.0, 8: 4.0}


def simulated_replica(excess_ms, n=400, period_ms=3.0, max_batch=8, window_ms=5.0, seed=1):
    """Audit rows of a replica whose dispatch follows the replay's rule, with the host adding `excess_ms(t)` to
    every forward pass and 0.1 ms a request of other work: what replica_share is given."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(period_ms, n))
    sizes: dict[float, int] = {}

    def busy(b, t):
        sizes[t] = b
        return float(_at_batch(UNLOADED, np.array([b]))[0]) + excess_ms(t) + 0.1 * b

    session = np.array([f"s{i % 40}" for i in range(n)], object)
    picks = replay.replay(arrival, busy, max_batch, window_ms, replay.live_sessions(arrival, session))
    batch = np.array([sizes[p] for p in picks], float)
    forward = _at_batch(UNLOADED, batch) + np.array([excess_ms(p) for p in picks])
    order = np.argsort(picks, kind="stable")
    sent = np.empty(n)
    for p in np.unique(picks):  # the chunks handed one after another after the forward pass
        rows = order[picks[order] == p]
        sent[rows] = p + forward[rows[0]] + 0.1 * (np.arange(rows.size) + 1)
    return {
        "picked_mono_ms": picks,
        "queue_wait_ms": picks - arrival,
        "forward_ms": forward,
        "batch": batch,
        "sent_mono_ms": sent,
        "session": session,
    }


def test_a_host_that_added_nothing_has_no_share():
    rows = simulated_replica(lambda t: 0.0)
    qw, inf, fig = replay.replica_share(rows, UNLOADED, replay.Scheduling(max_batch=8, batch_window_ms=5.0))
    assert np.allclose(qw, 0.0) and np.allclose(inf, 0.0)
    assert fig["replay_error_ms_p50"] == pytest.approx(0.0, abs=1e-6)


def test_a_starved_replica_s_queue_wait_is_split_and_the_replay_reproduces_it():
    slow = lambda t: 20.0 if (t // 200) % 2 else 0.0  # noqa: E731 - starved every other 200 ms
    rows = simulated_replica(slow)
    qw, inf, fig = replay.replica_share(rows, UNLOADED, replay.Scheduling(max_batch=8, batch_window_ms=5.0))
    assert abs(fig["replay_error_ms_p50"]) < 0.5 and abs(fig["replay_error_ms_p99"]) < 0.5
    assert np.percentile(qw, 90) > 5.0  # requests behind a slow pass waited longer than they would have
    assert fig["unloaded_ms_p99"] < fig["queue_wait_ms_p99"]
    assert np.allclose(inf[rows["forward_ms"] - _at_batch(UNLOADED, rows["batch"]) > 10], 20.0)


def test_a_pass_slowed_throughout_makes_the_queue_wait_longer_on_the_whole():
    # not request by request: a faster loop picks sooner, in smaller batches, and a request can then arrive just
    # after a pick and wait for it, where the slower loop would have taken it into a later, larger batch
    rows = simulated_replica(lambda t: 7.0, window_ms=0.0)
    qw, _, fig = replay.replica_share(rows, UNLOADED, replay.Scheduling(max_batch=8, batch_window_ms=0.0))
    assert (qw < 0).any() and qw.mean() > 1.0
    assert fig["queue_wait_ms_p99"] > fig["unloaded_ms_p99"] and fig["queue_wait_ms_p50"] > fig["unloaded_ms_p50"]


def _concat(lines_by_replica):
    t = audit_table.AuditTable()
    for rid, lines in lines_by_replica.items():
        t.add((json.dumps(x) for x in lines), rid)
    return t.table()


def lines_of(rows: dict, replica: str, with_pick: bool = True) -> list[dict]:
    out = []
    for i in range(rows["picked_mono_ms"].size):
        line = {
            "session_id": rows["session"][i],
            "client_mono_ns": 1000 + i,
            "outcome": "ok",
            "queue_wait_ms": float(rows["queue_wait_ms"][i]),
            "forward_ms": float(rows["forward_ms"][i]),
            "batch": int(rows["batch"][i]),
            "sent_mono_ms": float(rows["sent_mono_ms"][i]),
            "replica_id": replica,
        }
        if with_pick:
            line["picked_mono_ms"] = float(rows["picked_mono_ms"][i])
        out.append(line)
    return out


def test_server_share_says_why_a_replica_is_not_replayed():
    rows = simulated_replica(lambda t: 3.0, n=50)
    audit = _concat(
        {
            "r0": lines_of(rows, "r0"),
            "r1": lines_of(rows, "r1"),
            "r2": lines_of(rows, "r2", False),
            "r3": lines_of(rows, "r3"),
            "r5": lines_of(rows, "r5"),
        }
    )
    sched = {
        "r0": replay.Scheduling(8, 5.0),
        "r1": replay.Scheduling(8, 5.0, loops=2),
        "r2": replay.Scheduling(8, 5.0),
        "r3": replay.Scheduling(8, 5.0, strategy="deadline_aware"),
    }
    qw, inf, figs = replay.server_share(
        audit, {"r0": UNLOADED, "r1": UNLOADED, "r2": UNLOADED, "r3": UNLOADED, "r4": None, "r5": UNLOADED}, sched
    )
    by = {f["replica"]: f for f in figs}
    assert "note" not in by["r0"] and by["r0"]["batches"] > 0
    assert "2 dispatch loops" in by["r1"]["note"]
    assert "no picked_mono_ms" in by["r2"]["note"]
    assert "deadline_aware" in by["r3"]["note"]
    assert "no unloaded forward time" in by["r4"]["note"]
    assert "manifest" in by["r5"]["note"]  # its dispatch rule unknown
    replica = audit_table.strings(audit, "replica")
    assert np.isfinite(qw[replica == "r0"]).all() and np.isnan(qw[replica != "r0"]).all()
    # the forward pass's share needs no replay: every replica with an unloaded reference has it
    assert np.allclose(inf, 3.0)
    # and it reaches each request by its stamp
    qw_req, inf_req = audit_table.by_stamp(audit, replica == "r0", np.array([1000, 1001, 5]), [qw, inf])
    assert np.isfinite(qw_req[:2]).all() and np.isnan(qw_req[2]) and inf_req[0] == pytest.approx(3.0)


def test_scheduling_reads_the_manifest_with_the_server_s_defaults():
    assert replay.Scheduling.of_manifest(None) == replay.Scheduling(1, 2.0, 1, "round_robin")
    m = {
        "scheduling": {"max_batch": 64, "batch_window_ms": 50.0},
        "models": {"default_max_inflight": 1, "known": {"pi": {"max_inflight": 3}}},
    }
    assert replay.Scheduling.of_manifest(m, "pi") == replay.Scheduling(64, 50.0, 3, "round_robin")
    assert replay.Scheduling.of_manifest(m, "other").loops == 1


def test_the_unloaded_curve_never_falls_with_the_batch():
    # measured while three replicas started together (2-core VM, 2026-11-26): batch 1 read slower than 16
    ref = {1: 6.84, 2: 4.564, 4: 7.055, 8: 7.847, 16: 2.851}
    at = _at_batch(ref, np.array([1.0, 3.0, 16.0, 24.0, 64.0]))
    assert (np.diff(at) >= 0).all() and at[0] == pytest.approx(2.851) and at[-1] == pytest.approx(2.851)
    rising = _at_batch({1: 1.0, 2: 2.0}, np.array([4.0]))
    assert rising[0] == pytest.approx(4.0)


# ---- the bench's share and the assertions judged without it ------------------------------------------------


def run_data(rtt, qw, qw_bench, inf, inf_bench):
    n = len(rtt)
    req = {
        "robot": np.zeros(n, np.int32),
        "t": np.linspace(0.0, 9.0, n),
        "outcome": np.array(["ok"] * n, object),
        "rtt_ms": np.asarray(rtt, float),
        "queue_wait_ms": np.asarray(qw, float),
        "queue_wait_bench_ms": np.asarray(qw_bench, float),
        "inference_ms": np.asarray(inf, float),
        "inference_bench_ms": np.asarray(inf_bench, float),
    }
    return RunData(
        robots={"robot": np.array([0], np.int32), "group": np.array(["g"], object)},
        ticks={},
        requests=req,
        transitions={},
        episodes={},
        loop={},
        duration_s=10.0,
    )


def test_bench_share_takes_each_request_s_part_off_its_figure():
    n = 100
    rtt = np.full(n, 100.0)
    rtt[-5:] = 400.0  # the tail: five requests behind a starved pass
    qwb = np.zeros(n)
    qwb[-5:] = 250.0
    d = run_data(rtt, np.full(n, 30.0), qwb, np.full(n, 5.0), np.full(n, 2.0))
    legs = {
        "eu": {
            "edges_ms": [0.0, 1.0, 2.0],
            "upstream": {"chunks": 10, "hist": [0, 10, 0]},
            "downstream": {"chunks": 10, "hist": [0, 10, 0]},
        }
    }
    share = bench_share(legs, [], d.requests)
    assert share["inference_ms"]["p50"] == pytest.approx(2.0) and share["inference_ms"]["requests_measured"] == 1.0
    assert share["queue_wait_ms"]["p50"] == pytest.approx(0.0)
    net = share["network_ms_taken_off"]
    assert net > 0
    # p99 of the round trip: 400 -> 400 - 250 - 2 - net on the tail
    assert share["rtt_ms"]["p99"] == pytest.approx(np.percentile(rtt, 99) - np.percentile(rtt - qwb - 2.0 - net, 99))
    assert share["rtt_ms"]["p50"] == pytest.approx(2.0 + net)


def test_the_bench_share_away_from_faults_is_told_apart_from_the_one_in_their_windows():
    """At 1,000 robots on 16 cores the share's p99 (~50 ms) came from the seconds after a partition and a restart;
    steady state is its own figure. Requests at t 0..9 s; a fault from 3 to 4 s covers 3..4 + FAULT_SETTLE_S."""
    from bench.evidence.fidelity import FAULT_SETTLE_S, near_faults

    n = 100
    t = np.linspace(0.0, 9.0, n)
    rtt, qwb = np.full(n, 100.0), np.zeros(n)
    storm = t >= 3.0
    rtt[storm], qwb[storm] = 300.0, 200.0  # a starved queue after the fault's start
    d = run_data(rtt, np.full(n, 30.0), qwb, np.full(n, 5.0), np.full(n, 2.0))
    share = bench_share({}, [], d.requests, fault_windows=[{"t_start": 3.0, "t_end": 4.0}])["rtt_ms"]
    steady, near = share["steady"], share["around_faults"]
    assert steady["requests"] == int((~storm).sum()) and near["requests"] == int(storm.sum())
    assert steady["p99"] == pytest.approx(2.0) and near["p99"] == pytest.approx(202.0)
    assert share["p99"] > 100.0  # the whole run's p99 is the storm's
    # two faults: which one the tail came with (a partition at 1 s with no storm, a restart at 20 s with one)
    t = np.linspace(0.0, 40.0, 400)
    rtt, qwb = np.full(t.size, 100.0), np.zeros(t.size)
    storm = (t >= 20.0) & (t < 24.0)
    rtt[storm], qwb[storm] = 300.0, 200.0
    d = run_data(rtt, np.full(t.size, 30.0), qwb, np.full(t.size, 5.0), np.full(t.size, 2.0))
    d.requests["t"] = t
    two = bench_share(
        {},
        [],
        d.requests,
        fault_windows=[
            {"t_start": 1.0, "t_end": 2.0, "action": "partition", "target": "site:eu"},
            {"t_start": 20.0, "t_end": 21.0, "action": "restart", "target": "server:r1"},
        ],
    )["rtt_ms"]["by_fault"]
    assert [(b["fault"], b["t_start"]) for b in two] == [("partition site:eu", 1.0), ("restart server:r1", 20.0)]
    assert two[0]["requests"] == int(((t >= 1.0) & (t <= 2.0 + FAULT_SETTLE_S)).sum())
    assert two[0]["p99"] == pytest.approx(2.0)  # nothing starved after the partition
    assert two[1]["requests"] == int(((t >= 20.0) & (t <= 21.0 + FAULT_SETTLE_S)).sum())
    assert two[1]["p99"] == pytest.approx(202.0)  # the restart's storm
    # a window without an end reaches FAULT_SETTLE_S past its start; none given: no split at all
    assert near_faults(np.array([1.0, 1.0 + FAULT_SETTLE_S + 0.1]), [{"t_start": 1.0, "t_end": None}]).tolist() == [
        True,
        False,
    ]
    assert "steady" not in bench_share({}, [], d.requests)["rtt_ms"]


def test_a_failed_assertion_is_judged_again_without_the_bench_s_share():
    n = 200
    rtt = np.full(n, 100.0)
    rtt[-10:] = 450.0
    qwb = np.zeros(n)
    qwb[-10:] = 300.0
    d = run_data(rtt, np.full(n, 30.0), qwb, np.full(n, 5.0), np.full(n, np.nan))
    top, _ = compute(d)
    observed = evaluate("p99(rtt_ms) < 400", top, ["g"])
    assert not observed.passed
    bare = without_bench(d, top, network_ms=1.0)
    again = evaluate("p99(rtt_ms) < 400", bare, ["g"])
    assert again.passed and again.value == pytest.approx(np.percentile(rtt - qwb - 1.0, 99))
    # per group too, and the figures the share does not touch are the same
    assert evaluate("p99(group[g].rtt_ms) < 400", bare, ["g"]).passed
    assert {k: v for k, v in bare.scalars.items() if not k.startswith("goodput")} == {
        k: v for k, v in top.scalars.items() if not k.startswith("goodput")
    }
    assert np.allclose(np.sort(bare.series["queue_wait_ms"]), np.sort(30.0 - qwb))
    # an unmeasured part (NaN) counts as none: the forward pass is what was recorded
    assert np.allclose(bare.series["inference_ms"], 5.0)


def test_goodput_is_judged_again_on_the_round_trips_less_the_bench_s_share():
    """capacity_gpu's 4-session step failed on goodput 0.94 (4 chunks past the 333 ms budget) with its forward
    2.3x its unloaded time at p99: whether the system or the bench host missed the deadline is what the step's
    verdict without the bench answers."""
    n = 100
    rtt = np.full(n, 200.0)
    rtt[:10] = 400.0  # ten past a 333 ms deadline...
    inf_b = np.zeros(n)
    inf_b[:6] = 150.0  # ...six of them only for the bench's share of their forward pass
    d = run_data(rtt, np.full(n, 1.0), np.zeros(n), np.full(n, 150.0), inf_b)
    d.robots["deadline_s"] = np.array([0.333])
    top, _ = compute(d)
    assert top.scalars["goodput_ratio"] == pytest.approx(0.90)
    failed = evaluate("goodput_ratio >= 0.95", top, ["g"])
    bare = without_bench(d, top)
    again = evaluate("goodput_ratio >= 0.95", bare, ["g"])
    assert not failed.passed and again.passed and again.value == pytest.approx(0.96)
    assert bare.scalars["goodput_requests"] == 96 and bare.groups["g"].scalars["goodput_ratio"] == pytest.approx(0.96)
    assert top.scalars["goodput_ratio"] == pytest.approx(0.90)  # the run's own figure untouched


# ---- the hops between the router and the replica, beyond their floor -----------------------------------------


def test_a_hop_beyond_its_replica_s_floor_is_the_bench_s_and_never_negative():
    rng = np.random.default_rng(3)
    quiet = rng.uniform(0.2, 0.4, 200)  # r0's hop on a quiet host
    slow = np.concatenate([rng.uniform(1.0, 1.2, 180), np.full(20, 61.0)])  # r1: a slower floor, and a starved tail
    hop = np.concatenate([quiet, slow, [np.nan, 5.0]])
    replica = np.array(["r0"] * 200 + ["r1"] * 200 + ["r0", ""], dtype=object)
    excess, floors = hop_excess(hop, replica)
    assert floors["r0"] == pytest.approx(np.percentile(quiet, 10), abs=1e-3)
    assert floors["r1"] == pytest.approx(np.percentile(slow, 10), abs=1e-3) and floors["r1"] > 1.0
    assert (excess[:400] >= 0).all() and excess[:400].max() == pytest.approx(61.0 - floors["r1"], abs=1e-3)
    # an unknown hop or an unknown replica: not measured (NaN), never zero
    assert np.isnan(excess[400]) and np.isnan(excess[401])
    # a replica with too few requests to read a floor is not split
    few, floors = hop_excess(np.ones(5), np.array(["r9"] * 5))
    assert np.isnan(few).all() and floors == {}


def test_the_round_trip_s_share_takes_the_hops_off_and_counts_only_the_measured_window():
    n = 200
    rtt = np.full(n, 100.0)
    rtt[-4:] = 300.0  # the tail: four requests whose receive waited 150 ms for a core
    up = np.full(n, 0.5)
    up[-4:] = 150.5
    d = run_data(rtt, np.full(n, 30.0), np.zeros(n), np.full(n, 5.0), np.zeros(n))
    req = dict(d.requests)
    req["uplink_from_router_ms"], req["uplink_from_router_bench_ms"] = up, up - 0.5
    req["downlink_to_router_ms"], req["downlink_to_router_bench_ms"] = np.full(n, 0.2), np.zeros(n)
    req["t"] = np.linspace(-1.0, 9.0, n)  # the first 20 requests in the warm-up, before the measured window
    req["uplink_from_router_bench_ms"][:20] = 1000.0  # a share the window must not count
    share = bench_share(None, [], req, {"r0": {"uplink_from_router_ms": 0.5}}, duration_s=10.0)
    hop = share["uplink_from_router_ms"]
    assert hop["floor_ms"] == {"r0": 0.5} and hop["p50"] == pytest.approx(0.0)
    assert share["rtt_ms"]["p99"] == pytest.approx(
        np.percentile(rtt[20:], 99) - np.percentile(rtt[20:] - up[20:] + 0.5, 99)
    )
    # and the assertion judged without the bench reads the round trip less it too
    d.requests.update(req)
    top, _ = compute(d)
    bare = without_bench(d, top)
    assert evaluate("p99(rtt_ms) < 200", top, ["g"]).passed is False
    assert evaluate("p99(rtt_ms) < 200", bare, ["g"]).passed
    assert np.allclose(bare.series["uplink_from_router_ms"], 0.5)


def test_with_the_robot_side_hops_split_per_request_the_proxies_p50_is_not_taken_off_twice():
    n = 100
    rtt = np.full(n, 100.0)
    rtt[-2:] = 200.0  # two requests whose shard held its GIL 100 ms before their chunk's callback ran
    down = np.full(n, 0.5)
    down[-2:] = 100.5
    d = run_data(rtt, np.full(n, 30.0), np.zeros(n), np.full(n, 5.0), np.zeros(n))
    req = dict(d.requests)
    req["downlink_from_router_ms"], req["downlink_from_router_bench_ms"] = np.full(n, 25.0) + down, down
    legs = {
        "eu": {
            "edges_ms": [0.0, 1.0, 2.0],
            "upstream": {"chunks": 10, "hist": [0, 10, 0]},
            "downstream": {"chunks": 10, "hist": [0, 10, 0]},
        }
    }
    info = {"downlink_from_router_ms": {"eu": {"asked_ms_max": 27.0, "floor_ms": 0.3, "error_ms_p50": 0.5}}}
    share = bench_share(legs, [], req, robot_hops=info)
    assert (
        share["network_ms_taken_off"] == 0.0
        and share["downlink_from_router_ms"]["sites"] == info["downlink_from_router_ms"]
    )
    assert share["rtt_ms"]["p50"] == pytest.approx(0.5) and share["rtt_ms"]["p99"] == pytest.approx(
        np.percentile(rtt, 99) - np.percentile(rtt - down, 99)
    )
    assert "beyond what the proxies asked" in share["note"]
