"""Which pending request runs next: the policy server's scheduling strategies, keyed by the config word.

    Zenoh callbacks ──deposit──► Mailbox ──take(max_batch)──► dispatch thread ──► ModelRuntime.infer
                                 │     ▲     (server/mailbox.py: one per model; lock, TTL, overflow, retries)
                   push / remove ▼     │ select(now, max_batch)
                                Scheduler (this module: only the order)

Contract of every strategy (`Scheduler`): it holds at most one pending request per session, and a
`push` for a session that is already pending replaces that request and returns the replaced one
(newest wins, design 004 8.2). `select` removes and returns what runs next: one batch, all with the
same `batch_key`, at most `max_batch`; empty when nothing is pending or when the strategy is holding
for a fuller batch, in which case `next_wakeup` says when to ask again. Nothing pushed is lost: every
request leaves by `select`, by `remove`, or as the return value of the `push` that replaced it.
Schedulers are not thread-safe; the Mailbox calls them under its lock.

Strategies (`scheduling.strategy`): round_robin (default), deadline_aware, model_deadline,
priority_tiered, batch_optimized; add one with `@register_scheduler("word")`. Scoring functions for
deadline_aware and model_deadline (`scheduling.options.scoring`): `@register_scoring("word")`.
The contract's types and its test, `Request`, `Scheduler` and `check_scheduler`, live in
server/scheduling_contract.py and are re-exported here.
"""

from __future__ import annotations

import heapq
import inspect
import itertools
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any, ClassVar

from server.scheduling_contract import Request, Scheduler, check_scheduler

__all__ = [
    "Request",
    "Scheduler",
    "ScoringFn",
    "register_scheduler",
    "make_scheduler",
    "scheduler_names",
    "register_scoring",
    "get_scoring",
    "scoring_names",
    "deadline",
    "deadline_key",
    "deadline_score",
    "RoundRobinScheduler",
    "DeadlineAwareScheduler",
    "ModelDeadlineScheduler",
    "PriorityTieredScheduler",
    "BatchOptimizedScheduler",
    "check_scheduler",
    "DEFAULT_BATCH_WINDOW_MS",
]

# How long a partial batch waits for more sessions: the manifest's `scheduling.batch_window_ms` default
# (server/manifest/sections.py takes it from here), held by batch_optimized or gathered by the Mailbox.
DEFAULT_BATCH_WINDOW_MS = 2.0


# ---- deadline scoring ------------------------------------------------------------------------------------

DEFAULT_HORIZON_S = 0.1
URGENCY_WEIGHT_S = 0.05
PRIORITY_WEIGHT_S = 0.1


def deadline(req: Request, default_horizon_s: float = DEFAULT_HORIZON_S) -> float:
    """When the answer stops being useful (server clock): `arrived + horizon`.

    horizon = min(steps_remaining * cadence_s, latency_budget_ms / 1000) over the terms that are known;
    else cadence_s (the session's next request supersedes this one one period later); else
    `default_horizon_s`. The slack of the brief, `steps_remaining * cadence_s - age`, is `deadline - now`.
    """
    terms = []
    if req.steps_remaining is not None and req.cadence_s is not None:
        terms.append(req.steps_remaining * req.cadence_s)
    if req.latency_budget_ms is not None:
        terms.append(req.latency_budget_ms / 1000.0)
    if terms:
        horizon = min(terms)
    elif req.cadence_s is not None:
        horizon = req.cadence_s
    else:
        horizon = default_horizon_s
    return req.arrived + horizon


def deadline_key(
    req: Request,
    urgency_weight_s: float = URGENCY_WEIGHT_S,
    priority_weight_s: float = PRIORITY_WEIGHT_S,
    default_horizon_s: float = DEFAULT_HORIZON_S,
) -> float:
    """Smaller runs sooner: `deadline - urgency_weight_s * urgency + priority_weight_s * priority` (seconds).

    Urgency 1 is worth `urgency_weight_s` of extra slack, each priority level costs `priority_weight_s`.
    It does not depend on `now`: every request's slack shrinks at the same rate, so a heap stays ordered.
    """
    return deadline(req, default_horizon_s) - urgency_weight_s * req.urgency + priority_weight_s * req.priority


def deadline_score(req: Request, now: float) -> float:
    """The built-in scoring `deadline` as a `ScoringFn`: `now - deadline_key(req)` = -(slack) + bonuses."""
    return now - deadline_key(req)


