"""Child processes on 127.0.0.1: free ports, start-and-wait-for-ready, stop without orphans.

Shared by tests, the bench and the chaos faults so that every process the project starts is
started and reaped the same way. Invariant: `ChildProcess.stop()` returns only when the child is
gone (SIGTERM, then SIGKILL after a grace period), and every child runs in its own process group
so a kill reaches its helpers too.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

LISTEN_PORT_FLOOR = 20000  # below: registered services' ports (Ray's 6379 and 10001, ...)
LINUX_EPHEMERAL = (32768, 60999)  # the kernel's default ip_local_port_range


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives the local end of an outbound connection (Linux: ip_local_port_range)."""
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return LINUX_EPHEMERAL


def free_port() -> int:
    """A TCP port free now on 127.0.0.1 for a listener, below the kernel's ephemeral range where there is room
    (LISTEN_PORT_FLOOR up to it), else any the kernel picks. A listener restarted on its port (a replica's health
    port, a router) finds a port in the ephemeral range taken by the local end of an outbound connection made
    while it was down, and robots reconnecting at a restart make hundreds (at 1,000 robots, an estimate: ~400
    new local ports out of ~28,000, ~1.4 % a restart)."""
    import random

    lo, _ = ephemeral_range()
    if lo - LISTEN_PORT_FLOOR >= 1000:
        pick = random.SystemRandom()
        for _ in range(64):
            port = pick.randrange(LISTEN_PORT_FLOOR, lo)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:  # taken, or in TIME_WAIT: another
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raise_fd_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit; return the limit now in force. A process
    holding a socket per robot (a router: one a session; the chaos proxy: two a connection) outgrows a soft limit
    of 1024 near 1,000 robots, where the hard limit is usually far higher."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft


def raise_priority(want: str, fifo_priority: int, tid: int = 0) -> str:
    """Schedule thread `tid` (0: the calling one) as `want` asks: "fifo" = SCHED_FIFO at `fifo_priority`, falling
    back to nice -10 where the host refuses real-time (no CAP_SYS_NICE), then to unchanged; "nice" = nice -10 or
    unchanged; anything else = unchanged. Returns what took effect: "SCHED_FIFO N", "nice -10" or "normal". Used by
    the bench's control loops and the chaos proxy, the two parts of the twin that must not wait for a CPU, and by
    the server's dispatch loops (manifest `dispatch_priority`)."""
    if want == "fifo":
        try:
            os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(fifo_priority))
            return f"SCHED_FIFO {fifo_priority}"
        except (AttributeError, OSError):
            pass
    if want in ("fifo", "nice"):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, -10)
            return "nice -10"
        except (AttributeError, OSError):
            pass
    return "normal"


class ChildProcess:
    """A child started from `argv`, its stdout+stderr in `log_path`, ready when `ready_text` appears."""

    def __init__(
        self,
        argv: list[str],
        log_path: str | Path,
        ready_text: str | None = None,
        env: dict | None = None,
        name: str = "",
    ):
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.ready_text = ready_text
        self.env = env
        self.name = name or Path(argv[0]).name
        self.proc: subprocess.Popen | None = None
        self.exited_mono: float | None = None  # time.monotonic() when the process exited (set by a watcher thread)

    def start(self, timeout_s: float = 30.0) -> ChildProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self._log_offset = log.tell()  # a ready line of an earlier run in the same log does not count
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(self.env or {}))
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        self.exited_mono = None
        self._exit_watch = threading.Thread(
            target=self._watch_exit, args=(self.proc,), name=f"exit-{self.name}", daemon=True
        )
        self._exit_watch.start()
        if self.ready_text:
            self.wait_ready(timeout_s)
        return self

    def _watch_exit(self, proc: subprocess.Popen) -> None:
        """Block until `proc` exits and note when: a caller that polls `alive()` learns of an exit up to its poll
        interval late (the bench's runner: 0.5 s), and an unplanned exit's window then starts late."""
        proc.wait()
        if self.proc is proc:
            self.exited_mono = time.monotonic()

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                f.seek(getattr(self, "_log_offset", 0))
                if self.ready_text in f.read().decode(errors="replace"):
                    return
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} before ready; log {self.log_path}:\n{self.tail()}"
                )
            time.sleep(0.02)  # polling a log file: no event exists for "text appeared in a file"
        self.stop()
        raise TimeoutError(f"{self.name} not ready within {timeout_s}s; log {self.log_path}:\n{self.tail()}")

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.killpg(self.proc.pid, sig)

    def stop(self, grace_s: float = 5.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGCONT)
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self):
        return self.start() if self.proc is None else self

    def __exit__(self, *exc):
        self.stop()


def router_argv(
    endpoint: str, connect: list[str] | tuple[str, ...] = (), extra_args: list[str] | None = None
) -> list[str]:
    """A Zenoh router process (wire.transport) listening on `endpoint` and joining the routers at `connect`."""
    return [
        sys.executable,
        "-m",
        "wire.transport",
        "--listen",
        endpoint,
        *[a for e in connect for a in ("--connect", e)],
        *(extra_args or []),
    ]


PICKED_PORT_TRIES = 3  # start_router, start_on_picked_port: a child started again after its picked port was taken


def start_on_picked_port(make, port: int | None, timeout_s: float = 15.0, first: int | None = None):
    """Start the ChildProcess `make(port)` returns, on `port` or, without one, on a free port picked here (or
    `first`, one the caller picked already, tried first). The child binds it a moment later, and another process may
    take it in between (a test suite or a bench run starts many), so a child refused with "Address already in
    use" is started again on a new port, up to PICKED_PORT_TRIES times. A `port` given is the caller's: no
    retry. Returns (child, port)."""
    for attempt in range(1 if port else PICKED_PORT_TRIES):
        picked = port or (first if attempt == 0 and first else free_port())
        child = make(picked)
        try:
            child.start(timeout_s=timeout_s)
            return child, picked
        except RuntimeError:
            if port or attempt == PICKED_PORT_TRIES - 1 or "address already in use" not in child.tail().lower():
                raise
    raise AssertionError("unreachable")


def start_router(
    port: int | None,
    log_path: str | Path,
    extra_args: list[str] | None = None,
    host: str = "127.0.0.1",
    connect: list[str] | tuple[str, ...] = (),
    scheme: str = "tcp",
    env: dict | None = None,
) -> tuple[ChildProcess, str]:
    """Start a Zenoh router in its own process; return it and its endpoint (`scheme`/`host`:port; `host`: loopback
    unless processes on other hosts must reach it). `connect`: routers it joins (they route between them).
    `extra_args`: more of wire.transport's flags (TLS files, access rules, --max-sessions). Without `port`, one is
    picked, and taken again if another process got it first (start_on_picked_port)."""
    child, picked = start_on_picked_port(
        lambda p: ChildProcess(
            router_argv(f"{scheme}/{host}:{p}", connect, extra_args),
            log_path,
            ready_text="router ready",
            name="zenoh-router",
            env=env,
        ),
        port,
    )
    return child, f"{scheme}/{host}:{picked}"
