"""Sweep variants: the dotted keys a sweep or `--set` addresses, and the checks of a `sweep:` section.

A sweep varies one dotted key (`fleet.groups.arm.count`: list items by index, name or id); every value
is checked as the run it will build, so a bad value is blamed on `sweep.values[i]` by `bench validate`.
The scenario builder is passed in (`build`): bench.scenario.load builds the variants
(`sweep_variants`) and this module stays below it.
"""

from __future__ import annotations

import copy

from bench.scenario import model as sm
from bench.scenario.spec import ScenarioError, Where


def read_sweep(w: Where, m: sm.ScenarioFile, data: dict, build) -> dict | None:
    sw = m.sweep
    if sw is None:
        return None
    try:
        get_dotted(data, sw.key)
    except KeyError as exc:
        raise w.fail(("sweep", "key"), f"{sw.key!r} does not name a key of this scenario ({exc.args[0]})") from None
    if sw.key.split(".")[0] in ("sweep", "name"):
        raise w.fail(("sweep", "key"), "sweep cannot vary `sweep` or `name`")
    from bench.scenario.assertions import AssertionSyntaxError
    from bench.scenario.sweeps import check_sweep_expression

    for i, expr in enumerate(sw.assertions):
        try:
            check_sweep_expression(expr)
        except AssertionSyntaxError as exc:
            raise ScenarioError(
                w.source, w.line("sweep", "assertions", i), f"sweep.assertions[{i}]", str(exc)
            ) from None
    if sw.assertions and sw.mode != "capacity":  # the runner judges them against a capacity sweep's knee only
        raise w.fail(
            ("sweep", "assertions"),
            f"sweep assertions are judged only with mode: capacity (this sweep's "
            f"mode is {sw.mode!r}); set mode: capacity, or move each run's "
            f"checks to the top-level assertions",
        )
    if sw.formula and sw.mode != "capacity":  # P10's formula is printed beside a capacity sweep's knee only
        raise w.fail(
            ("sweep", "formula"),
            f"the formula is compared with a capacity sweep's knee only (this sweep's "
            f"mode is {sw.mode!r}); set mode: capacity, or remove it",
        )
    _check_sweep_values(w, sw, data, build)
    formula = (
        {k: v for k, v in sw.formula.model_dump().items() if k in (data["sweep"].get("formula") or {})}
        if sw.formula
        else None
    )
    return {
        "key": sw.key,
        "values": list(sw.values),
        "mode": sw.mode,
        "stop_after_failure": (sw.mode == "capacity") if sw.stop_after_failure is None else sw.stop_after_failure,
        "formula": formula or None,
        "assertions": list(sw.assertions),
    }


def _check_sweep_values(w: Where, sw, data: dict, build) -> None:
    """Each value once (a run and its directory are named after it), a capacity sweep's load steps increasing (its
    knee is the last step held before the first that failed), and every run valid as the sweep will build it: a bad
    value is blamed on `sweep.values[i]`, found by `bench validate`, not by the run that reaches it (or, for the
    first step, by a traceback)."""
    values = list(sw.values)

    def fail(i: int, message: str) -> ScenarioError:
        return ScenarioError(w.source, w.line("sweep", "values", i), f"sweep.values[{i}]", message)

    for i, v in enumerate(values):
        if v in values[:i]:
            raise fail(i, f"{v!r} is given twice: each value is one run, named after it; give each once")
    if sw.mode == "capacity":
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise fail(i, f"a capacity sweep's values are load steps (numbers), got {v!r}")
            if i and v <= values[i - 1]:
                raise fail(
                    i,
                    f"{v!r} after {values[i - 1]!r}: a capacity sweep's steps increase (its knee is the last "
                    f"step held before the first that failed); sort them: {sorted(values)}",
                )
    for i, v in enumerate(values):
        variant = copy.deepcopy(data)
        variant.pop("sweep", None)
        set_dotted(variant, sw.key, v)
        try:
            build(variant, w.source)
        except ScenarioError as exc:
            raise fail(i, f"with {sw.key} = {v!r}: {exc.path + ': ' if exc.path else ''}{exc.message}") from None


def _step(obj, part):
    if isinstance(obj, list):
        if part.isdigit() and int(part) < len(obj):
            return int(part)
        for i, item in enumerate(obj):  # groups/replicas may be addressed by name or id
            if isinstance(item, dict) and part in (item.get("name"), item.get("id")):
                return i
        raise KeyError(f"no item {part!r}")
    if isinstance(obj, dict) and part in obj:
        return part
    raise KeyError(f"no key {part!r}")


def get_dotted(data, key: str):
    obj = data
    for part in key.split("."):
        obj = obj[_step(obj, part)]
    return obj


def set_dotted(data, key: str, value) -> None:
    parts = key.split(".")
    obj = data
    for part in parts[:-1]:
        obj = obj[_step(obj, part)]
    last = parts[-1]
    if isinstance(obj, dict):
        obj[last] = value
    else:
        obj[_step(obj, last)] = value
