"""The manifest's reference table (the generated part of docs/manifest.md, `python -m server.manifest --doc`)
and its JSON Schema for editors (`policy-server schema manifest`), both read from the schema's fields.
"""

from __future__ import annotations

import json
import math
import typing
from dataclasses import is_dataclass
from typing import Any, Literal

from pydantic_core import PydanticUndefined as MISSING

from server.manifest.fields import _Kind, _plain
from server.manifest.sections import EmulatedLatency, Manifest, _adapter
from wire import configerrors as ce

_unwrap, _markers, _bounds, _range_text, _meta = ce.unwrap, ce.markers, ce.bounds, ce.range_text, ce.doc_meta

# ---- reference documentation and JSON Schema ---------------------------------------------------------------------

_KIND_TEXT = {
    "checkpoint_dir": "directory",
    "file": "file",
    "not_file": "str",
    "not_dir": "str",
    "endpoint": "endpoint",
    "listen_endpoint": "endpoint",
    "key_chunk": "key chunk",
    "key_root": "@chunk",
    "device": "cpu \\| cuda \\| cuda:N",
}


def _type_text(tp: Any, info: Any) -> str:
    marks = _markers(tp) + list(getattr(info, "metadata", ()) or ())
    tp, nullable = _unwrap(tp)
    nullable = nullable and not _meta(info).get("default_doc")
    origin = typing.get_origin(tp)
    if origin is Literal:
        text = " \\| ".join(typing.get_args(tp))
    elif origin is tuple:
        text = f"list of {_type_text(typing.get_args(tp)[0], None)}"
    elif origin is dict:
        text = "mapping"
    elif is_dataclass(tp):
        text = "number (ms) or mapping" if tp is EmulatedLatency else "mapping"
    else:
        text = {bool: "bool", int: "int", float: "float", str: "str"}[tp]
        for m in marks:
            if isinstance(m, _Kind) and m.word in _KIND_TEXT:
                text = _KIND_TEXT[m.word]
            elif isinstance(m, _Kind) and m.word == "choices" and m.names() is not None:
                text = " \\| ".join(m.names())
        lo, hi, gt = _bounds(info)
        if lo is not None or hi is not None or gt is not None:
            text += " " + _range_text(lo, hi, gt)
    return text + (" or null" if nullable else "")


def _default_text(info: Any) -> str:
    meta = _meta(info)
    if meta.get("default_doc"):
        return meta["default_doc"]
    if info.is_required():
        return "**required**"
    v = info.default_factory() if info.default is MISSING else info.default
    if is_dataclass(v):
        return ""
    if v is None:
        return "null"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return f"`{json.dumps(_plain(v))}`" if not isinstance(v, str) else f"`{v}`" if v else '`""`'


def schema_doc() -> str:
    """The manifest reference table (the generated part of docs/manifest.md)."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]

    def walk(cls: type, prefix: str) -> None:
        for name, info in cls.__pydantic_fields__.items():
            key = f"{prefix}{name}"
            tp = _unwrap(info.annotation)[0]
            doc = (info.description or "").replace("|", "\\|")
            origin = typing.get_origin(tp)
            if is_dataclass(tp) and tp is not EmulatedLatency:
                walk(tp, key + ".")
                continue
            rows.append(f"| `{key}` | {_type_text(info.annotation, info)} | {_default_text(info)} | {doc} |")
            if is_dataclass(tp):
                walk(tp, key + ".")
            elif origin is dict and is_dataclass(_unwrap(typing.get_args(tp)[1])[0]):
                walk(_unwrap(typing.get_args(tp)[1])[0], key + ".<model_id>.")
            elif origin is tuple and is_dataclass(_unwrap(typing.get_args(tp)[0])[0]):
                walk(_unwrap(typing.get_args(tp)[0])[0], key + "[].")

    walk(Manifest, "")
    return "\n".join(rows)


def json_schema() -> dict:
    """The manifest as JSON Schema (draft 2020-12), for editors (docs/manifest.md "Editor support").

    It checks shapes, types, bounds and fixed choices; what needs the file system or the plugin
    registries (files exist, scheduler names, cross-field rules) only `load_manifest` checks."""
    schema = ce.finite(_adapter(Manifest).json_schema())
    defs = schema.setdefault("$defs", {})
    # what the validators accept beyond the field's type: a number for emulated_latency, a single
    # string for a list of strings, the log level in any case
    for owner in [schema, *defs.values()]:
        for name, prop in owner.get("properties", {}).items():
            if name == "emulated_latency":
                prop["anyOf"] = [{"type": "number", "minimum": 0}, *prop.get("anyOf", [])]
            elif name in ("connect_endpoints", "listen_endpoints", "allowlist"):
                prop["anyOf"] = [{"type": "string"}, {k: prop.pop(k) for k in ("type", "items") if k in prop}]
            elif name == "log_level" and "enum" in prop:
                prop["enum"] = prop["enum"] + [v.lower() for v in prop["enum"]]
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "fleet-inference policy server manifest"
    return schema
