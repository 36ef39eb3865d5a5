"""ActionQueue against a plain reference model of LeRobot's rules (hypothesis state machine)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from edge.queue import ActionQueue

A = 2


class Reference:
    """The rules of the issue, as lists: no numpy views, no locks."""

    def __init__(self, rtc: bool, trim: str):
        self.rtc, self.trim = rtc, trim
        self.orig: list | None = None
        self.proc: list | None = None
        self.cursor = 0

    def get(self):
        if self.proc is None or self.cursor >= len(self.proc):
            return None
        self.cursor += 1
        return self.proc[self.cursor - 1]

    def merge(self, orig, proc, real_delay, idx_before):
        delay = real_delay
        if idx_before is not None and self.trim == "consumed":
            delay = min(real_delay, max(0, self.cursor - idx_before))
        if self.rtc:
            d = max(0, min(delay, len(orig), len(proc)))
            self.orig, self.proc, self.cursor = orig[d:], proc[d:], 0
        elif self.proc is None:
            self.orig, self.proc, self.cursor = list(orig), list(proc), 0
        else:
            self.orig = self.orig[self.cursor :] + list(orig)
            self.proc = self.proc[self.cursor :] + list(proc)
            self.cursor = 0


class QueueMachine(RuleBasedStateMachine):
    counter = 0

    @initialize(rtc=st.booleans(), trim=st.sampled_from(["real_delay", "consumed"]))
    def setup(self, rtc, trim):
        self.q = ActionQueue(rtc, trim, action_dim=A)
        self.ref = Reference(rtc, trim)
        self.idx_before = None

    @rule()
    def get(self):
        got = self.q.get()
        want = self.ref.get()
        if want is None:
            assert got is None
        else:
            assert got is not None and np.array_equal(got, np.asarray(want[1], np.float32))

    @rule()
    def snapshot_index(self):
        self.idx_before = self.q.get_action_index()
        assert self.idx_before == self.ref.cursor

    @rule()
    def size_and_snapshot(self):
        """The two reads notify_observation takes under one lock equal the two taken apart."""
        size, snap = self.q.size_and_snapshot()
        assert size == self.q.qsize() == (0 if self.ref.proc is None else len(self.ref.proc) - self.ref.cursor)
        assert snap == self.q.snapshot()

    @rule()
    def get_several(self):
        for _ in range(4):
            self.get()

    @rule(n=st.integers(1, 12), delay=st.integers(-3, 15), use_idx=st.booleans())
    def merge(self, n, delay, use_idx):
        QueueMachine.counter += 1
        base = QueueMachine.counter * 100
        rows = [(base + i, base + i + 0.5) for i in range(n)]
        orig = np.asarray([[r[0], -r[0]] for r in rows], np.float32).reshape(n, A)
        proc = np.asarray([[r[1], -r[1]] for r in rows], np.float32).reshape(n, A)
        idx = self.idx_before if use_idx else None
        self.q.merge(orig, proc, delay, idx)
        self.ref.merge([(r[0], [r[0], -r[0]]) for r in rows], [(r[1], [r[1], -r[1]]) for r in rows], delay, idx)
        self.idx_before = None

    @rule(
        bad=st.one_of(
            # a NaN or an infinity anywhere, in either space
            st.tuples(
                st.integers(1, 12),
                st.integers(0, 11),
                st.integers(0, A - 1),
                st.booleans(),
                st.sampled_from([np.nan, np.inf, -np.inf, 1e300]),
            ).map(lambda t: ("value",) + t),
            st.tuples(st.integers(0, 12), st.integers(0, 5))
            .filter(lambda t: t[0] == 0 or t[1] != A)
            .map(lambda t: ("shape",) + t),  # no rows, or another action width
            st.sampled_from([np.int32, np.int64, np.uint8, np.bool_]).map(lambda t: ("dtype", t)),
        ),
        delay=st.integers(-3, 15),
    )
    def merge_refused(self, bad, delay):
        """A bad chunk raises and leaves the queue as it was (the reference is not told): never a row of it
        executed, never the leftover lost."""
        if bad[0] == "value":
            _, n, row, col, in_model, value = bad
            orig, proc = np.ones((n, A)), np.ones((n, A))
            (orig if in_model else proc)[row % n, col] = value
        elif bad[0] == "shape":
            orig = proc = np.ones((bad[1], bad[2]), np.float32)
        else:
            orig = proc = np.ones((3, A), bad[1])
        with pytest.raises(ValueError):
            self.q.merge(orig, proc, delay, self.idx_before)

    @precondition(lambda self: hasattr(self, "q"))
    @invariant()
    def every_row_is_finite_and_as_wide_as_the_queue(self):
        rows = self.q.get_processed_left_over()
        assert rows is None or (rows.shape[1] == A and np.isfinite(rows).all())

    @precondition(lambda self: hasattr(self, "q"))
    @invariant()
    def same_leftovers(self):
        left = self.q.get_left_over()
        if self.ref.orig is None:
            assert left is None and self.q.qsize() == 0
            return
        want = np.asarray([r[1] for r in self.ref.orig[self.ref.cursor :]], np.float32).reshape(-1, A)
        assert np.array_equal(left, want)
        wantp = np.asarray([r[1] for r in self.ref.proc[self.ref.cursor :]], np.float32).reshape(-1, A)
        assert np.array_equal(self.q.get_processed_left_over(), wantp)
        assert self.q.qsize() == len(self.ref.proc) - self.ref.cursor
        assert self.q.get_action_index() == self.ref.cursor

    @rule()
    def clear(self):
        self.q.clear()
        self.ref = Reference(self.ref.rtc, self.ref.trim)


TestQueueMachine = QueueMachine.TestCase
TestQueueMachine.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


def test_first_chunk_from_standstill_is_not_over_trimmed_with_trim_consumed():
    """Open risk 2: a 700 ms first inference trims 21 of 30 actions by latency although none was consumed."""
    chunk = np.arange(60, dtype=np.float32).reshape(30, 2)
    lerobot = ActionQueue(True, "real_delay")
    lerobot.merge(chunk, chunk, 21, action_index_before_inference=0)
    fixed = ActionQueue(True, "consumed")
    fixed.merge(chunk, chunk, 21, action_index_before_inference=0)
    assert lerobot.qsize() == 9 and fixed.qsize() == 30


def test_reads_are_copies():
    q = ActionQueue(True)
    chunk = np.zeros((4, 2), np.float32)
    q.merge(chunk, chunk, 0)
    q.get_left_over()[:] = 7
    a = q.get()
    a[:] = 9
    assert np.all(q.get_left_over() == 0) and np.all(q.get() == 0)
    chunk[:] = 5  # the caller's array is not aliased either
    assert np.all(q.get() == 0)


@pytest.mark.parametrize(
    "orig,proc,words",
    [
        (np.zeros(3), np.zeros(3), "2-D"),
        (np.zeros((3, 2)), np.zeros((4, 2)), "rows"),
        (np.zeros((0, 2)), np.zeros((0, 2)), "T, A >= 1"),
        (np.zeros((3, 2), np.int32), np.zeros((3, 2), np.int32), "floating point"),
        (np.zeros((3, 2)), np.full((3, 2), np.nan), "non-finite"),
        (np.full((3, 2), np.inf), np.zeros((3, 2)), "non-finite"),
        (np.zeros((3, 2)), np.full((3, 2), 1e300), "non-finite"),  # float64 beyond float32: inf after the cast
    ],
)
def test_bad_shapes_are_refused(orig, proc, words):
    with pytest.raises(ValueError, match=words):
        ActionQueue(True).merge(orig, proc, 0)


def test_action_dimension_may_not_change():
    q = ActionQueue(False)
    q.merge(np.zeros((3, 2)), np.zeros((3, 2)), 0)
    with pytest.raises(ValueError, match="action dims"):
        q.merge(np.zeros((3, 3)), np.zeros((3, 3)), 0)


def test_a_queue_with_an_action_dim_refuses_another_width_even_when_empty():
    """After a clear (an episode reset) the first chunk set the width: a remote server's chunk of 5 columns
    for a 3-action robot was executed as 5-wide actions."""
    q = ActionQueue(True, action_dim=3)
    with pytest.raises(ValueError, match="5 action dims; the queue holds 3"):
        q.merge(np.zeros((4, 5), np.float32), np.zeros((4, 5), np.float32), 0)
    assert q.qsize() == 0
    q.merge(np.zeros((4, 3), np.float32), np.zeros((4, 3), np.float32), 0)
    q.clear()
    with pytest.raises(ValueError, match="action dims"):
        q.merge(np.zeros((4, 1), np.float32), np.zeros((4, 1), np.float32), 0)


def test_a_refused_chunk_keeps_the_queue_and_its_snapshot():
    q = ActionQueue(True, "consumed", action_dim=2)
    q.merge(np.ones((4, 2)), np.ones((4, 2)), 0)
    snap = q.snapshot()
    with pytest.raises(ValueError, match="non-finite"):
        q.merge(np.ones((4, 2)), np.full((4, 2), np.nan), 0)
    assert q.qsize() == 4 and q.left_over_at(snap) is not None  # nothing merged: the snapshot still holds


def test_provenance_travels_with_each_row():
    q = ActionQueue(True)
    q.merge(np.zeros((5, 2)), np.ones((5, 2)), 2, meta="chunk-7")
    values, meta, index = q.get_with_meta()
    assert meta == "chunk-7" and index == 2 and np.all(values == 1)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 50), st.integers(1, 50))
def test_concurrent_gets_and_merges_never_duplicate_or_invent_rows(n_merges, rows):
    q = ActionQueue(False)
    seen: list[float] = []
    done = threading.Event()

    def reader():
        while not done.is_set() or q.qsize():
            a = q.get()
            if a is not None:
                seen.append(float(a[0]))

    t = threading.Thread(target=reader)
    t.start()
    for m in range(n_merges):
        vals = np.arange(m * rows, (m + 1) * rows, dtype=np.float32)
        chunk = np.stack([vals, vals], axis=1)
        q.merge(chunk, chunk, 0)
    done.set()
    t.join()
    assert seen == sorted(seen) and len(seen) == len(set(seen)) == n_merges * rows


def test_skip_source_drops_one_stale_merge_and_keeps_the_next_in_append_mode():
    q = ActionQueue(rtc_enabled=False)
    old, new = object(), object()
    q.merge(np.zeros((3, A), np.float32), np.zeros((3, A), np.float32), 0, meta=old)
    q.merge(np.ones((2, A), np.float32), np.ones((2, A), np.float32), 0, meta=new)
    first = q.get_with_meta()
    assert first[1] is old
    assert q.skip_source(old) == 2  # the rest of the stale chunk
    values, meta, index = q.get_with_meta()
    assert meta is new and index == 0 and values.tolist() == [1.0] * A
    assert q.skip_source(old) == 0 and q.qsize() == 1


def test_switching_to_append_keeps_the_leftover_at_the_next_merge():
    q = ActionQueue(rtc_enabled=True)
    q.merge(np.zeros((4, A), np.float32), np.zeros((4, A), np.float32), 0)
    q.set_rtc_enabled(False)
    q.merge(np.ones((2, A), np.float32), np.ones((2, A), np.float32), 1)
    assert q.qsize() == 6  # appended, untrimmed: append mode ignores real_delay


def test_a_snapshot_reads_the_leftover_of_its_tick_until_the_next_merge_or_clear():
    q = ActionQueue(rtc_enabled=True, trim="consumed")
    assert q.left_over_at(q.snapshot()) == (None, None, 0)
    chunk = np.arange(10, dtype=np.float32).reshape(5, 2)
    q.merge(chunk, chunk * 10, 0)
    q.get()
    at_tick = q.snapshot()  # the observation's tick, before its own get
    q.get()
    model, robot, cursor = q.left_over_at(at_tick)
    assert cursor == 1 and np.array_equal(model, chunk[1:]) and np.array_equal(robot, chunk[1:] * 10)
    model[0] = -1  # a copy
    assert q.left_over_at(at_tick)[0][0, 0] == chunk[1, 0]
    q.merge(chunk, chunk, 1, 1)
    assert q.left_over_at(at_tick) is None  # the rows it pointed at are gone
    at_tick = q.snapshot()
    q.clear()
    assert q.left_over_at(at_tick) is None


def test_left_over_since_is_the_snapshots_leftover_else_the_queue_now():
    q = ActionQueue(rtc_enabled=True, trim="consumed")
    chunk = np.arange(10, dtype=np.float32).reshape(5, 2)
    q.merge(chunk, chunk * 10, 0)
    at_tick = q.snapshot()
    q.get()
    model, robot, cursor = q.left_over_since(at_tick)
    assert cursor == 0 and np.array_equal(model, chunk) and np.array_equal(robot, chunk * 10)
    q.merge(chunk + 1, chunk + 1, 0)  # a merge since: the snapshot's rows are gone, so the queue now
    model, _, cursor = q.left_over_since(at_tick)
    assert cursor == q.get_action_index() and np.array_equal(model, q.get_left_over())
    assert q.left_over_since(None)[2] == q.get_action_index()
