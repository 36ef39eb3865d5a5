"""edge.remote.drive: a worker's steps run alike inline (a thread each) and on a shared WorkerPool."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge.remote.drive import Call, Signal, Wait, WorkerPool, run_inline


@pytest.fixture
def pool():
    p = WorkerPool("test pool", call_threads=4)
    yield p
    p.close(wait=False)


def waiter(sig: Signal, timeout_s, log: list):
    got = yield Wait(sig, timeout_s)
    log.append(got)
    return got


def caller(fn, log: list):
    try:
        out = yield Call(fn)
    except ValueError as exc:
        log.append(("raised", str(exc)))
        return "raised"
    log.append(("returned", out))
    return out


def test_inline_wait_returns_true_when_set_and_false_on_timeout():
    sig = Signal()
    log: list = []
    assert run_inline(waiter(sig, 0.01, log)) is False
    sig.set()
    assert run_inline(waiter(sig, 5.0, log)) is True
    assert log == [False, True]


def test_inline_call_returns_the_result_or_raises_into_the_worker():
    log: list = []
    assert run_inline(caller(lambda: 7, log)) == 7

    def bad():
        raise ValueError("no replica")

    assert run_inline(caller(bad, log)) == "raised"
    assert log == [("returned", 7), ("raised", "no replica")]


def test_a_pooled_wait_resumes_when_its_signal_is_set_from_another_thread(pool):
    sig = Signal()
    log: list = []
    h = pool.spawn(waiter(sig, None, log), "w")
    assert h.is_alive()
    threading.Timer(0.05, sig.set).start()
    h.join(5.0)
    assert not h.is_alive() and log == [True]
    assert sig.waiter is None  # the pool let go of the signal once it resumed


def test_a_pooled_wait_times_out_and_a_stale_set_does_not_end_the_next_wait(pool):
    sig = Signal()
    first_done = threading.Event()
    log: list = []

    def twice():
        log.append((yield Wait(sig, 0.02)))
        first_done.set()
        log.append((yield Wait(Signal(), 0.2)))  # another signal: a set of the first one must not end this wait

    h = pool.spawn(twice(), "w")
    assert first_done.wait(5.0)
    sig.set()  # the first wait is over: this set resumes nothing
    h.join(5.0)
    assert log == [False, False]


def test_a_set_signal_resumes_at_once(pool):
    sig = Signal()
    sig.set()
    log: list = []
    h = pool.spawn(waiter(sig, 60.0, log), "w")
    h.join(5.0)
    assert log == [True]


def test_a_pooled_call_runs_off_the_pool_thread_and_its_error_reaches_the_worker(pool):
    names: list = []
    log: list = []

    def where():
        names.append(threading.current_thread().name)
        return 3

    def bad():
        raise ValueError("refused")

    h1 = pool.spawn(caller(where, log), "a")
    h1.join(5.0)
    h2 = pool.spawn(caller(bad, log), "b")
    h2.join(5.0)
    assert log == [("returned", 3), ("raised", "refused")]
    assert names and names[0].startswith("test pool call")


def test_a_blocking_call_does_not_stall_the_other_workers(pool):
    release = threading.Event()
    sig = Signal()
    log: list = []
    slow = pool.spawn(caller(lambda: release.wait(5.0), log), "slow")
    fast = pool.spawn(waiter(sig, None, log), "fast")
    sig.set()
    fast.join(5.0)
    assert not fast.is_alive() and slow.is_alive()
    release.set()
    slow.join(5.0)
    assert log == [True, ("returned", True)]


def test_a_worker_that_raises_ends_alone(pool):
    def broken():
        yield Wait(Signal(), 0.0)
        raise RuntimeError("bug")

    sig = Signal()
    log: list = []
    bad = pool.spawn(broken(), "broken")
    good = pool.spawn(waiter(sig, None, log), "good")
    bad.join(5.0)
    assert not bad.is_alive() and good.is_alive()
    sig.set()
    good.join(5.0)
    assert log == [True]


def test_spawn_after_close_is_refused():
    p = WorkerPool("closed pool")
    p.close()
    with pytest.raises(RuntimeError, match="closed"):
        p.spawn(waiter(Signal(), 0.0, []))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3)), min_size=1, max_size=6))
def test_many_workers_each_see_their_own_waits_in_order(plan):
    """Workers interleave on one thread; each sees exactly its own waits' outcomes, in its own order."""
    p = WorkerPool("prop pool", call_threads=2)
    try:
        sigs = [Signal() for _ in plan]
        logs: list[list] = [[] for _ in plan]

        def worker(k, set_it, calls):
            for c in range(calls):
                logs[k].append(("call", (yield Call(lambda c=c: c * 10 + k))))
            logs[k].append(("wait", (yield Wait(sigs[k], None if set_it else 0.01))))

        handles = [p.spawn(worker(k, s, c), f"w{k}") for k, (s, c) in enumerate(plan)]
        for k, (s, _) in enumerate(plan):
            if s:
                sigs[k].set()
        for h in handles:
            h.join(10.0)
        for k, (s, c) in enumerate(plan):
            assert logs[k] == [("call", i * 10 + k) for i in range(c)] + [("wait", s)]
    finally:
        p.close(wait=False)
