"""Start the fault proxy as its own process: the real `toxiproxy-server` if on PATH, else ours.

`start_proxy_server(log_path)` returns a `ProxyServer` with `.api_url`, `.pid`, `.real_toxiproxy`
(True when the Go binary runs: scenarios using our `loss` toxic then send its stand-ins) and
`.stop()`. `CHAOS_PROXY=python` forces ours, `CHAOS_PROXY=toxiproxy` insists on the real one.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from wire.procs import ChildProcess, start_on_picked_port


@dataclass
class ProxyServer:
    child: ChildProcess
    host: str
    port: int
    real_toxiproxy: bool
    priority: str = "normal"  # how its process was scheduled once ready (scheduling_of), what took effect

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.child.pid

    def stop(self) -> None:
        self.child.stop()


def start_proxy_server(
    log_path: str | Path,
    host: str = "127.0.0.1",
    port: int | None = None,
    timeout_s: float = 15.0,
    priority: str = "normal",
    loop: str = "auto",
) -> ProxyServer:
    """`priority`: ours' `--priority` (normal, nice, fifo; the Go binary has no such flag and runs as started);
    `loop`: ours' `--loop` (auto, uvloop, asyncio).
    Without `port`, the API's port is picked and picked again if another process bound it first."""
    choice = os.environ.get("CHAOS_PROXY", "auto")
    binary = shutil.which("toxiproxy-server")
    if choice == "toxiproxy" and not binary:
        raise FileNotFoundError(
            "CHAOS_PROXY=toxiproxy but no toxiproxy-server on PATH; unset it to use chaos.toxiproxy"
        )
    real = bool(binary) and choice != "python"

    def make(p: int) -> ChildProcess:
        if real:
            argv, ready = [binary, "-host", host, "-port", str(p)], "Starting Toxiproxy HTTP server"
        else:
            argv, ready = (
                [sys.executable, "-m", "chaos.toxiproxy", "--host", host, "--port", str(p), "--priority", priority]
                + ["--loop", loop],
                "toxiproxy-server-py ready",
            )
        return ChildProcess(argv, log_path, ready_text=ready, name="chaos-proxy")

    child, port = start_on_picked_port(make, port, timeout_s)
    return ProxyServer(child, host, port, real, scheduling_of(child.pid))


PRIORITY_LOG_TEXT = "event loop priority: "  # chaos.toxiproxy's log line saying what its --priority took


def priority_in_log(path: str | Path, text: str = PRIORITY_LOG_TEXT) -> str | None:
    """What priority a proxy process of ours reported in its log (`SCHED_FIFO 5`, `nice -10`, `normal`), for one
    whose process this host cannot read (on another node of a cluster run); None if the log does not say.
    `text`: the words before it (a replica's dispatch loops: server.priority.DISPATCH_PRIORITY_LOG_TEXT)."""
    try:
        with open(path, errors="replace") as lines:
            for line in lines:
                at = line.find(text)
                if at >= 0:
                    return line[at + len(text) :].split(" (asked", 1)[0].strip()
    except OSError:
        return None
    return None


def scheduling_of(pid: int | None) -> str:
    """A process's scheduling as the proxy words it (`SCHED_FIFO 5`, `nice -10`, `normal`); `unknown` if unreadable."""
    try:
        if os.sched_getscheduler(pid) == os.SCHED_FIFO:
            return f"SCHED_FIFO {os.sched_getparam(pid).sched_priority}"
        niceness = os.getpriority(os.PRIO_PROCESS, pid)
        return f"nice {niceness}" if niceness else "normal"
    except (AttributeError, OSError, TypeError):
        return "unknown"
