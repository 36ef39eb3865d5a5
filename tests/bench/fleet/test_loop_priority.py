"""The shard's control loop thread runs as a robot's real-time loop; threads it starts do not."""

from __future__ import annotations

import os
import threading

from bench.fleet.shard import normal_thread_priority, raise_loop_priority


def _in_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.update(fn()))
    t.start()
    t.join()
    return out


def test_only_the_loop_thread_is_raised_and_its_children_are_lowered_again():
    def loop():
        got = raise_loop_priority()
        policy = os.sched_getscheduler(0)  # 0: the calling thread
        child = _in_thread(lambda: (normal_thread_priority(), {"policy": os.sched_getscheduler(0)})[1])
        return {"got": got, "policy": policy, "child": child["policy"]}

    res = _in_thread(loop)
    assert res["got"] in ("SCHED_FIFO 10", "nice -10", "normal")
    if res["got"].startswith("SCHED_FIFO"):
        assert res["policy"] == os.SCHED_FIFO
    assert res["child"] == os.SCHED_OTHER  # a thread the loop starts (robot faults) gets the ordinary policy
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the test's own thread was never touched


def test_the_environment_can_ask_for_a_weaker_priority(monkeypatch):
    monkeypatch.setenv("BENCH_LOOP_PRIORITY", "normal")
    assert _in_thread(lambda: {"got": raise_loop_priority()})["got"] == "normal"
