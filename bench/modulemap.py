"""The module maps of the reference pages, generated from the modules' own docstrings (`python -m bench.modulemap --write`).

A map sits between `<!-- modules: PACKAGE -->` and `<!-- /modules -->` in a page of docs/ (PACKAGE a
folder of the tree: `bench`, `server`, `edge`, `chaos`, `wire`, `bench/run`, ...) and lists every module
under that folder, recursively, with the first sentence of its docstring; a package's row is its
`__init__.py`. Tests beside the code (`test_*.py`) are left out. The files are parsed, never
imported, so the maps of the server's and the bench's pages need no torch or MuJoCo. `--write`
rewrites every map in place, and tests/bench/test_modulemap.py fails when a page and the tree drift apart
(as `bench.scenario.docs` does for the scenario key tables): a module added, moved or re-described
shows up as a diff. The prose around a map stays hand-written.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
_BLOCK = re.compile(r"(<!-- modules: (?P<package>[\w/]+) -->\n)(?P<body>.*?)(<!-- /modules -->)", re.S)
# a sentence ends at . ! or ? followed by whitespace and a capital, a quote, a backtick or a bracket
_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)(?<!etc)(?<!vs)[.!?](?=\s+[A-Z`(\"']|$)")


def first_sentence(docstring: str | None) -> str:
    """The first sentence of a docstring's first paragraph, on one line ("" without a docstring)."""
    if not docstring:
        return ""
    para = " ".join(line.strip() for line in docstring.strip().split("\n\n")[0].splitlines())
    end = _SENTENCE_END.search(para)
    return para[: end.end()] if end else para


def modules(package: str) -> list[tuple[str, str]]:
    """(path shown in the map, first docstring sentence) for every module under `package`, sorted by path."""
    base = ROOT / package
    if not (base / "__init__.py").is_file():
        raise FileNotFoundError(f"{package!r} is not a package of the tree (no {package}/__init__.py)")
    rows = []
    for path in sorted(base.rglob("*.py")):
        if path.name.startswith("test_") or not (path.parent / "__init__.py").is_file():
            continue
        rel = path.relative_to(ROOT).as_posix()
        shown = rel[: -len("__init__.py")] if path.name == "__init__.py" else rel
        rows.append((shown, first_sentence(ast.get_docstring(ast.parse(path.read_text())))))
    return sorted(rows, key=lambda r: r[0].rstrip("/").split("/"))


def table(package: str) -> str:
    rows = ["| module | owns |", "| --- | --- |"]
    for shown, sentence in modules(package):
        rows.append(f"| `{shown}` | {sentence.replace('|', chr(92) + '|') or '(no docstring)'} |")
    return "\n".join(rows)


def render(text: str) -> str:
    """`text` (a page of docs/) with every marked module map replaced by the generated one."""
    return _BLOCK.sub(lambda m: f"{m.group(1)}{table(m.group('package'))}\n{m.group(4)}", text)


def marked(text: str) -> list[str]:
    """The packages whose maps `text` marks, in page order."""
    return [m.group("package") for m in _BLOCK.finditer(text)]


def pages() -> list[Path]:
    """Every page of docs/ (results excepted) that holds at least one module map."""
    return [p for p in sorted(DOCS.glob("*.md")) if marked(p.read_text())]


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        for page in pages():
            old = page.read_text()
            new = render(old)
            if new != old:
                page.write_text(new)
                print(f"rewrote the module maps of {page.relative_to(ROOT)}")
    elif len(sys.argv) == 2:
        print(table(sys.argv[1]))
    else:
        sys.exit("usage: python -m bench.modulemap --write | PACKAGE (prints its map)")
