"""A shard's CPU by thread role (bench.fleet.threadcpu): real threads burn CPU, the ledger must put it on the
right role, keep it after the thread ends, and say which share of the process's CPU it accounts for."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from bench.fleet import threadcpu

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")


def _spin_cpu(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_roles_from_python_names_and_kernel_names():
    assert threadcpu.role_of(None, "python", is_main=True) == "loop"
    assert threadcpu.role_of("remote-engine robot-1", "python", False) == "engine"
    assert threadcpu.role_of("rtc-engine", "python", False) == "engine"
    assert threadcpu.role_of("records-ticks", "python", False) == "records"
    assert threadcpu.role_of("status", "python", False) == "status"
    assert threadcpu.role_of("control-read", "python", False) == "control"
    assert threadcpu.role_of("Thread-3", "python", False) == "python_other"
    for comm in ("rx-0", "tx-1", "app-0", "net-0", "acc-0"):
        assert threadcpu.role_of(None, comm, False) == "zenoh", comm
    assert threadcpu.role_of(None, "python", False) == "native"  # e.g. a BLAS pool thread


def _burning_thread(name: str, seconds: float, release: threading.Event | None):
    """A thread that burns `seconds` of CPU, sets the returned event `burned`, then waits for `release` (if
    any) and ends."""
    burned = threading.Event()

    def run():
        _spin_cpu(seconds)
        burned.set()
        if release is not None:
            release.wait()

    return threading.Thread(target=run, name=name), burned


def test_cpu_of_a_thread_that_ended_stays_on_its_role():
    ledger = threadcpu.Ledger()
    sampled = threading.Event()
    t, burned = _burning_thread("remote-engine robot-test", 0.4, sampled)
    t.start()
    try:
        assert burned.wait(30)
        ledger.sample()  # as the shard's status tick does, while the engine's worker lives
    finally:
        sampled.set()
        t.join()
    assert not t.is_alive()
    got = ledger.report()
    assert got["cpu_s"]["engine"] >= 0.35, got
    assert got["cpu_s"]["loop"] < got["cpu_s"]["engine"], got
    assert 0.95 <= got["accounted"] <= 1.001, got  # the split is the process's CPU, the ended thread's included


def _wait_gone_from_proc(tid: int, timeout_s: float = 5.0) -> None:
    """Until the ended thread `tid` is no longer in /proc/self/task (no event says so: polled)."""
    deadline = time.monotonic() + timeout_s
    while os.path.exists(f"/proc/self/task/{tid}"):
        assert time.monotonic() < deadline, f"thread {tid} still in /proc/self/task {timeout_s} s after its join"
        time.sleep(0.001)


def test_a_thread_born_and_ended_between_samples_is_missing_and_accounted_says_so():
    ledger = threadcpu.Ledger()
    t, burned = _burning_thread("records-test", 0.4, None)
    t.start()
    t.join()
    _wait_gone_from_proc(t.native_id)  # join returns before the kernel lets go of the thread: /proc may still list it
    got = ledger.report()
    assert got["cpu_s"]["records"] == 0.0, got
    assert got["process_cpu_s"] >= 0.35 and got["accounted"] < 0.6, got


def test_a_live_threads_cpu_lands_on_its_role_not_the_loops():
    ledger = threadcpu.Ledger()
    release = threading.Event()
    t, burned = _burning_thread("records-test", 0.3, release)
    t.start()
    try:
        assert burned.wait(30)
        got = ledger.report()
    finally:
        release.set()
        t.join()
    assert got["cpu_s"]["records"] >= 0.25, got
    assert got["cpu_s"]["loop"] < got["cpu_s"]["records"], got


def test_a_reused_tid_is_another_thread_not_one_whose_cpu_went_back():
    """The kernel gives an ended thread's tid to a new one: keyed by (tid, start time), the ended thread keeps
    its 0.5 s and the new one adds its own 0.4 s (keyed by tid alone: 0.4 - 2.5 clipped to nothing)."""
    reads = iter(
        [
            {(1, 10): ("loop", 1.0), (7, 100): ("engine", 2.0)},  # the base
            {(1, 10): ("loop", 1.2), (7, 100): ("engine", 2.5)},
            {(1, 10): ("loop", 1.5), (7, 900): ("engine", 0.4)},  # tid 7 ended; a new thread got it
        ]
    )
    process = iter([10.0, 11.6])
    ledger = threadcpu.Ledger(read=lambda: next(reads), read_process=lambda: next(process))
    ledger.sample()
    got = ledger.report()
    assert got["cpu_s"]["engine"] == pytest.approx(0.9) and got["cpu_s"]["loop"] == pytest.approx(0.5)
    assert got["process_cpu_s"] == pytest.approx(1.6) and got["accounted"] == pytest.approx(1.4 / 1.6, abs=1e-3)


def test_a_python_thread_past_its_run_keeps_its_role():
    """Between the end of run() and the thread's exit, `threading` no longer lists it: read then, it is "native"."""
    reads = iter([{(5, 50): ("status", 0.0)}, {(5, 50): ("native", 0.3)}])
    ledger = threadcpu.Ledger(read=lambda: next(reads), read_process=lambda: 1.0)
    ledger.sample()
    assert ledger.by_role()["status"] == pytest.approx(0.3) and ledger.by_role()["native"] == 0.0


def test_a_thread_is_keyed_by_its_start_time_from_proc():
    main = threading.main_thread().native_id
    keys = [k for k in threadcpu.threads() if k[0] == main]
    assert len(keys) == 1
    with open(f"/proc/self/task/{main}/stat") as f:
        assert keys[0][1] == int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime


def test_main_thread_is_the_loop():
    ledger = threadcpu.Ledger()
    _spin_cpu(0.2)
    got = ledger.report()["cpu_s"]
    assert got["loop"] >= 0.15, got
    assert set(got) == set(threadcpu.ROLES)


def test_combine_sums_cores_and_divides_by_ticks_and_requests():
    a = {
        "cpu_s": {"loop": 6.0, "engine": 3.0, "records": 1.2, "zenoh": 0.6},
        "wall_s": 60.0,
        "ticks": 100_000,
        "requests": 6_000,
    }
    b = {
        "cpu_s": {"loop": 3.0, "engine": 1.5, "records": 0.6, "zenoh": 0.3},
        "wall_s": 30.0,
        "ticks": 50_000,
        "requests": 3_000,
    }
    got = threadcpu.combine([a, b, None, {}])
    assert "accounted" not in got  # reports without the process's CPU (not Linux) claim no share
    got = threadcpu.combine([{**a, "process_cpu_s": 12.0}, {**b, "process_cpu_s": 6.0}, None, {}])
    assert got["accounted"] == pytest.approx(16.2 / 18.0, abs=1e-3)
    assert got["process_cores"] == pytest.approx(0.4)
    assert got["shards"] == 2
    assert got["cores"]["loop"] == pytest.approx(0.2) and got["cores"]["engine"] == pytest.approx(0.1)
    assert got["loop_us_per_robot_tick"] == pytest.approx(60.0)
    assert got["records_us_per_robot_tick"] == pytest.approx(12.0)
    assert got["engine_ms_per_request"] == pytest.approx(0.5)
    assert got["zenoh_ms_per_request"] == pytest.approx(0.1)
    assert threadcpu.combine([]) == {} and threadcpu.combine([None]) == {}
