"""A shard's CPU by thread role (bench.fleet.threadcpu): real threads burn CPU, the snapshots must put it on
the right role."""

from __future__ import annotations

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


def test_cpu_of_a_busy_thread_lands_on_its_role_not_the_loops():
    before = threadcpu.snapshot()
    assert before, "no /proc/self/task"
    t = threading.Thread(target=_spin_cpu, args=(0.3,), name="remote-engine robot-test")
    t.start()
    t.join()  # ended: its time is gone, so measure a live one instead
    done = threading.Event()
    release = threading.Event()

    def busy():
        _spin_cpu(0.3)
        done.set()
        release.wait()

    t = threading.Thread(target=busy, name="records-test")
    t.start()
    try:
        assert done.wait(30)
        got = threadcpu.by_role(before, threadcpu.snapshot())
    finally:
        release.set()
        t.join()
    assert got["records"] >= 0.25, got
    assert got["engine"] == 0.0, "an ended thread's time is not counted (the module's documented lower bound)"
    assert got["loop"] < got["records"], got


def test_main_thread_is_the_loop():
    before = threadcpu.snapshot()
    _spin_cpu(0.2)
    got = threadcpu.by_role(before, threadcpu.snapshot())
    assert got["loop"] >= 0.15, got
    assert set(got) == set(threadcpu.ROLES)


def test_combine_sums_cores_and_divides_by_ticks_and_requests():
    a = {"cpu_s": {"loop": 6.0, "engine": 3.0, "records": 1.2, "zenoh": 0.6}, "wall_s": 60.0, "ticks": 100_000,
         "requests": 6_000}
    b = {"cpu_s": {"loop": 3.0, "engine": 1.5, "records": 0.6, "zenoh": 0.3}, "wall_s": 30.0, "ticks": 50_000,
         "requests": 3_000}
    got = threadcpu.combine([a, b, None, {}])
    assert got["shards"] == 2
    assert got["cores"]["loop"] == pytest.approx(0.2) and got["cores"]["engine"] == pytest.approx(0.1)
    assert got["loop_us_per_robot_tick"] == pytest.approx(60.0)
    assert got["records_us_per_robot_tick"] == pytest.approx(12.0)
    assert got["engine_ms_per_request"] == pytest.approx(0.5)
    assert got["zenoh_ms_per_request"] == pytest.approx(0.1)
    assert threadcpu.combine([]) == {} and threadcpu.combine([None]) == {}