# ---- registries --------------------------------------------------------------------------------------------

ScoringFn = Callable[[Request, float], float]  # (request, now) -> score; higher is dispatched sooner

_SCHEDULERS: dict[str, Callable[..., Scheduler]] = {}
_SCORINGS: dict[str, ScoringFn] = {}


def _known(kind: str, name: str, names: Iterable[str]) -> ValueError:
    return ValueError(f"unknown {kind} {name!r}; known: {', '.join(sorted(names))}")


def register_scheduler(name: str) -> Callable:
    """Class (or factory) decorator: `scheduling.strategy: <name>` builds it with `scheduling.options`."""

    def deco(factory):
        if _SCHEDULERS.get(name, factory) is not factory:
            raise ValueError(f"scheduler {name!r} is already registered")
        _SCHEDULERS[name] = factory
        if isinstance(factory, type):
            factory.name = name
        return factory

    return deco


def make_scheduler(name: str, **options: Any) -> Scheduler:
    """A fresh scheduler by its config word; unknown names and options raise ValueError naming the known ones."""
    try:
        factory = _SCHEDULERS[name]
    except KeyError:
        raise _known("scheduler", name, _SCHEDULERS) from None
    try:
        inspect.signature(factory).bind(**options)
    except TypeError:
        params = [p for p in inspect.signature(factory).parameters if p != "self"]
        raise ValueError(f"scheduler {name!r} got options {sorted(options)}; it accepts {params or 'none'}") from None
    return factory(**options)


def scheduler_names() -> list[str]:
    return sorted(_SCHEDULERS)


def register_scoring(name: str) -> Callable[[ScoringFn], ScoringFn]:
    """Function decorator: `fn(req, now) -> float`, higher = dispatched sooner, ties go to the earlier push.

    Used as `make_scheduler("deadline_aware", scoring=name)`. A custom scoring is evaluated for every
    pending request at each `select` (O(n)); only the built-in `deadline` rides a heap.
    """

    def deco(fn: ScoringFn) -> ScoringFn:
        if _SCORINGS.get(name, fn) is not fn:
            raise ValueError(f"scoring {name!r} is already registered")
        _SCORINGS[name] = fn
        return fn

    return deco


def get_scoring(name: str) -> ScoringFn:
    try:
        return _SCORINGS[name]
    except KeyError:
        raise _known("scoring", name, _SCORINGS) from None


def scoring_names() -> list[str]:
    return sorted(_SCORINGS)


register_scoring("deadline")(deadline_score)


# ---- round_robin ---------------------------------------------------------------------------------------------


@register_scheduler("round_robin")
class RoundRobinScheduler(Scheduler):
    """Strict rotation over sessions with a pending request (design 004 8.2): starvation is impossible.

    Sessions wait in one line; a replaced request keeps its session's place, a served session rejoins at
    the back when it next pushes, so each pending session is served once before any is served twice.
    A batch is the head of the line plus the next sessions in line with the head's batch_key; the others
    keep their places. A session whose batch_key changes rejoins at the back.
    """

    def __init__(self) -> None:
        super().__init__()
        self._line: OrderedDict[str, None] = OrderedDict()
        self._by_key: dict[Hashable, OrderedDict[str, None]] = {}  # each is a subsequence of _line

    def _enqueue(self, req: Request, replaced: Request | None) -> None:
        sid = req.session_id
        if replaced is not None and replaced.batch_key == req.batch_key:
            return
        if replaced is not None:
            self._unlink(sid, replaced.batch_key)
        self._line[sid] = None
        self._by_key.setdefault(req.batch_key, OrderedDict())[sid] = None

    def _dequeue(self, req: Request) -> None:
        self._unlink(req.session_id, req.batch_key)

    def _unlink(self, sid: str, key: Hashable) -> None:
        del self._line[sid]
        group = self._by_key[key]
        del group[sid]
        if not group:
            del self._by_key[key]

    def _select(self, now: float, max_batch: int) -> list[Request]:
        head = self._slots[next(iter(self._line))]
        sids = list(itertools.islice(self._by_key[head.batch_key], max_batch))
        batch = [self._slots[sid] for sid in sids]
        for req in batch:
            self._unlink(req.session_id, req.batch_key)
            self._take(req)
        return batch


# ---- deadline_aware and model_deadline --------------------------------------------------------------------------


