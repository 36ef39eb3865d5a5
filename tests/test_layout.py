"""The import drawing of the tree: no circle between modules, no import from a lower package or
bench room to a higher one, and no microbenchmark outside benchmarks/ (issue 21's layout rules)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("wire", "server", "edge", "chaos", "bench", "benchmarks")
# What each unit may import (besides itself). bench's rooms are listed bottom to top.
ALLOWED = {
    "wire": set(),
    "server": {"wire"},
    "edge": {"wire"},
    "chaos": {"wire"},
    "bench.scenario": {"wire", "edge", "chaos", "bench.robots", "bench.security"},
    "bench.robots": {"wire"},
    "bench.security": {"wire"},
    "bench.fleet": {"wire", "edge", "server", "chaos", "bench.scenario", "bench.robots"},
    "bench.evidence": {"wire", "bench.scenario", "bench.fleet"},
    "bench.training": {"wire", "server", "bench.scenario", "bench.robots", "bench.evidence"},
    "bench.run": {
        "wire",
        "edge",
        "server",
        "chaos",
        "bench.scenario",
        "bench.robots",
        "bench.security",
        "bench.fleet",
        "bench.evidence",
    },
    "bench": {"wire", "edge", "server", "chaos"}
    | {f"bench.{r}" for r in ("scenario", "robots", "security", "fleet", "evidence", "training", "run")},
    "benchmarks": {
        "wire",
        "server",
        "edge",
        "chaos",
        "bench",
        "bench.robots",
        "bench.fleet",
        "bench.scenario",
        "bench.run",
    },
}


def _modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    mods = {}
    for pkg in packages:
        for f in (root / pkg).rglob("*.py"):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = f
    return mods


def _imports(path: Path, mods: dict[str, Path], module: str) -> set[str]:
    """Modules of the tree that `path` (module `module`) imports anywhere: at module level, inside a function or
    class, relative (`from . import x`) or absolute, and under `if TYPE_CHECKING:` (a dependency of the drawing
    all the same: a circle through it is a circle a reader has to untangle)."""
    tree = ast.parse(path.read_text())
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):  # every node, so an import in a function body counts like one at the top
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for cand in [f"{source}.{a.name}" for a in node.names] + [source]:
                if cand in mods:
                    out.add(cand)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in mods)
    return out


def _unit(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "bench" and len(parts) > 1 and (ROOT / "bench" / parts[1]).is_dir():
        return f"bench.{parts[1]}"
    return parts[0]


def _graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES):
    mods = _modules(root, packages)
    return {m: _imports(p, mods, m) - {m} for m, p in mods.items()}


def test_no_module_imports_upward_or_across_rooms_it_sits_below():
    bad = []
    for mod, deps in _graph().items():
        src = _unit(mod)
        for dep in deps:
            dst = _unit(dep)
            if dst == src or (src.startswith("bench") and dst == "bench" and dep == "bench"):
                continue
            if dst not in ALLOWED[src]:
                bad.append(f"{mod} -> {dep}")
    assert not bad, "imports against the layout:\n" + "\n".join(sorted(bad))


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph` (its strongly connected components of more than one module), sorted."""
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return sorted(cycles)


def test_no_import_circle_between_modules():
    """No circle, counting every import: at module level, in a function body, relative, type-only."""
    cycles = _circles(_graph())
    assert not cycles, f"import circles: {cycles}"


def test_the_circle_check_sees_function_level_relative_and_type_only_imports(tmp_path):
    """The check itself can fail: the shape bench/robots had (cameras -> models -> core -> cameras, closed by a
    type-only import and a function-level relative one), and a circle closed only by a function-level relative
    import, are each found."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.core import T\n")
    (pkg / "cameras.py").write_text("from pkg.models import LIMIT\n")
    (pkg / "core.py").write_text("from .models import shared\n\ndef camera():\n    from .cameras import make\n")
    (pkg / "low.py").write_text("def f():\n    from . import high\n")
    (pkg / "high.py").write_text("from pkg import low\n")
    graph = _graph(tmp_path, ("pkg",))
    assert graph["pkg.core"] == {"pkg.models", "pkg.cameras"} and graph["pkg.low"] == {"pkg", "pkg.high"}
    assert _circles(graph) == [["pkg.cameras", "pkg.core", "pkg.models"], ["pkg.high", "pkg.low"]]


def test_microbenchmarks_live_only_in_benchmarks():
    strays = [
        str(p.relative_to(ROOT)) for pkg in PACKAGES if pkg != "benchmarks" for p in (ROOT / pkg).rglob("bench_*.py")
    ]
    assert not strays, f"move these to benchmarks/: {strays}"


def test_the_robot_side_imports_no_torch_or_server():
    graph = _graph()
    bad = [
        f"{m} -> {d}"
        for m, deps in graph.items()
        if _unit(m) == "edge"
        for d in deps
        if _unit(d) != "edge" and _unit(d) != "wire"
    ]
    assert not bad, bad
