"""Process faults: kill, term, restart, restart_with, pause and resume on a `ManagedProcess`.

A `ManagedProcess` is a `wire.procs.ChildProcess` (argv, log, ready text) plus the know-how to
bring it back: start again and wait for a ready line written after the restart. A router is one
too (`ManagedProcess.router`); its argv holds its port, so a restart listens on the same port.

    fault        signal / step                  handle.undo()
    kill         SIGKILL to the process group   start again, wait ready
    term         SIGTERM, SIGKILL after grace   start again, wait ready
    restart      term, then start               (none)
    restart_with term, start with other argv    restart_with the previous argv
    pause        SIGSTOP                        resume (SIGCONT)
    resume       SIGCONT                        (none)

Invariants: a restart reuses the same `ChildProcess` object (a new Popen inside), so whoever
registered it (the bench's `ProcessSet`) still stops whatever runs now; signals go to the whole
process group; a fault on a process that is not running raises `ProcessGone`, never an OSError.
"""

from __future__ import annotations

import inspect
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from wire.procs import ChildProcess, start_router
from wire.suggest import did_you_mean


class ProcessFaultError(RuntimeError):
    """A process fault could not be applied; the message says which process and why."""


class UnknownProcess(ProcessFaultError):
    pass


class UnknownFault(ProcessFaultError):
    pass


class ProcessGone(ProcessFaultError):
    """The process is not running (never started, exited or killed) so it cannot take the fault."""


@dataclass
class FaultHandle:
    """What a fault did, and how to take it back (`undo()` is idempotent)."""

    process: ManagedProcess
    action: str
    _undo: Callable[[], object] | None = field(default=None, repr=False)
    undone: bool = False

    @property
    def reversible(self) -> bool:
        return self._undo is not None

    def undo(self) -> None:
        if self._undo is None:
            raise ProcessFaultError(f"{self.process.name}: {self.action} has no undo")
        if self.undone:
            return
        self._undo()
        self.undone = True


