"""YAML that remembers where every key and list item came from: the one loader the manifest and
the scenario language share (it sits in `wire` because the server may not import the bench).

Owns the one fact a config schema needs from YAML beyond the data: the line of each key and each
list item, so that every validation error can say ``file:line: key.path: what is wrong``.
Invariants: the loaded objects are plain `dict`/`list` subclasses (code that ignores lines works
unchanged); lines are 1-based, as editors show them; a key that a command-line override set has the
line `OVERRIDE`; keys are scalars and never repeat (a duplicate is a YAML error naming both lines).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

OVERRIDE = "override"  # the "line" of a value that came from a flag or --set


class LineDict(dict):
    """A mapping with `.line` (where it starts) and `.key_lines` (key -> line of the key)."""

    line: int | str = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.key_lines: dict = {}

    def line_of(self, key) -> int | str:
        return self.key_lines.get(key, self.line)


class LineList(list):
    """A sequence with `.line` (where it starts) and `.item_lines` (index -> line of the item)."""

    line: int | str = 0

    def __init__(self, *args):
        super().__init__(*args)
        self.item_lines: list = []

    def line_of(self, index: int) -> int | str:
        return self.item_lines[index] if 0 <= index < len(self.item_lines) else self.line


class YamlError(ValueError):
    """Text that is not YAML: `line` (1-based, 0 when unknown) and `problem` (the parser's words)."""

    def __init__(self, line: int, problem: str):
        self.line, self.problem = line, problem
        super().__init__(f"line {line}: {problem}" if line else problem)


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    out = LineDict()
    out.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise yaml.constructor.ConstructorError(None, None, "keys must be plain words", key_node.start_mark)
        if key in out:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {out.key_lines[key]})", key_node.start_mark
            )
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = key_node.start_mark.line + 1
    return out


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> LineList:
    out = LineList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def load(text: str) -> Any:
    """Parse YAML text; mappings become `LineDict`, sequences `LineList`. Raises YamlError."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader derives from SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        raise YamlError(mark.line + 1 if mark else 0, getattr(exc, "problem", None) or str(exc)) from None


def line_at(tree: Any, path: Iterable, default: int | str | None = None) -> int | str | None:
    """The line of the deepest key or item of `path` (keys and indexes) that `tree` holds, else `default`."""
    line, cur = default, tree
    for part in path:
        if isinstance(cur, dict) and part in cur:
            line = cur.key_lines.get(part, line) if isinstance(cur, LineDict) else line
            cur = cur[part]
        elif isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur):
            line = cur.line_of(part) if isinstance(cur, LineList) else line
            cur = cur[part]
        else:
            break
    return line
