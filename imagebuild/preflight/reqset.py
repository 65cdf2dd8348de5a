"""A wheel engine's requirement set against the wheel it is installed beside.

The engine installs the set with --no-deps, then the wheel with --no-deps: nothing checks
that the set is what the wheel asks for until vLLM fails to import (or `pip check` at the
end of the build). Here every Requires-Dist of the pinned wheel that applies on the
target (its markers for the target's machine and the set's Python) must be pinned in the
set at a version it allows; the one allowance is the recorded local-version swap (the
wheel's `torch==X+cpu`, met by the index's `torch==X`: lock/requirements.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from imagebuild.errors import ImagebuildError
from imagebuild.lock.requirements import (
    MACHINES,
    environment,
    read_pins,
    unsatisfied,
    wheel_requires,
)
from imagebuild.preflight.findings import Finding, Rule
from imagebuild.spec.matrix import Cell, LoadedMatrix
from imagebuild.vllmsource.wheel import cached_wheel, fetch_wheel

# the set's Python, as lock/requirements.py writes its header; a set without one (written
# by hand) is for the cpu base image's python3: Debian bookworm's 3.11
PYTHON = re.compile(r"cpython (\d+\.\d+)")
DEFAULT_PYTHON = "3.11"

RULES = (
    Rule("requirements-satisfy-wheel", "error",
         "the engine installs its requirement set and then the wheel without dependencies "
         "(--no-deps): a set that misses or mis-pins one of the wheel's requirements builds "
         "an engine that fails at import or at serve time",
         "write the set from the wheel: `python build.py lock --update ENGINE`",
         waivable=False),
)
BY_ID = {r.id: r for r in RULES}


def _python(path: Path) -> str:
    head = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))
    found = PYTHON.search(head)
    return found.group(1) if found else DEFAULT_PYTHON


def check(lm: LoadedMatrix, cells: list[Cell], labels: list[str], *, fetch: bool
          ) -> list[Finding]:
    """One finding per wheel realization whose set does not satisfy its wheel."""
    r = BY_ID["requirements-satisfy-wheel"]
    out: list[Finding] = []
    seen: set[tuple[str, str]] = set()
    for cell, label in zip(cells, labels, strict=True):
        real, key = cell.realization, (cell.engine_name, cell.target_name)
        if real.wheel is None or key in seen:
            continue
        seen.add(key)
        w = real.wheel
        path = lm.root / w.requirements
        where = lm.located.where(("engines", cell.engine_name, "realize", cell.target_name,
                                  "wheel", "requirements"))
        try:
            wheel = (fetch_wheel(w.package, w.version, w.sha256) if fetch
                     else cached_wheel(w.sha256))
            if wheel is None or not path.is_file():
                continue  # patches-untried says the wheel is not here; inputs, the set
            env = environment(MACHINES.get(cell.target.platform, "x86_64"), _python(path))
            bad = unsatisfied(wheel_requires(wheel), read_pins(path), env)
        except ImagebuildError as exc:
            out.append(r.finding(label, f"engine {cell.engine_name}: {exc.message}",
                                 where=where, fix=exc.fix))
            continue
        if bad:
            out.append(r.finding(label, f"engine {cell.engine_name} ({cell.target_name}): "
                                        f"{w.requirements} does not satisfy {w.package} "
                                        f"{w.version}: " + "; ".join(bad[:5])
                                        + (f" (and {len(bad) - 5} more)" if len(bad) > 5
                                           else ""),
                                 where=where,
                                 fix=f"`python build.py lock --update {cell.engine_name}`"))
    return out