class _ScoredScheduler(Scheduler):
    """Highest score first; the batch is the best request plus the best others of its group.

    With the built-in scoring `deadline` every group is a heap on `deadline_key` (push O(log n), stale
    entries deleted lazily); a custom scoring depends on `now`, so it is evaluated over all pending
    requests at each select (O(n)). Ties go to the earlier push.
    """

    def __init__(
        self,
        *,
        scoring: str | ScoringFn = "deadline",
        urgency_weight_s: float = URGENCY_WEIGHT_S,
        priority_weight_s: float = PRIORITY_WEIGHT_S,
        default_horizon_s: float = DEFAULT_HORIZON_S,
    ) -> None:
        super().__init__()
        self._scoring: ScoringFn | None = (
            None if scoring == "deadline" else (scoring if callable(scoring) else get_scoring(scoring))
        )
        self._weights = (urgency_weight_s, priority_weight_s, default_horizon_s)
        self._ticket = itertools.count()
        self._ticket_of: dict[str, int] = {}
        self._heaps: dict[Hashable, list[tuple[float, int, Request]]] = {}
        self._entries = 0

    @abstractmethod
    def _group(self, req: Request) -> Hashable:
        """Requests of one group may share a batch."""

    def _enqueue(self, req: Request, replaced: Request | None) -> None:
        ticket = next(self._ticket)
        self._ticket_of[req.session_id] = ticket
        if self._scoring is not None:
            return
        heapq.heappush(self._heaps.setdefault(self._group(req), []), (deadline_key(req, *self._weights), ticket, req))
        self._entries += 1
        if self._entries > 2 * len(self._slots) + 64:
            self._rebuild()

    def _dequeue(self, req: Request) -> None:
        del self._ticket_of[req.session_id]

    def _take(self, req: Request) -> Request:
        del self._ticket_of[req.session_id]
        return super()._take(req)

    def _rebuild(self) -> None:
        self._heaps = {}
        for req in self._slots.values():
            self._heaps.setdefault(self._group(req), []).append(
                (deadline_key(req, *self._weights), self._ticket_of[req.session_id], req)
            )
        for heap in self._heaps.values():
            heapq.heapify(heap)
        self._entries = len(self._slots)

    def _live(self, entry: tuple[float, int, Request]) -> bool:
        req = entry[2]
        return self._is_pending(req) and self._ticket_of[req.session_id] == entry[1]

    def _select(self, now: float, max_batch: int, groups: Callable[[Hashable], bool] | None = None) -> list[Request]:
        if self._scoring is not None:
            return self._select_scored(now, max_batch, groups)
        best: tuple | None = None
        best_group = None
        for g in list(self._heaps):
            heap = self._heaps[g]
            while heap and not self._live(heap[0]):
                heapq.heappop(heap)
                self._entries -= 1
            if not heap:
                del self._heaps[g]
            elif (groups is None or groups(g)) and (best is None or heap[0][:2] < best[:2]):
                best, best_group = heap[0], g
        if best is None:
            return []
        heap, batch = self._heaps[best_group], []
        while heap and len(batch) < max_batch:
            entry = heapq.heappop(heap)
            self._entries -= 1
            if self._live(entry):
                batch.append(self._take(entry[2]))
        return batch

    def _select_scored(self, now: float, max_batch: int, groups: Callable[[Hashable], bool] | None) -> list[Request]:
        scored = [
            (self._scoring(r, now), -self._ticket_of[sid], r)
            for sid, r in self._slots.items()
            if groups is None or groups(self._group(r))
        ]
        if not scored:
            return []
        top = max(scored, key=lambda e: e[:2])
        g = self._group(top[2])
        same = [e for e in scored if self._group(e[2]) == g]
        return [self._take(e[2]) for e in heapq.nlargest(max_batch, same, key=lambda e: e[:2])]


@register_scheduler("deadline_aware")
class DeadlineAwareScheduler(_ScoredScheduler):
    """Most urgent first by `deadline_key` (or a registered scoring); batches share a batch_key.

    Urgency 1 buys `urgency_weight_s` of slack, each priority level costs `priority_weight_s`: priority
    weighs, it does not isolate (use priority_tiered for that). Keys are absolute times, so waiting
    ages a request: only a newcomer with a smaller key overtakes it. Under sustained overload a
    request can still lose every round until the Mailbox's TTL expires it: deadlines over fairness.
    """

    def _group(self, req: Request) -> Hashable:
        return req.batch_key


