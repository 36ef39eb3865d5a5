"""The docs name every scenario key and every figure the code knows (they drift otherwise)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.scenario import schema as scenario
from bench.scenario.catalog import FIGURES

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("table", [n for n in dir(scenario) if n.startswith("SCHEMA_")])
def test_scenarios_md_documents_every_key(table):
    text = (DOCS / "scenarios.md").read_text()
    missing = [k for k in getattr(scenario, table) if f"`{k}`" not in text]
    assert not missing, f"docs/scenarios.md lacks {table} keys {missing}"


def test_scenarios_md_lists_every_figure():
    text = (DOCS / "scenarios.md").read_text()
    assert not [f for f in FIGURES if f"`{f}`" not in text]
