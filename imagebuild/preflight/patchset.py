"""Each engine's patch series tried against the hash-pinned vLLM it patches, before any build.

The engine build applies the series with apply-patches.sh and stops at the first patch
that does not apply: 2 min 20 s into a cpu build (issue 35), longer on a GB10. Here the
same `git apply` runs on the files the series touches, taken from the pinned wheel or
sdist (vllmsource/pinned.py), in about a second. A patch the pinned vLLM already has
(it applies in reverse: vLLM 0.32 carries both cpu fixes) is said so: applying it again
would fail the build too. `check` (and `render`) use the cached source; `lock`, and a
check of cells a release builds (`check --tag`, `build`), fetch what is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from imagebuild.errors import ImagebuildError, UserError
from imagebuild.preflight.findings import Finding, Rule
from imagebuild.spec.matrix import Cell, LoadedMatrix
from imagebuild.vllmsource.patches import try_series
from imagebuild.vllmsource.pinned import describe, pinned_source

RULES = (
    Rule("patch-applies", "error",
         "the engine build applies its patch series to the pinned vLLM and stops at the "
         "first patch that does not apply, minutes into the build",
         "rebase the patch onto the pinned vLLM's file, or drop it from the engine's patches",
         waivable=False),
    Rule("patch-upstream", "error",
         "a patch the pinned vLLM already contains does not apply a second time: the "
         "engine build fails on it (an upgrade often brings the fix a patch carried)",
         "drop the patch from the engine's patches", waivable=False),
    Rule("patches-untried", "warning",
         "the patch series could not be tried before the build: the pinned wheel or sdist "
         "is not on this machine (or could not be fetched)",
         "run `python build.py lock` where the package index is reachable (it fetches the "
         "pinned source into .cache/vllm-src), then check again"),
)
BY_ID = {r.id: r for r in RULES}


def _patch_files(lm: LoadedMatrix, names: Iterable[str]) -> list[Path]:
    return [lm.root / "patches" / name for name in names]


def check(lm: LoadedMatrix, cells: list[Cell], labels: list[str], *, fetch: bool
          ) -> list[Finding]:
    """One try per engine realization of the cells (named on its first cell)."""
    out: list[Finding] = []
    seen: set[tuple[str, str]] = set()
    for cell, label in zip(cells, labels, strict=True):
        key = (cell.engine_name, cell.target_name)
        real = cell.realization
        if key in seen or not real.patches:
            continue
        seen.add(key)
        out += _try(lm, cell, label, fetch=fetch)
    return out


def _try(lm: LoadedMatrix, cell: Cell, label: str, *, fetch: bool) -> list[Finding]:
    ename, tname, real = cell.engine_name, cell.target_name, cell.realization
    version = cell.engine.vllm_version
    at = ("engines", ename, "realize", tname, "patches")
    head = f"engine {ename} ({tname})"
    patches = _patch_files(lm, real.patches)
    try:
        with pinned_source(real, version, patches, fetch=fetch) as pinned:
            if pinned is None:
                return [BY_ID["patches-untried"].finding(
                    label, f"{head}: its {len(patches)} patch(es) were not tried: "
                           f"{describe(real, version)} is not in this machine's cache",
                    where=lm.located.where(at))]
            outcomes = try_series(pinned.tree, patches)
    except ImagebuildError as exc:
        return [BY_ID["patches-untried"].finding(
            label, f"{head}: its patches were not tried: {exc.message}",
            where=lm.located.where(at))]
    out = []
    for i, o in enumerate(outcomes):
        where = lm.located.where(at + (i,))
        if o.status == "fails":
            out.append(BY_ID["patch-applies"].finding(
                label, f"{head}: {o.detail}, against {pinned.what}", where=where,
                fix=f"rebase {o.patch.name} onto vLLM {version}'s file, or drop it from "
                    f"engines.{ename}.realize.{tname}.patches"))
        elif o.status == "upstream":
            out.append(BY_ID["patch-upstream"].finding(
                label, f"{head}: patch {o.patch.name} is already in {pinned.what} (it "
                       "applies in reverse): applying it again fails the build", where=where,
                fix=f"drop {o.patch.name} from engines.{ename}.realize.{tname}.patches"))
    return out


def refuse_unapplied(lm: LoadedMatrix, cells: list[Cell], *, fetch: bool,
                     say: Callable[[str], None]) -> None:
    """`lock` and `render`: exit 2 (nothing written) when a patch does not apply to its
    pinned vLLM; a series that could not be tried is only said."""
    labels = [f"{c.target_name}/{c.engine_name}" for c in cells]
    found = check(lm, cells, labels, fetch=fetch)
    for f in found:
        if not f.blocking:
            say(f"note: {f.message}")
    bad = [f for f in found if f.blocking]
    if bad:
        raise UserError("\n".join(f.message for f in bad), fix=bad[0].fix or "",
                        where=bad[0].where)
