"""The sweep's own assertions: the figures a sweep reports across its runs and the checks over them.

Part of the scenario language (a `sweep:` section's `assertions`); bench.evidence.capacity computes the
figures after the runs. Same expression language as run assertions, over SWEEP_FIGURES only.
"""

from __future__ import annotations

import math

from bench.scenario.assertions import AssertionSyntaxError, _Evaluator, parse

# sweep-level figures (the sweep's own `assertions` may use them)
SWEEP_FIGURES = {
    "knee": "the last swept value whose run held every assertion (null if the first one failed)",
    "first_failure": "the first swept value whose run failed an assertion (null if none failed)",
    "n_max": "P10's N_max from the measured r, t and RTT of the lightest load step",
    "n_max_nominal": "P10's N_max from the sweep's `formula` section (null without one)",
    "knee_ratio": "knee / n_max",
    "knee_ratio_nominal": "knee / n_max_nominal",
    "steps": "sweep values run",
    "knee_without_bench": "the knee with each failed step judged again on its figures less the bench host's "
    "measured share (null if the first step still failed)",
    "first_failure_without_bench": "the first failing value so judged (null if none)",
}


def evaluate_sweep_assertions(expressions: list[str], figures: dict) -> list[dict]:
    """The sweep's own assertions over SWEEP_FIGURES (same language: comparisons, and/or, + - * /)."""
    out = []
    for expr in expressions:
        scope = _SweepFigures(figures)
        try:
            ev = _sweep_evaluator()(scope, [])
            ok = bool(ev.eval(parse(expr)))
            value = ev.values[0] if len(ev.values) == 1 else ev.values
            out.append({"expression": expr, "result": "pass" if ok else "fail", "value": value, "error": None})
        except Exception as exc:
            out.append({"expression": expr, "result": "error", "value": None, "error": str(exc)})
    return out


def _sweep_evaluator():
    class SweepEvaluator(_Evaluator):
        def figure(self, name, scope):
            if name not in SWEEP_FIGURES:
                raise AssertionSyntaxError(f"unknown sweep figure {name!r}; sweep figures: {', '.join(SWEEP_FIGURES)}")
            return scope.scalars.get(name, math.nan)

    return SweepEvaluator


def check_sweep_expression(expr: str) -> None:
    if not isinstance(_sweep_evaluator()(_SweepFigures({k: 1 for k in SWEEP_FIGURES}), []).eval(parse(expr)), bool):
        raise AssertionSyntaxError("a sweep assertion must be a comparison, e.g. `knee >= 8`")


class _SweepFigures:
    """Looks like bench.scenario.assertions.Figures to the evaluator, holding the sweep's figures."""

    def __init__(self, figures: dict):
        self.scalars = {k: (math.nan if v is None else float(v)) for k, v in figures.items()}
        self.series, self.groups, self.states = {}, {}, {}
