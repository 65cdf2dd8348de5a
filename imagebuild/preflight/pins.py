"""Pin rules: every pin a cell builds from is a full SHA recorded in matrix.lock.json, and
the lock agrees with matrix.yaml (docs/design.md "Pins are immutable").

Agreement is decided by lock.verify_cells, the same code `build` and `lock --check` run, so
check and build cannot disagree; this module turns its refusals into findings and adds what
verify_cells leaves to the build (unresolved entries, SHA shape).

Unresolved pins are one rule for `check` and `build`: a warning while nothing is built
(`check` without --tag: the matrix is reviewed, not released), an error for the cells a
release builds (`check --tag`, `build`, `release`: buildable.py runs this check), whose
fix is the one `lock --update` command that resolves every such pin of a target, run
where the pins can be read (the target's runner: its Docker engine reaches the base
images' registry).
"""

from __future__ import annotations

from dataclasses import dataclass

from imagebuild.errors import UserError
from imagebuild.lock.lockfile import LOCK_NAME, Lock
from imagebuild.lock.resolve import verify_cells
from imagebuild.preflight.checkpoint import SKIPPED
from imagebuild.preflight.findings import MATRIX, Finding, Rule
from imagebuild.spec import hardware
from imagebuild.spec.config import FULL_SHA, Target
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
         "the cell until it is resolved (an error for the cells a release builds: "
         "`check --tag`, `build`)",
         "run `python build.py lock --update NAME` where the Hub is reachable and commit the "
         "lock", waivable=False),
)
BY_ID = {r.id: r for r in RULES}


def _hub_pins(cell: Cell) -> list[tuple[str, str, str | None]]:
    return [("models", cell.model_name, cell.model.repository),
            ("drafters", cell.drafter_name, cell.drafter_model)]


def update_command(names: list[str]) -> str:
    """The one `lock --update` that resolves `names` (--update repeats, argparse append)."""
    return "python build.py lock " + " ".join(f"--update {n}" for n in names)


def where_to_lock(name: str, target: Target) -> str:
    """Where a target's pins can be read: its base images' registry and the Hub."""
    if not target.base_image or "/" not in target.base_image.split("@")[0]:
        return "on a machine that reaches the Hugging Face Hub"
    host = target.base_image.split("/", 1)[0]
    registry = host if "." in host or ":" in host else "its base images' registry"
    return (f"on a runner of target {name} (labels "
            f"{', '.join(hardware.runner(target))}: it reaches {registry} and the Hub)")


@dataclass
class _Unresolved:
    label: str
    target: str
    name: str  # what `lock --update` takes: a model, drafter or target name
    message: str
    fix: str | None
    where: str | None


def _unresolved(lm: LoadedMatrix, cells: list[Cell], lock: Lock,
                labels: list[str]) -> list[_Unresolved]:
    """Every unresolved pin of `cells`, once per pin (the cells share them)."""
    out: list[_Unresolved] = []
    seen: set[tuple[str, str]] = set()
    for label, cell in zip(labels, cells, strict=True):
        for kind, name, repo in _hub_pins(cell):
            entry = lock.entry(kind, name)
            if (not repo or not entry or entry.get("repository") != repo
                    or entry.get("status") == "resolved" or (kind, name) in seen):
                continue  # no Hub pin, verify_cells already refused it, resolved, or said
            seen.add((kind, name))
            missing = ", ".join(entry.get("unresolved") or ["sha"])
            out.append(_Unresolved(
                label, cell.target_name, name,
                f"{kind[:-1]} {name} ({repo}) is unresolved in {LOCK_NAME} (missing: "
                f"{missing}): cannot check {', '.join(SKIPPED[kind])}; build refuses it "
                "until resolved",
                entry.get("fix") or BY_ID["pin-unresolved"].fix.replace("NAME", name),
                lm.located.where((kind, name))))
        eng = (lock.entry("engines", cell.engine_name) or {}).get(cell.target_name) or {}
        key = ("engines", f"{cell.engine_name}/{cell.target_name}")
        commit = (eng.get("source") or {}).get("commit")
        shape_refused = bool(cell.realization.source and commit and not FULL_SHA.match(commit))
        # no entry at all: verify_cells refused it already (the lock is not this matrix's)
        if (eng and eng.get("status") != "resolved" and not shape_refused
                and key not in seen):
            seen.add(key)
            out.append(_Unresolved(
                label, cell.target_name, cell.target_name,
                f"engine {cell.engine_name} for {cell.target_name} is unresolved in "
                f"{LOCK_NAME}", eng.get("fix") or "run `python build.py lock`", None))
        base = lock.entry("bases", cell.target_name) or {}
        key = ("bases", cell.target_name)
        if base.get("status") != "resolved" and key not in seen:
            seen.add(key)
            target = cell.target
            unpinned = [image for image, digest in (
                (target.base_image, base.get("digest")),
                (target.runtime_image, base.get("runtime_digest"))) if image and not digest]
            images = " and ".join(unpinned) or base.get("image") or target.base_image
            out.append(_Unresolved(
                label, cell.target_name, cell.target_name,
                f"{images} of target {cell.target_name} "
                f"{'has' if len(unpinned) < 2 else 'have'} no digest in {LOCK_NAME}: a "
                "release builds only FROM images pinned by digest",
                base.get("fix") or f"run `python build.py lock --update {cell.target_name}`",
                lm.located.where(("targets", cell.target_name, "base_image"))))
    return out


