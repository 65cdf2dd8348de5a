"""An engine's `caveat:` (what users must know about a patch set, e.g. that it lacks the
upstream change its name promises) as a preflight warning on every cell that builds it,
so `check`, `plan` and `build` say it before anything is built."""

from __future__ import annotations

from imagebuild.preflight.findings import Finding, Rule
from imagebuild.spec.matrix import Cell, LoadedMatrix

RULES = (
    Rule("engine-caveat", "warning",
         "the patch set's author recorded something users must know about it (matrix.yaml "
         "engines.<name>.caveat); it is also in the plan, the image labels and the notes",
         "read the caveat; complete the patch set (and drop the caveat) before relying on "
         "what its name promises", waivable=False),
)


def check(lm: LoadedMatrix, cells: list[Cell], labels: list[str]) -> list[Finding]:
    rule = RULES[0]
    return [rule.finding(label, f"engine {cell.engine_name}: {cell.engine.caveat}",
                         where=lm.located.where(("engines", cell.engine_name, "caveat")))
            for cell, label in zip(cells, labels, strict=True) if cell.engine.caveat]
