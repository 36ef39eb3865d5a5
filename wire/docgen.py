"""Print the field tables of docs/wire-protocol.md from the schema (`python -m wire.docgen`).

The tables in the spec are generated, never hand-edited; tests/wire/test_docs.py fails when the
spec and `wire.messages` drift apart.
"""

from __future__ import annotations

from wire.messages import REGISTRY

_MSGPACK = {
    "str": "str",
    "uint": "int (>= 0)",
    "uint?": "int (>= 0) or nil",
    "int": "int (i64)",
    "float": "float (f64)",
    "float?": "float or nil",
    "bool": "bool",
    "tensor": "tensor map",
    "tensor?": "tensor map or nil",
    "images": "map str -> image map",
    "tensors": "map str -> tensor map",
    "str_list": "array of str",
    "str_map": "map str -> str",
    "cams": "map str -> [h, w, c]",
    "any_map": "map str -> any",
}


def table(kind: str) -> str:
    cls = REGISTRY[kind]
    rows = ["| field | msgpack type | required | default | unit / range | meaning |", "|---|---|---|---|---|---|"]
    for f in cls.FIELDS:
        rng = f.unit
        if f.lo is not None or f.hi is not None:
            rng = (rng + " " if rng else "") + f"[{'' if f.lo is None else f.lo}, {'' if f.hi is None else f.hi}]"
        default = "" if f.required else repr(f.default) if f.default is not None else "nil"
        rows.append(
            f"| `{f.name}` | {_MSGPACK[f.kind]} | {'yes' if f.required else 'no'} | {default} | {rng} | {f.doc} |"
        )
    return "\n".join(rows)


def all_tables() -> dict[str, str]:
    return {kind: table(kind) for kind in REGISTRY}


if __name__ == "__main__":
    for kind, t in all_tables().items():
        print(f"#### `{kind}` ({REGISTRY[kind].__name__})\n\n{t}\n")
