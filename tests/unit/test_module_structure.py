"""How imagebuild's modules depend on each other: no import cycle and no two folders
importing each other (every import counts, also one inside a function or under
TYPE_CHECKING); the units and their order are docs/design.md's Layers, and nothing imports
upward but the imports it lists; bench/ reads releases through the record model in
registry/, never release/; an import inside a function says why it is deferred."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tools.importgraph import (
    Import,
    design_exceptions,
    design_layers,
    figures,
    folder_of,
    scan,
)

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


# --------------------------------------- design.md's Layers against the import graph

def _scanned() -> tuple[dict[str, Path], list[Import], list[dict]]:
    return scan(ROOT / "imagebuild")


def _units(mods: dict[str, Path]) -> dict[str, str]:
    return {m: folder_of(m, mods, root_as_one=False).removesuffix("/") for m in mods}


def test_no_folder_pair_imports_each_other() -> None:
    mods, imports, _ = _scanned()
    every = figures(sorted(mods), imports, _units(mods), {"top", "function", "typing"},
                    None, set())
    assert every["mutual_folder_pairs"] == []
    assert every["module_cycles"] == [] and every["folder_cycles"] == []


def test_layers_are_the_units_the_package_has() -> None:
    """design.md's Layers lists every folder and top-level module once, nothing gone."""
    listed = design_layers()
    assert len(listed) == len(set(listed)), [u for u in listed if listed.count(u) > 1]
    mods, _, _ = _scanned()
    assert set(listed) == set(_units(mods).values())


def _upward(imports: list[Import], units: dict[str, str], order: list[str]
            ) -> set[tuple[str, str]]:
    """(importing file relative to imagebuild/, imported module without the package name)
    for every import, of any kind, from a unit to one listed after it."""
    rank = {u: r for r, u in enumerate(order)}
    return {(i.file.removeprefix("imagebuild/"), i.dst.removeprefix("imagebuild."))
            for i in imports if rank[units[i.dst]] > rank[units[i.src]]}


def test_no_import_runs_back_up_but_the_ones_design_md_lists() -> None:
    mods, imports, _ = _scanned()
    up = _upward(imports, _units(mods), design_layers())
    listed = {(f, m) for f, ms in design_exceptions().items() for m in ms}
    assert sorted(up - listed) == [], "an import against docs/design.md's Layers order"
    assert sorted(listed - up) == [], "design.md lists an upward import the code no longer has"


def test_the_layers_test_sees_an_upward_import() -> None:
    """The check itself: an import from spec/ (near the bottom) of bench/ is caught."""
    mods, imports, _ = _scanned()
    planted = Import("imagebuild.spec.matrix", "imagebuild.bench.store", 1, "function",
                     "imagebuild/spec/matrix.py", ())
    assert ("spec/matrix.py", "bench.store") in _upward([*imports, planted], _units(mods),
                                                          design_layers())


# ------------------------------------------------------- imports inside functions

# In-function imports whose line does not say why they are deferred (`# deferred: why`),
# per file, as the code has them today: a file may lose some, never gain one. Move an
# import to the top (no circle forbids it now), or defer it with its reason on the line:
# a heavy optional dependency (matplotlib, huggingface_hub, the Docker SDK, vLLM), a
# command that loads only its own stage (cli.py), code that also runs inside an image.
UNEXPLAINED_IN_FUNCTION = {
    "bench/command.py": 1,
    "builder/builder.py": 6,
    "cli.py": 7,
    "gates/run.py": 1,
    "job.py": 29,
    "preflight/flags.py": 3,
    "preflight/kernels.py": 2,
    "preflight/kvcache.py": 1,
    "preflight/run.py": 1,
    "release/repositories.py": 1,
    "smoke/probes.py": 2,
}
# facts/recorder/ runs inside the described vLLM's own interpreter (`facts record`), where
# vLLM is importable only there; its text is hashed into the recorded facts, so a comment
# on each line would make every recorded version stale
RECORDER = "facts/recorder/"


def _in_function_lines() -> Counter[str]:
    _, internal, external = _scanned()
    where = {(i.file, i.line) for i in internal if i.where == "function"}
    where |= {(e["file"], e["line"]) for e in external if e["where"] == "function"}
    unexplained: Counter[str] = Counter()
    for file, line in where:
        name = file.removeprefix("imagebuild/")
        if name.startswith(RECORDER):
            continue
        if "# deferred:" not in (ROOT / file).read_text().splitlines()[line - 1]:
            unexplained[name] += 1
    return unexplained


def test_imports_inside_functions_say_why_or_are_old() -> None:
    found = _in_function_lines()
    grown = {f: (n, UNEXPLAINED_IN_FUNCTION.get(f, 0)) for f, n in found.items()
             if n > UNEXPLAINED_IN_FUNCTION.get(f, 0)}
    assert grown == {}, ("an import inside a function without `# deferred: <reason>` on "
                         "its line (file: (found, allowed)); move it to the top")
    shrunk = {f: n for f, n in UNEXPLAINED_IN_FUNCTION.items() if found.get(f, 0) < n}
    assert shrunk == {}, f"fewer now: lower UNEXPLAINED_IN_FUNCTION to {dict(found)}"


@pytest.mark.parametrize("line", ["    import json\n", "    from imagebuild import plan\n"])
def test_the_in_function_check_sees_a_new_one(line: str, tmp_path: Path) -> None:
    """The check itself: the scanner finds an import in a function body, and only the
    reason comment on its line excuses it."""
    pkg = tmp_path / "imagebuild"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "plan.py").write_text("")
    (pkg / "m.py").write_text("def f():\n" + line)
    _, internal, external = scan(pkg)
    rows = [(i.file, i.line) for i in internal if i.where == "function"]
    rows += [(e["file"], e["line"]) for e in external if e["where"] == "function"]
    assert rows == [("imagebuild/m.py", 2)]


LIGHT = ("--help", "check --target all", "render --check", "schema", "lock --check",
         "plan --tag 2026-06-18-dflashfix")
HEAVY = ("docker", "aiohttp", "huggingface_hub", "cyclonedx", "matplotlib")


def test_the_quick_commands_load_no_heavy_dependency() -> None:
    """What the deferred imports buy (cli.py docstring): the quick commands, run one after
    the other in one process, load none of the heavy libraries."""
    code = (f"import contextlib, io, sys\nfrom imagebuild.cli import main\n"
            f"for argv in {[c.split() for c in LIGHT]!r}:\n"
            "    with contextlib.redirect_stdout(io.StringIO()):\n"
            "        try:\n            assert main(argv) == 0, argv\n"
            "        except SystemExit as e:\n            assert e.code == 0, argv\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