@register_scheduler("model_deadline")
class ModelDeadlineScheduler(_ScoredScheduler):
    """deadline_aware with one heap per (model, batch_key): a batch never mixes models.

    `select(now, max_batch, model=...)` serves one model only, for a dispatch loop per model sharing
    one scheduler; `depth(model)` is that loop's queue depth.
    """

    def _group(self, req: Request) -> Hashable:
        return (req.model, req.batch_key)

    def select(self, now: float, max_batch: int = 1, model: str | None = None) -> list[Request]:
        if model is None:
            return super().select(now, max_batch)
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if not self._per_model.get(model):
            return []
        return self._select(now, max_batch, groups=lambda g: g[0] == model)


# ---- priority_tiered ------------------------------------------------------------------------------------------


@register_scheduler("priority_tiered")
class PriorityTieredScheduler(Scheduler):
    """Strict tiers: priority p is served only while every tier < p is empty (0 = highest).

    Within a tier, round_robin over its sessions (FIFO of sessions, fair). Batches never mix tiers.
    A lower tier can starve under sustained higher-tier load; that is what strict means.
    """

    def __init__(self) -> None:
        super().__init__()
        self._tiers: dict[int, RoundRobinScheduler] = {}

    def _enqueue(self, req: Request, replaced: Request | None) -> None:
        if replaced is not None and replaced.priority != req.priority:
            self._tier_remove(replaced)
        self._tiers.setdefault(req.priority, RoundRobinScheduler()).push(req)

    def _dequeue(self, req: Request) -> None:
        self._tier_remove(req)

    def _tier_remove(self, req: Request) -> None:
        tier = self._tiers[req.priority]
        tier.remove(req.session_id)
        if not len(tier):
            del self._tiers[req.priority]

    def _select(self, now: float, max_batch: int) -> list[Request]:
        p = min(self._tiers)
        tier = self._tiers[p]
        batch = tier.select(now, max_batch)
        if not len(tier):
            del self._tiers[p]
        return [self._take(r) for r in batch]


# ---- batch_optimized --------------------------------------------------------------------------------------------


@register_scheduler("batch_optimized")
class BatchOptimizedScheduler(Scheduler):
    """Holds requests per batch_key until `max_batch` of them wait or the oldest waited `batch_window_ms`.

    The window counts from when the session's slot began waiting, so replacements by newer requests
    cannot postpone a flush forever. Of several ready groups the one with the oldest waiter goes first;
    a flush takes the longest-waiting sessions of the group. Select is O(n) in pending requests.
    This hold is the batch window: the Mailbox gathers no second one (`holds_batches`).
    """

    holds_batches: ClassVar[bool] = True

    def __init__(self, *, batch_window_ms: float = DEFAULT_BATCH_WINDOW_MS) -> None:
        super().__init__()
        if batch_window_ms < 0:
            raise ValueError(f"batch_window_ms must be >= 0, got {batch_window_ms}")
        self.batch_window_s = batch_window_ms / 1000.0
        self._groups: dict[Hashable, dict[str, None]] = {}
        self._since: dict[str, float] = {}

    def _enqueue(self, req: Request, replaced: Request | None) -> None:
        since = req.arrived
        if replaced is not None:
            since = min(self._unlink(replaced), since)
        self._since[req.session_id] = since
        self._groups.setdefault(req.batch_key, {})[req.session_id] = None

    def _unlink(self, req: Request) -> float:
        sid = req.session_id
        group = self._groups[req.batch_key]
        del group[sid]
        if not group:
            del self._groups[req.batch_key]
        return self._since.pop(sid)

    def _dequeue(self, req: Request) -> None:
        self._unlink(req)

    def _oldest(self, group: dict[str, None]) -> float:
        return min(self._since[sid] for sid in group)

    def _select(self, now: float, max_batch: int) -> list[Request]:
        ready = None
        for key, group in self._groups.items():
            oldest = self._oldest(group)
            if (len(group) >= max_batch or now >= oldest + self.batch_window_s) and (
                ready is None or oldest < ready[0]
            ):
                ready = (oldest, key)
        if ready is None:
            return []
        group = self._groups[ready[1]]
        sids = sorted(group, key=self._since.__getitem__)[:max_batch]
        batch = [self._slots[sid] for sid in sids]
        for req in batch:
            self._unlink(req)
            self._take(req)
        return batch

    def next_wakeup(self, now: float) -> float | None:
        if not self._groups:
            return None
        return min(self._oldest(g) for g in self._groups.values()) + self.batch_window_s