def _unresolved_findings(lm: LoadedMatrix, found: list[_Unresolved],
                         building: bool) -> list[Finding]:
    rule = BY_ID["pin-unresolved"]
    if not building:
        return [rule.finding(u.label, u.message, fix=u.fix, where=u.where) for u in found]
    # one command per target resolves every pin it builds from: the user runs it once
    names: dict[str, list[str]] = {}
    for u in found:  # the target first: its base digests are what only its runner reads
        names.setdefault(u.target, [u.target] if any(
            v.target == u.target and v.name == u.target for v in found) else [])
        if u.name not in names[u.target]:
            names[u.target].append(u.name)
    out = []
    for u in found:
        target = lm.matrix.targets[u.target]
        out.append(rule.finding(
            u.label, f"{u.message}; this release builds it", severity="error", where=u.where,
            fix=f"{where_to_lock(u.target, target)}: "
                f"`{update_command(names[u.target])}`, then commit {LOCK_NAME} and tag again"))
    return out


def check(lm: LoadedMatrix, cells: list[Cell], lock: Lock | None,
          labels: list[str] | None = None, *, building: bool = False) -> list[Finding]:
    """Pin findings; labels[i] names cells[i] in findings (default: cell.id). `building`:
    the cells are the ones a release builds, so an unresolved pin is an error."""
    if lock is None:
        r = BY_ID["pin-lock-agrees"]
        return [r.finding(MATRIX, f"no {LOCK_NAME}: no pin is locked",
                          fix="run `python build.py lock` and commit the lock")]
    labels = labels or [c.id for c in cells]
    out: list[Finding] = []
    for label, cell in zip(labels, cells, strict=True):
        try:
            verify_cells(lm, [cell], lock, allow_unresolved=True)
        except UserError as exc:
            out.append(BY_ID["pin-lock-agrees"].finding(label, exc.message, fix=exc.fix,
                                                        where=exc.where))
        for kind, name, repo in _hub_pins(cell):
            entry = lock.entry(kind, name)
            if (repo and entry and entry.get("repository") == repo
                    and entry.get("status") == "resolved"
                    and not FULL_SHA.match(entry.get("sha") or "")):
                out.append(BY_ID["pin-full-sha"].finding(
                    label, f"{kind[:-1]} {name} is locked at {entry.get('sha')!r}, not a "
                             "full commit SHA",
                    fix=BY_ID["pin-full-sha"].fix.replace("NAME", name),
                    where=lm.located.where((kind, name))))
        eng = (lock.entry("engines", cell.engine_name) or {}).get(cell.target_name) or {}
        commit = (eng.get("source") or {}).get("commit")
        if cell.realization.source and eng and commit and not FULL_SHA.match(commit):
            out.append(BY_ID["pin-full-sha"].finding(
                label, f"engine {cell.engine_name} source is locked at {commit!r}, not a "
                         "full commit SHA", fix="write the full 40-hex commit in matrix.yaml",
                where=lm.located.where(("engines", cell.engine_name, "realize",
                                        cell.target_name, "source", "commit"))))
    return out + _unresolved_findings(lm, _unresolved(lm, cells, lock, labels), building)
