"""The module maps of docs/ are the ones generated from the tree's docstrings (they drift otherwise)."""

from __future__ import annotations

from bench import modulemap


def test_every_module_map_in_docs_is_the_generated_one():
    pages = modulemap.pages()
    assert {p.name for p in pages} >= {"bench.md", "edge.md", "server.md", "chaos.md"}
    stale = [p.name for p in pages if modulemap.render(p.read_text()) != p.read_text()]
    assert not stale, (
        f"module maps differ from the modules' docstrings in {stale}: regenerate with python -m bench.modulemap --write"
    )


def test_every_package_of_the_tree_has_a_map():
    mapped = {pkg for p in modulemap.pages() for pkg in modulemap.marked(p.read_text())}
    assert {"wire", "server", "edge", "chaos", "bench", "benchmarks"} <= mapped


def test_a_map_lists_every_module_with_its_first_sentence(tmp_path):
    rows = dict(modulemap.modules("bench"))
    assert "bench/modulemap.py" in rows and rows["bench/modulemap.py"].startswith(
        "The module maps of the reference pages"
    )
    assert "bench/run/" in rows, "a package is its __init__.py's row"
    assert not [path for path in rows if path.rsplit("/", 1)[-1].startswith("test_")]
    page = "intro\n<!-- modules: bench/scenario -->\n| stale |\n<!-- /modules -->\nafter\n"
    out = modulemap.render(page)
    assert "| stale |" not in out and "| `bench/scenario/docs.py` | The key tables of docs/scenarios.md" in out
    assert out.startswith("intro\n") and out.endswith("<!-- /modules -->\nafter\n")


def test_first_sentence_stops_at_the_first_full_stop_not_at_an_abbreviation():
    assert modulemap.first_sentence("One thing, e.g. this. Then more.\n\nOther paragraph.") == "One thing, e.g. this."
    assert modulemap.first_sentence("Wrapped\nover two lines") == "Wrapped over two lines"
    assert modulemap.first_sentence(None) == ""
