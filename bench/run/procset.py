"""Every process a run starts, and the guarantee that none outlives it.

Owns the orphan-free teardown: children are `wire.procs.ChildProcess` objects (own process
group each) registered here in start order; `stop_all()` stops them in reverse order. It runs
from the runner's `finally`, from an atexit hook, and on SIGTERM/SIGHUP (turned into
KeyboardInterrupt in the main thread so the same `finally` runs). Invariant: once `stop_all()`
returns, no registered child or any member of its process group is alive. `is_local` says whether a child runs
on this host (a cluster child may run on another).
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
from collections.abc import Callable

from wire.procs import ChildProcess

_LIVE: list[ProcessSet] = []
_HOOKED = False


def _atexit_stop_all() -> None:
    for ps in list(_LIVE):
        ps.stop_all()


def _raise_interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def install_signal_handlers() -> None:
    """SIGTERM/SIGHUP behave like Ctrl-C (main thread only; elsewhere atexit still covers)."""
    global _HOOKED
    if not _HOOKED:
        atexit.register(_atexit_stop_all)
        _HOOKED = True
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                signal.signal(sig, _raise_interrupt)
            except (ValueError, OSError):
                pass


class ProcessSet:
    def __init__(self):
        self.children: list[tuple[str, ChildProcess]] = []
        self.cleanups: list[tuple[str, Callable[[], None]]] = []
        self._lock = threading.Lock()
        _LIVE.append(self)

    def add(self, name: str, child: ChildProcess) -> ChildProcess:
        with self._lock:
            self.children.append((name, child))
        return child

    def replace(self, name: str, child: ChildProcess) -> None:
        with self._lock:
            for i, (n, _) in enumerate(self.children):
                if n == name:
                    self.children[i] = (name, child)
                    return
            self.children.append((name, child))

    def on_stop(self, name: str, fn: Callable[[], None]) -> None:
        """Run `fn` during stop_all, in reverse registration order with the children."""
        with self._lock:
            self.children.append((name, _Cleanup(fn)))  # type: ignore[arg-type]

    def get(self, name: str) -> ChildProcess | None:
        return next((c for n, c in self.children if n == name), None)

    def pids(self) -> dict[str, int]:
        return {n: c.pid for n, c in self.children if isinstance(c, ChildProcess) and c.pid}

    def stop_all(self, grace_s: float = 5.0) -> list[str]:
        """Stop everything in reverse start order; returns names of children that had to be killed."""
        with self._lock:
            items = list(reversed(self.children))
            self.children.clear()
        problems = []
        for name, child in items:
            try:
                child.stop(grace_s)
            except Exception as exc:  # keep going: one stuck child must not leave the others running
                problems.append(f"{name}: {exc!r}")
            if isinstance(child, ChildProcess) and child.proc is not None:
                _reap_group(child.proc.pid)
        if self in _LIVE:
            _LIVE.remove(self)
        return problems


class _Cleanup:
    def __init__(self, fn):
        self.fn = fn
        self.proc = None
        self.pid = None

    def stop(self, _grace_s=None):
        self.fn()


def _reap_group(pgid: int) -> None:
    """SIGKILL any straggler left in a child's process group (helpers the child spawned)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)  # polling: there is no event for "a process group emptied"


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def is_local(child, for_cpu: bool = False) -> bool:
    """Whether `child` runs on this host (its pid means something to this host's CPU sampler). `for_cpu` with
    BENCH_TEST_CPU_REMOTE=1 (tests only): a cluster child is sampled through its actor even on this host."""
    import socket

    if for_cpu and hasattr(child, "node") and os.environ.get("BENCH_TEST_CPU_REMOTE") == "1":
        return False
    return not hasattr(child, "node") or child.node.get("hostname") == socket.gethostname()
