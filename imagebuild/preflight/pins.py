"""Pin rules: every pin a cell builds from is a full SHA recorded in matrix.lock.json, and
the lock agrees with matrix.yaml (docs/design.md "Pins are immutable").

Agreement is decided by lock.verify_cells, the same code `build` and `lock --check` run, so
check and build cannot disagree; this module turns its refusals into findings and adds what
verify_cells leaves to the build (unresolved entries, SHA shape).
"""

from __future__ import annotations

from imagebuild.errors import UserError
from imagebuild.lock.lockfile import LOCK_NAME, Lock
from imagebuild.lock.resolve import verify_cells
from imagebuild.preflight.checkpoint import SKIPPED
from imagebuild.preflight.findings import MATRIX, Finding, Rule
from imagebuild.spec.config import FULL_SHA
from imagebuild.spec.matrix import Cell, LoadedMatrix

RULES = (
    Rule("pin-lock-agrees", "error",
         "builds read pins only from the lock; a lock that lacks or contradicts matrix.yaml "
         "builds something other than what matrix.yaml says",
         "run `python build.py lock` (or `lock --update NAME`) and commit the lock",
         waivable=False),
    Rule("pin-full-sha", "error",
         "a branch or short SHA moves or becomes ambiguous under the pin (the z-lab drafter's "
         "main was retrained and broke serving)",
         "run `python build.py lock --update NAME` so the lock records the full 40-hex commit",
         waivable=False),
    Rule("pin-unresolved", "warning",
         "the lock could not resolve this pin here (no Hub/registry access); build refuses "
         "the cell until it is resolved",
         "run `python build.py lock --update NAME` where the Hub is reachable and commit the "
         "lock", waivable=False),
)
BY_ID = {r.id: r for r in RULES}


def _hub_pins(cell: Cell) -> list[tuple[str, str, str | None]]:
    return [("models", cell.model_name, cell.model.repository),
            ("drafters", cell.drafter_name, cell.drafter_model)]


def check(lm: LoadedMatrix, cells: list[Cell], lock: Lock | None,
          labels: list[str] | None = None) -> list[Finding]:
    """Pin findings; labels[i] names cells[i] in findings (default: cell.id)."""
    if lock is None:
        r = BY_ID["pin-lock-agrees"]
        return [r.finding(MATRIX, f"no {LOCK_NAME}: no pin is locked",
                          fix="run `python build.py lock` and commit the lock")]
    out: list[Finding] = []
    seen: set[tuple[str, str]] = set()
    for i, cell in enumerate(cells):
        label = labels[i] if labels else cell.id
        try:
            verify_cells(lm, [cell], lock, allow_unresolved=True)
        except UserError as exc:
            out.append(BY_ID["pin-lock-agrees"].finding(label, exc.message, fix=exc.fix,
                                                        where=exc.where))
        for kind, name, repo in _hub_pins(cell):
            entry = lock.entry(kind, name)
            if not repo or not entry or entry.get("repository") != repo:
                continue  # no Hub pin, or verify_cells already refused it
            where = lm.located.where((kind, name))
            if entry.get("status") != "resolved":
                if (kind, name) not in seen:  # once per pin is enough: the cells share it
                    missing = ", ".join(entry.get("unresolved") or ["sha"])
                    out.append(BY_ID["pin-unresolved"].finding(
                        label, f"{kind[:-1]} {name} ({repo}) is unresolved in {LOCK_NAME} "
                               f"(missing: {missing}): cannot check "
                               f"{', '.join(SKIPPED[kind])}; build refuses it until resolved",
                        fix=entry.get("fix") or BY_ID["pin-unresolved"].fix.replace("NAME", name),
                        where=where))
            elif not FULL_SHA.match(entry.get("sha") or ""):
                out.append(BY_ID["pin-full-sha"].finding(
                    label, f"{kind[:-1]} {name} is locked at {entry.get('sha')!r}, not a "
                             "full commit SHA",
                    fix=BY_ID["pin-full-sha"].fix.replace("NAME", name), where=where))
            seen.add((kind, name))
        eng = (lock.entry("engines", cell.engine_name) or {}).get(cell.target_name) or {}
        commit = (eng.get("source") or {}).get("commit")
        if cell.realization.source and eng and commit and not FULL_SHA.match(commit):
            out.append(BY_ID["pin-full-sha"].finding(
                label, f"engine {cell.engine_name} source is locked at {commit!r}, not a "
                         "full commit SHA", fix="write the full 40-hex commit in matrix.yaml",
                where=lm.located.where(("engines", cell.engine_name, "realize",
                                        cell.target_name, "source", "commit"))))
        elif cell.realization.source and eng.get("status") != "resolved":
            key = ("engines", f"{cell.engine_name}/{cell.target_name}")
            if key not in seen:
                out.append(BY_ID["pin-unresolved"].finding(
                    label, f"engine {cell.engine_name} source for {cell.target_name} is "
                             f"unresolved in {LOCK_NAME}",
                    fix=eng.get("fix") or "run `python build.py lock`"))
                seen.add(key)
        base = lock.entry("bases", cell.target_name) or {}
        key = ("bases", cell.target_name)
        if base.get("status") != "resolved" and key not in seen:
            out.append(BY_ID["pin-unresolved"].finding(
                label, f"base image {base.get('image') or cell.target.base_image} of target "
                         f"{cell.target_name} has no digest in {LOCK_NAME}",
                fix=base.get("fix") or "run `python build.py lock`",
                where=lm.located.where(("targets", cell.target_name, "base_image"))))
            seen.add(key)
    return out
