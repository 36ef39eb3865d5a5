"""How the remote engine's worker is run: on a thread of its own (a robot), or with many others on one shared
thread (a host of many engines, e.g. a bench shard).

The worker (edge.remote.worker) is written once, as generators that yield at every point where it would block:

    yield Wait(signal, timeout_s)  ─► resumes with True if the signal was set, False on the timeout
    yield Call(fn)                 ─► resumes with fn()'s result (or raises what fn raised): blocking I/O
                                      (a handshake's queries, a session's close)

`run_inline(gen)` runs it on the caller's thread: a Wait is `signal.wait(timeout)`, a Call a plain call. That is
the robot's driver, one thread per engine, as before. `WorkerPool` runs many on one thread: a Wait registers the
worker with its signal and a timer, a Call goes to a few helper threads, and a worker resumes when its signal is
set, its timer fires or its call returns. With a hundred engines in one process that is one thread waking per
event instead of a hundred threads contending for one GIL; the worker's code, its state machine and its tests
are the same under either driver. Between two workers' steps the pool lets go of the GIL (`time.sleep(0)`), so
a thread that waits for it gets it within one step.

Invariants: a worker's code never blocks outside a Wait or a Call (a pooled one would stall every other); a
`Signal` is a `threading.Event` whose `set` also resumes the pooled worker waiting on it (at most one waiter).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger(__name__)


class Wait:
    """Resume when `signal` is set (True) or after `timeout_s` (False; None waits for the signal only)."""

    __slots__ = ("signal", "timeout_s")

    def __init__(self, signal: Signal, timeout_s: float | None):
        self.signal, self.timeout_s = signal, timeout_s


class Call:
    """Resume with `fn()`: a call that may block (the pool runs it on a helper thread)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn


Steps = Generator[Wait | Call, Any, Any]


class Signal(threading.Event):
    """A threading.Event that also resumes the pooled worker waiting on it (WorkerPool)."""

    def __init__(self):
        super().__init__()
        self.waiter: Callable[[], None] | None = None

    def set(self) -> None:
        super().set()
        waiter = self.waiter
        if waiter is not None:
            waiter()


def run_inline(gen: Steps):
    """Run a worker's steps on this thread to the end; its return value."""
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = gen.throw(error) if error is not None else gen.send(result)
        except StopIteration as stop:
            return stop.value
        result, error = None, None
        if type(op) is Wait:
            result = op.signal.wait(op.timeout_s)
        else:
            try:
                result = op.fn()
            except Exception as exc:
                error = exc


class _Task:
    __slots__ = ("gen", "name", "token", "done", "signal")

    def __init__(self, gen: Steps, name: str):
        self.gen, self.name = gen, name
        self.token = 0  # bumped when a wait ends: a stale timer or signal for an earlier wait is ignored
        self.done = threading.Event()
        self.signal: Signal | None = None  # the one it waits on now


class Handle:
    """A pooled worker, as a thread handle: `join(timeout)`, `is_alive()`."""

    def __init__(self, task: _Task):
        self._task = task

    def join(self, timeout: float | None = None) -> None:
        self._task.done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._task.done.is_set()


class WorkerPool:
    """Runs many workers' steps on one thread (`name`), their blocking calls on up to `call_threads` helpers.

    `spawn(gen, name)` starts one and returns its Handle; `close()` ends the thread once its workers are done (or
    at once with `wait=False`). A worker that raises is logged and ends; the others run on."""

    def __init__(self, name: str = "remote-engine pool", call_threads: int = 16):
        self.name = name
        self._cv = threading.Condition()
        self._ready: deque = deque()  # (task, result, error)
        self._timers: list = []  # (deadline, n, task, token)
        self._n = itertools.count()
        self._tasks: set[_Task] = set()
        self._closing = False
        self._calls = ThreadPoolExecutor(max_workers=call_threads, thread_name_prefix=f"{name} call")
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def spawn(self, gen: Steps, name: str = "") -> Handle:
        task = _Task(gen, name)
        with self._cv:
            if self._closing:
                raise RuntimeError(f"{self.name} is closed")
            self._tasks.add(task)
            self._ready.append((task, None, None))
            self._cv.notify()
        return Handle(task)

    def close(self, wait: bool = True, timeout_s: float = 10.0) -> None:
        if wait:
            deadline = time.monotonic() + timeout_s
            for task in list(self._tasks):
                task.done.wait(max(deadline - time.monotonic(), 0.0))
        with self._cv:
            self._closing = True
            self._cv.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self._calls.shutdown(wait=False, cancel_futures=True)

    # --- the pool's thread -----------------------------------------------------------------------------------

    def _resume(self, task: _Task, token: int, result: Any = None, error: BaseException | None = None) -> None:
        """From any thread: task's wait `token` ended; queue it to run (once per wait)."""
        with self._cv:
            if task.token != token:
                return
            task.token += 1
            self._ready.append((task, result, error))
            self._cv.notify()

    def _run(self) -> None:
        cv, ready, timers = self._cv, self._ready, self._timers
        while True:
            with cv:
                while not ready:
                    if self._closing:
                        return
                    now = time.monotonic()
                    while timers and timers[0][0] <= now:
                        _, _, task, token = heapq.heappop(timers)
                        if task.token == token:
                            task.token += 1
                            ready.append((task, False, None))
                    if ready:
                        break
                    cv.wait(timers[0][0] - now if timers else None)
                batch = list(ready)
                ready.clear()
            for k, (task, result, error) in enumerate(batch):
                if k:
                    # between two workers' steps, let go of the GIL: a thread waiting for it (a bench shard's
                    # control loop) takes it now, not after the interpreter's 5 ms switch interval
                    time.sleep(0)
                sig = task.signal
                if sig is not None:
                    sig.waiter = None
                    task.signal = None
                self._step(task, result, error)

    def _step(self, task: _Task, result: Any, error: BaseException | None) -> None:
        """Run `task` up to its next Wait or Call and arrange its resumption."""
        try:
            op = task.gen.throw(error) if error is not None else task.gen.send(result)
        except StopIteration:
            self._finish(task)
            return
        except Exception:
            log.exception("%s: worker %s failed", self.name, task.name)
            self._finish(task)
            return
        token = task.token
        if type(op) is Wait:
            sig = op.signal
            task.signal = sig
            sig.waiter = lambda: self._resume(task, token, True)  # before the check: a set() after it wakes us
            if sig.is_set():
                self._resume(task, token, True)
            elif op.timeout_s is not None:
                with self._cv:
                    heapq.heappush(self._timers, (time.monotonic() + op.timeout_s, next(self._n), task, token))
            return
        fn = op.fn

        def call():
            try:
                out = fn()
            except Exception as exc:
                self._resume(task, token, None, exc)
            else:
                self._resume(task, token, out)

        try:
            self._calls.submit(call)
        except RuntimeError as exc:  # the pool is shutting down
            self._resume(task, token, None, exc)

    def _finish(self, task: _Task) -> None:
        with self._cv:
            self._tasks.discard(task)
        task.done.set()
