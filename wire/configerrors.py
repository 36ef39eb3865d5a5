"""Pydantic's validation records as ``file:line: key.path: what is wrong; what to do``: the one
translation the server manifest and the scenario language share.

Owns the wording of every schema error (type, range, choice, unknown key, missing key, null) and
the walk from an error's location to the field that explains it. The models stay with their
owners (server/manifest/, bench/scenario/model.py); the line comes from `wire.yamlines`.
Invariants: no pydantic import at module level (wire is the robot's light install: only the
server and the twin, which have pydantic, call these functions); the first error reported is an
unknown key if there is one (a typo usually explains the rest), else pydantic's first.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from wire import yamlines
from wire.suggest import did_you_mean

CUSTOM = "config"  # the error type of a check written in our words (`problem`)


class Doc:
    """What docs and errors need beyond pydantic's field (`noun`, `default_doc`, ...), carried on the
    field's `json_schema_extra`; `enum` (a callable) adds the names a registry knows to the JSON Schema."""

    def __init__(self, enum: Callable[[], Any] | None = None, **meta: Any):
        self.enum, self.meta = enum, meta

    def __call__(self, schema: dict) -> None:
        names = self.enum() if self.enum is not None else None
        if names:
            target = next((s for s in schema.get("anyOf", ()) if s.get("type") == "string"), schema)
            target["enum"] = list(names)


def problem(message: str, key: str | None = None) -> None:
    """Fail a validator with our own words; `key` names a field below the one being validated."""
    from pydantic_core import PydanticCustomError

    raise PydanticCustomError(CUSTOM, "{message}", {"message": message, "key": key})


def show(v: Any) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(type(v))
    if isinstance(v, Mapping):
        kind = "a mapping"
    elif isinstance(v, (list, tuple)):
        kind = "a list"
    return f"{v!r} ({kind})" if kind else repr(v)


def unwrap(tp: Any) -> tuple[Any, bool]:
    """(the type without None and without Annotated, whether None is allowed)."""
    nullable = False
    while True:
        if typing.get_origin(tp) is Annotated:
            tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) in (typing.Union, types.UnionType):
            args = typing.get_args(tp)
            rest = [a for a in args if a is not type(None)]
            nullable = nullable or len(rest) < len(args)
            if len(rest) != 1:
                return typing.Union[tuple(rest)], nullable  # noqa: UP007 (a Union built at run time)
            tp = rest[0]
        else:
            return tp, nullable


def markers(tp: Any) -> list[Any]:
    """The Annotated metadata of `tp` and of its non-None union member."""
    out: list[Any] = []
    while True:
        if typing.get_origin(tp) is Annotated:
            out.extend(typing.get_args(tp)[1:])
            tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) in (typing.Union, types.UnionType):
            rest = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(rest) != 1:
                return out
            tp = rest[0]
        else:
            return out


def model_fields(tp: Any) -> dict[str, Any]:
    """name -> pydantic FieldInfo of a pydantic dataclass or model; {} for anything else."""
    return getattr(tp, "__pydantic_fields__", None) or getattr(tp, "model_fields", None) or {}


def is_model(tp: Any) -> bool:
    """A pydantic model or pydantic dataclass (a section with keys), not a value type."""
    return isinstance(tp, type) and (hasattr(tp, "__pydantic_fields__") or hasattr(tp, "model_fields"))


def field_at(cls: type, loc: tuple) -> tuple[Any, Any]:
    """(the FieldInfo of the last field named on `loc`, the type at `loc`); (None, None) off the schema."""
    tp, info = cls, None
    for part in loc:
        tp = unwrap(tp)[0]
        if is_model(tp) and isinstance(part, str):
            info = model_fields(tp).get(part)
            if info is None:
                return None, None
            tp = info.annotation
        elif typing.get_origin(tp) in (tuple, list) and isinstance(part, int):
            tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[0 if part == "[key]" else 1]
        elif typing.get_origin(tp) is typing.Union and isinstance(part, str):
            continue  # a tagged union member: pydantic names the member on the loc
        else:
            return info, None
    return info, tp


