"""The one shape every benchmark returns, the machine facts beside its figures, and the summary table.

A benchmark module exposes `run(quick: bool) -> Result`: named figures with units and, where the
project has one, a target. The runner (`python -m benchmarks`) writes each Result as
reports/bench/NAME.json and all of them as one table, reports/bench/summary.md. Invariant: a timing
target is judged only in a full run (quick runs on noisy CI machines only produce figures); a figure
marked `budget` (a memory or size budget, not a timing) is judged in every run, quick included.

A benchmark's own command line (`python -m benchmarks.NAME`) is built from the same few helpers:
`cli(__doc__)` for its parser, `parse_with_out` for its `--out` (where its JSON report goes),
`write_report` to write it; `run_main` runs such a main for the suite without its own JSON.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import multiprocessing
import os
import platform
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Figure:
    name: str
    value: float | None
    unit: str
    target: float | None = None
    better: str = "lower"  # "lower": met when value <= target; "higher": met when value >= target
    budget: bool = False  # judged in quick mode too (memory/size, not a timing)

    def met(self) -> bool | None:
        if self.target is None or self.value is None:
            return None
        return self.value <= self.target if self.better == "lower" else self.value >= self.target

    def target_text(self) -> str:
        if self.target is None:
            return ""
        return f"{'<=' if self.better == 'lower' else '>='} {self.target:g}"


@dataclass
class Result:
    figures: list[Figure] = field(default_factory=list)
    details: dict = field(default_factory=dict)  # the benchmark's full figures (written to its JSON)
    skipped: str | None = None  # why the benchmark did not run here (no CUDA, a library missing)

    def add(
        self, name: str, value, unit: str, target: float | None = None, better: str = "lower", budget: bool = False
    ) -> None:
        self.figures.append(Figure(name, None if value is None else float(value), unit, target, better, budget))

    def failures(self, quick: bool) -> list[Figure]:
        """Figures whose target is judged in this mode and missed."""
        return [f for f in self.figures if (f.budget or not quick) and f.met() is False]


def load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def machine_facts() -> dict:
    """Cores, CPU model, the versions that move figures, the date: what a reader needs to compare runs."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    from importlib import metadata

    versions = {"python": platform.python_version()}
    # the installed distributions' versions (zenoh-python has no __version__; its distribution is eclipse-zenoh)
    for mod, dist in (("torch", "torch"), ("zenoh", "eclipse-zenoh"), ("numpy", "numpy"), ("mujoco", "mujoco")):
        try:
            versions[mod] = metadata.version(dist)
        except metadata.PackageNotFoundError:  # a missing library is a fact, not an error
            versions[mod] = None
    return {
        "cores": os.cpu_count(),
        "cpu_model": cpu,
        "platform": platform.platform(),
        **versions,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def summary_table(results: dict[str, dict]) -> str:
    """One Markdown table over every benchmark's JSON report: benchmark, figure, value, unit, target, met?"""
    lines = ["| benchmark | figure | value | unit | target | met? |", "|---|---|---|---|---|---|"]
    for name, rep in results.items():
        if rep.get("skipped"):
            lines.append(f"| {name} | skipped | | | | {rep['skipped']} |")
            continue
        if rep.get("error"):
            lines.append(f"| {name} | FAILED | | | | {rep['error']} |")
            continue
        for f in rep["figures"]:
            fig = Figure(**f)
            met = fig.met()
            judged = fig.budget or not rep["quick"]
            mark = "" if met is None else ("yes" if met else "NO") + ("" if judged else " (not judged: quick)")
            lines.append(f"| {name} | {fig.name} | {_fmt(fig.value)} | {fig.unit} | {fig.target_text()} | {mark} |")
    return "\n".join(lines) + "\n"


def report_dict(name: str, result: Result, quick: bool, load_start: list[float], seconds: float) -> dict:
    return {
        "benchmark": name,
        "quick": quick,
        "seconds": round(seconds, 2),
        "machine": machine_facts(),
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "skipped": result.skipped,
        "figures": [asdict(f) for f in result.figures],
        "details": result.details,
    }


def cli(doc: str, prog: str | None = None) -> argparse.ArgumentParser:
    """A benchmark's own parser: the first paragraph of its module docstring as the description."""
    return argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])


def parse_with_out(parser: argparse.ArgumentParser, argv: list[str] | None, out: str | Path) -> argparse.Namespace:
    """`parser`'s arguments and, last, `--out` (the JSON report's path; default `out`), parsed from argv."""
    parser.add_argument("--out", type=Path, default=Path(out))
    return parser.parse_args(argv)


def write_report(
    out: str | Path, report: dict, *, indent: int = 2, end: str = "\n", default=None, say: str | None = "wrote"
) -> dict:
    """`report` as JSON at `out` (its folder made), then `say out` printed unless `say` is None; returns `report`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=indent, default=default) + end)
    if say is not None:
        print(f"{say} {out}")
    return report


def run_main(main: Callable[[list[str]], dict], argv: list[str]) -> Result:
    """A Result whose details are what `main(argv)` returns, its own JSON report sent to /dev/null (the suite
    writes reports/bench/NAME.json itself)."""
    return Result(details=main([*argv, "--out", os.devnull]))


def run_one(name: str, quick: bool, out_dir: Path) -> dict:
    mod = importlib.import_module(f"benchmarks.{name}")
    load0, t0 = load_average(), time.monotonic()
    try:
        result = mod.run(quick)
    except Exception as exc:  # noqa: BLE001  one broken benchmark must not hide the others' figures
        traceback.print_exc()
        rep = {
            "benchmark": name,
            "quick": quick,
            "error": f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300],
            "figures": [],
        }
    else:
        rep = report_dict(name, result, quick, load0, time.monotonic() - t0)
        rep["failed_targets"] = [f.name for f in result.failures(quick)]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(rep, indent=1, default=float) + "\n")
    return rep


def _child(name: str, quick: bool, out_dir: Path) -> None:
    run_one(name, quick, out_dir)


def run_isolated(name: str, quick: bool, out_dir: Path) -> dict:
    """`run_one` in a spawned process; its report, or an error report when the process died without one."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.unlink(missing_ok=True)
    sys.stdout.flush()
    proc = multiprocessing.get_context("spawn").Process(target=_child, args=(name, quick, out_dir))
    proc.start()
    proc.join()
    if path.is_file() and proc.exitcode == 0:
        return json.loads(path.read_text())
    code = proc.exitcode
    how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
    rep = {
        "benchmark": name,
        "quick": quick,
        "error": f"its process ended ({how}) before writing a report",
        "figures": [],
    }
    path.write_text(json.dumps(rep, indent=1) + "\n")
    return rep
