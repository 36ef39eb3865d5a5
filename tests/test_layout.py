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
    "bench.run": {"wire", "edge", "server", "chaos", "bench.scenario", "bench.robots", "bench.security",
                  "bench.fleet", "bench.evidence"},
    "bench": {"wire", "edge", "server", "chaos"} | {f"bench.{r}" for r in
                                                     ("scenario", "robots", "security", "fleet", "evidence", "training", "run")},
    "benchmarks": {"wire", "server", "edge", "chaos", "bench", "bench.robots", "bench.fleet", "bench.scenario", "bench.run"},
}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = f
    return mods


def _imports(path: Path, mods: dict[str, Path]) -> set[str]:
    """Modules of the tree that `path` imports at run time (imports under `if TYPE_CHECKING:` skipped)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            node.body = []
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for cand in [f"{node.module}.{a.name}" for a in node.names] + [node.module]:
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


def _graph():
    mods = _modules()
    return {m: _imports(p, mods) - {m} for m, p in mods.items()}


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


def test_no_import_circle_between_modules():
    graph = _graph()
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
    assert not cycles, f"import circles: {cycles}"


def test_microbenchmarks_live_only_in_benchmarks():
    strays = [str(p.relative_to(ROOT)) for pkg in PACKAGES if pkg != "benchmarks"
              for p in (ROOT / pkg).rglob("bench_*.py")]
    assert not strays, f"move these to benchmarks/: {strays}"


def test_the_robot_side_imports_no_torch_or_server():
    graph = _graph()
    bad = [f"{m} -> {d}" for m, deps in graph.items() if _unit(m) == "edge" for d in deps if _unit(d) != "edge" and _unit(d) != "wire"]
    assert not bad, bad
