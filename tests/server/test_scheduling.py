"""server.scheduling: the Scheduler contract, each built-in strategy's ordering, and the two registries."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.scheduling import (
    BatchOptimizedScheduler,
    Request,
    Scheduler,
    check_scheduler,
    deadline,
    deadline_key,
    get_scoring,
    make_scheduler,
    register_scheduler,
    register_scoring,
    scheduler_names,
    scoring_names,
)

BUILTINS = ["round_robin", "deadline_aware", "model_deadline", "priority_tiered", "batch_optimized"]


def req(session: str, seq: int = 0, arrived: float = 0.0, **kw) -> Request:
    kw.setdefault("model", "m")
    return Request(session, client=f"c-{session}", seq_id=seq, arrived=arrived, **kw)


def drain(s: Scheduler, now: float = 1e9, max_batch: int = 1) -> list[list[Request]]:
    out = []
    while len(s):
        batch = s.select(now, max_batch)
        assert batch, "a strategy must not hold once the window has long passed"
        out.append(batch)
    return out


# ---- registry ----------------------------------------------------------------------------------------------------


def test_builtin_strategies_are_registered_under_their_config_words():
    assert set(BUILTINS) <= set(scheduler_names())
    for name in BUILTINS:
        assert make_scheduler(name).name == name


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_strategy_keeps_the_scheduler_contract(name):
    check_scheduler(lambda: make_scheduler(name))
    check_scheduler(lambda: make_scheduler(name), max_batch=1)


@pytest.mark.parametrize("name", ["deadline_aware", "model_deadline"])
def test_scored_strategies_keep_the_contract_with_a_custom_scoring(name):
    check_scheduler(lambda: make_scheduler(name, scoring=lambda r, now: r.urgency - r.priority))


def test_unknown_strategy_name_raises_value_error_listing_the_known_ones():
    with pytest.raises(ValueError, match="round_robin") as e:
        make_scheduler("fastest_first")
    assert "'fastest_first'" in str(e.value) and "batch_optimized" in str(e.value)


def test_unknown_strategy_option_raises_value_error_naming_the_accepted_ones():
    with pytest.raises(ValueError, match="batch_window_ms"):
        make_scheduler("batch_optimized", window_ms=5)
    with pytest.raises(ValueError, match="accepts none"):
        make_scheduler("round_robin", batch_window_ms=5)


def test_unknown_scoring_name_raises_value_error_listing_the_known_ones():
    with pytest.raises(ValueError, match="deadline"):
        make_scheduler("deadline_aware", scoring="nope")
    with pytest.raises(ValueError, match="nope"):
        get_scoring("nope")


@register_scheduler("test_lifo")
class _Lifo(Scheduler):
    """Newest push first: proves a user strategy needs only the three hooks."""

    def __init__(self):
        super().__init__()
        self._stack: list[Request] = []

    def _enqueue(self, req, replaced):
        self._stack.append(req)

    def _dequeue(self, req):
        pass

    def _select(self, now, max_batch):
        while not self._is_pending(self._stack[-1]):
            self._stack.pop()
        return [self._take(self._stack.pop())]


def test_a_registered_user_strategy_is_built_by_name_and_keeps_the_contract():
    assert "test_lifo" in scheduler_names()
    check_scheduler(lambda: make_scheduler("test_lifo"))
    s = make_scheduler("test_lifo")
    for i in range(3):
        s.push(req(f"s{i}"))
    assert [b[0].session_id for b in drain(s)] == ["s2", "s1", "s0"]


def test_registering_a_taken_name_raises():
    with pytest.raises(ValueError, match="already registered"):
        register_scheduler("round_robin")(_Lifo)
    with pytest.raises(ValueError, match="already registered"):
        register_scoring("deadline")(lambda r, now: 0.0)


# ---- latest-only, for every strategy ------------------------------------------------------------------------

pushes = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=40)


@pytest.mark.parametrize("name", BUILTINS)
@settings(max_examples=40, deadline=None)
@given(ops=pushes, max_batch=st.integers(1, 4))
def test_newest_push_of_each_session_is_the_one_selected(name, ops, max_batch):
    s = make_scheduler(name)
    last, replaced = {}, []
    for i, (sess, prio, key) in enumerate(ops):
        r = req(f"s{sess}", seq=i, arrived=i * 0.001, priority=prio, batch_key=key, urgency=(i % 3) / 2)
        old = s.push(r)
        assert old is last.get(r.session_id)
        if old is not None:
            replaced.append(old)
        last[r.session_id] = r
    batches = drain(s, max_batch=max_batch)
    got = [r for b in batches for r in b]
    assert {r.session_id: r for r in got} == last and len(got) == len(last)
    assert all(len({r.batch_key for r in b}) == 1 and len(b) <= max_batch for b in batches)
    assert len(got) + len(replaced) == len(ops)


# ---- round_robin -------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 12),
    k=st.integers(1, 6),
    max_batch=st.integers(1, 4),
    extra=st.lists(st.integers(0, 11), max_size=60),
    order=st.randoms(use_true_random=False),
)
def test_round_robin_serves_every_always_pending_session_once_per_cycle(n, k, max_batch, extra, order):
    """Overload: all N sessions always pending, served ones re-push at once, others spam replacements."""
    s = make_scheduler("round_robin")
    sessions = [f"s{i}" for i in range(n)]
    order.shuffle(sessions)
    seq = 0
    for sid in sessions:
        s.push(req(sid, seq=(seq := seq + 1)))
    served = dict.fromkeys(sessions, 0)
    spam = iter(extra)
    total = 0
    while total < k * n:
        batch = s.select(0.0, max_batch)
        assert len(batch) == min(max_batch, n)
        for r in batch:
            served[r.session_id] += 1
            total += 1
        assert max(served.values()) - min(served.values()) <= 1, "no session is served twice in one cycle"
        for r in batch:
            s.push(req(r.session_id, seq=(seq := seq + 1)))
        for _ in range(2):  # replacements of pending requests must not move a session forward
            i = next(spam, None)
            if i is not None and i < n:
                s.push(req(f"s{i}", seq=(seq := seq + 1)))
    assert all(abs(c - total / n) <= 1 for c in served.values())


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(st.integers(0, 2), min_size=1, max_size=10), max_batch=st.integers(1, 4), rounds=st.integers(1, 30)
)
def test_round_robin_with_mixed_batch_keys_serves_a_pending_session_within_n_selections(keys, max_batch, rounds):
    n = len(keys)
    s = make_scheduler("round_robin")
    for i, key in enumerate(keys):
        s.push(req(f"s{i}", batch_key=key))
    waited = dict.fromkeys(range(n), 0)
    for _ in range(rounds * n):
        batch = s.select(0.0, max_batch)
        head_key = batch[0].batch_key
        assert all(r.batch_key == head_key for r in batch)
        for i in waited:
            waited[i] += 1
        for r in batch:
            waited[int(r.session_id[1:])] = 0
            s.push(req(r.session_id, batch_key=keys[int(r.session_id[1:])]))
        assert max(waited.values()) < n, "starvation is structurally impossible"


def test_round_robin_batches_the_head_with_the_next_sessions_in_line_sharing_its_key():
    s = make_scheduler("round_robin")
    for sid, key in [("a", 1), ("b", 2), ("c", 1), ("d", 1), ("e", 2)]:
        s.push(req(sid, batch_key=key))
    assert [r.session_id for r in s.select(0.0, 2)] == ["a", "c"]
    assert [r.session_id for r in s.select(0.0, 3)] == ["b", "e"]
    assert [r.session_id for r in s.select(0.0, 3)] == ["d"]


def test_round_robin_session_changing_batch_key_rejoins_at_the_back():
    s = make_scheduler("round_robin")
    for sid in "abc":
        s.push(req(sid, batch_key=0))
    s.push(req("a", seq=1, batch_key=9))
    assert [b[0].session_id for b in drain(s)] == ["b", "c", "a"]


# ---- priority_tiered ---------------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("push"), st.integers(0, 7), st.integers(0, 3), st.integers(0, 1)),
            st.tuples(st.just("select"), st.integers(1, 3), st.just(0), st.just(0)),
        ),
        max_size=60,
    )
)
def test_priority_tiered_serves_a_tier_only_when_every_higher_tier_is_empty(ops):
    s = make_scheduler("priority_tiered")
    pending: dict[str, Request] = {}
    for i, (op, a, prio, key) in enumerate(ops):
        if op == "push":
            r = req(f"s{a}", seq=i, priority=prio, batch_key=key)
            s.push(r)
            pending[r.session_id] = r
            continue
        batch = s.select(0.0, a)
        if not pending:
            assert batch == []
            continue
        top = min(r.priority for r in pending.values())
        assert batch and all(r.priority == top for r in batch), "strict tiers, and a batch never mixes tiers"
        for r in batch:
            assert pending.pop(r.session_id) is r
    assert len(s) == len(pending)


def test_priority_tiered_rotates_sessions_fifo_within_a_tier():
    s = make_scheduler("priority_tiered")
    for sid, prio in [("low1", 2), ("hi1", 0), ("hi2", 0), ("mid", 1), ("low2", 2)]:
        s.push(req(sid, priority=prio))
    first = s.select(0.0)[0]
    s.push(req(first.session_id, seq=1, priority=0))  # the served session rejoins its tier at the back
    assert [b[0].session_id for b in drain(s)] == ["hi2", "hi1", "mid", "low1", "low2"]


def test_priority_tiered_moves_a_session_whose_priority_changed():
    s = make_scheduler("priority_tiered")
    s.push(req("a", priority=3))
    s.push(req("b", priority=1))
    s.push(req("a", seq=1, priority=0))
    assert [(b[0].session_id, b[0].seq_id) for b in drain(s)] == [("a", 1), ("b", 0)]


# ---- deadline_aware / model_deadline ---------------------------------------------------------------------------

request_fields = st.fixed_dictionaries(
    {
        "arrived": st.floats(0, 1, allow_nan=False),
        "urgency": st.floats(0, 1, allow_nan=False),
        "priority": st.integers(0, 3),
        "steps_remaining": st.one_of(st.none(), st.integers(0, 50)),
        "cadence_s": st.one_of(st.none(), st.floats(0.01, 0.5)),
        "latency_budget_ms": st.one_of(st.none(), st.floats(5, 500)),
    }
)


@pytest.mark.parametrize("name", ["deadline_aware", "model_deadline"])
@settings(max_examples=60, deadline=None)
@given(fields=st.lists(request_fields, min_size=1, max_size=25))
def test_deadline_strategies_dispatch_in_ascending_deadline_key_order(name, fields):
    s = make_scheduler(name)
    for i, f in enumerate(fields):
        s.push(req(f"s{i}", **f))
    keys = [deadline_key(b[0]) for b in drain(s, now=0.5)]
    assert keys == sorted(keys)


def test_deadline_is_arrival_plus_the_tightest_known_horizon():
    assert deadline(req("a", arrived=1.0, steps_remaining=10, cadence_s=0.1)) == pytest.approx(2.0)
    assert deadline(req("a", arrived=1.0, steps_remaining=10, cadence_s=0.1, latency_budget_ms=50)) == pytest.approx(
        1.05
    )
    assert deadline(req("a", arrived=1.0, cadence_s=0.2)) == pytest.approx(1.2)
    assert deadline(req("a", arrived=1.0), default_horizon_s=0.3) == pytest.approx(1.3)


def test_deadline_aware_prefers_less_slack_then_urgency_then_priority():
    s = make_scheduler("deadline_aware")
    s.push(req("relaxed", arrived=0.0, steps_remaining=40, cadence_s=0.1))  # slack 4 s
    s.push(req("tight", arrived=0.5, steps_remaining=2, cadence_s=0.1))  # deadline 0.7 s: despite arriving later
    s.push(req("calm", arrived=0.5, steps_remaining=3, cadence_s=0.1, urgency=0.0))
    s.push(req("urgent", arrived=0.5, steps_remaining=3, cadence_s=0.1, urgency=1.0))
    s.push(req("low_prio", arrived=0.5, steps_remaining=3, cadence_s=0.1, urgency=1.0, priority=1))
    assert [b[0].session_id for b in drain(s, now=0.6)] == ["tight", "urgent", "calm", "low_prio", "relaxed"]


def test_deadline_aware_weights_are_options():
    s = make_scheduler("deadline_aware", urgency_weight_s=10.0)
    s.push(req("tight", steps_remaining=1, cadence_s=0.1, urgency=0.0))
    s.push(req("urgent", steps_remaining=40, cadence_s=0.1, urgency=1.0))
    assert s.select(0.0)[0].session_id == "urgent"


def test_deadline_aware_batches_the_most_urgent_with_the_most_urgent_of_its_batch_key():
    s = make_scheduler("deadline_aware")
    for sid, steps, key in [("a", 1, "x"), ("b", 2, "y"), ("c", 3, "x"), ("d", 9, "x"), ("e", 4, "x")]:
        s.push(req(sid, steps_remaining=steps, cadence_s=0.1, batch_key=key))
    assert [r.session_id for r in s.select(0.0, 3)] == ["a", "c", "e"]
    assert [r.session_id for r in s.select(0.0, 3)] == ["b"]


def test_model_deadline_never_batches_two_models_and_selects_per_model():
    s = make_scheduler("model_deadline")
    s.push(req("a", model="policy", steps_remaining=1, cadence_s=0.1))
    s.push(req("b", model="telemetry", steps_remaining=2, cadence_s=0.1))
    s.push(req("c", model="policy", steps_remaining=5, cadence_s=0.1))
    assert s.depth("policy") == 2 and s.depth("telemetry") == 1
    assert [r.session_id for r in s.select(0.0, 4, model="telemetry")] == ["b"]
    assert s.select(0.0, 4, model="telemetry") == []
    assert s.depth("telemetry") == 0
    s.push(req("d", model="telemetry", steps_remaining=3, cadence_s=0.1))
    assert [r.session_id for r in s.select(0.0, 4)] == ["a", "c"]


def test_deadline_heap_stays_bounded_under_endless_replacements():
    s = make_scheduler("deadline_aware")
    for i in range(5000):
        s.push(req(f"s{i % 4}", seq=i, arrived=i * 1e-3))
    assert sum(len(h) for h in s._heaps.values()) <= 2 * 4 + 64 + 1
    assert sorted(r.seq_id for b in drain(s) for r in b) == [4996, 4997, 4998, 4999]


# ---- custom scoring ---------------------------------------------------------------------------------------


@register_scoring("test_safety_first")
def _safety_first(r: Request, now: float) -> float:
    return 1000.0 if r.urgency > 0.9 else -10.0 * r.priority + (now - r.arrived)


def test_a_registered_scoring_is_chosen_by_name_and_higher_scores_go_first():
    assert {"deadline", "test_safety_first"} <= set(scoring_names())
    for name in ("deadline_aware", "model_deadline"):
        s = make_scheduler(name, scoring="test_safety_first")
        s.push(req("p0_old", arrived=0.0, priority=0))
        s.push(req("p1", arrived=0.0, priority=1))
        s.push(req("p0_new", arrived=0.5, priority=0))
        s.push(req("critical", arrived=0.9, priority=3, urgency=0.95))
        assert [b[0].session_id for b in drain(s, now=1.0)] == ["critical", "p0_old", "p0_new", "p1"]


def test_a_custom_scoring_is_evaluated_at_select_time_with_now():
    seen = []
    s = make_scheduler("deadline_aware", scoring=lambda r, now: seen.append(now) or -abs(now - r.arrived - 1.0))
    s.push(req("a", arrived=0.0))
    s.push(req("b", arrived=2.0))
    assert s.select(1.0)[0].session_id == "a" and seen[-1] == 1.0
    s.push(req("a", seq=1, arrived=0.0))
    assert s.select(3.0)[0].session_id == "b"


def test_custom_scoring_ties_go_to_the_earlier_push_and_batches_share_a_key():
    s = make_scheduler("deadline_aware", scoring=lambda r, now: 0.0)
    for sid, key in [("a", 1), ("b", 2), ("c", 1), ("d", 1)]:
        s.push(req(sid, batch_key=key))
    assert [r.session_id for r in s.select(0.0, 2)] == ["a", "c"]
    assert [r.session_id for r in s.select(0.0, 2)] == ["b"]


# ---- batch_optimized ---------------------------------------------------------------------------------------


def test_batch_optimized_flushes_as_soon_as_max_batch_requests_share_a_key():
    s = make_scheduler("batch_optimized", batch_window_ms=50)
    for i in range(3):
        s.push(req(f"s{i}", arrived=0.0, batch_key="k"))
    s.push(req("other", arrived=0.0, batch_key="j"))
    assert s.select(0.001, 4) == []
    s.push(req("s3", arrived=0.002, batch_key="k"))
    assert {r.session_id for r in s.select(0.002, 4)} == {"s0", "s1", "s2", "s3"}


def test_batch_optimized_flushes_a_partial_batch_when_the_oldest_waited_the_window():
    s = make_scheduler("batch_optimized", batch_window_ms=10)
    s.push(req("a", arrived=1.000))
    s.push(req("b", arrived=1.004))
    assert s.select(1.009, 8) == []
    assert s.next_wakeup(1.009) == pytest.approx(1.010)
    assert [r.session_id for r in s.select(s.next_wakeup(1.009), 8)] == ["a", "b"]
    assert s.next_wakeup(1.02) is None


def test_batch_optimized_window_is_not_postponed_by_replacements():
    s = make_scheduler("batch_optimized", batch_window_ms=10)
    for i in range(20):
        s.push(req("a", seq=i, arrived=1.0 + i * 0.001))
    assert s.next_wakeup(1.0) == pytest.approx(1.010)
    assert [r.seq_id for r in s.select(1.010, 8)] == [19]


@settings(max_examples=80, deadline=None)
@given(
    events=st.lists(st.tuples(st.floats(0, 0.02), st.integers(0, 9), st.integers(0, 2)), min_size=1, max_size=40),
    max_batch=st.integers(1, 5),
    window_ms=st.sampled_from([0.0, 5.0, 10.0]),
)
def test_batch_optimized_releases_exactly_full_or_overdue_groups(events, max_batch, window_ms):
    s = make_scheduler("batch_optimized", batch_window_ms=window_ms)
    window = window_ms / 1000
    now, since, key_of, out = 0.0, {}, {}, 0
    for i, (dt, sess, key) in enumerate(events):
        now += dt
        sid = f"s{sess}"
        s.push(req(sid, seq=i, arrived=now, batch_key=key))
        since.setdefault(sid, now)  # a slot waits from its first request, whatever replaced it
        key_of[sid] = key
        groups = {}
        for x, k in key_of.items():
            groups.setdefault(k, []).append(since[x])
        batch = s.select(now, max_batch)
        ready = {k: v for k, v in groups.items() if len(v) >= max_batch or now >= min(v) + window}
        if not ready:
            assert batch == []
            wake = s.next_wakeup(now)
            assert wake == pytest.approx(min(min(v) for v in groups.values()) + window) and wake > now
            continue
        assert batch, "a ready group must be flushed"
        k = batch[0].batch_key
        assert k in ready and len(batch) == min(max_batch, len(ready[k]))
        assert min(ready[k]) == min(min(v) for v in ready.values()), "the group with the oldest waiter goes first"
        for r in batch:
            del since[r.session_id], key_of[r.session_id]
        out += len(batch)
    assert len(s) == len(key_of)


def test_batch_optimized_rejects_a_negative_window():
    with pytest.raises(ValueError):
        BatchOptimizedScheduler(batch_window_ms=-1)


def test_batch_optimized_holds_for_the_manifests_default_window():
    """One default for the batch window, the manifest's (scheduling.batch_window_ms): the strategy said 10 ms."""
    from server.manifest import SchedulingConfig

    default_ms = SchedulingConfig.__pydantic_fields__["batch_window_ms"].default
    assert make_scheduler("batch_optimized").batch_window_s == pytest.approx(default_ms / 1e3)
