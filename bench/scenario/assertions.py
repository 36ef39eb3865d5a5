"""The assertion language of scenario files, and its safe evaluator.

An assertion is one expression such as ``p99(rtt_ms) < 250 and dead_robots == 0``,
``group[hold].fallback_ticks > 0`` or
``states(group=eu) contains [STREAMING, DEGRADED, STALLED, STREAMING]``.

Invariant: expressions are parsed with `ast` and walked node by node; only figure names (from
bench.scenario.catalog), numbers, comparisons, and/or/not, unary minus, + - * / between numbers, the `contains` operator, state-name
lists and the functions in `FUNCTIONS` are accepted. Nothing is ever passed to eval/exec, no
attribute of a Python object is ever looked up by a user-supplied name, and every rejection names
the offending word and lists what is allowed.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.scenario.catalog import FIGURES, STATES, scalar_names, series_names
from wire.suggest import did_you_mean

MAX_EXPRESSION_CHARS = 500
_CONTAINS_RE = re.compile(r"\bcontains\b")


class AssertionSyntaxError(ValueError):
    """The expression is not in the assertion language (names the offending part)."""


@dataclass
class Series:
    name: str
    values: np.ndarray


@dataclass
class StateSequences:
    """Per-robot state sequences (consecutive duplicates removed) of one group or of all robots."""

    scope: str
    sequences: list[list[str]]


@dataclass
class Figures:
    """What an assertion can see: scalars, series, per-group figures and per-robot state sequences."""

    scalars: dict[str, float] = field(default_factory=dict)
    series: dict[str, np.ndarray] = field(default_factory=dict)
    groups: dict[str, Figures] = field(default_factory=dict)
    states: dict[str, list[list[str]]] = field(default_factory=dict)  # group -> sequences; "*" = all


@dataclass
class AssertionResult:
    expression: str
    passed: bool
    value: Any
    error: str | None = None
    line: int = 0
    # a failed assertion on a figure the bench's measured share moves: {value, result} of it without that share
    # (bench.evidence.figures.without_bench); None otherwise
    without_bench: dict | None = None

    def to_json(self) -> dict:
        out = {
            "expression": self.expression,
            "result": "pass" if self.passed else ("error" if self.error else "fail"),
            "value": _jsonable(self.value),
            "error": self.error,
            "line": self.line,
        }
        if self.without_bench is not None:
            out["without_bench"] = {k: _jsonable(v) for k, v in self.without_bench.items()}
        return out


def _jsonable(v):
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (np.floating, float)):
        return None if math.isnan(float(v)) else float(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    return v


# --- functions: config word -> implementation -------------------------------------------------

FUNCTIONS: dict[str, Callable[..., Any]] = {}


def function(name: str):
    def deco(fn):
        FUNCTIONS[name] = fn
        return fn

    return deco


def _series_arg(fname: str, arg) -> np.ndarray:
    if isinstance(arg, Series):
        return np.asarray(arg.values, dtype=float)
    if isinstance(arg, (int, float)) and not isinstance(arg, bool):
        return np.asarray([arg], dtype=float)
    raise AssertionSyntaxError(f"{fname}() takes a series such as {', '.join(series_names())}")


def _percentile(q: float):
    def fn(ctx, series):
        v = _series_arg(f"p{int(q)}", series)
        return float(np.percentile(v, q)) if v.size else math.nan

    return fn


for _q in (50, 90, 95, 99):
    FUNCTIONS[f"p{_q}"] = _percentile(_q)


@function("max")
def _max(ctx, *args):
    if len(args) == 1:
        v = _series_arg("max", args[0])
        return float(v.max()) if v.size else math.nan
    return max(_number("max", a) for a in args)


@function("min")
def _min(ctx, *args):
    if len(args) == 1:
        v = _series_arg("min", args[0])
        return float(v.min()) if v.size else math.nan
    return min(_number("min", a) for a in args)


@function("mean")
def _mean(ctx, series):
    v = _series_arg("mean", series)
    return float(v.mean()) if v.size else math.nan


@function("count")
def _count(ctx, series):
    return int(_series_arg("count", series).size)


@function("ratio")
def _ratio(ctx, a, b):
    a, b = _number("ratio", a), _number("ratio", b)
    if b == 0:
        return 0.0 if a == 0 else math.inf
    return a / b


@function("states")
def _states(ctx, group=None):
    key = "*" if group is None else group
    if key != "*" and key not in ctx.figures.groups and key not in ctx.figures.states:
        raise AssertionSyntaxError(
            f"unknown group {key!r} in states(); groups: {', '.join(ctx.group_names) or '(none)'}"
        )
    return StateSequences(key, ctx.figures.states.get(key, []))


@function("group")
def _group(ctx, name):
    return ctx.group_scope(name)


def _number(fname, v) -> float:
    if isinstance(v, Series):
        raise AssertionSyntaxError(f"{fname}() got the series {v.name!r}; wrap it in p99(...), max(...), count(...)")
    if not isinstance(v, (int, float)):
        raise AssertionSyntaxError(f"{fname}() takes numbers")
    return float(v)


def is_subsequence(expected: list[str], seq: list[str]) -> bool:
    it = iter(seq)
    return all(any(s == e for s in it) for e in expected)


# --- the evaluator -----------------------------------------------------------------------------

_COMPARE = {
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
}
_ALLOWED = (
    "figure names, numbers, + - * /, < <= > >= == !=, and/or/not, contains, group[NAME].figure, figure[PROCESS], and the functions "
    + ", ".join(sorted(set(FUNCTIONS) | {"p50", "p90", "p95", "p99"}))
)


class _Evaluator:
    def __init__(self, figures: Figures, group_names: list[str], replicas: list[str] | None = None):
        self.figures = figures
        self.group_names = group_names
        self.replicas = replicas  # a check before the run (its processes unknown yet): `figure[PROCESS]` by its form
        self.values: list[Any] = []  # the left operand of each comparison, for the report

    def group_scope(self, name) -> Figures:
        if name not in self.group_names:
            raise AssertionSyntaxError(f"unknown group {name!r}; groups: {', '.join(self.group_names) or '(none)'}")
        return self.figures.groups.get(name, Figures())

    def figure(self, name: str, scope: Figures) -> Any:
        if name not in FIGURES:
            hint = _closest(name, list(FIGURES))
            raise AssertionSyntaxError(f"unknown figure {name!r}{hint}; known figures: {', '.join(FIGURES)}")
        kind = FIGURES[name][0]
        if kind.startswith("process_"):
            raise AssertionSyntaxError(
                f"{name} is one value per process: name the process, e.g. {name}[server:r0] "
                f"or {name}[router]; processes here: {', '.join(self.processes()) or '(none)'}"
            )
        if kind == "series":
            return Series(name, scope.series.get(name, np.empty(0)))
        return scope.scalars.get(name, math.nan)

    def eval(self, node: ast.AST, scope: Figures | None = None) -> Any:
        scope = scope or self.figures
        if isinstance(node, ast.Expression):
            return self.eval(node.body)
        if isinstance(node, ast.BoolOp):
            parts = [self._truth(self.eval(v)) for v in node.values]  # evaluate all: every value is reported
            return all(parts) if isinstance(node.op, ast.And) else any(parts)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.Not):
                return not self._truth(self.eval(node.operand))
            if isinstance(node.op, ast.USub):
                return -_number("-", self.eval(node.operand))
            raise AssertionSyntaxError(f"operator {type(node.op).__name__} is not allowed; allowed: {_ALLOWED}")
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.RShift):  # the rewritten `contains`
            return self._contains(node)
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:  # relative bounds: 1.5 * group[lan].x
            a = _scalar_or_fail(self.eval(node.left), node.left)
            b = _scalar_or_fail(self.eval(node.right), node.right)
            if isinstance(a, bool) or isinstance(b, bool):
                raise AssertionSyntaxError("arithmetic takes numbers, not comparisons")
            return _ARITHMETIC[type(node.op)](float(a), float(b))
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or isinstance(node.value, (int, float)):
                return node.value
            raise AssertionSyntaxError(f"literal {node.value!r} is not allowed; only numbers, true/false")
        if isinstance(node, ast.Name):
            if node.id in ("true", "false"):
                return node.id == "true"
            if node.id in FUNCTIONS:
                raise AssertionSyntaxError(f"{node.id} is a function; call it, e.g. {node.id}(...)")
            return self.figure(node.id, scope)
        if isinstance(node, ast.Call):
            return self._call(node)
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and FIGURES.get(node.value.id, ("",))[0].startswith("process_")
        ):
            return self.process_figure(node.value.id, self._process_word(node.slice))
        if isinstance(node, ast.Subscript):
            if not (isinstance(node.value, ast.Name) and node.value.id == "group"):
                raise AssertionSyntaxError("indexing is only allowed as group[NAME] and figure[PROCESS]")
            return self.group_scope(self._word(node.slice, "group name"))
        if isinstance(node, ast.Attribute):
            target = self.eval(node.value)
            if not isinstance(target, Figures):
                raise AssertionSyntaxError(f"'.{node.attr}' is only allowed after group[NAME]")
            return self.figure(node.attr, target)
        if isinstance(node, ast.List):
            raise AssertionSyntaxError("a list is only allowed after `contains`")
        raise AssertionSyntaxError(f"{type(node).__name__} is not allowed in an assertion; allowed: {_ALLOWED}")

    def processes(self) -> list[str]:
        return sorted(
            {k[k.index("[") + 1 : -1] for k in (*self.figures.scalars, *self.figures.series) if k.endswith("]")}
        )

    def process_figure(self, name: str, process: str) -> Any:
        if self.replicas is not None:
            self._check_process(process)
        key = f"{name}[{process}]"
        if FIGURES[name][0] == "process_series":
            if key not in self.figures.series and self.processes() and process not in self.processes():
                raise AssertionSyntaxError(
                    f"no process {process!r} in this run; processes: {', '.join(self.processes())}"
                )
            return Series(key, self.figures.series.get(key, np.empty(0)))
        return self.figures.scalars.get(key, math.nan)

    def _check_process(self, process: str) -> None:
        """Before the run: a process of the forms a run has (docs/scenarios.md), a replica by its id."""
        kind, _, name = process.partition(":")
        if (
            kind == "server"
            and name in self.replicas
            or kind == "shard"
            and name.isdigit()
            or process in ("router", "chaos-proxy", "runner")
            or re.fullmatch(r"chaos-proxy-\d+", process)
            or kind in ("router", "chaos-proxy")
            and name
        ):  # a node's router or proxy (--cluster ray)
            return
        hint = (
            f"; replicas: {', '.join(self.replicas)}"
            if kind == "server"
            else did_you_mean(process, ["router", "chaos-proxy", "runner", *(f"server:{r}" for r in self.replicas)])
        )
        raise AssertionSyntaxError(
            f"no process {process!r} in a run of this scenario{hint}; processes: router, "
            f"chaos-proxy, runner, server:<replica>, shard:<k> (and router:<node>, "
            f"chaos-proxy:<node> with --cluster ray)"
        )

    def _process_word(self, node: ast.AST) -> str:
        """`server:r0` parses as a slice, `shard:0` too, `router` as a name, `chaos-proxy` as a subtraction (or
        "chaos-proxy" as a string)."""
        if isinstance(node, ast.Slice) and node.step is None and node.lower is not None and node.upper is not None:
            return f"{self._dashed(node.lower)}:{self._dashed(node.upper)}"
        return self._dashed(node)

    def _dashed(self, node: ast.AST) -> str:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            return f"{self._dashed(node.left)}-{self._dashed(node.right)}"
        return self._word(node, "process name (router, chaos-proxy, server:<replica>, shard:<k>, runner)")

    def _truth(self, v) -> bool:
        if isinstance(v, bool):
            return v
        raise AssertionSyntaxError("and/or/not combine comparisons, e.g. `dead_robots == 0 and p99(rtt_ms) < 250`")

    def _word(self, node: ast.AST, what: str) -> str:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return str(node.value)
        raise AssertionSyntaxError(f"expected a {what} (a bare word)")

    def _call(self, node: ast.Call):
        if not isinstance(node.func, ast.Name):
            raise AssertionSyntaxError(f"only these functions may be called: {', '.join(sorted(FUNCTIONS))}")
        name = node.func.id
        fn = FUNCTIONS.get(name)
        if fn is None:
            raise AssertionSyntaxError(
                f"unknown function {name!r}{_closest(name, list(FUNCTIONS))}; functions: {', '.join(sorted(FUNCTIONS))}"
            )
        if name in ("states", "group"):  # their arguments are group names, not figures
            args = [self._word(a, "group name") for a in node.args]
            kwargs = {}
            for kw in node.keywords:
                if kw.arg != "group":
                    raise AssertionSyntaxError(f"{name}() takes only group=NAME")
                kwargs["group"] = self._word(kw.value, "group name")
            if name == "group":
                if len(args) + len(kwargs) != 1:
                    raise AssertionSyntaxError("group() takes one group name")
                return fn(self, args[0] if args else kwargs["group"])
            if len(args) + len(kwargs) > 1:
                raise AssertionSyntaxError("states() takes at most one group name")
            chosen = args[0] if args else kwargs.get("group")
            return fn(self, chosen)
        if node.keywords:
            raise AssertionSyntaxError(f"{name}() takes no keyword arguments")
        args = [self.eval(a) for a in node.args]
        try:
            return fn(self, *args)
        except TypeError:
            raise AssertionSyntaxError(f"{name}() got {len(args)} argument(s)") from None

    def _compare(self, node: ast.Compare) -> bool:
        left = self.eval(node.left)
        self.values.append(_scalar_or_fail(left, node.left))
        ok = True
        for op, right_node in zip(node.ops, node.comparators):
            fn = _COMPARE.get(type(op))
            if fn is None:
                raise AssertionSyntaxError(
                    f"comparison {type(op).__name__} is not allowed; use < <= > >= == != or contains"
                )
            right = _scalar_or_fail(self.eval(right_node), right_node)
            if isinstance(left, float) and math.isnan(left) or isinstance(right, float) and math.isnan(right):
                ok = False  # no data never passes
            elif not fn(left, right):
                ok = False
            left = right
        return ok

    def _contains(self, node: ast.BinOp) -> bool:
        seqs = self.eval(node.left)
        if not isinstance(seqs, StateSequences):
            raise AssertionSyntaxError("`contains` needs states(...) on its left")
        if not isinstance(node.right, ast.List) or not node.right.elts:
            raise AssertionSyntaxError("`contains` needs a list of states on its right, e.g. [STREAMING, STALLED]")
        expected = []
        for elt in node.right.elts:
            word = self._word(elt, "state name")
            if word.upper() not in STATES:
                raise AssertionSyntaxError(f"unknown state {word!r}; states: {', '.join(STATES)}")
            expected.append(word.upper())
        matched = sum(1 for s in seqs.sequences if is_subsequence(expected, s))
        total = len(seqs.sequences)
        self.values.append(f"{matched}/{total} robots")
        return total > 0 and matched == total


def _divide(a: float, b: float) -> float:
    return a / b if b else (math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a))


_ARITHMETIC: dict[type, Callable[[float, float], float]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: _divide,
}


def _scalar_or_fail(v, node):
    if isinstance(v, Series):
        raise AssertionSyntaxError(
            f"{v.name!r} is a series; compare p50/p95/p99/max/min/mean/count of it, e.g. p99({v.name})"
        )
    if isinstance(v, (Figures, StateSequences)):
        raise AssertionSyntaxError("compare a figure, e.g. group[NAME].fallback_ticks, or use `contains` with states()")
    if isinstance(v, bool):
        return v
    if not isinstance(v, (int, float)):
        raise AssertionSyntaxError("comparisons take numbers")
    return v


def _closest(word: str, options: list[str]) -> str:
    return did_you_mean(word, options)


# a number with a unit glued on (`5ms`, `2 s`, `50 %`): only looked for once the expression fails to parse
_UNIT_RE = re.compile(
    r"(?<![\w.])(\d+(?:\.\d+)?)\s*(ms|us|µs|s|min|%|hz|Hz|kHz|B|kB|KB|MB|GB|bps|kbps|Mbps|Mbit|mbit)(?!\w)"
)


def parse(expression: str) -> ast.Expression:
    if not isinstance(expression, str) or not expression.strip():
        raise AssertionSyntaxError("empty assertion")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise AssertionSyntaxError(f"assertion longer than {MAX_EXPRESSION_CHARS} characters")
    if ">>" in expression:
        raise AssertionSyntaxError("'>>' is not allowed; allowed: " + _ALLOWED)
    source = _CONTAINS_RE.sub(">>", expression.strip())
    try:
        return ast.parse(source, mode="eval")
    except SyntaxError as exc:
        unit = _UNIT_RE.search(expression)
        if unit:
            raise AssertionSyntaxError(
                f"units are not written: write {unit.group(1)} instead of {unit.group(0).strip()}; each figure has "
                f"one fixed unit, in its name (rtt_ms, duration_s) and in `bench figures`"
            ) from None
        raise AssertionSyntaxError(f"not an expression: {exc.msg} at column {exc.offset}") from None


def figure_names(expression: str) -> set[str]:
    """The bare names an assertion reads (figures, and the names of the functions it calls); empty if it does not
    parse."""
    try:
        tree = parse(expression)
    except AssertionSyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def check_expression(expression: str, groups: list[str], replicas: list[str] | None = None) -> None:
    """Raise AssertionSyntaxError unless `expression` is valid for a scenario with these groups (and replica ids:
    `figure[server:ID]` must name one)."""
    tree = parse(expression)
    empty = Figures(groups={g: Figures() for g in groups}, states={g: [] for g in [*groups, "*"]})
    result = _Evaluator(empty, list(groups), None if replicas is None else list(replicas)).eval(tree)
    if not isinstance(result, bool):
        raise AssertionSyntaxError("an assertion must be a comparison, e.g. `dead_robots == 0`")


def evaluate(expression: str, figures: Figures, groups: list[str] | None = None, line: int = 0) -> AssertionResult:
    groups = list(figures.groups) if groups is None else groups
    try:
        tree = parse(expression)
        ev = _Evaluator(figures, groups)
        result = ev.eval(tree)
        if not isinstance(result, bool):
            raise AssertionSyntaxError("an assertion must be a comparison, e.g. `dead_robots == 0`")
    except AssertionSyntaxError as exc:
        return AssertionResult(expression, False, None, error=str(exc), line=line)
    value = ev.values[0] if len(ev.values) == 1 else ev.values
    return AssertionResult(expression, bool(result), value, line=line)


def known_figures_help() -> str:
    return "scalars: " + ", ".join(scalar_names()) + "\nseries: " + ", ".join(series_names())