def doc_meta(info: Any) -> dict:
    extra = getattr(info, "json_schema_extra", None)
    return extra.meta if isinstance(extra, Doc) else {}


def bounds(info: Any, tp: Any = None) -> tuple[Any, Any, Any]:
    """(ge, le, gt) of a field (from its FieldInfo or an Annotated type); None where unbounded."""
    lo = hi = gt = None
    found = [*(getattr(info, "metadata", ()) or ()), *markers(tp)]
    found += [x for m in found for x in (getattr(m, "metadata", None) or ())]  # a Field(...) inside Annotated
    for m in found:
        lo = getattr(m, "ge", lo) if hasattr(m, "ge") else lo
        hi = getattr(m, "le", hi) if hasattr(m, "le") else hi
        gt = getattr(m, "gt", gt) if hasattr(m, "gt") else gt
    return lo, hi, gt


def dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def range_text(lo, hi, gt) -> str:
    if gt is not None:
        return f"> {num(gt)}" + (f" and <= {num(hi)}" if hi is not None else "")
    if lo is not None and hi is not None:
        return f"from {num(lo)} to {num(hi)}"
    return f">= {num(lo)}" if lo is not None else f"<= {num(hi)}"


def _first_required(cls: type, loc: tuple) -> tuple:
    """A missing section reports the first key it requires, as a missing key would."""
    _, tp = field_at(cls, loc)
    tp = unwrap(tp)[0] if tp is not None else None
    while tp is not None and is_model(tp):
        name = next((n for n, i in model_fields(tp).items() if i.is_required()), None)
        if name is None:
            break
        loc = (*loc, name)
        tp = unwrap(model_fields(tp)[name].annotation)[0]
    return loc


_TYPE_WORDS = {
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "tuple_type": "must be a list",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
}
UNKNOWN = ("unexpected_keyword_argument", "extra_forbidden")
MISSING = ("missing", "missing_keyword_argument")


def explain(cls: type, err: Mapping, unknown_hint: Callable[[type, str, str], str]) -> tuple[tuple, str]:
    """(where the error points, what it says) for one pydantic error record against model `cls`.

    `unknown_hint(model, key, path)` words the rest of an unknown-key error (its owner's style)."""
    kind, value = err["type"], err.get("input")
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    info, tp = field_at(cls, loc)
    if kind in UNKNOWN:
        owner = unwrap(field_at(cls, loc[:-1])[1] if loc[:-1] else cls)[0]
        return loc, unknown_hint(owner, str(loc[-1]), dotted(loc[:-1]))
    if kind in MISSING:
        full = _first_required(cls, loc)
        info, _ = field_at(cls, full)
        return full, f"is required: {getattr(info, 'description', '') or 'give it'}"
    if kind == CUSTOM:
        ctx = err.get("ctx") or {}
        return ((*loc, ctx["key"]) if ctx.get("key") else loc), ctx.get("message", err["msg"])
    if value is None and info is not None:
        return loc, f"may not be null; {info.description or 'give a value'}"
    if kind in ("too_short", "too_long"):  # a list's length (pydantic: "List should have at least 1 item ...")
        ctx = err.get("ctx") or {}
        bound = ctx.get("min_length") if kind == "too_short" else ctx.get("max_length")
        size = len(value) if hasattr(value, "__len__") else ctx.get("actual_length")
        need = f"at least {bound}" if kind == "too_short" else f"at most {bound}"
        return loc, (
            f"needs {need} item{'s' if bound != 1 else ''}, got {size}"
            + (f"; {info.description}" if info is not None and info.description else "")
        )
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        lo, hi, gt = bounds(info, tp)
        opening = f"({num(gt)}" if gt is not None else f"[{num(lo) if lo is not None else '-inf'}"
        span = f"{opening}, {num(hi) + ']' if hi is not None else 'inf)'}"
        return loc, f"{num(value)} is outside {span}; give a value {range_text(lo, hi, gt)}"
    if kind in ("literal_error", "enum"):
        choices = [str(c) for c in typing.get_args(unwrap(tp)[0])] if tp is not None else []
        noun = doc_meta(info).get("noun")
        return loc, (
            f"{noun + ' ' if noun else ''}{value!r} is not one of {', '.join(choices)}; pick one of them"
            f"{did_you_mean(value, choices)}"
        )
    if kind in ("dataclass_type", "dataclass_exact_type", "dataclass_args_type", "model_type", "model_attributes_type"):
        names = list(model_fields(unwrap(tp)[0])) if tp is not None else []
        return loc, f"must be a mapping of {', '.join(names)}, got {show(value)}"
    if kind in _TYPE_WORDS:
        words = _TYPE_WORDS[kind]
        lo, hi, gt = bounds(info, tp)
        hint = ""
        if kind == "string_type" and isinstance(value, (int, float, bool)):
            hint = "; quote it" if isinstance(value, float) else f"; quote it: '{value}'"
        elif words == "must be an integer" and hi is None and (gt == 0 or lo == 1):
            hint = "; give a positive integer"
        elif words in ("must be an integer", "must be a number") and (lo, hi, gt) != (None, None, None):
            hint = f"; give a value {range_text(lo, hi, gt)}"
        if words in ("must be an integer", "must be a number") and isinstance(value, str) and _yaml_1_1_number(value):
            # YAML 1.1 (PyYAML) reads an exponent without a dot or a sign as a string: 1e9, 2E3
            hint += f"; YAML reads {value} as text: " + (
                f"write it out ({int(float(value))})"
                if words == "must be an integer" and float(value).is_integer()
                else f"write it with a dot and a signed exponent ({_yaml_number(value)})"
            )
        return loc, f"{words}, got {show(value)}{hint}"
    return loc, err["msg"]


