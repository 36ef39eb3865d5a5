"""What a finished run hands the report: its outcome (`RunOutcome`), the verdict drawn from its assertions
and fidelity, and the exit code of each verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bench.evidence.exitcode import Exit
from bench.evidence.figures import RunData
from bench.scenario.assertions import AssertionResult


@dataclass
class RunOutcome:
    scenario_name: str
    description: str
    run_dir: Path
    verdict: str
    started_utc: str
    wall_s: float
    duration_s: float
    robots: int
    assertions: list[AssertionResult] = field(default_factory=list)
    figures: dict = field(default_factory=dict)
    group_figures: dict = field(default_factory=dict)
    data: RunData | None = None
    meta: dict = field(default_factory=dict)
    error: str | None = None

    @property
    def exit_code(self) -> int:
        return Exit.of(self.verdict)


def verdict_of(results: list[AssertionResult], error: str | None, fidelity: dict | None = None) -> str:
    """pass, fail, error, or inconclusive: an assertion failed while the run's fidelity was out of
    tolerance, so the bench host, not the system, may have failed it. A pass stays a pass (with the warning)."""
    if error:
        return "error"
    if any(r.error for r in results):
        return "error"
    if all(r.passed for r in results):
        return "pass"
    return "inconclusive" if fidelity and not fidelity.get("valid", True) else "fail"
