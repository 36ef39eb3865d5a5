"""The action queue every engine executes from, behaviour-compatible with LeRobot's ActionQueue.

    merge(original, processed, real_delay, idx_before) ──► [ original (T, A) | processed (T, A) | meta ]
                                                                     ▲ cursor
    get() / get_with_meta() ──► processed[cursor], cursor += 1       (nothing is popped)

Two modes, fixed at construction:
- RTC (replace): d = max(0, min(real_delay, len(original), len(processed))); both queues become
  chunk[d:], cursor 0. The old leftover is discarded: blending is the policy's job (guidance).
- append (non-RTC): the first merge stores the chunk untrimmed; later merges keep the unconsumed
  part of the old queue and append the new chunk; `real_delay` is ignored.

`trim="real_delay"` (LeRobot's default) trims by the measured delay even when fewer actions were
consumed during inference (a mismatch is only logged); `trim="consumed"` trims by
min(real_delay, consumed), which fixes the first-chunk over-trim from standstill (design open risk 2).

`snapshot()` on the observation's tick (before that tick's `get`) and `left_over_at(snapshot)` (or
`left_over_since`, which falls back to the queue as it is now) when the
request is built give the leftover and index of the tick the observation was taken on: a chunk's row 0 then
belongs to that tick, as the policy assumes (the prefix starts with the action executed on it).

Invariant: one lock; every public method takes it and returns copies, so a caller never holds a view
the worker thread can change. Each row carries provenance (`meta` of its merge and its index in the
source chunk) so an engine can report where an action came from and how old it is.

Invariant: every row the queue holds is finite and `action_dim` wide. `merge` refuses (ValueError, the queue
left as it was) a chunk that is not a non-empty 2-D floating-point array, whose two spaces disagree in shape,
whose width is not `action_dim` (or, without one, the width the queue holds), or that holds a NaN or an
infinity in either space (checked after the cast to float32, so a float64 beyond float32's range is refused
too). The check runs where a chunk arrives (the worker, or the sync engine's inference), never in `get`:
every engine executes from this queue, so none can hand a robot a non-finite action or one of the wrong width.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

TRIM_MODES = ("real_delay", "consumed")


class ActionQueue:
    def __init__(self, rtc_enabled: bool, trim: str = "real_delay", action_dim: int | None = None):
        if trim not in TRIM_MODES:
            raise ValueError(f"trim must be one of {TRIM_MODES}, got {trim!r}")
        self.rtc_enabled = bool(rtc_enabled)
        self.trim = trim
        self.action_dim = action_dim  # None: the width of the first chunk merged after a clear
        self._lock = threading.Lock()
        self._original: np.ndarray | None = None
        self._processed: np.ndarray | None = None
        self._meta: list[Any] = []  # per row: the merge's meta
        self._index: list[int] = []  # per row: index within its source chunk (ints: get reads one per tick)
        self._cursor = 0
        self._generation = 0  # merges and clears so far: a snapshot is only good until the next

    # --- reads (control thread) ------------------------------------------------------------------

    def get(self) -> np.ndarray | None:
        with self._lock:
            if self._processed is None or self._cursor >= len(self._processed):
                return None
            a = self._processed[self._cursor].copy()
            self._cursor += 1
            return a

    def get_with_meta(self) -> tuple[np.ndarray, Any, int] | None:
        """(processed action, its merge's meta, its index in the source chunk), or None."""
        with self._lock:
            if self._processed is None or self._cursor >= len(self._processed):
                return None
            i = self._cursor
            self._cursor += 1
            return self._processed[i].copy(), self._meta[i], self._index[i]

    def peek_meta(self) -> tuple[Any, int] | None:
        """Provenance of the next action without consuming it."""
        with self._lock:
            if self._processed is None or self._cursor >= len(self._processed):
                return None
            return self._meta[self._cursor], self._index[self._cursor]

    def skip_source(self, meta: Any) -> int:
        """Advance the cursor past the rows of the merge that `meta` marks (all stale together: they share
        a source observation); rows of later merges (append mode) stay. Returns how many were skipped."""
        with self._lock:
            if self._processed is None:
                return 0
            start = self._cursor
            while self._cursor < len(self._processed) and self._meta[self._cursor] is meta:
                self._cursor += 1
            return self._cursor - start

    def set_rtc_enabled(self, enabled: bool) -> None:
        """Switch replace/append for later merges (a server that downgraded the session to append mode)."""
        with self._lock:
            self.rtc_enabled = bool(enabled)

    def skip(self, n: int) -> int:
        """Advance the cursor by up to n actions (stale ones the engine refuses); returns how many."""
        with self._lock:
            if self._processed is None:
                return 0
            k = max(0, min(int(n), len(self._processed) - self._cursor))
            self._cursor += k
            return k

    def qsize(self) -> int:
        with self._lock:
            return 0 if self._processed is None else len(self._processed) - self._cursor

    def empty(self) -> bool:
        return self.qsize() == 0

    def get_action_index(self) -> int:
        with self._lock:
            return self._cursor

    def snapshot(self) -> tuple[int, int]:
        """Where the queue stands now, (generation, cursor), for `left_over_at` later."""
        with self._lock:
            return self._generation, self._cursor

    def size_and_snapshot(self) -> tuple[int, tuple[int, int]]:
        """(qsize(), snapshot()) read together, under one lock: what the queue holds and where it stands at
        the same instant (notify_observation, on every tick)."""
        with self._lock:
            size = 0 if self._processed is None else len(self._processed) - self._cursor
            return size, (self._generation, self._cursor)

    def left_over_at(self, snapshot: tuple[int, int]) -> tuple[np.ndarray | None, np.ndarray | None, int] | None:
        """(model-space rows, robot-space rows, cursor) from the snapshot's cursor, as `get_left_over`,
        `get_processed_left_over` and `get_action_index` read then; None if a merge or clear came since."""
        generation, cursor = snapshot
        with self._lock:
            if generation != self._generation or cursor > self._cursor:
                return None
            return self._left_over_from(cursor)

    def left_over_since(self, snapshot: tuple[int, int] | None) -> tuple[np.ndarray | None, np.ndarray | None, int]:
        """`left_over_at(snapshot)`, or, if a merge or clear came since (or there is no snapshot), the same three
        as the queue stands now; read under one lock either way (what a request is built from)."""
        with self._lock:
            if snapshot is not None and snapshot[0] == self._generation and snapshot[1] <= self._cursor:
                return self._left_over_from(snapshot[1])
            return self._left_over_from(self._cursor)

    def _left_over_from(self, cursor: int) -> tuple[np.ndarray | None, np.ndarray | None, int]:
        if self._original is None:
            return None, None, cursor
        return self._original[cursor:].copy(), self._processed[cursor:].copy(), cursor

    def get_left_over(self) -> np.ndarray | None:
        """Model-space actions from the cursor; None only before the first merge."""
        with self._lock:
            return None if self._original is None else self._original[self._cursor :].copy()

    def get_processed_left_over(self) -> np.ndarray | None:
        with self._lock:
            return None if self._processed is None else self._processed[self._cursor :].copy()

    def clear(self) -> None:
        with self._lock:
            self._original = self._processed = None
            self._meta = []
            self._index = []
            self._cursor = 0
            self._generation += 1

    # --- merge (worker thread) ---------------------------------------------------------------------

    def merge(
        self,
        original: np.ndarray,
        processed: np.ndarray,
        real_delay: int,
        action_index_before_inference: int | None = None,
        meta: Any = None,
    ) -> int:
        """Merge a new chunk; returns how many of its rows were trimmed. A chunk that breaks the queue's
        invariant (module docstring) raises ValueError and leaves the queue as it was."""
        original, processed = check_chunk(original, processed, self.action_dim)  # outside the lock get() takes
        with self._lock:
            if self._processed is not None and self._processed.shape[1:] != processed.shape[1:]:
                raise ValueError(
                    f"chunk has {processed.shape[1]} action dims; the queue holds {self._processed.shape[1]}"
                )
            self._generation += 1
            delay = int(real_delay)
            if action_index_before_inference is not None:
                consumed = max(0, self._cursor - int(action_index_before_inference))
                if consumed != delay:
                    log.debug("real_delay %d differs from %d actions consumed during inference", delay, consumed)
                if self.trim == "consumed":
                    delay = min(delay, consumed)
            rows = list(range(len(processed)))
            if self.rtc_enabled:
                d = max(0, min(delay, len(original), len(processed)))
                self._original, self._processed = original[d:].copy(), processed[d:].copy()
                self._meta = [meta] * (len(processed) - d)
                self._index = rows[d:]
                self._cursor = 0
                return d
            if self._processed is None:
                self._original, self._processed = original.copy(), processed.copy()
                self._meta = [meta] * len(processed)
                self._index = rows
            else:
                c = self._cursor
                self._original = np.concatenate([self._original[c:], original])
                self._processed = np.concatenate([self._processed[c:], processed])
                self._meta = self._meta[c:] + [meta] * len(processed)
                self._index = self._index[c:] + rows
            self._cursor = 0
            return 0


def check_chunk(original, processed, action_dim: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Both spaces of a chunk as float32 (T, A) arrays, if the queue would hold them (module docstring: non-empty,
    floating point, one shape, `action_dim` wide when given, every value finite); else ValueError saying why."""
    original = _as_chunk(original, "original")
    processed = _as_chunk(processed, "processed")
    if original.shape != processed.shape:
        raise ValueError(
            f"original has shape {original.shape} but processed has {processed.shape}; "
            "both are the same chunk in two spaces (rows, action dims)"
        )
    if action_dim is not None and processed.shape[1] != action_dim:
        raise ValueError(f"chunk has {processed.shape[1]} action dims; the queue holds {action_dim}")
    return original, processed


def _as_chunk(x, name: str) -> np.ndarray:
    """`x` as a float32 (T, A) array, T >= 1, A >= 1, every value finite; else ValueError naming what is wrong."""
    raw = np.asarray(x)
    if not np.issubdtype(raw.dtype, np.floating):
        # an integer or boolean chunk is not an action chunk (the wire's is float32): a bug or a hostile sender
        raise ValueError(f"{name} chunk must be floating point, got dtype {raw.dtype}")
    if raw.ndim != 2 or raw.shape[0] < 1 or raw.shape[1] < 1:
        raise ValueError(f"{name} chunk must be 2-D (T, A) with T, A >= 1, got shape {raw.shape}")
    with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf here, and is refused below
        a = raw.astype(np.float32, copy=False)
    if not np.isfinite(a).all():
        bad = np.argwhere(~np.isfinite(a))[0]
        raise ValueError(
            f"{name} chunk holds a non-finite value ({a[tuple(bad)]} at row {bad[0]}, column {bad[1]}; "
            f"{int((~np.isfinite(a)).sum())} in all): a NaN or inf action never reaches the robot"
        )
    return a


def fit_prefix(rows: np.ndarray | None, horizon: int) -> np.ndarray | None:
    """Leftover cut to `horizon` rows or padded by repeating its last row; None when empty."""
    if rows is None or len(rows) == 0 or horizon < 1:
        return None
    if len(rows) >= horizon:
        return np.ascontiguousarray(rows[:horizon])
    return np.concatenate([rows, np.repeat(rows[-1:], horizon - len(rows), axis=0)])
