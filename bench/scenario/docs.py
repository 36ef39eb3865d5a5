"""The key tables of docs/scenarios.md, generated from `bench.scenario.model` (`python -m bench.scenario.docs`).

Each table sits between `<!-- schema: SECTION -->` and `<!-- /schema -->` in the page and is never
hand-edited: `--write` rewrites them in place, and tests/bench/test_docs.py fails when the page and
the models drift apart (as wire/docgen.py does for the wire spec). The prose around them stays
hand-written: it explains, the tables enumerate.
"""

from __future__ import annotations

import json
import re
import sys
import typing
from pathlib import Path
from typing import Any, Literal

from bench.scenario import model as sm
from wire import configerrors as ce

DOC = Path(__file__).resolve().parents[2] / "docs" / "scenarios.md"
_BLOCK = re.compile(r"(<!-- schema: (?P<name>[\w .\[\]<>-]+) -->\n)(?P<body>.*?)(<!-- /schema -->)", re.S)


def _type_text(info: Any) -> str:
    if ce.doc_meta(info).get("type_doc"):
        return ce.doc_meta(info)["type_doc"]
    tp, _ = ce.unwrap(info.annotation)
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(tp))
    if origin is typing.Union:
        parts = []
        for a in typing.get_args(tp):
            a = ce.unwrap(a)[0]
            parts.append(
                " \\| ".join(f"`{x}`" for x in typing.get_args(a))
                if typing.get_origin(a) is Literal
                else "list of strings"
                if typing.get_origin(a) is list
                else str(a)
            )
        return " or ".join(parts)
    if origin is list:
        inner = ce.unwrap(typing.get_args(tp)[0])[0]
        return "list of mappings" if ce.model_fields(inner) else "list of strings" if inner is str else "list"
    if origin is dict:
        value = ce.unwrap(typing.get_args(tp)[1])[0]
        return "name -> mapping or profile name" if value is sm.Site else "mapping"
    if ce.model_fields(tp) or tp is dict:
        return "mapping"
    if tp is list:
        return "list"
    if tp is Any:
        return "any"
    text = {bool: "bool", int: "int", float: "number", str: "string"}.get(tp, str(tp))
    marks = ce.markers(info.annotation) + list(info.metadata or ())
    if any(getattr(m, "func", None) is sm._name for m in marks):
        text = "name"
    extra = info.json_schema_extra
    if isinstance(extra, ce.Doc) and extra.enum is not None:
        text = " \\| ".join(f"`{n}`" for n in extra.enum())
    lo, hi, gt = ce.bounds(info, info.annotation)
    if (lo, hi, gt) != (None, None, None):
        text += " " + ce.range_text(lo, hi, gt)
    return text


def _default_text(info: Any) -> str:
    meta = ce.doc_meta(info)
    if meta.get("default_doc"):
        return meta["default_doc"]
    if info.is_required():
        return "**required**"
    v = info.get_default(call_default_factory=True)
    if v is None:
        return "none"
    if isinstance(v, str):
        return f"`{v}`" if v else '`""`'
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return f"`{json.dumps(v)}`"


def table(model: type) -> str:
    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name, info in ce.model_fields(model).items():
        doc = (info.description or "").replace("|", "\\|")
        rows.append(f"| `{name}` | {_type_text(info)} | {_default_text(info)} | {doc} |")
    return "\n".join(rows)


def tables() -> dict[str, str]:
    """Section name (as in the page's markers) -> its generated table."""
    out = {name: table(model) for name, model in sm.SECTIONS}
    out["engine"] = table(sm.engine_model())
    return out


def render(text: str) -> str:
    """`text` (docs/scenarios.md) with every marked table replaced by the generated one."""
    generated = tables()

    def one(m: re.Match) -> str:
        name = m.group("name")
        if name not in generated:
            raise KeyError(
                f"docs/scenarios.md marks a table {name!r} the schema does not have ({', '.join(generated)})"
            )
        return f"{m.group(1)}{generated[name]}\n{m.group(4)}"

    return _BLOCK.sub(one, text)


def marked(text: str) -> list[str]:
    return [m.group("name") for m in _BLOCK.finditer(text)]


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        DOC.write_text(render(DOC.read_text()))
        print(f"rewrote the tables of {DOC}")
    else:
        for name, t in tables().items():
            print(f"<!-- schema: {name} -->\n{t}\n<!-- /schema -->\n")
