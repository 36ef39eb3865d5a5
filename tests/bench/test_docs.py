"""The docs name every scenario key and every figure the code knows (they drift otherwise)."""

from __future__ import annotations

from pathlib import Path

from bench.scenario import docs
from bench.scenario import model as scenario_model
from bench.scenario.catalog import FIGURES

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_scenarios_md_key_tables_are_generated_from_the_schema():
    text = (DOCS / "scenarios.md").read_text()
    assert set(docs.marked(text)) == set(docs.tables()), "every schema section has exactly one table in the page"
    assert docs.render(text) == text, (
        "docs/scenarios.md key tables differ from bench.scenario.model: regenerate with python -m bench.scenario.docs --write"
    )
    for name, model in [*model_sections(), ("engine", scenario_model.engine_model())]:
        missing = [k for k, info in model.model_fields.items() if not info.description]
        assert not missing, f"{name}: keys without a meaning {missing}"


def test_every_engine_field_is_documented_by_the_engine():
    import dataclasses

    from edge.remote import FIELD_DOCS, RemoteEngineConfig

    assert {f.name for f in dataclasses.fields(RemoteEngineConfig)} == set(FIELD_DOCS)
    # the fields the twin evaluation found in the docs but not in the engine stay out of the table
    engine_rows = docs.tables()["engine"]
    # (no row named `rtc`: the word `rtc` is a value of `chunking`, which the table shows)
    keys = [row.split(" | ")[0] for row in engine_rows.splitlines()]
    assert "| `rtc_enabled`" in keys and "| `rtc`" not in keys and "`fixed_delay_steps`" not in engine_rows


def test_scenarios_md_lists_every_figure():
    text = (DOCS / "scenarios.md").read_text()
    assert not [f for f in FIGURES if f"`{f}`" not in text]


def model_sections():
    return list(scenario_model.SECTIONS)
