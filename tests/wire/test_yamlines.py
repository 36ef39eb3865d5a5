"""The shared YAML-with-lines loader and the one "did you mean" rule (manifest, scenario, chaos use both)."""

from __future__ import annotations

import pytest

from wire import yamlines
from wire.suggest import closest, did_you_mean


def test_every_key_and_item_keeps_its_line():
    data = yamlines.load("a: 1\nb:\n  c: [x, y]\n  d:\n    - p\n    - q: 2\n")
    assert data == {"a": 1, "b": {"c": ["x", "y"], "d": ["p", {"q": 2}]}}
    assert (data.line_of("a"), data.line_of("b"), data["b"].line_of("d"), data["b"]["d"].line_of(1)) == (1, 2, 4, 6)
    assert yamlines.line_at(data, ("b", "d", 1, "q")) == 6
    assert yamlines.line_at(data, ("b", "d", 7, "q")) == 4  # the deepest key that exists
    assert yamlines.line_at({"plain": 1}, ("plain",), 9) == 9


@pytest.mark.parametrize(
    "text,line,words",
    [
        ("a: 1\na: 2\n", 2, "duplicate key 'a' (first at line 1)"),
        ("a:\n  b: 1\n   c: 2\n", 3, "mapping values are not allowed"),
        ("? [a, b]\n: 1\n", 1, "keys must be plain words"),
    ],
)
def test_bad_yaml_names_the_line(text, line, words):
    with pytest.raises(yamlines.YamlError) as err:
        yamlines.load(text)
    assert err.value.line == line and words in err.value.problem


def test_suggestions_read_alike_everywhere():
    assert closest("max_sesions", ["max_sessions", "min_sessions"]) == "max_sessions"
    assert did_you_mean("holdd", ["hold", "zero"]) == " (did you mean 'hold'?)"
    assert did_you_mean("zzz", ["hold", "zero"]) == "" and closest("zzz", []) is None
