"""The hand-off between the Zenoh callback and a model's dispatch thread(s): one `Mailbox` per model.

    Zenoh callbacks (any thread)                          dispatch thread(s) of this model
    deposit(req) ──► [ lock: per-session slot (newest wins) ──► Scheduler ] ──► take(max_batch) ──► infer
         │            TTL, max_queue_size + overflow_policy        ▲                   │ failed
         ▼                                                         └──── requeue(req) ◄┘ (max_retries)
    DepositResult: superseded / dropped + why          Batch: requests, expired, queue_depth

Owns the queue-management half of scheduling (design 003 "Queue Management", design 004 8.2): a
session has at most one pending request and a newer one replaces it; a full queue obeys
`overflow_policy`; a request older than `request_ttl_ms` is expired; a failed dispatch is retried up
to `max_retries` times unless the session has sent something newer. The Scheduler only orders.

Invariant, "don't drop any data on the floor": every deposited request leaves exactly once, and the
caller is told which way: in `Batch.requests` (dispatched; `requeue` puts it back), as
`DepositResult.superseded` or a refused `RequeueResult` (superseded, counted for `superseded_seqs`),
in `Batch.expired` / `expire()` (requests_expired), as `DepositResult.dropped` (queue_full_drops),
or returned by `remove_session` / `close`. The Mailbox records no metrics; the caller does.

Owns the micro-batch window too (`batch_window_ms`): a partial batch taken from an empty queue waits
up to the window for more arrivals while `senders()` says more sessions could send. A scheduler that
holds partial batches itself (`Scheduler.holds_batches`: batch_optimized) is that window, and the
Mailbox then adds none: a request waits one window, never two.

`deposit` is O(log n) and holds the lock for a few dict and heap operations: the Zenoh callback may
call it. `take` sleeps on a Condition (no polling) until the scheduler selects something, a batch
window or TTL falls due, the timeout passes, or `close()`.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from server.scheduling import DEFAULT_BATCH_WINDOW_MS, Request, Scheduler, make_scheduler

__all__ = ["Mailbox", "DepositResult", "Batch", "RequeueResult", "SchedulingConfig", "OVERFLOW_POLICIES"]


@dataclass(frozen=True)
class DepositResult:
    accepted: bool  # the request is now its session's pending request
    superseded: Request | None = None  # the request replaced (or, if not accepted, the stale incoming one)
    dropped: Request | None = None  # overflow victim: another session's oldest, or the incoming one
    reason: str | None = None  # why `dropped`: the overflow_policy word, or "closed"
    queue_depth: int = 0

    @property
    def error(self) -> bool:
        """The client should get an error event ("reject" policy, or a closed mailbox)."""
        return self.reason in ("reject", "closed")


@dataclass(frozen=True)
class Batch:
    requests: list[Request]  # one forward pass: same batch_key, at most max_batch
    expired: list[Request] = field(default_factory=list)  # outlived request_ttl_ms; tell their clients
    queue_depth: int = 0  # requests still pending after this batch left
    taken_at: float = 0.0  # mailbox clock at selection: queue_wait = taken_at - arrived
    closed: bool = False  # the mailbox is closed: the dispatch loop should exit


@dataclass(frozen=True)
class RequeueResult:
    requeued: bool
    reason: str | None = None  # retries_exhausted | superseded | session_removed | queue_full | closed


@dataclass(frozen=True)
class SchedulingConfig:
    """The manifest's `scheduling:` block (design 003 "Configuration"); the config words are the field names."""

    strategy: str = "round_robin"
    options: Mapping[str, Any] = field(default_factory=dict)  # strategy options, e.g. scoring, batch_window_ms
    max_queue_size: int = 500
    request_ttl_ms: float | None = 5000.0
    overflow_policy: str = "drop_oldest"
    max_retries: int = 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> SchedulingConfig:
        d = dict(d or {})
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"scheduling: unknown keys {unknown}; known: {', '.join(sorted(known))}")
        return cls(**d)


# ---- overflow policies: which request leaves when a new session finds the queue full ------------------------


