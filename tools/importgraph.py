#!/usr/bin/env python3
"""Import graph of one Python package: modules, folders, cycles, layers, upward imports.

Standard library only (ast); nothing is imported or executed from the package scanned.

Run from the checkout root: `python -m tools.importgraph imagebuild` (or python3
tools/importgraph.py imagebuild).

    python3 importgraph.py imagebuild                       # summary
    python3 importgraph.py imagebuild --json graph.json     # + every figure as JSON
    python3 importgraph.py imagebuild --order spec,lock,... # upward imports vs that order
    python3 importgraph.py --from-edges newgraph.json       # the same figures for a graph
                                                            # described by hand (a plan)

How it counts (the words below are the ones the summary prints):
- module: every .py file under the package dir; a package's __init__.py is the package.
- import: one imported *module* per statement and target. `from a import b, c` where b and
  c are submodules counts two imports (a->a.b, a->a.c); where they are names defined in a,
  one (a). `import a.b.c` counts one (the deepest module that exists). Only imports of
  modules inside the scanned package make edges; others are counted as "external".
- where: "top" (runs when the module is imported: module body, class bodies, module-level
  if/try), "function" (inside a def/async def/lambda, at any depth: runs when called),
  "typing" (under `if TYPE_CHECKING:`: never runs). An import inside a function inside
  `if TYPE_CHECKING` is "typing".
- folder: the first path component below the package: a sub-package `bench/` (all of its
  modules, nested sub-packages included) or a top-level module `job.py` (its own unit).
  `--root-as-one` merges every top-level module into one unit `(root)`.
- graph edges, three views, each with all the figures below: "runtime" = top + function
  imports (what the code needs to run); "top" = import-time only; "all" = runtime plus
  TYPE_CHECKING imports (a dependency on another folder's types is a dependency too).
- cycle: a strongly connected component of more than one node (Tarjan); a self-import of
  a folder (bench/ -> bench/) is not a cycle. Each cycle's edges are listed with file:line.
- mutual pair: two folders each importing the other (edges of the chosen kind).
- layer: longest path to the bottom in the graph with cycles condensed; a node importing
  nothing inside the package is layer 0; a node is 1 + the highest layer it imports.
  "layers" = highest layer + 1. Figures are given for modules and for folders.
- upward import: given a declared order of folders (bottom first, `--order`), an import
  from a folder to a folder placed above it. Each is listed with file:line. Folders not
  in the order are reported (and their imports not judged). Without `--order`, the
  default is docs/design.md's Layers block (design_layers below).
  `--allow src->dst` (repeatable) marks a listed exception; it is still printed, flagged.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# The declared order, bottom first, and the imports allowed to run back up against it:
# docs/design.md "Layers" (its first fenced block after the heading, one unit a line) and
# "Imports that run back up" (one `file` -> `module`, ... item each). Used when --order
# is not given and the package is imagebuild; tests/unit/test_module_structure.py reads
# the same two lists.
DESIGN_MD = Path(__file__).resolve().parents[1] / "docs" / "design.md"


def design_layers(design_md: Path = DESIGN_MD) -> list[str]:
    """The units of design.md's Layers block, bottom first (`spec/` -> `spec`)."""
    text = design_md.read_text(encoding="utf-8")
    block = text.split("\n## Layers\n", 1)[1].split("```\n", 2)[1]
    return [line.split()[0].rstrip("/") for line in block.splitlines() if line.strip()]


def design_exceptions(design_md: Path = DESIGN_MD) -> dict[str, set[str]]:
    """design.md's "Imports that run back up": importing file (relative to the package)
    -> the modules (dotted, without the package name) it may import from above."""
    text = design_md.read_text(encoding="utf-8")
    part = text.split("\n### Imports that run back up\n", 1)[1].split("\n## ", 1)[0]
    out: dict[str, set[str]] = {}
    for item in re.split(r"\n- ", "\n" + part)[1:]:
        names = re.findall(r"`([^`]+)`", item.split("`:", 1)[0] + "`")
        if len(names) >= 2:
            out[names[0]] = set(names[1:])
    return out