def _yaml_1_1_number(text: str) -> bool:
    """A number in scientific notation that YAML 1.1 leaves a string (`1e9`; `1.0e+9` is a float)."""
    try:
        float(text)
    except ValueError:
        return False
    return "e" in text.lower() and text.strip().lower() not in ("inf", "-inf", "+inf", "nan")


def _yaml_number(text: str) -> str:
    mantissa, _, exponent = text.strip().lower().partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return f"{mantissa}e{exponent if exponent[:1] in '+-' else '+' + exponent}"


def first_error(errors: list[Mapping]) -> Mapping:
    """The error to report: an unknown key first, else pydantic's first (field order)."""
    return next((e for e in errors if e["type"] in UNKNOWN), errors[0])


def locate(
    cls: type, exc: Any, raw: Any, unknown_hint: Callable[[type, str, str], str], default_line: int | str | None = None
) -> tuple[tuple, int | str | None, str]:
    """(key path, line, message) of the error to report from a pydantic ValidationError `exc`."""
    err = first_error(exc.errors(include_url=False))
    where, message = explain(cls, err, unknown_hint)
    where = tuple(p for p in where if p != "[key]")  # a bad mapping key is blamed on the key itself
    # a missing key has no line: point at the mapping that lacks it (for a section, its parent)
    anchor = where[: len(err["loc"]) - 1] if err["type"] in MISSING else where
    line = yamlines.line_at(raw, anchor, default_line)
    return where, line, message


def finite(node: Any) -> Any:
    """JSON has no Infinity: a default of inf (no bound) is left out of a JSON Schema."""
    if isinstance(node, dict):
        return {
            k: finite(v) for k, v in node.items() if not (k == "default" and isinstance(v, float) and math.isinf(v))
        }
    if isinstance(node, list):
        return [finite(v) for v in node]
    return node


__all__ = [
    "Doc",
    "problem",
    "show",
    "unwrap",
    "markers",
    "field_at",
    "bounds",
    "dotted",
    "num",
    "range_text",
    "explain",
    "first_error",
    "locate",
    "finite",
    "model_fields",
    "doc_meta",
    "is_model",
]