def _drop_oldest(box: Mailbox, incoming: Request) -> Request:
    return box._evict_oldest()


def _refuse(box: Mailbox, incoming: Request) -> Request:
    return incoming


OVERFLOW_POLICIES: dict[str, Callable[[Mailbox, Request], Request]] = {
    "drop_oldest": _drop_oldest,  # evict the longest-waiting request of another session
    "drop_newest": _refuse,  # refuse the incoming request quietly
    "reject": _refuse,  # refuse it and let the client know (DepositResult.error)
}


class Mailbox:
    """Pending requests of one model, shared by depositing threads and its dispatch thread(s)."""

    def __init__(
        self,
        scheduler: Scheduler | str = "round_robin",
        *,
        model: str = "",
        max_queue_size: int = 500,
        overflow_policy: str = "drop_oldest",
        request_ttl_ms: float | None = 5000.0,
        max_retries: int = 0,
        scheduler_options: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        batch_window_ms: float = DEFAULT_BATCH_WINDOW_MS,
        senders: Callable[[], int] | None = None,
    ):
        """`batch_window_ms` is the gather window of a partial batch, used only with `senders` (how many sessions
        could send now: the gather stops once the batch holds that many); without it a partial batch leaves at once."""
        if overflow_policy not in OVERFLOW_POLICIES:
            raise ValueError(f"unknown overflow_policy {overflow_policy!r}; known: {', '.join(OVERFLOW_POLICIES)}")
        if max_queue_size < 1:
            raise ValueError(f"max_queue_size must be >= 1, got {max_queue_size}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if request_ttl_ms is not None and request_ttl_ms <= 0:
            raise ValueError(f"request_ttl_ms must be > 0 or None, got {request_ttl_ms}")
        if batch_window_ms < 0:
            raise ValueError(f"batch_window_ms must be >= 0, got {batch_window_ms}")
        if isinstance(scheduler, str):
            scheduler = make_scheduler(scheduler, **dict(scheduler_options or {}))
        elif scheduler_options:
            raise ValueError("scheduler_options apply only when the scheduler is given by name")
        self.model = model
        self.scheduler = scheduler
        self.max_queue_size = max_queue_size
        self.overflow_policy = overflow_policy
        self._overflow = OVERFLOW_POLICIES[overflow_policy]
        self.request_ttl_s = None if request_ttl_ms is None else request_ttl_ms / 1000.0
        self.max_retries = max_retries
        self.batch_window_s = batch_window_ms / 1000.0
        self._senders = senders
        self._clock = clock  # scheduling and TTL time; take's timeout is always real time
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._pending: dict[str, Request] = {}  # session -> its one pending request (mirrors the scheduler)
        self._by_age: list[tuple[float, int, Request]] = []  # (arrived, tie, req); stale entries skipped lazily
        self._tie = itertools.count()
        self._latest_seq: dict[str, int] = {}  # session -> seq_id of its last accepted deposit
        self._superseded: dict[str, int] = {}
        self._expired_out: list[Request] = []  # expired while making room; reported by the next take/expire
        self._closed = False

    @classmethod
    def from_config(
        cls,
        config: SchedulingConfig | Mapping[str, Any] | None,
        *,
        model: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> Mailbox:
        c = config if isinstance(config, SchedulingConfig) else SchedulingConfig.from_dict(config)
        return cls(
            c.strategy,
            model=model,
            max_queue_size=c.max_queue_size,
            overflow_policy=c.overflow_policy,
            request_ttl_ms=c.request_ttl_ms,
            max_retries=c.max_retries,
            scheduler_options=c.options,
            clock=clock,
        )

    # ---- depositing side (Zenoh callbacks) ----

    def deposit(self, req: Request) -> DepositResult:
        """Make `req` its session's pending request (newest wins) unless the full queue refuses it."""
        sid = req.session_id
        with self._lock:
            if self._closed:
                return DepositResult(False, dropped=req, reason="closed", queue_depth=len(self._pending))
            old = self._pending.get(sid)
            if old is not None and req.seq_id < old.seq_id:  # reordered delivery: the pending one is newer
                self._superseded[sid] = self._superseded.get(sid, 0) + 1
                return DepositResult(False, superseded=req, queue_depth=len(self._pending))
            dropped = None
            if old is None and len(self._pending) >= self.max_queue_size:
                # an expired request must not cost a live one its place; the next take reports it
                self._expired_out = self._expire_locked(self._clock())
                if len(self._pending) >= self.max_queue_size:
                    dropped = self._overflow(self, req)
                    if dropped is req:
                        return DepositResult(
                            False, dropped=req, reason=self.overflow_policy, queue_depth=len(self._pending)
                        )
            replaced = self._enqueue_locked(req)
            self._latest_seq[sid] = req.seq_id
            if replaced is not None:
                self._superseded[sid] = self._superseded.get(sid, 0) + 1
            self._ready.notify()
            return DepositResult(
                True,
                superseded=replaced,
                dropped=dropped,
                reason=self.overflow_policy if dropped is not None else None,
                queue_depth=len(self._pending),
            )

    def take_superseded(self, session_id: str) -> int:
        """Requests of this session replaced unanswered since the last call: the next chunk's `superseded_seqs`."""
        with self._lock:
            return self._superseded.pop(session_id, 0)

    # ---- dispatching side ----

    def take(self, max_batch: int = 1, timeout_s: float | None = 0.0) -> Batch:
        """The next batch, waiting up to `timeout_s` real seconds (None: until something or close), then, if it is
        partial and the queue empty, up to the batch window for more of its batch_key (see the module doc).

        Returns early with only `expired` filled when requests expired, so their clients hear at once.
        """
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        give_up = None if timeout_s is None else time.monotonic() + timeout_s
        with self._ready:
            batch = self._wait_locked(max_batch, give_up)
            if self._gathers(batch, max_batch):
                batch = self._gather_locked(batch, max_batch)
            return batch

    def _gathers(self, batch: Batch, max_batch: int) -> bool:
        """Whether a micro-batch window pays: one forward pass of 16 costs about what 2 single passes cost, so a
        partial batch waits for more while more sessions could send."""
        return (
            bool(batch.requests)
            and len(batch.requests) < max_batch
            and self.batch_window_s > 0
            and batch.queue_depth == 0
            and not self.scheduler.holds_batches
            and self._senders is not None
            and self._senders() > len(batch.requests)
        )

    def _gather_locked(self, batch: Batch, max_batch: int) -> Batch:
        """Arrivals of the batch's batch_key until the window closes or the batch is full; another batch_key's
        request goes back in line and ends the window (that batch is served next)."""
        close_at = time.monotonic() + self.batch_window_s
        reqs, expired, depth = list(batch.requests), list(batch.expired), batch.queue_depth
        key = reqs[0].batch_key
        while len(reqs) < max_batch and self._senders() > len(reqs) and time.monotonic() < close_at:
            more = self._wait_locked(max_batch - len(reqs), close_at)
            if more.closed:
                break
            expired += more.expired
            depth = more.queue_depth
            reqs += [r for r in more.requests if r.batch_key == key]
            foreign = [r for r in more.requests if r.batch_key != key]
            for r in foreign:
                self._enqueue_locked(r)
            if foreign:
                depth = len(self._pending)
                self._ready.notify()
                break
        return Batch(reqs, expired, depth, batch.taken_at)

    def _wait_locked(self, max_batch: int, give_up: float | None) -> Batch:
        """Under the lock: what the scheduler selects, waiting until `give_up` (time.monotonic) for something."""
        while True:
            now = self._clock()
            expired = self._expire_locked(now)
            if self._closed:
                return Batch([], expired, len(self._pending), now, closed=True)
            batch = self.scheduler.select(now, max_batch) if self._pending else []
            for r in batch:
                del self._pending[r.session_id]
            if batch or expired:
                if batch and self._pending:
                    self._ready.notify()  # another dispatch thread may find more
                return Batch(batch, expired, len(self._pending), now)
            wait = None if give_up is None else give_up - time.monotonic()
            if wait is not None and wait <= 0:
                return Batch([], [], len(self._pending), now)
            due = self._next_due_locked(now)
            if due is not None:
                # floor: a wake-up already due (clock granularity) must not turn into a busy loop
                wait = max(due - now, 1e-3) if wait is None else min(wait, max(due - now, 1e-3))
            self._ready.wait(wait)

    def expire(self) -> list[Request]:
        """Remove and return the requests that outlived `request_ttl_ms` (and any expired while making room)."""
        with self._lock:
            return self._expire_locked(self._clock())

    def requeue(self, req: Request) -> RequeueResult:
        """Put a request whose dispatch failed back in line, unless retries are spent or it is stale."""
        sid = req.session_id
        with self._lock:
            if self._closed:
                return RequeueResult(False, "closed")
            if req.retries >= self.max_retries:
                return RequeueResult(False, "retries_exhausted")
            if sid not in self._latest_seq:
                return RequeueResult(False, "session_removed")
            if sid in self._pending or self._latest_seq[sid] != req.seq_id:
                self._superseded[sid] = self._superseded.get(sid, 0) + 1  # the client never gets this answer
                return RequeueResult(False, "superseded")
            if len(self._pending) >= self.max_queue_size:
                return RequeueResult(False, "queue_full")
            req.retries += 1
            self._enqueue_locked(req)
            self._ready.notify()
            return RequeueResult(True)

    # ---- lifecycle ----

    def remove_session(self, session_id: str) -> Request | None:
        """Forget a closed session; returns its pending request, which will not be served."""
        with self._lock:
            self._latest_seq.pop(session_id, None)
            self._superseded.pop(session_id, None)
            req = self._pending.pop(session_id, None)
            if req is not None:
                self.scheduler.remove(session_id)
            return req

    def close(self) -> list[Request]:
        """Refuse further deposits, wake every waiter, and return every request still held (unserved)."""
        with self._ready:
            self._closed = True
            left = self._expired_out + [r for sid in list(self._pending) if (r := self.scheduler.remove(sid))]
            self._expired_out = []
            self._pending.clear()
            self._by_age.clear()
            self._ready.notify_all()
            return left

    @property
    def closed(self) -> bool:
        return self._closed

    def depth(self) -> int:
        """Sessions with a pending request."""
        with self._lock:
            return len(self._pending)

    def __len__(self) -> int:
        return self.depth()

    # ---- under the lock ----

    def _enqueue_locked(self, req: Request) -> Request | None:
        replaced = self.scheduler.push(req)
        self._pending[req.session_id] = req
        heapq.heappush(self._by_age, (req.arrived, next(self._tie), req))
        if len(self._by_age) > 2 * len(self._pending) + 64:
            self._by_age = [e for e in self._by_age if self._pending.get(e[2].session_id) is e[2]]
            heapq.heapify(self._by_age)
        return replaced

    def _oldest_locked(self) -> Request | None:
        heap = self._by_age
        while heap and self._pending.get(heap[0][2].session_id) is not heap[0][2]:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def _evict_oldest(self) -> Request:
        victim = self._oldest_locked()
        heapq.heappop(self._by_age)
        del self._pending[victim.session_id]
        self.scheduler.remove(victim.session_id)
        return victim

    def _expire_locked(self, now: float) -> list[Request]:
        out, self._expired_out = self._expired_out, []
        if self.request_ttl_s is not None:
            while (oldest := self._oldest_locked()) is not None and now - oldest.arrived >= self.request_ttl_s:
                heapq.heappop(self._by_age)
                del self._pending[oldest.session_id]
                self.scheduler.remove(oldest.session_id)
                out.append(oldest)
        return out

    def _next_due_locked(self, now: float) -> float | None:
        """The earliest clock time something may become selectable or expire without a deposit."""
        due = self.scheduler.next_wakeup(now) if self._pending else None
        if self.request_ttl_s is not None and (oldest := self._oldest_locked()) is not None:
            ttl_due = oldest.arrived + self.request_ttl_s
            due = ttl_due if due is None else min(due, ttl_due)
        return due