@dataclass(frozen=True)
class Import:
    src: str          # importing module, dotted
    dst: str          # imported module, dotted (inside the package)
    line: int
    where: str        # top | function | typing
    file: str         # path relative to the package's parent
    names: tuple[str, ...]  # the names taken (`from x import a, b`), () for `import x`


# ---------------------------------------------------------------- scanning

def find_modules(pkg_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under pkg_dir (pkg_dir's name is the root)."""
    root = pkg_dir.name
    mods: dict[str, Path] = {}
    for path in sorted(pkg_dir.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(pkg_dir).with_suffix("")
        parts = [root, *rel.parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Walker(ast.NodeVisitor):
    """Collects (node, where) for every Import/ImportFrom with its scope."""

    def __init__(self) -> None:
        self.found: list[tuple[ast.Import | ast.ImportFrom, str]] = []
        self.fn_depth = 0
        self.typing_depth = 0

    def _where(self) -> str:
        if self.typing_depth:
            return "typing"
        return "function" if self.fn_depth else "top"

    def visit_Import(self, node: ast.Import) -> None:
        self.found.append((node, self._where()))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.found.append((node, self._where()))

    def _fn(self, node: ast.AST) -> None:
        self.fn_depth += 1
        self.generic_visit(node)
        self.fn_depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _fn

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self.typing_depth += 1
            for stmt in node.body:
                self.visit(stmt)
            self.typing_depth -= 1
            for stmt in node.orelse:
                self.visit(stmt)
        else:
            self.generic_visit(node)


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def scan(pkg_dir: Path) -> tuple[dict[str, Path], list[Import], list[dict]]:
    """Every import in the package: internal ones as Import, external ones as dicts."""
    mods = find_modules(pkg_dir)
    internal: list[Import] = []
    external: list[dict] = []
    base = pkg_dir.parent
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        w = _Walker()
        w.visit(tree)
        rel = str(path.relative_to(base))
        for node, where in w.found:
            targets: list[tuple[str, tuple[str, ...]]] = []  # (dotted candidate, names)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    targets.append((alias.name, ()))
            else:
                if node.level:
                    pkg = _package_of(mod, path).split(".")
                    up = pkg[: len(pkg) - (node.level - 1)]
                    basename = ".".join(up + ([node.module] if node.module else []))
                else:
                    basename = node.module or ""
                names = tuple(a.name for a in node.names)
                sub = [n for n in names if f"{basename}.{n}" in mods]
                rest = tuple(n for n in names if f"{basename}.{n}" not in mods)
                for n in sub:
                    targets.append((f"{basename}.{n}", (n,)))
                if rest or not sub:
                    targets.append((basename, rest))
            for cand, names in targets:
                dst = cand
                while dst and dst not in mods:
                    dst = dst.rpartition(".")[0]
                if dst and cand.split(".")[0] == pkg_dir.name:
                    internal.append(Import(mod, dst, node.lineno, where, rel, names))
                else:
                    external.append({"src": mod, "module": cand, "line": node.lineno,
                                     "where": where, "file": rel})
    return mods, internal, external


# ---------------------------------------------------------------- graph figures

def folder_of(module: str, mods: dict[str, Path], root_as_one: bool) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "(root)" if root_as_one else "__init__.py"
    first = ".".join(parts[:2])
    if mods[first].name == "__init__.py":
        return parts[1]
    return "(root)" if root_as_one else parts[1] + ".py"


def sccs(nodes: list[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan, iterative; components in reverse topological order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def layers(nodes: list[str], edges: dict[str, set[str]]) -> tuple[dict[str, int], list[list[str]]]:
    """Longest-path layer per node (0 = imports nothing inside), cycles condensed."""
    comps = sccs(nodes, edges)  # reverse topological: dependencies come first
    comp_of = {n: i for i, c in enumerate(comps) for n in c}
    layer_of_comp: dict[int, int] = {}
    for i, comp in enumerate(comps):
        deps = {comp_of[w] for n in comp for w in edges.get(n, ()) if comp_of[w] != i}
        layer_of_comp[i] = 1 + max((layer_of_comp[d] for d in deps), default=-1)
    return {n: layer_of_comp[comp_of[n]] for n in nodes}, [c for c in comps if len(c) > 1]


def figures(mods: list[str], imports: list[Import], folder: dict[str, str],
            edge_kinds: set[str], order: list[str] | None,
            allow: set[tuple[str, str]],
            allow_imports: frozenset[tuple[str, str]] = frozenset()) -> dict:
    used = [i for i in imports if i.where in edge_kinds]
    medges: dict[str, set[str]] = defaultdict(set)
    for i in used:
        if i.src != i.dst:
            medges[i.src].add(i.dst)
    folders = sorted(set(folder.values()))
    fedges: dict[str, set[str]] = defaultdict(set)
    for i in used:
        a, b = folder[i.src], folder[i.dst]
        if a != b:
            fedges[a].add(b)

    mlayer, mcycles = layers(mods, medges)
    flayer, fcycles = layers(folders, fedges)

    def cycle_edges(comp: list[str], of) -> list[str]:
        members = set(comp)
        return sorted({f"{i.file}:{i.line} {i.src} -> {i.dst} ({i.where})" for i in used
                       if of(i.src) in members and of(i.dst) in members
                       and of(i.src) != of(i.dst)})

    mutual = []
    for a in folders:
        for b in sorted(fedges.get(a, ())):
            if a < b and a in fedges.get(b, ()):
                lines = sorted(f"{i.file}:{i.line} {i.src} -> {i.dst} ({i.where})"
                               for i in used if {folder[i.src], folder[i.dst]} == {a, b})
                mutual.append({"pair": [a, b], "imports": lines})

    result = {
        "edge_kinds": sorted(edge_kinds),
        "module_edges": sum(len(v) for v in medges.values()),
        "folder_edges": sum(len(v) for v in fedges.values()),
        "module_cycles": [{"modules": c, "imports": cycle_edges(c, lambda m: m)}
                          for c in mcycles],
        "folder_cycles": [{"folders": c,
                           "imports": cycle_edges(c, lambda m: folder[m])} for c in fcycles],
        "mutual_folder_pairs": mutual,
        "module_layers": max(mlayer.values()) + 1 if mlayer else 0,
        "folder_layers": max(flayer.values()) + 1 if flayer else 0,
        "module_layer": dict(sorted(mlayer.items(), key=lambda kv: (kv[1], kv[0]))),
        "folder_layer": dict(sorted(flayer.items(), key=lambda kv: (kv[1], kv[0]))),
    }
    if order is not None:
        rank = {name: r for r, name in enumerate(order)}
        unplaced = sorted(f for f in folders if f not in rank)
        upward: list[dict[str, Any]] = []
        allowed: list[dict[str, Any]] = []
        for i in sorted(used, key=lambda i: (i.file, i.line)):
            a, b = folder[i.src], folder[i.dst]
            if a == b or a not in rank or b not in rank or rank[b] <= rank[a]:
                continue
            row = {"from": a, "to": b, "at": f"{i.file}:{i.line}", "src": i.src,
                   "dst": i.dst, "where": i.where, "names": list(i.names)}
            listed = (a, b) in allow or (i.file, i.dst) in allow_imports
            (allowed if listed else upward).append(row)
        result["order"] = order
        result["unplaced_folders"] = unplaced
        result["upward_imports"] = upward
        result["upward_allowed"] = allowed
        result["upward_folder_edges"] = sorted({f"{r['from']} -> {r['to']}" for r in upward})
    return result


# ---------------------------------------------------------------- output

def _norm_order(order: list[str], folders: set[str]) -> list[str]:
    """Accept `bench`, `bench/`, `job`, `job.py`."""
    out = []
    for name in order:
        name = name.strip().rstrip("/")
        if not name:
            continue
        if name not in folders and name + ".py" in folders:
            name += ".py"
        out.append(name)
    return out


def summary(data: dict, out=sys.stdout) -> None:
    p = lambda *a: print(*a, file=out)  # noqa: E731
    c = data["counts"]
    p(f"package {data['package']}: {c['modules']} modules in {c['folders']} folders")
    p(f"internal imports: {c['internal']} (top {c['top']}, in functions {c['function']}, "
      f"TYPE_CHECKING {c['typing']}); in-function imports of any module "
      f"(internal + external): {c['function_any']}; of them crossing folders: "
      f"{c['function_cross_folder']}")
    for key, title in (("runtime", "runtime edges (top + function)"),
                       ("top", "import-time edges (top only)"),
                       ("all", "every import (top + function + TYPE_CHECKING)")):
        f = data[key]
        p(f"\n== {title}: {f['module_edges']} module edges, {f['folder_edges']} folder edges")
        p(f"layers: modules {f['module_layers']}, folders {f['folder_layers']}")
        p(f"module cycles: {len(f['module_cycles'])}")
        for cyc in f["module_cycles"]:
            p("  " + " <-> ".join(cyc["modules"]))
            for line in cyc["imports"]:
                p("      " + line)
        p(f"folder cycles (strongly connected sets): {len(f['folder_cycles'])}")
        for cyc in f["folder_cycles"]:
            p("  {" + ", ".join(cyc["folders"]) + "}")
        p(f"mutually importing folder pairs: {len(f['mutual_folder_pairs'])}")
        for m in f["mutual_folder_pairs"]:
            p(f"  {m['pair'][0]} <-> {m['pair'][1]}")
            for line in m["imports"]:
                p("      " + line)
        p("folder layers (bottom 0): " + ", ".join(
            f"{k}={v}" for k, v in f["folder_layer"].items()))
        if "upward_imports" in f:
            p(f"upward imports against the declared order: {len(f['upward_imports'])} "
              f"({len(f['upward_folder_edges'])} folder edges), allowed: "
              f"{len(f['upward_allowed'])}")
            if f["unplaced_folders"]:
                p("  folders not in the order (not judged): " + ", ".join(f["unplaced_folders"]))
            for r in f["upward_imports"]:
                p(f"  {r['at']} {r['src']} -> {r['dst']} ({r['where']}) "
                  f"[{r['from']} below {r['to']}]")
            for r in f["upward_allowed"]:
                p(f"  allowed: {r['at']} {r['src']} -> {r['dst']} ({r['where']})")
    p("\n== imports inside functions (internal), file:line")
    for i in data["function_imports"]:
        p(f"  {i['file']}:{i['line']} {i['src']} -> {i['dst']}")


def analyse(mods: list[str], imports: list[Import], external: list[dict], folder: dict[str, str],
            order: list[str] | None, allow: set[tuple[str, str]], package: str,
            allow_imports: frozenset[tuple[str, str]] = frozenset()) -> dict:
    ext_fn = [e for e in external if e["where"] == "function"]
    cnt = Counter(i.where for i in imports)
    data = {
        "package": package,
        "counts": {
            "modules": len(mods), "folders": len(set(folder.values())),
            "internal": len(imports), "top": cnt["top"], "function": cnt["function"],
            "typing": cnt["typing"],
            "function_any": cnt["function"] + len(ext_fn),
            "function_external": len(ext_fn),
            "function_cross_folder": sum(1 for i in imports if i.where == "function"
                                         and folder[i.src] != folder[i.dst]),
            "function_import_statements": len({(i.file, i.line) for i in imports
                                               if i.where == "function"}),
        },
        "runtime": figures(mods, imports, folder, {"top", "function"}, order, allow,
                           allow_imports),
        "top": figures(mods, imports, folder, {"top"}, order, allow, allow_imports),
        "all": figures(mods, imports, folder, {"top", "function", "typing"}, order, allow,
                       allow_imports),
        "function_imports": [asdict(i) for i in sorted(imports, key=lambda i: (i.file, i.line))
                             if i.where == "function"],
        "function_imports_external": ext_fn,
        "typing_imports": [asdict(i) for i in imports if i.where == "typing"],
        "folder_of": folder,
    }
    return data


def from_edges(path: Path) -> tuple[list[str], list[Import], dict[str, str]]:
    """A graph described by hand: {"folder_of": {module: folder}, "imports":
    [{"src", "dst", "where", "file"?, "line"?}]}. Used to predict a plan's figures."""
    spec = json.loads(path.read_text())
    folder = spec["folder_of"]
    imports = [Import(r["src"], r["dst"], r.get("line", 0), r.get("where", "top"),
                      r.get("file", r["src"]), tuple(r.get("names", ())))
               for r in spec["imports"]]
    for i in imports:
        for m in (i.src, i.dst):
            if m not in folder:
                raise SystemExit(f"{path}: module {m} has no folder in folder_of")
    return sorted(folder), imports, folder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("package", nargs="?", type=Path, help="the package directory")
    ap.add_argument("--from-edges", type=Path, help="a JSON graph instead of a package")
    ap.add_argument("--json", type=Path, help="write every figure to this file")
    ap.add_argument("--dump-edges", type=Path,
                    help="write the scanned graph in --from-edges form (to edit into a plan)")
    ap.add_argument("--order", help="folders bottom first, comma-separated, or @file "
                    "(one a line, # comments)")
    ap.add_argument("--allow", action="append", default=[],
                    help="an upward folder edge listed as an exception: SRC->DST")
    ap.add_argument("--root-as-one", action="store_true",
                    help="top-level modules form one folder (root) instead of one each")
    ap.add_argument("--exclude", default="",
                    help="modules left out of the graph (comma-separated dotted names; a name "
                         "also drops its submodules), e.g. the entry modules to see the stages")
    ap.add_argument("--quiet", action="store_true", help="no summary on stdout")
    args = ap.parse_args(argv)

    if args.from_edges:
        mods, imports, folder = from_edges(args.from_edges)
        external: list[dict] = []
        package = str(args.from_edges)
    elif args.package:
        pkg = args.package.resolve()
        if not (pkg / "__init__.py").is_file():
            ap.error(f"{pkg} is not a package (no __init__.py)")
        modmap, imports, external = scan(pkg)
        mods = sorted(modmap)
        folder = {m: folder_of(m, modmap, args.root_as_one) for m in mods}
        package = str(args.package)
    else:
        ap.error("give a package directory or --from-edges")

    drop = [x.strip() for x in args.exclude.split(",") if x.strip()]
    if drop:
        gone = lambda m: any(m == x or m.startswith(x + ".") for x in drop)  # noqa: E731
        mods = [m for m in mods if not gone(m)]
        imports = [i for i in imports if not gone(i.src) and not gone(i.dst)]
        external = [e for e in external if not gone(e["src"])]
        folder = {m: f for m, f in folder.items() if not gone(m)}
    folders = set(folder.values())
    allow_imports: frozenset[tuple[str, str]] = frozenset()
    if args.order:
        text = (Path(args.order[1:]).read_text() if args.order.startswith("@")
                else args.order.replace(",", "\n"))
        order = _norm_order([ln.split("#")[0] for ln in text.splitlines()], folders)
    else:  # design.md's order and the imports it lists against it
        order = _norm_order(design_layers(), folders)
        root = package.rstrip("/").rsplit("/", 1)[-1]
        allow_imports = frozenset((f"{root}/{src}", f"{root}.{dst}")
                                  for src, dsts in design_exceptions().items() for dst in dsts)
    allow = set()
    for a in args.allow:
        s, _, d = a.partition("->")
        n = _norm_order([s, d], folders)
        allow.add((n[0], n[1]))

    data = analyse(mods, imports, external, folder, order, allow, package, allow_imports)
    if args.dump_edges:
        args.dump_edges.write_text(json.dumps({
            "folder_of": folder,
            "imports": [{"src": i.src, "dst": i.dst, "where": i.where, "file": i.file,
                         "line": i.line, "names": list(i.names)} for i in imports],
        }, indent=1))
    if args.json:
        args.json.write_text(json.dumps(data, indent=1))
    if not args.quiet:
        summary(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
