"""What a run shows the person at the terminal: live progress, then a table of the assertions.

On a TTY with `rich` installed: one progress bar per phase (warmup, run, ...) with robots per
state and live figures beside it, refreshed every second, and the verdict as a coloured table.
Otherwise (CI logs, a pipe, no rich): a plain line every 10 s and one plain line per assertion,
the same words in both forms. `--quiet` shows no progress. Invariants: it only reads a status
snapshot the runner hands it and never blocks the run; a display problem never stops one.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable


def format_status(elapsed_s: float, total_s: float, phase: str, status: dict, cpu: dict | None) -> str:
    return f"[{phase} {elapsed_s:6.1f}/{total_s:g}s] | " + _status_text(status, cpu)


def _status_text(status: dict, cpu: dict | None) -> str:
    states = status.get("states") or {}
    st = " ".join(f"{k[:4]}:{v}" for k, v in sorted(states.items(), key=lambda kv: -kv[1]) if v)
    ticks = status.get("ticks", 0)
    none = status.get("none_ticks", 0)
    late = status.get("late_ticks", 0)
    host = status.get("host_late_ticks", 0)
    rtt = status.get("rtt_ms_p50")
    rtt99 = status.get("rtt_ms_p99")
    parts = [
        st or "no robots yet",
        f"ticks {ticks}",
        f"none {100 * none / ticks:.1f}%" if ticks else "none -",
        f"late {100 * late / ticks:.2f}% host-late {100 * host / ticks:.2f}%" if ticks else "",
        f"rtt p50 {rtt:.0f} p99 {rtt99:.0f} ms" if rtt is not None and rtt99 is not None else "rtt -",
    ]
    if cpu:
        parts.append(f"cpu {cpu.get('host_percent', 0):.0f}%")
    if status.get("unplanned_exits"):  # a replica or router died with no fault on it: the run fails (bench.run.verdict)
        parts.append("EXITED " + " ".join(status["unplanned_exits"]))
    return " | ".join(p for p in parts if p)


def rich_console(stream):
    """A rich Console on `stream` when it is a terminal and rich is installed, else None (plain lines)."""
    if not bool(getattr(stream, "isatty", lambda: False)()):
        return None
    try:
        from rich.console import Console
    except ImportError:  # rich comes with the sim extra; without it the plain form is complete
        return None
    return Console(file=stream, highlight=False)


class Progress:
    def __init__(self, snapshot: Callable[[], tuple[float, float, str, dict, dict | None]], stream=None, enabled=True):
        self.snapshot = snapshot
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.console = rich_console(self.stream) if enabled else None
        self.tty = self.console is not None
        self.period_s = 1.0 if self.tty else 10.0
        self._bars = None
        self._tasks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def start(self) -> Progress:
        if self.enabled:
            if self.console is not None:
                from rich.progress import BarColumn, TextColumn
                from rich.progress import Progress as Bars
                from rich.table import Column

                fixed = dict(no_wrap=True, overflow="ignore")  # the phase and its time never squeeze
                self._bars = Bars(
                    TextColumn("{task.description:>6}", table_column=Column(min_width=6, **fixed)),
                    BarColumn(bar_width=16, table_column=Column(**fixed)),
                    TextColumn("{task.completed:6.1f}/{task.total:g}s", table_column=Column(min_width=11, **fixed)),
                    TextColumn("{task.fields[status]}", table_column=Column(ratio=1, overflow="fold")),
                    console=self.console,
                    auto_refresh=False,
                )
                self._bars.start()
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.emit()

    def emit(self) -> None:
        try:
            snap = self.snapshot()
            line = format_status(*snap)
        except Exception as exc:  # a display problem must never stop the run
            snap, line = None, f"(progress unavailable: {exc!r})"
        if self._bars is not None and snap is not None:
            self._show_bar(*snap)
            return
        self.stream.write(line + "\n")
        self.stream.flush()

    def _show_bar(self, elapsed_s: float, total_s: float, phase: str, status: dict, cpu: dict | None) -> None:
        if phase not in self._tasks:  # a new phase: the previous bars stay, full, as a record of the run
            for task in self._tasks.values():
                t = self._bars.tasks[task]
                self._bars.update(task, completed=t.total)
            self._tasks[phase] = self._bars.add_task(phase, total=max(float(total_s), 1e-9), status="")
        self._bars.update(
            self._tasks[phase], completed=min(float(elapsed_s), float(total_s)), status=_status_text(status, cpu)
        )
        self._bars.refresh()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)
        if self._bars is not None:
            self._bars.stop()


def print_verdict(title: str, results: list, error: str | None = None, stream=None) -> None:
    """The end of a run: `title` (verdict and where the summary is), then each assertion with its value.

    `results` hold `passed`, `error`, `expression` and `value` (bench.evidence assertions), and a failed one
    may hold `without_bench` (its value less the bench's measured share)."""
    stream = stream or sys.stderr
    console = rich_console(stream)
    if console is None:
        print(title, file=stream)
        for r in results:
            mark = "PASS" if r.passed else ("ERROR" if r.error else "FAIL")
            print(
                f"  {mark:5} {r.expression}  (value: {r.value!r}{'; ' + r.error if r.error else ''}{_bare(r)})",
                file=stream,
            )
        if error:
            print("  ERROR " + "\n        ".join(error_lines(error)), file=stream)
        return
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", show_lines=False)
    for name in ("result", "assertion", "value"):
        table.add_column(name, overflow="fold")
    for r in results:
        mark, style = ("PASS", "green") if r.passed else (("ERROR", "yellow") if r.error else ("FAIL", "bold red"))
        table.add_row(
            Text(mark, style=style),
            Text(r.expression),
            Text(repr(r.value) + (f"; {r.error}" if r.error else "") + _bare(r)),
        )
    console.print(table)
    if error:
        console.print(Text("ERROR " + "\n      ".join(error_lines(error)), style="yellow"))


def _bare(r) -> str:
    w = getattr(r, "without_bench", None)
    return f"; without the bench's measured share {w['value']!r}: {w['result']}" if w else ""


def error_lines(error: str, most: int = 12) -> list[str]:
    """The run's error as printed: its lines (a replica that did not start names its own error on the next
    lines) up to a traceback, blank ones dropped, at most `most` (the rest is in summary.json and the logs)."""
    lines = [line for line in error.splitlines() if line.strip()] or [error]
    if any(line.startswith("Traceback (most recent call last)") for line in lines[1:]):  # the runner's own, for
        lines = lines[: next(i for i, line in enumerate(lines) if line.startswith("Traceback"))]  # summary.json only
    return lines[:most] + ([f"... {len(lines) - most} more lines in summary.json"] if len(lines) > most else [])


def now() -> float:
    return time.monotonic()
