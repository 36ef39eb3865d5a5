"""Clock offsets between the runner and its children (bench.fleet.clock): the NTP-style estimate and its bound,
the control channel's ping/pong against a child whose clock is skewed, and the hop split across clocks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.fleet import clock as clocks
from bench.fleet.control import ControlServer
from bench.run.collect import HOP_SPLIT_MAX_CLOCK_ERROR, hop_split

REPO = Path(__file__).resolve().parents[3]
delays = st.floats(min_value=0.0, max_value=0.5, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    offset=st.floats(-1e5, 1e5, allow_nan=False),
    start=st.floats(0.0, 1e6, allow_nan=False),
    trips=st.lists(st.tuples(delays, delays, st.floats(0.0, 0.01)), min_size=1, max_size=8),
    symmetric=st.booleans(),
)
def test_the_estimate_is_within_half_the_kept_round_trip_of_the_true_offset(offset, start, trips, symmetric):
    samples, t = [], start
    for there, back, handling in trips:
        back = there if symmetric else back
        t1 = t
        t2 = t1 + there + offset  # on the child's clock
        t3 = t2 + handling
        t4 = t3 - offset + back
        samples.append((t1, t2, t3, t4))
        t = t4 + 0.001
    est = clocks.estimate(samples)
    assert est.exchanges == len(trips)
    assert est.rtt_s == pytest.approx(min(a + (a if symmetric else b) for a, b, _ in trips), abs=1e-6)
    assert est.uncertainty_s == pytest.approx(est.rtt_s / 2)
    assert abs(est.offset_s - offset) <= est.uncertainty_s + 1e-6 * max(1.0, abs(offset), start)
    if symmetric:  # equal delays each way: the kept exchange is exact
        assert est.offset_s == pytest.approx(offset, abs=1e-6 * max(1.0, abs(offset), start))


def test_no_exchange_is_an_error():
    with pytest.raises(ValueError, match="no clock exchange"):
        clocks.estimate([])


def test_a_child_on_this_host_within_its_error_of_zero_shares_the_clock_exactly():
    near = clocks.ClockOffset(0.0002, 0.0004, 0.0008)
    assert clocks.settle(near, same_host=True) == clocks.ClockOffset(0.0, 0.0, 0.0008, 1, same_clock=True)
    assert clocks.settle(near, same_host=False) is near  # another host: what was measured, with its error
    skewed = clocks.ClockOffset(5.0, 0.0004, 0.0008)
    assert clocks.settle(skewed, same_host=True) is skewed  # a skewed clock on this host is not taken for ours


def test_a_start_and_an_end_measurement_combine_into_the_interval_holding_both():
    a, b = clocks.ClockOffset(5.000, 0.001, 0.002), clocks.ClockOffset(5.010, 0.002, 0.004)
    c = clocks.combine(a, b)  # [4.999, 5.001] and [5.008, 5.012]: the clocks drifted 10 ms over the run
    assert c.offset_s == pytest.approx(5.0055) and c.uncertainty_s == pytest.approx(0.0065)
    assert (c.exchanges, c.rtt_s) == (2, 0.002)
    noisy = clocks.combine(a, clocks.ClockOffset(5.0005, 0.003, 0.006))  # a worse second look widens, never shifts out
    assert noisy.offset_s - noisy.uncertainty_s == pytest.approx(
        4.9975
    ) and noisy.offset_s + noisy.uncertainty_s == pytest.approx(5.0035)
    assert clocks.combine(clocks.SAME_CLOCK, clocks.SAME_CLOCK).same_clock


def test_measure_times_the_child_read_between_two_runner_reads():
    runner = iter([10.0, 10.004, 20.0, 20.001])
    child = iter([15.002, 25.0007])
    est = clocks.measure(lambda: next(child), clock=lambda: next(runner), n=2)
    assert est.rtt_s == pytest.approx(0.001) and est.offset_s == pytest.approx(5.0002)


def test_the_control_channel_measures_a_shard_whose_clock_is_5_s_ahead(tmp_path):
    """The client end (a shard) runs in its own process with BENCH_TEST_MONO_SKEW_S=5: its clock reads as another
    host's; the runner's estimate over the real socket is 5 s within the measured bound."""
    server = ControlServer()
    child_code = (
        "import sys, threading\n"
        "from bench.fleet.clock import apply_test_skew\n"
        "assert apply_test_skew() == 5.0\n"
        "from bench.fleet.control import ControlClient\n"
        "done = threading.Event()\n"
        "c = ControlClient(sys.argv[1], lambda m: done.set() if m.get('type') in ('stop', 'closed') else None)\n"
        "c.send({'type': 'hello', 'shard': 7, 'pid': 0})\n"
        "done.wait(30)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), BENCH_TEST_MONO_SKEW_S="5")
    proc = subprocess.Popen([sys.executable, "-c", child_code, server.path], env=env)
    try:
        link, msg = server.messages.get(timeout=30)
        assert msg["type"] == "hello" and link.shard == 7
        t0 = time.monotonic()
        est = link.measure_clock()
        took = time.monotonic() - t0
        assert est.exchanges == clocks.EXCHANGES
        assert abs(est.offset_s - 5.0) <= est.uncertainty_s + 1e-6, est
        assert est.uncertainty_s < 0.25, est  # loopback: even a loaded host answers one of 8 pings quickly
        assert clocks.settle(est, same_host=True) is est  # skewed: not mistaken for this host's clock
        print(
            f"skewed shard: offset {est.offset_s:.6f} s ± {est.uncertainty_s * 1e3:.3f} ms, 8 pings in {took * 1e3:.1f} ms"
        )
        link.send({"type": "stop"})
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        server.close()


def test_a_shard_that_never_answers_is_a_timeout_naming_it():
    import socket

    server = ControlServer(tcp_host="127.0.0.1")
    host, port = server.path[4:].rsplit(":", 1)
    mute = socket.create_connection((host, int(port)))  # connects, says hello, never answers a ping
    try:
        mute.sendall(b'{"type":"hello","shard":4,"pid":0}\n')
        link, _ = server.messages.get(timeout=10)
        with pytest.raises(TimeoutError, match="shard 4 answered no clock ping"):
            link.measure_clock(n=2, timeout_s=0.3)
    finally:
        mute.close()
        server.close()


def _requests(robot_skew_ms: float):
    """Three answered requests to replica r0 on a true clock (ms): robot send, server receipt/send, robot receipt;
    the robot's stamps then read `robot_skew_ms` ahead, as a shard on another host would."""
    true = [(1000.0, 1030.0, 1055.0, 1080.0), (2000.0, 2010.5, 2020.0, 2050.0), (3000.0, 3002.0, 3003.0, 3004.0)]
    sent_ns = np.array([int((s + robot_skew_ms) * 1e6) for s, *_ in true], np.int64)
    rows = pa.Table.from_pylist(
        [
            {"outcome": "ok", "client_mono_ns": int(k), "received_mono_ms": r, "sent_mono_ms": x, "replica": "r0"}
            for k, (_, r, x, _) in zip(sent_ns, true)
        ]
    )
    # the robot's receipt reaches the runner as record t (seconds since t = 0, on the shard's corrected t0)
    t_recv_s = np.array([rcv / 1e3 for *_, rcv in true])
    return sent_ns, t_recv_s, rows


