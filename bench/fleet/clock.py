"""Clock offsets between the runner and its children: every instant a run passes between processes is a
`time.monotonic()` value, and two hosts' monotonic clocks do not compare.

    runner                          child (a shard over the control channel, a replica's node over Ray)
      t1 = runner's clock ── ping ──►  t2 = child's clock on receipt
      t4 = runner's clock ◄── pong ──  t3 = child's clock on reply

One exchange (NTP's): offset = ((t2 - t1) + (t3 - t4)) / 2 and round trip = (t4 - t1) - (t3 - t2). Whatever
the path's delays, the true offset lies within round trip / 2 of the estimate (the reply cannot arrive
before it was sent), so a `ClockOffset` carries that bound as its uncertainty; of several exchanges the
one with the smallest round trip is kept (`estimate`).

Sign: `offset_s` is child clock minus runner clock, so `runner_instant + offset_s` is the same instant on
the child's clock, and `child_instant - offset_s` is it on the runner's.

Invariant: a child on the runner's host shares its clock (Linux's CLOCK_MONOTONIC is host-wide), and its
estimate is always within its uncertainty of 0; such a child's offset is taken as exactly 0
(`same_clock`), so a one-host run's instants are used as they were, with no measurement error added.

`BENCH_TEST_MONO_SKEW_S` (tests only): a process that calls `apply_test_skew()` at start reads its
monotonic clock shifted by that many seconds, as a process on another host would. The runner passes it to
every shard; `BENCH_TEST_REPLICA_MONO_SKEW_S` gives cluster replicas (and their actors' clock) theirs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

TEST_SKEW_ENV = "BENCH_TEST_MONO_SKEW_S"
# tests only, `bench run --cluster ray`: each replica (and its ChildActor's `mono()`) reads its clock this far off
REPLICA_TEST_SKEW_ENV = "BENCH_TEST_REPLICA_MONO_SKEW_S"
EXCHANGES = 8  # pings per measurement: the smallest round trip of these is kept


@dataclass(frozen=True)
class ClockOffset:
    """Child clock minus runner clock, and the bound on its error (the kept exchange's round trip / 2)."""

    offset_s: float
    uncertainty_s: float
    rtt_s: float
    exchanges: int = 1
    same_clock: bool = False  # the child is on the runner's host: offset exactly 0, no error

    def to_child(self, runner_instant: float) -> float:
        return runner_instant + self.offset_s

    def to_runner(self, child_instant: float) -> float:
        return child_instant - self.offset_s

    def to_json(self) -> dict:
        d = asdict(self)
        return {
            "offset_ms": round(d.pop("offset_s") * 1e3, 3),
            "uncertainty_ms": round(d.pop("uncertainty_s") * 1e3, 3),
            "rtt_ms": round(d.pop("rtt_s") * 1e3, 3),
            **d,
        }


SAME_CLOCK = ClockOffset(0.0, 0.0, 0.0, 0, same_clock=True)


def exchange(t1: float, t2: float, t3: float, t4: float) -> ClockOffset:
    """One ping/pong: t1, t4 on the runner's clock (send, receipt), t2, t3 on the child's (receipt, reply)."""
    rtt = max(0.0, (t4 - t1) - (t3 - t2))
    return ClockOffset(((t2 - t1) + (t3 - t4)) / 2.0, rtt / 2.0, rtt)


def estimate(samples: Iterable[tuple[float, float, float, float]]) -> ClockOffset:
    """The exchange with the smallest round trip among `samples` (t1, t2, t3, t4); ValueError if there is none."""
    got = [exchange(*s) for s in samples]
    if not got:
        raise ValueError("no clock exchange completed")
    best = min(got, key=lambda o: o.rtt_s)
    return ClockOffset(best.offset_s, best.uncertainty_s, best.rtt_s, len(got))


def measure(ask: Callable[[], float], clock: Callable[[], float] = time.monotonic, n: int = EXCHANGES) -> ClockOffset:
    """`n` exchanges where `ask()` returns the child's clock read while it handled the request (t2 = t3)."""
    samples = []
    for _ in range(n):
        t1 = clock()
        t2 = ask()
        t4 = clock()
        samples.append((t1, t2, t2, t4))
    return estimate(samples)


def combine(a: ClockOffset, b: ClockOffset) -> ClockOffset:
    """Two measurements of one child (a run's start and end): the smallest interval holding both of theirs. The
    offset drifts between them over the run (linearly, for two clocks running at steady rates), so at every
    instant of the run it lies in that interval."""
    if a.same_clock and b.same_clock:
        return a
    lo = min(a.offset_s - a.uncertainty_s, b.offset_s - b.uncertainty_s)
    hi = max(a.offset_s + a.uncertainty_s, b.offset_s + b.uncertainty_s)
    return ClockOffset((lo + hi) / 2.0, (hi - lo) / 2.0, min(a.rtt_s, b.rtt_s), a.exchanges + b.exchanges)


def settle(offset: ClockOffset, same_host: bool) -> ClockOffset:
    """A child on this host whose estimate is within its error of 0 shares this host's clock: exactly 0."""
    if same_host and abs(offset.offset_s) <= offset.uncertainty_s:
        return ClockOffset(0.0, 0.0, offset.rtt_s, offset.exchanges, same_clock=True)
    return offset


def apply_test_skew() -> float:
    """Tests only: shift this process's `time.monotonic` / `time.monotonic_ns` by BENCH_TEST_MONO_SKEW_S seconds.

    Every reader that looks the functions up on the `time` module (the shard, its engines, the control channel)
    then sees another host's clock; waits and timeouts are durations and are unaffected. Returns the skew."""
    raw = os.environ.get(TEST_SKEW_ENV)
    if not raw:
        return 0.0
    skew = float(raw)
    real, real_ns = time.monotonic, time.monotonic_ns
    skew_ns = int(round(skew * 1e9))
    time.monotonic = lambda: real() + skew
    time.monotonic_ns = lambda: real_ns() + skew_ns
    return skew
