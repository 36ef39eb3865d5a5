"""server.mailbox: newest wins, nothing lost, overflow policies, TTL, retries, blocking take, threads."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.mailbox import Batch, Mailbox, SchedulingConfig
from server.scheduling import Request


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def req(session: str, seq: int = 0, arrived: float = 100.0, **kw) -> Request:
    kw.setdefault("model", "m")
    return Request(session, client=f"c-{session}", seq_id=seq, arrived=arrived, **kw)


def take_all(box: Mailbox, max_batch: int = 8) -> list[Request]:
    out = []
    while (b := box.take(max_batch, timeout_s=0)).requests:
        out += b.requests
    return out


# ---- newest wins -------------------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    sessions=st.lists(st.integers(0, 6), min_size=1, max_size=60),
    strategy=st.sampled_from(["round_robin", "deadline_aware", "priority_tiered", "batch_optimized"]),
)
def test_newest_request_of_each_session_wins_and_the_replaced_are_counted(sessions, strategy):
    box = Mailbox(strategy, clock=FakeClock())
    last = {}
    for seq, s in enumerate(sessions):
        r = req(f"s{s}", seq)
        res = box.deposit(r)
        assert res.accepted and res.dropped is None
        assert res.superseded is last.get(r.session_id)
        last[r.session_id] = r
    box._clock.t += 1.0  # past any batch window
    assert {r.session_id: r for r in take_all(box)} == last
    counts = Counter(f"s{s}" for s in sessions)
    for sid, n in counts.items():
        assert box.take_superseded(sid) == n - 1
        assert box.take_superseded(sid) == 0, "take_superseded returns and zeroes"


def test_an_older_seq_arriving_late_is_superseded_by_the_pending_newer_one():
    box = Mailbox(clock=FakeClock())
    new = req("a", seq=5)
    box.deposit(new)
    res = box.deposit(req("a", seq=4))
    assert not res.accepted and res.superseded.seq_id == 4 and res.dropped is None
    assert box.take().requests == [new]
    assert box.take_superseded("a") == 1


# ---- nothing lost ------------------------------------------------------------------------------------------

op = st.one_of(
    st.tuples(st.just("deposit"), st.integers(0, 7), st.integers(0, 2)),  # session, priority
    st.tuples(st.just("take"), st.integers(1, 4), st.booleans()),  # max_batch, fail the dispatch (requeue)
    st.tuples(st.just("tick"), st.integers(1, 400), st.just(0)),  # advance the clock, ms
    st.tuples(st.just("remove"), st.integers(0, 7), st.just(0)),
    st.tuples(st.just("expire"), st.just(0), st.just(0)),
)


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(op, max_size=80),
    strategy=st.sampled_from(["round_robin", "deadline_aware", "model_deadline", "priority_tiered", "batch_optimized"]),
    overflow=st.sampled_from(["drop_oldest", "drop_newest", "reject"]),
    max_queue_size=st.integers(1, 5),
    ttl_ms=st.sampled_from([None, 300.0, 1000.0]),
    max_retries=st.integers(0, 2),
)
def test_every_deposited_request_leaves_exactly_one_way(ops, strategy, overflow, max_queue_size, ttl_ms, max_retries):
    clock = FakeClock()
    box = Mailbox(
        strategy,
        max_queue_size=max_queue_size,
        overflow_policy=overflow,
        request_ttl_ms=ttl_ms,
        max_retries=max_retries,
        clock=clock,
    )
    fate: dict[int, str] = {}  # id(request) -> how it left; "dispatched" may later turn into another fate
    deposited, seq = [], 0

    def leave(r: Request, how: str, allow_from: tuple[str, ...] = ()) -> None:
        assert fate.get(id(r), None) in (None, *allow_from), f"{r} left twice: {fate.get(id(r))} then {how}"
        fate[id(r)] = how

    def record(batch: Batch) -> None:
        for r in batch.expired:
            leave(r, "expired", ("requeued",))
            assert ttl_ms is not None and clock.t - r.arrived >= ttl_ms / 1000
        for r in batch.requests:
            leave(r, "dispatched", ("requeued",))
        assert len({r.batch_key for r in batch.requests}) <= 1 and batch.queue_depth == box.depth()

    for kind, a, b in ops:
        if kind == "deposit":
            r = req(f"s{a}", seq := seq + 1, arrived=clock.t, priority=b)
            deposited.append(r)
            res = box.deposit(r)
            if res.superseded is not None:
                leave(res.superseded, "superseded", ("requeued",))
            if res.dropped is not None:
                leave(res.dropped, "dropped", ("requeued",))
                assert res.reason == overflow and res.error == (overflow == "reject")
            assert res.accepted == (res.dropped is not r and res.superseded is not r)
            assert box.depth() <= max_queue_size
        elif kind == "take":
            batch = box.take(a, timeout_s=0)
            record(batch)
            if b:
                for r in batch.requests:
                    res = box.requeue(r)
                    if res.requeued:
                        fate[id(r)] = "requeued"
                    else:
                        assert res.reason in ("retries_exhausted", "superseded", "session_removed", "queue_full")
                        fate[id(r)] = "failed" if res.reason != "superseded" else "superseded"
        elif kind == "tick":
            clock.t += a / 1000
        elif kind == "remove":
            r = box.remove_session(f"s{a}")
            if r is not None:
                leave(r, "removed", ("requeued",))
        else:
            for r in box.expire():
                leave(r, "expired", ("requeued",))

    clock.t += 10.0  # past every window: what is left is dispatched, or expired when a TTL is set
    while True:
        batch = box.take(8, timeout_s=0)
        record(batch)
        if not batch.requests and not batch.expired:
            break
    for r in box.close():
        leave(r, "closed", ("requeued",))
    assert box.depth() == 0
    assert all(id(r) in fate and fate[id(r)] != "requeued" for r in deposited), "nothing is lost"
    assert box.deposit(req("late")).reason == "closed"


# ---- overflow policies ----------------------------------------------------------------------------------------


def full_box(policy: str, clock=None) -> Mailbox:
    clock = clock or FakeClock()
    box = Mailbox(max_queue_size=3, overflow_policy=policy, clock=clock)
    for i, sid in enumerate("abc"):
        box.deposit(req(sid, arrived=clock.t + i * 0.01))
    return box


def test_drop_oldest_evicts_the_longest_waiting_request_of_another_session():
    box = full_box("drop_oldest")
    box.deposit(req("a", seq=1, arrived=100.05))  # replacing never overflows, and a is now the youngest
    incoming = req("d", arrived=100.1)
    res = box.deposit(incoming)
    assert res.accepted and res.dropped.session_id == "b" and res.reason == "drop_oldest" and not res.error
    assert res.queue_depth == 3
    assert {r.session_id for r in take_all(box)} == {"a", "c", "d"}


def test_drop_newest_refuses_the_incoming_request_quietly():
    box = full_box("drop_newest")
    incoming = req("d")
    res = box.deposit(incoming)
    assert not res.accepted and res.dropped is incoming and res.reason == "drop_newest" and not res.error
    assert {r.session_id for r in take_all(box)} == {"a", "b", "c"}


def test_reject_refuses_the_incoming_request_and_asks_for_an_error_event():
    box = full_box("reject")
    res = box.deposit(req("d"))
    assert not res.accepted and res.dropped.session_id == "d" and res.reason == "reject" and res.error


def test_a_full_queue_expires_stale_requests_before_dropping_a_live_one():
    clock = FakeClock(0.0)
    box = Mailbox(max_queue_size=2, overflow_policy="reject", request_ttl_ms=100, clock=clock)
    old = req("a", arrived=clock.t)
    box.deposit(old)
    box.deposit(req("b", arrived=clock.t + 0.08))
    clock.t += 0.1
    res = box.deposit(req("c", arrived=clock.t))
    assert res.accepted and res.dropped is None
    batch = box.take(4)
    assert batch.expired == [old], "the expired request is reported by the next take"
    assert {r.session_id for r in batch.requests} == {"b", "c"}


def test_unknown_overflow_policy_raises_listing_the_known_ones():
    with pytest.raises(ValueError, match="drop_oldest, drop_newest, reject"):
        Mailbox(overflow_policy="drop_random")


# ---- TTL ---------------------------------------------------------------------------------------------------


def test_requests_older_than_the_ttl_are_returned_by_the_next_take_not_dispatched():
    clock = FakeClock(10.0)
    box = Mailbox(request_ttl_ms=500, clock=clock)
    box.deposit(req("old", arrived=10.0))
    box.deposit(req("young", arrived=10.4))
    clock.t = 10.5
    batch = box.take(4)
    assert [r.session_id for r in batch.expired] == ["old"]
    assert [r.session_id for r in batch.requests] == ["young"]
    assert box.expire() == []


def test_expire_returns_only_requests_past_the_ttl():
    clock = FakeClock(0.0)
    box = Mailbox(request_ttl_ms=100, clock=clock)
    for i in range(5):
        box.deposit(req(f"s{i}", arrived=i * 0.03))
    clock.t = 0.13
    assert [r.session_id for r in box.expire()] == ["s0", "s1"]
    assert box.depth() == 3


def test_a_replaced_request_does_not_expire_twice():
    clock = FakeClock(0.0)
    box = Mailbox(request_ttl_ms=100, clock=clock)
    box.deposit(req("a", seq=0, arrived=0.0))
    box.deposit(req("a", seq=1, arrived=0.09))
    clock.t = 0.15
    assert box.expire() == []
    clock.t = 0.19
    assert [r.seq_id for r in box.expire()] == [1]


def test_ttl_none_never_expires():
    clock = FakeClock(0.0)
    box = Mailbox(request_ttl_ms=None, clock=clock)
    box.deposit(req("a", arrived=0.0))
    clock.t = 1e6
    assert box.take().requests[0].session_id == "a"


# ---- retries -------------------------------------------------------------------------------------------------


def test_a_failed_dispatch_is_requeued_up_to_max_retries():
    box = Mailbox(max_retries=2, clock=FakeClock())
    box.deposit(req("a"))
    for attempt in range(2):
        r = box.take().requests[0]
        assert box.requeue(r).requeued and r.retries == attempt + 1
    r = box.take().requests[0]
    assert box.requeue(r).reason == "retries_exhausted" and box.depth() == 0


def test_a_retry_is_dropped_when_the_session_sent_a_newer_request_meanwhile():
    box = Mailbox(max_retries=3, clock=FakeClock())
    box.deposit(req("a", seq=1))
    failed = box.take().requests[0]
    newer = req("a", seq=2)
    assert box.deposit(newer).superseded is None, "the in-flight request is not superseded by a deposit"
    res = box.requeue(failed)
    assert not res.requeued and res.reason == "superseded"
    assert box.take_superseded("a") == 1
    assert box.take().requests == [newer]
    # newer is served too, then a retry of the older one would still be stale
    assert box.requeue(failed).reason == "superseded"


def test_a_retry_of_a_removed_session_is_dropped():
    box = Mailbox(max_retries=1, clock=FakeClock())
    box.deposit(req("a"))
    r = box.take().requests[0]
    box.remove_session("a")
    assert box.requeue(r).reason == "session_removed"


def test_max_retries_zero_means_no_retry():
    box = Mailbox(clock=FakeClock())
    box.deposit(req("a"))
    assert box.requeue(box.take().requests[0]).reason == "retries_exhausted"


# ---- sessions, close, config ----------------------------------------------------------------------------------


def test_remove_session_returns_its_pending_request_and_forgets_its_counters():
    box = Mailbox(clock=FakeClock())
    box.deposit(req("a", seq=1))
    last = req("a", seq=2)
    box.deposit(last)
    box.deposit(req("b"))
    assert box.remove_session("a") is last
    assert box.take_superseded("a") == 0 and box.remove_session("a") is None
    assert [r.session_id for r in take_all(box)] == ["b"]


def test_close_returns_everything_still_held_and_refuses_deposits():
    box = Mailbox(clock=FakeClock())
    held = [req(s) for s in "abc"]
    for r in held:
        box.deposit(r)
    assert set(box.close()) == set(held)
    res = box.deposit(req("d"))
    assert not res.accepted and res.reason == "closed" and res.error
    batch = box.take(timeout_s=None)
    assert batch.closed and batch.requests == []


def test_config_words_build_the_mailbox_and_unknown_keys_are_refused():
    box = Mailbox.from_config(
        {
            "strategy": "batch_optimized",
            "options": {"batch_window_ms": 20},
            "max_queue_size": 7,
            "request_ttl_ms": 3000,
            "overflow_policy": "reject",
            "max_retries": 1,
        },
        model="pi0",
    )
    assert box.scheduler.name == "batch_optimized" and box.scheduler.batch_window_s == pytest.approx(0.02)
    assert (box.max_queue_size, box.request_ttl_s, box.overflow_policy, box.max_retries, box.model) == (
        7,
        pytest.approx(3.0),
        "reject",
        1,
        "pi0",
    )
    assert Mailbox.from_config(None).scheduler.name == "round_robin"
    with pytest.raises(ValueError, match="max_queue_size"):
        SchedulingConfig.from_dict({"max_queue": 5})
    with pytest.raises(ValueError, match="round_robin"):
        Mailbox.from_config({"strategy": "fifo"})


def test_queue_depth_is_what_still_waits_after_the_batch_left():
    box = Mailbox(clock=FakeClock())
    for s in "abcde":
        box.deposit(req(s))
    batch = box.take(2)
    assert len(batch.requests) == 2 and batch.queue_depth == 3 == box.depth()
    assert batch.taken_at == 100.0


# ---- blocking take (real time, kept short) ------------------------------------------------------------------


def test_take_returns_within_the_timeout_when_nothing_arrives():
    box = Mailbox()
    t0 = time.monotonic()
    batch = box.take(timeout_s=0.05)
    assert batch.requests == [] and not batch.closed
    assert 0.04 <= time.monotonic() - t0 < 1.0


def test_a_waiting_take_wakes_on_deposit_from_another_thread():
    box = Mailbox()
    got = []
    t = threading.Thread(target=lambda: got.append((box.take(timeout_s=5.0), time.monotonic())))
    t.start()
    time.sleep(0.05)
    sent = time.monotonic()
    box.deposit(req("a", arrived=sent))
    t.join(2.0)
    assert not t.is_alive()
    batch, woke = got[0]
    assert batch.requests[0].session_id == "a" and woke - sent < 0.5


def test_close_wakes_every_waiting_take():
    box = Mailbox()
    results = []
    threads = [threading.Thread(target=lambda: results.append(box.take(timeout_s=None))) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    box.close()
    for t in threads:
        t.join(2.0)
    assert not any(t.is_alive() for t in threads) and all(b.closed for b in results) and len(results) == 3


def test_take_holds_for_the_batch_window_then_flushes_without_a_new_deposit():
    box = Mailbox("batch_optimized", scheduler_options={"batch_window_ms": 30})
    box.deposit(req("a", arrived=time.monotonic()))
    t0 = time.monotonic()
    batch = box.take(max_batch=4, timeout_s=2.0)
    elapsed = time.monotonic() - t0
    assert [r.session_id for r in batch.requests] == ["a"]
    assert 0.02 <= elapsed < 1.0, elapsed


def test_take_returns_a_full_batch_before_the_window():
    box = Mailbox("batch_optimized", scheduler_options={"batch_window_ms": 5000})
    now = time.monotonic()
    for s in "abcd":
        box.deposit(req(s, arrived=now))
    t0 = time.monotonic()
    assert len(box.take(max_batch=4, timeout_s=2.0).requests) == 4
    assert time.monotonic() - t0 < 0.5


def test_deposit_stays_cheap_with_many_sessions():
    box = Mailbox(max_queue_size=100_000, clock=FakeClock())
    t0 = time.perf_counter()
    for i in range(20_000):
        box.deposit(req(f"s{i % 5000}", seq=i))
    assert time.perf_counter() - t0 < 2.0
    assert box.depth() == 5000


# ---- threads ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "strategy, overflow",
    [
        ("round_robin", "drop_oldest"),
        ("batch_optimized", "drop_newest"),
        ("deadline_aware", "reject"),
        ("priority_tiered", "drop_newest"),
    ],
)
def test_depositors_hammering_while_dispatchers_take_lose_nothing_and_never_deadlock(strategy, overflow):
    options = {"batch_window_ms": 1.0} if strategy == "batch_optimized" else {}
    box = Mailbox(
        strategy,
        scheduler_options=options,
        max_queue_size=24,
        overflow_policy=overflow,
        request_ttl_ms=5.0,
        max_retries=1,
    )
    n_depositors, per_depositor, sessions_each = 4, 1500, 10
    lock = threading.Lock()
    tally = Counter()
    superseded_reported = Counter()
    done = threading.Event()

    def depositor(d: int) -> None:
        rng = random.Random(d)
        for i in range(per_depositor):
            sid = f"d{d}s{rng.randrange(sessions_each)}"  # a session belongs to one depositor: seqs rise
            res = box.deposit(
                req(sid, seq=i, arrived=time.monotonic(), batch_key=rng.randrange(2), priority=rng.randrange(2))
            )
            with lock:
                tally["deposited"] += 1
                tally["superseded"] += res.superseded is not None
                tally["dropped"] += res.dropped is not None
            if i % 50 == 0:
                time.sleep(0.0005)

    def dispatcher(k: int) -> None:
        rng = random.Random(100 + k)
        while True:
            batch = box.take(max_batch=4, timeout_s=0.05)
            if batch.closed:
                return
            local = Counter(expired=len(batch.expired))
            if batch.requests:
                time.sleep(0.001)  # the forward pass: lets the queue fill, overflow and expire
            for r in batch.requests:
                if rng.random() < 0.1:  # the forward pass failed for this one
                    res = box.requeue(r)
                    if res.requeued:
                        local["requeued"] += 1
                    elif res.reason == "superseded":
                        local["superseded"] += 1
                    else:
                        local["failed"] += 1
                    continue
                local["dispatched"] += 1
                n = box.take_superseded(r.session_id)
                with lock:  # two dispatchers: `+=` on a shared Counter is a read-modify-write
                    superseded_reported[r.session_id] += n
            with lock:
                tally.update(local)
            if done.is_set() and not batch.requests and not batch.expired and box.depth() == 0:
                return

    dispatchers = [threading.Thread(target=dispatcher, args=(k,)) for k in range(2)]
    depositors = [threading.Thread(target=depositor, args=(d,)) for d in range(n_depositors)]
    t0 = time.monotonic()
    for t in dispatchers + depositors:
        t.start()
    for t in depositors:
        t.join(10.0)
    done.set()
    for t in dispatchers:
        t.join(10.0)
    assert not any(t.is_alive() for t in dispatchers + depositors), "deadlock"
    left = box.close()
    assert time.monotonic() - t0 < 10.0
    assert tally["deposited"] == n_depositors * per_depositor
    gone = tally["dispatched"] + tally["superseded"] + tally["dropped"] + tally["expired"] + tally["failed"] + len(left)
    assert gone == tally["deposited"], tally
    assert tally["dispatched"] > 0
    for d in range(n_depositors):
        for s in range(sessions_each):
            superseded_reported[f"d{d}s{s}"] += box.take_superseded(f"d{d}s{s}")
    assert sum(superseded_reported.values()) == tally["superseded"]


def test_a_partial_batch_gathers_for_the_window_only_while_more_sessions_could_send():
    """The micro-batch window is the mailbox's: a partial batch from an empty queue waits for more arrivals
    while `senders()` says more sessions could send, and leaves once it holds them all."""
    alone = Mailbox("round_robin", batch_window_ms=5000, senders=lambda: 1)
    alone.deposit(req("a", arrived=time.monotonic()))
    t0 = time.monotonic()
    assert [r.session_id for r in alone.take(max_batch=8, timeout_s=1.0).requests] == ["a"]
    assert time.monotonic() - t0 < 1.0, "one session open: nothing to wait for"

    box = Mailbox("round_robin", batch_window_ms=5000, senders=lambda: 2)
    box.deposit(req("a", arrived=time.monotonic()))
    late = threading.Thread(target=box.deposit, args=(req("b", arrived=time.monotonic()),))
    late.start()  # before or during the take: either way one batch of both, well inside the window
    t0 = time.monotonic()
    batch = box.take(max_batch=8, timeout_s=1.0)
    late.join()
    assert sorted(r.session_id for r in batch.requests) == ["a", "b"] and time.monotonic() - t0 < 4.0


def test_a_scheduler_that_holds_batches_is_the_only_window():
    """batch_optimized holds a partial batch for its window; the mailbox then gathers none of its own."""
    box = Mailbox("batch_optimized", scheduler_options={"batch_window_ms": 300}, batch_window_ms=300, senders=lambda: 2)
    box.deposit(req("a", arrived=time.monotonic()))
    t0 = time.monotonic()
    assert [r.session_id for r in box.take(max_batch=4, timeout_s=2.0).requests] == ["a"]
    assert 0.25 <= time.monotonic() - t0 < 0.5, "held for one window, not two"
