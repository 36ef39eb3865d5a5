"""`engine.chunking`: each strategy a scenario compares has a word, and the word is the engine fields it names."""

from __future__ import annotations

import pytest

from bench.scenario import model as sm
from bench.scenario.load import ScenarioError, parse_scenario

BASE = """\
name: t
duration_s: 10
fleet:
  shards: 1
  groups:
    - {name: g, robot: reacher, count: 2, site: lab, engine: ENGINE}
sites:
  lab: {profile: lan}
servers:
  replicas:
    - {id: r0, checkpoint: reacher}
"""


def engine_of(engine: str) -> dict:
    return parse_scenario(BASE.replace("ENGINE", engine), source="t.yaml").groups[0].engine


@pytest.mark.parametrize(
    "word, fields",
    [
        ("sync", {"rtc_enabled": False, "buffer_time_s": sm.SYNC_BUFFER_TIME_S}),
        ("append", {"rtc_enabled": False}),
        ("rtc", {"rtc_enabled": True}),
    ],
)
def test_a_chunking_word_is_the_fields_it_names(word, fields):
    assert engine_of(f"{{chunking: {word}, trim: consumed}}") == {**fields, "trim": "consumed"}
    assert engine_of(f"{{chunking: {word}}}") == engine_of(
        "{" + ", ".join(f"{k}: {str(v).lower()}" for k, v in fields.items()) + "}"
    )


def test_a_field_given_beside_the_word_wins_as_a_set_override_does():
    assert engine_of("{chunking: sync, buffer_time_s: 0.5}") == {"rtc_enabled": False, "buffer_time_s": 0.5}
    assert engine_of("{chunking: rtc, rtc_enabled: false}") == engine_of("{chunking: append}")


def test_an_unknown_chunking_word_names_the_known_ones():
    with pytest.raises(ScenarioError) as info:
        engine_of("{chunking: blocking}")
    assert "fleet.groups[0].engine.chunking" in str(info.value) and "sync, append, rtc" in str(info.value)