def test_the_hop_split_of_a_skewed_shard_is_right_with_its_offset_and_wrong_without():
    sent_ns, t_recv, rows = _requests(robot_skew_ms=5000.0)
    up, down, dropped = hop_split(sent_ns, t_recv, rows, np.full(3, 5000.0), np.full(3, 0.05), np.zeros(3))
    assert dropped == []
    assert up == pytest.approx([30.0, 10.5, 2.0]) and down == pytest.approx([25.0, 30.0, 1.0], abs=1e-4)
    wrong, _, _ = hop_split(sent_ns, t_recv, rows)  # the one-clock assumption: 5 s off
    assert wrong[0] == pytest.approx(30.0 - 5000.0)


def test_a_pair_of_clocks_less_sure_than_its_hop_allows_has_its_split_dropped_not_printed():
    sent_ns, t_recv, rows = _requests(robot_skew_ms=5000.0)
    # hops of 27.5, 20.25 and 1.5 ms: shard 0 -> r0's median is 20.25 ms
    up, _, dropped = hop_split(sent_ns, t_recv, rows, np.full(3, 5000.0), np.full(3, 5.0), np.zeros(3))
    assert dropped == [] and np.isfinite(up).all()  # 5 ms <= 25 % of 20.25 ms: every request keeps its split
    # 6 ms of error: too much for that pair; all its requests go, not only the short hop (what is left would be
    # biased to the long ones)
    up, down, dropped = hop_split(sent_ns, t_recv, rows, np.full(3, 5000.0), np.full(3, 6.0), np.zeros(3))
    assert 6.0 > HOP_SPLIT_MAX_CLOCK_ERROR * 20.25 and np.isnan(up).all() and np.isnan(down).all()
    assert dropped == [{"shard": 0, "replica": "r0", "requests": 3, "clock_error_ms": 6.0, "hop_ms_p50": 20.25}]
    # the replica's error counts too (a replica on another host: collect_audit gives its rows theirs), and pairs are
    # judged apart: shard 1's robots keep theirs when only shard 0's clock is unsure
    rows = rows.append_column("clock_uncertainty_ms", pa.array([2.0] * rows.num_rows))
    # shard 0 (the 27.5 ms hop): 2 + 6 ms > 6.9 ms; shard 1 (hops 20.25 and 1.5, median 10.9 ms): 2 + 0.5 <= 2.7 ms
    up, _, dropped = hop_split(
        sent_ns, t_recv, rows, np.full(3, 5000.0), np.array([6.0, 0.5, 0.5]), np.array([0, 1, 1])
    )
    assert [(p["shard"], p["requests"]) for p in dropped] == [(0, 1)] and np.isnan(up[0]) and np.isfinite(up[1:]).all()
