"""The live progress line on stderr: elapsed time, robots per state and live figures.

Refreshed in place every second on a TTY, printed as a new line every 10 s otherwise (CI logs).
Invariant: it only reads a status snapshot the runner hands it; it never blocks the run.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable


def format_status(elapsed_s: float, total_s: float, phase: str, status: dict, cpu: dict | None) -> str:
    states = status.get("states") or {}
    st = " ".join(f"{k[:4]}:{v}" for k, v in sorted(states.items(), key=lambda kv: -kv[1]) if v)
    ticks = status.get("ticks", 0)
    none = status.get("none_ticks", 0)
    late = status.get("late_ticks", 0)
    host = status.get("host_late_ticks", 0)
    rtt = status.get("rtt_p50_ms")
    rtt99 = status.get("rtt_p99_ms")
    parts = [f"[{phase} {elapsed_s:6.1f}/{total_s:g}s]", st or "no robots yet",
             f"ticks {ticks}", f"none {100 * none / ticks:.1f}%" if ticks else "none -",
             f"late {100 * late / ticks:.2f}% host-late {100 * host / ticks:.2f}%" if ticks else "",
             f"rtt p50 {rtt:.0f} p99 {rtt99:.0f} ms" if rtt is not None and rtt99 is not None else "rtt -"]
    if cpu:
        parts.append(f"cpu {cpu.get('host_percent', 0):.0f}%")
    return " | ".join(p for p in parts if p)


class Progress:
    def __init__(self, snapshot: Callable[[], tuple[float, float, str, dict, dict | None]], stream=None, enabled=True):
        self.snapshot = snapshot
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.period_s = 1.0 if self.tty else 10.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def start(self) -> "Progress":
        if self.enabled:
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.emit()

    def emit(self) -> None:
        try:
            line = format_status(*self.snapshot())
        except Exception as exc:  # a display problem must never stop the run
            line = f"(progress unavailable: {exc!r})"
        if self.tty:
            self.stream.write("\r\x1b[2K" + line[: 200])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def now() -> float:
    return time.monotonic()
