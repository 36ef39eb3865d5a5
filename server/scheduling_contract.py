"""The scheduling contract: the `Request` a strategy orders, the `Scheduler` base every strategy implements, and
`check_scheduler`, the contract as a test any strategy can run.

server.scheduling holds the strategies, their registries and the deadline scoring, and re-exports these names.
The contract itself is stated there and on `Scheduler`: at most one pending request per session, newest wins,
batches of one batch_key and at most max_batch, nothing pushed is lost.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(eq=False)  # identity equality: payloads are arrays, and two requests are never "the same" by value
class Request:
    """One observation waiting for inference, as the dispatch side sees it."""

    session_id: str
    client: str  # client uuid: the `client` metrics label
    model: str  # model key: the `model` metrics label
    seq_id: int
    arrived: float  # server monotonic clock, seconds
    urgency: float = 0.5  # 0 (can wait) .. 1 (critical), per observation
    priority: int = 0  # 0 = highest
    steps_remaining: int | None = None  # actions left in the robot's current chunk when it asked
    cadence_s: float | None = None  # the session's expected request period
    latency_budget_ms: float | None = None
    batch_key: Hashable = None  # equal keys may share one forward pass
    payload: Any = field(default=None, repr=False)
    retries: int = 0


class Scheduler(ABC):
    """Pending requests of one mailbox, at most one per session, and the rule that picks the next batch.

    The public contract is `push`, `remove`, `select`, `next_wakeup`, `len()` and `depth`. This base
    keeps the per-session slots (latest-only) and the per-model counts; a strategy only orders them by
    implementing `_enqueue`, `_dequeue` and `_select`, and calls `_take` for each request it selects.
    """

    name: ClassVar[str] = ""
    # True: `select` itself holds a partial batch for a window (`next_wakeup` says until when), so the
    # Mailbox adds no gather window of its own (one window, not two).
    holds_batches: ClassVar[bool] = False

    def __init__(self) -> None:
        self._slots: dict[str, Request] = {}
        self._per_model: Counter[str] = Counter()

    def push(self, req: Request) -> Request | None:
        """Make `req` its session's pending request; returns the request it replaced, if any."""
        old = self._slots.get(req.session_id)
        if old is not None:
            self._count_out(old)
        self._slots[req.session_id] = req
        self._per_model[req.model] += 1
        self._enqueue(req, old)
        return old

    def remove(self, session_id: str) -> Request | None:
        """Drop that session's pending request and return it (None if it had none)."""
        req = self._slots.pop(session_id, None)
        if req is not None:
            self._count_out(req)
            self._dequeue(req)
        return req

    def select(self, now: float, max_batch: int = 1) -> list[Request]:
        """Remove and return the next batch (same batch_key, <= max_batch); [] when empty or holding."""
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if not self._slots:
            return []
        return self._select(now, max_batch)

    def next_wakeup(self, now: float) -> float | None:
        """When `select` may return something without another push (batch windows); None: only a push can."""
        return None

    def __len__(self) -> int:
        return len(self._slots)

    def depth(self, model: str | None = None) -> int:
        """Pending sessions, of one model or of all."""
        return len(self._slots) if model is None else self._per_model.get(model, 0)

    def pending(self, session_id: str) -> Request | None:
        return self._slots.get(session_id)

    # -- what a strategy implements --
    @abstractmethod
    def _enqueue(self, req: Request, replaced: Request | None) -> None:
        """Order `req`; `replaced` (same session) is no longer pending and must never be selected."""

    @abstractmethod
    def _dequeue(self, req: Request) -> None:
        """Forget `req` (removed); lazy deletion is fine: `self._is_pending(req)` turns False."""

    @abstractmethod
    def _select(self, now: float, max_batch: int) -> list[Request]:
        """Pick the batch among pending requests and `_take` each one."""

    # -- helpers for strategies --
    def _is_pending(self, req: Request) -> bool:
        return self._slots.get(req.session_id) is req

    def _take(self, req: Request) -> Request:
        del self._slots[req.session_id]
        self._count_out(req)
        return req

    def _count_out(self, req: Request) -> None:
        n = self._per_model[req.model] - 1
        if n:
            self._per_model[req.model] = n
        else:
            del self._per_model[req.model]


# ---- the contract as a test ----------------------------------------------------------------------------------


def check_scheduler(make: Callable[[], Scheduler], max_batch: int = 3) -> None:
    """Assert the Scheduler contract on a fresh instance from `make` (raises AssertionError)."""
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
