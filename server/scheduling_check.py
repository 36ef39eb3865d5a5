"""The scheduling contract as a test: `check_scheduler`, which any strategy can run.

It asserts on a fresh strategy what every server.scheduling.Scheduler promises: one pending request per session,
newest wins, batches of one batch_key and at most max_batch, every request selected exactly once, a holding
strategy says when to ask again.

Re-exported by server.scheduling; run by tests/server/test_scheduling.py on every registered strategy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.scheduling import Scheduler


def check_scheduler(make: Callable[[], Scheduler], max_batch: int = 3) -> None:
    """Assert the Scheduler contract on a fresh instance from `make` (raises AssertionError)."""
    from server.scheduling import Request

    s = make()
    assert len(s) == 0 and s.select(0.0, max_batch) == [] and s.depth() == 0
    reqs = [
        Request(
            f"s{i}",
            f"c{i}",
            "m" if i % 3 else "n",
            seq_id=1,
            arrived=i * 0.001,
            urgency=(i % 5) / 4,
            priority=i % 2,
            batch_key=i % 2,
        )
        for i in range(12)
    ]
    for r in reqs:
        assert s.push(r) is None
    assert len(s) == 12 and s.depth("n") == 4 and s.depth("m") == 8
    newer = Request("s0", "c0", "n", seq_id=2, arrived=0.02, batch_key=0)
    assert s.push(newer) is reqs[0], "push must return the replaced request of the same session"
    assert len(s) == 12
    assert s.remove("s1") is reqs[1] and s.remove("s1") is None and len(s) == 11
    out: list[Request] = []
    now = 0.05
    while len(s):
        batch = s.select(now, max_batch)
        assert len(batch) <= max_batch
        assert len({r.batch_key for r in batch}) <= 1, "a batch shares one batch_key"
        out += batch
        if not batch:
            wake = s.next_wakeup(now)
            assert wake is not None and wake > now, "a holding scheduler must say when to ask again"
            now = wake
    left = set(reqs[2:]) | {newer}
    assert set(out) == left and len(out) == len(left), "every pending request is selected exactly once"
    assert s.depth() == 0 and s.depth("m") == 0
