"""The manifest's field vocabulary: `ManifestError`, the field constructor `_f`, the checked value types
(paths, key chunks, endpoints, devices) and `_Section`, the base of every manifest section.

A checked type names its check by a word (`_checked("file")`); the checks live in
server/manifest/checks.py, keyed by that word, and the docs table shows the word's text.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, Strict, model_validator
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticUndefined as MISSING

from server.manifest.checks import _CHECKS
from wire import configerrors as ce
from wire.configerrors import Doc, problem
from wire.yamlines import OVERRIDE

FALLBACK_SCHEDULERS = ("round_robin", "deadline_aware", "model_deadline", "priority_tiered", "batch_optimized")
DEFAULT_EXECUTION_HORIZON = 10


class ManifestError(ValueError):
    """A manifest problem: ``source:line: dotted.key: problem; fix`` (line omitted when unknown)."""

    def __init__(self, source: str, line: int | str | None, key: str, message: str):
        self.source, self.line, self.key, self.message = source, line, key, message
        if line == OVERRIDE:
            where = f"{source} (override)"
        elif line:
            where = f"{source}:{line}"
        else:
            where = source
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


# ---- field and value types ---------------------------------------------------------------------------------------


def _f(
    default: Any = MISSING,
    doc: str = "",
    *,
    lo: float | None = None,
    hi: float | None = None,
    gt: float | None = None,
    **meta: Any,
) -> Any:
    """A manifest field: `doc` explains it; lo/hi/gt bound a number; meta may hold noun, default_doc."""
    kw: dict[str, Any] = {"description": doc, "json_schema_extra": Doc(**meta)}
    for name, v in (("ge", lo), ("le", hi), ("gt", gt)):
        if v is not None:
            kw[name] = v
    if default is MISSING:
        return Field(**kw)
    if isinstance(default, (list, dict, set)):
        value = default
        return Field(default_factory=lambda: type(value)(value), **kw)
    if isinstance(default, type) and is_dataclass(default):
        return Field(default_factory=default, **kw)
    return Field(default, **kw)


class _Kind:
    """A marker in a field's type naming the check it runs (for the docs table)."""

    def __init__(self, word: str, names: Callable[[], list[str] | None] | None = None):
        self.word, self.names = word, names


def _raise(message: str) -> None:
    problem(message)


def _run_check(word: str, v: Any) -> Any:
    _CHECKS[word](v, _raise)
    return v


def _checked(word: str) -> Any:
    return Annotated[str, Strict(), AfterValidator(functools.partial(_run_check, word)), _Kind(word)]


def _in(names: Callable[[], list[str] | None]) -> Any:
    def check(v: str) -> str:
        known = names()
        if known is not None and v not in known:
            _raise(f"{v!r} is not one of {', '.join(known)}; pick one of them")
        return v

    return Annotated[str, Strict(), AfterValidator(check), _Kind("choices", names)]


def _not_nan(v: float) -> float:
    if math.isnan(v):
        _raise("must be a number, got nan")
    return v


def _one_or_many(v: Any) -> Any:
    return [v] if isinstance(v, str) else v


def _upper(v: Any) -> Any:
    return v.upper() if isinstance(v, str) else v


Int = Annotated[int, Strict()]
Num = Annotated[float, Strict(), AfterValidator(_not_nan)]
Str = Annotated[str, Strict()]
Bool = Annotated[bool, Strict()]
Checkpoint = _checked("checkpoint_dir")
File = _checked("file")
Dir = _checked("not_file")
OutFile = _checked("not_dir")
KeyChunk = _checked("key_chunk")
KeyRoot = _checked("key_root")
Endpoint = _checked("endpoint")
ListenEndpoint = _checked("listen_endpoint")  # port 0: any free port
Device = _checked("device")
Endpoints = Annotated[tuple[Endpoint, ...], BeforeValidator(_one_or_many)]
ListenEndpoints = Annotated[tuple[ListenEndpoint, ...], BeforeValidator(_one_or_many)]
Strs = Annotated[tuple[Str, ...], BeforeValidator(_one_or_many)]

_CONFIG = ConfigDict(extra="forbid")
_show, _unwrap, _markers, _bounds, _num, _range_text = ce.show, ce.unwrap, ce.markers, ce.bounds, ce.num, ce.range_text
_meta = ce.doc_meta


@dataclass(frozen=True, kw_only=True, config=_CONFIG)
class _Section:
    """Shared by every manifest section: cross-field checks after the fields, plain data, dict-style `get`."""

    @model_validator(mode="after")
    def _cross_checks(self):
        resolve = getattr(self, "_resolve", None)
        if resolve is not None:
            resolve(lambda key, message: problem(message, key))
        return self

    def _derive(self, **changes: Any) -> None:
        """Fill derived defaults while the section is being validated (it is frozen afterwards)."""
        for k, v in changes.items():
            object.__setattr__(self, k, v)

    def to_dict(self) -> dict:
        return _plain(self)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


def _plain(v: Any) -> Any:
    if is_dataclass(v):
        return {f.name: _plain(getattr(v, f.name)) for f in fields(v)}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _scheduler_names() -> list[str]:
    try:  # the registry lives with the strategies; import late so a half-built tree still validates
        from server.scheduling import scheduler_names

        return list(scheduler_names())
    except ImportError:
        return list(FALLBACK_SCHEDULERS)


def _scoring_names() -> list[str] | None:
    try:
        from server.scheduling import scoring_names

        return list(scoring_names())
    except ImportError:
        return None  # any name; the server checks it when it builds the scheduler