class ManagedProcess:
    """A child process that faults can kill, stop, pause and bring back."""

    def __init__(
        self, child: ChildProcess, name: str | None = None, ready_timeout_s: float = 30.0, stop_grace_s: float = 5.0
    ):
        self.child = child
        self.name = name or child.name
        self.ready_timeout_s = ready_timeout_s
        self.stop_grace_s = stop_grace_s
        self._lock = threading.RLock()  # one fault at a time per process

    @classmethod
    def launch(
        cls,
        argv: list[str],
        log_path: str | Path,
        ready_text: str | None = None,
        env: dict | None = None,
        name: str = "",
        ready_timeout_s: float = 30.0,
        stop_grace_s: float = 5.0,
    ) -> ManagedProcess:
        """Start `argv` now and wait for `ready_text` in its log."""
        proc = cls(
            ChildProcess(argv, log_path, ready_text=ready_text, env=env, name=name),
            name=name or None,
            ready_timeout_s=ready_timeout_s,
            stop_grace_s=stop_grace_s,
        )
        proc.start()
        return proc

    @classmethod
    def router(
        cls, log_path: str | Path, port: int | None = None, extra_args: list[str] | None = None, name: str = "router"
    ) -> tuple[ManagedProcess, str]:
        """A Zenoh router (wire.procs.start_router) as a ManagedProcess, and its endpoint."""
        child, endpoint = start_router(port, log_path, extra_args)
        return cls(child, name=name, ready_timeout_s=15.0), endpoint

    # --- state ---------------------------------------------------------------------------------

    @property
    def argv(self) -> list[str]:
        return list(self.child.argv)

    @property
    def pid(self) -> int | None:
        return self.child.pid

    def alive(self) -> bool:
        return self.child.alive()

    def state(self) -> str | None:
        """The kernel's state letter for the process (R, S, D, T stopped, Z zombie), None if gone."""
        if self.child.proc is None or self.child.proc.returncode is not None:
            return None
        try:
            stat = Path(f"/proc/{self.child.pid}/stat").read_text()
        except OSError:
            return None
        return stat[stat.rindex(")") + 2]  # "pid (comm) S ...": comm may hold spaces and parens

    def _require_running(self, action: str) -> None:
        proc = self.child.proc
        if proc is None:
            raise ProcessGone(f"{self.name}: cannot {action}: it was never started")
        if proc.poll() is not None:
            raise ProcessGone(
                f"{self.name}: cannot {action}: pid {proc.pid} is not running "
                f"(exited with {proc.returncode}); restart it first"
            )

    def _signal_group(self, sig: int, action: str) -> None:
        self._require_running(action)
        try:
            os.killpg(self.child.pid, sig)
        except ProcessLookupError:
            raise ProcessGone(f"{self.name}: cannot {action}: pid {self.child.pid} exited meanwhile") from None

    def _await_state(self, stopped: bool, timeout_s: float = 1.0) -> None:
        # The kernel applies SIGSTOP/SIGCONT asynchronously (microseconds); waitpid(WUNTRACED)
        # would report it but would race subprocess's own reaping, so read /proc instead.
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            st = self.state()
            if st is None or (st == "T") == stopped:
                return
            time.sleep(0.001)

    # --- start ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the argv (if not running) and wait for a ready line written after this start."""
        with self._lock:
            if self.alive():
                return
            ready_text = self.child.ready_text
            log = self.child.log_path
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "ab") as f:
                if f.tell():  # a restart: mark it, and only a ready line after the mark counts
                    command = " ".join(self.child.argv).replace("\n", "\\n")
                    f.write(f"--- chaos: start {self.name}: {command[:300]}\n".encode())
                offset = f.tell()
            self.child.ready_text = None  # ChildProcess would match the ready line of the previous run
            try:
                self.child.start()
            finally:
                self.child.ready_text = ready_text
            if ready_text:
                self._wait_ready(ready_text, offset)

    def _wait_ready(self, ready_text: str, offset: int) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        needle = ready_text.encode()
        while True:
            with open(self.child.log_path, "rb") as f:
                f.seek(offset)
                if needle in f.read():
                    return
            if self.child.proc.poll() is not None:
                raise ProcessFaultError(
                    f"{self.name} exited with {self.child.proc.returncode} before ready; "
                    f"log {self.child.log_path}:\n{self.child.tail()}"
                )
            if time.monotonic() >= deadline:
                self.child.stop(self.stop_grace_s)
                raise ProcessFaultError(
                    f"{self.name} not ready within {self.ready_timeout_s}s; "
                    f"log {self.child.log_path}:\n{self.child.tail()}"
                )
            time.sleep(0.02)  # polling a log file: no event exists for "text appeared in a file"

    def stop(self) -> int | None:
        """Stop for good (SIGTERM, SIGKILL after the grace period); the exit code."""
        with self._lock:
            return self.child.stop(self.stop_grace_s)

    # --- the faults ----------------------------------------------------------------------------

    def kill(self) -> FaultHandle:
        """SIGKILL the process group; returns once the process is reaped."""
        with self._lock:
            self._signal_group(signal.SIGKILL, "kill")
            self.child.proc.wait()
        return FaultHandle(self, "kill", self.start)

    def term(self, grace_s: float | None = None) -> FaultHandle:
        """SIGTERM (the process drains and exits), SIGKILL if still alive after the grace period."""
        with self._lock:
            self._require_running("term")
            self.child.stop(self.stop_grace_s if grace_s is None else grace_s)
        return FaultHandle(self, "term", self.start)

    def restart(self) -> FaultHandle:
        """Stop (if running) and start the same argv; returns once ready."""
        with self._lock:
            self.child.stop(self.stop_grace_s)
            self.start()
        return FaultHandle(self, "restart")

    def start_new(self) -> FaultHandle:
        """Start a process not started yet (a replica added mid-run: a scale-up); returns once ready."""
        with self._lock:
            if self.alive():
                raise ProcessFaultError(f"{self.name}: start of a process that is already running")
            self.start()
        return FaultHandle(self, "start")

    def restart_with(self, argv: list[str]) -> FaultHandle:
        """Restart with another argv (another manifest or checkpoint); undo restores the previous."""
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ProcessFaultError(f"{self.name}: restart_with needs a non-empty argv of strings, got {argv!r}")
        with self._lock:
            previous = list(self.child.argv)
            self.child.stop(self.stop_grace_s)
            self.child.argv = list(argv)
            try:
                self.start()
            except Exception:
                self.child.argv = previous  # a later plain restart brings back the good one
                raise
        return FaultHandle(self, "restart_with", lambda: self.restart_with(previous))

    def pause(self) -> FaultHandle:
        """SIGSTOP the process group: it holds its sockets but answers nothing."""
        with self._lock:
            self._signal_group(signal.SIGSTOP, "pause")
            self._await_state(stopped=True)
        return FaultHandle(self, "pause", self.resume)

    def resume(self) -> FaultHandle:
        """SIGCONT the process group."""
        with self._lock:
            self._signal_group(signal.SIGCONT, "resume")
            self._await_state(stopped=False)
        return FaultHandle(self, "resume")

    def __repr__(self) -> str:
        return f"ManagedProcess({self.name!r}, pid={self.pid}, alive={self.alive()})"


# The fault word (as written in timelines) -> the method that applies it.
FAULTS: dict[str, Callable[..., FaultHandle]] = {
    "kill": ManagedProcess.kill,
    "term": ManagedProcess.term,
    "restart": ManagedProcess.restart,
    "start": ManagedProcess.start_new,
    "restart_with": ManagedProcess.restart_with,
    "pause": ManagedProcess.pause,
    "resume": ManagedProcess.resume,
}


def apply_fault(processes: Mapping[str, ManagedProcess], target: str, action: str, **params) -> FaultHandle:
    """Apply fault `action` to `processes[target]` (e.g. "server:r1", "router")."""
    if target not in processes:
        raise UnknownProcess(
            f"no process {target!r}"
            + did_you_mean(target, processes)
            + f"; known: {', '.join(sorted(processes)) or '(none)'}"
        )
    fn = FAULTS.get(action)
    if fn is None:
        raise UnknownFault(f"unknown process fault {action!r}; faults: {', '.join(FAULTS)}")
    proc = processes[target]
    try:
        inspect.signature(fn).bind(proc, **params)
    except TypeError:
        wanted = [p for p in inspect.signature(fn).parameters if p != "self"]
        raise ProcessFaultError(
            f"{target}: {action} takes {', '.join(wanted) or 'no parameters'}, got {', '.join(params) or 'none'}"
        ) from None
    return getattr(proc, fn.__name__)(**params)  # by name: a process on another host has the same face


def replace_arg(argv: list[str], flag: str, value: str) -> list[str]:
    """argv with the value after `flag` replaced (`--flag value` or `--flag=value`), or appended."""
    out = list(argv)
    for i, a in enumerate(out):
        if a == flag and i + 1 < len(out):
            out[i + 1] = value
            return out
        if a.startswith(flag + "="):
            out[i] = f"{flag}={value}"
            return out
    return out + [flag, value]
