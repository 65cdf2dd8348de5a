"""How imagebuild's modules depend on each other: no new import cycle (every import counts,
also one inside a function or under TYPE_CHECKING), and bench/ reads releases through the
record model in registry/, never release/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# cycles older than this test, each through a function-level import; not to grow
KNOWN_CYCLES = [
]


def _graph() -> dict[str, set[str]]:
    mods: dict[str, Path] = {}
    for path in (ROOT / "imagebuild").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in mods:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    graph[mod].add(sub if sub in mods else node.module)
            elif isinstance(node, ast.Import):
                graph[mod] |= {a.name for a in node.names if a.name in mods}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_new_import_cycle() -> None:
    cycles = _cycles(_graph())
    assert not [c for c in cycles if c not in KNOWN_CYCLES], cycles
    assert not any(m.startswith("imagebuild.preflight") for c in cycles for m in c)


def test_bench_does_not_reach_up_into_release() -> None:
    graph = _graph()
    reach = {(m, d) for m, deps in graph.items() if m.startswith("imagebuild.bench")
             for d in deps if d.startswith("imagebuild.release")}
    assert not reach, sorted(reach)
