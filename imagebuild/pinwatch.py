"""`build.py pins watch`: has a pinned model or drafter moved upstream, and would the new head
pass preflight? (Engines: is a newer vLLM on the package index, enginewatch.py.)

For each Hub pin of matrix.yaml the watched branch is its `track:` branch, or `main` for a
revision pin. When the branch head differs from the locked commit, the head's small metadata
files are downloaded to a scratch directory and every preflight rule runs on the cells that
use the pin, with the head standing in for the locked commit (an in-memory lock; nothing in
the repository changes). The z-lab drafter's retrain is the case this exists for: its `main`
moved to 8 KV heads with a sliding window and trips vLLM 0.23's page-size assert (docs/domain.md).

The report (JSON or markdown, one issue body per pin) feeds the pins workflow, which opens or
updates one GitHub issue per pin; deciding and wording stay here, in tested Python.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagebuild.enginewatch import MARKER, EngineReport, findings_table, watch_engines
from imagebuild.errors import OperationFailed, UserError
from imagebuild.lock.hub import HubClient, HubUnreachable
from imagebuild.lock.lockfile import LOCK_NAME, Lock, read_lock
from imagebuild.lock.resolve import METADATA_FILES
from imagebuild.preflight import pins as pin_rules
from imagebuild.preflight.findings import Finding
from imagebuild.preflight.run import cell_labels, run_checks
from imagebuild.spec import matrix as mx
from imagebuild.spec.config import Drafter, Model
from imagebuild.spec.matrix import Cell, LoadedMatrix, expand

# Pin-agreement rules compare the lock with matrix.yaml: with a candidate head standing in
# for the pin they fire by construction, so they say nothing about the new revision.
IGNORED_RULES = set(pin_rules.BY_ID) | {"waiver-unused", "waiver-invalid"}
# Short names for what a failing rule means at serve time (issue titles stay readable).
REASONS = {
    "kv-page-unify": "KV page-size unification",
    "drafter-fits-target": "drafter does not fit the target",
    "dflash-target-layers": "drafter reads target layers that do not exist",
    "quantization-matches-checkpoint": "quantization does not match the checkpoint",
    "vision-weights-nested": "vision weights nested (skip-loaded)",
    "max-model-len-supported": "max-model-len beyond the config",
    "metadata-matches-lock": "metadata does not match the listing",
}


def reason_of(f: Finding) -> str:
    if f.rule == "kv-page-unify" and "AssertionError" in f.message:
        return "page-size assert"
    return REASONS.get(f.rule, f.rule)


@dataclass(frozen=True)
class PinReport:
    kind: str  # "models" | "drafters"
    name: str
    repository: str
    branch: str  # the watched branch
    locked: str | None  # the commit in matrix.lock.json (None: never resolved)
    head: str | None  # the branch head now (None: the Hub did not answer)
    verdict: str  # current | passes | fails | incomplete | unreachable
    reason: str = ""  # why it fails / is incomplete / unreachable
    rule: str | None = None  # the first blocking rule, when it fails
    cells: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = field(default=(), repr=False)
    context: tuple[str, ...] = ()  # other pins fetched because the lock lacks them
    tracked: bool = False  # a `track:` pin: `lock --update NAME` moves it

    @property
    def label(self) -> str:
        return f"{self.kind[:-1]} {self.name}"

    @property
    def keep(self) -> str | None:
        """The pin to keep: the locked commit, whenever the head is not known to pass."""
        return self.locked if self.verdict in ("fails", "incomplete") else None

    @property
    def moved(self) -> bool:
        return self.verdict not in ("current", "unreachable")

    @property
    def title(self) -> str:
        return f"pins watch: {self.label} ({self.repository})"

    @property
    def headline(self) -> str:
        head = self.head[:12] if self.head else "?"
        if self.verdict == "current":
            return f"{self.branch} is still at the locked commit {head}"
        if self.verdict == "unreachable":
            return f"could not read {self.branch}: {self.reason}"
        if self.verdict == "fails":
            keep = (f"keep the pin {self.locked}" if self.locked
                    else "no pin to keep: pin a commit that passes")
            bad = len({f.cell for f in self.findings if f.blocking})
            return (f"new head {head} fails preflight: {self.reason} ({self.rule}) on "
                    f"{bad} of {len(self.cells)} cell(s); {keep}")
        if self.verdict == "incomplete":
            return f"new head {head} could not be fully checked: {self.reason}"
        return f"new head {head} passes preflight on {len(self.cells)} cell(s)"

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "repository": self.repository,
                "branch": self.branch, "locked": self.locked, "head": self.head,
                "verdict": self.verdict, "reason": self.reason, "rule": self.rule,
                "keep": self.keep, "headline": self.headline, "title": self.title,
                "cells": list(self.cells), "context": list(self.context),
                "findings": [f.to_dict() for f in self.findings]}

    def markdown(self) -> str:
        """The issue body: verdict first, then what preflight said per cell."""
        out = [MARKER, f"**{self.headline}**", "",
               f"- repository: `{self.repository}`, watched branch `{self.branch}`",
               f"- locked in {LOCK_NAME}: `{self.locked or 'unresolved'}`",
               f"- upstream head: `{self.head or 'unknown'}`"]
        if self.keep:
            out.append(f"- pin to keep: `{self.keep}`")
        if self.verdict == "passes":
            how = (f"`python build.py lock --update {self.name}`" if self.tracked
                   else f"set `revision: {self.head}` for {self.label} in matrix.yaml, then "
                        f"`python build.py lock --update {self.name}`")
            out.append(f"- to move the pin: {how}, then run a release")
        if self.context:
            out.append("- also fetched (unresolved in the lock): "
                       + ", ".join(f"`{c}`" for c in self.context))
        if self.cells:
            out.append(f"- cells checked: {', '.join(self.cells)}")
        return "\n".join(out + findings_table(self.findings))


def _hub_pins(lm: LoadedMatrix) -> list[tuple[str, str, Model | Drafter]]:
    out: list[tuple[str, str, Model | Drafter]] = []
    for kind, pins in (("models", lm.matrix.models), ("drafters", lm.matrix.drafters)):
        out += [(kind, name, pin) for name, pin in pins.items() if pin.repository]
    return out


def _uses(cell: Cell, kind: str, name: str) -> bool:
    return (cell.model_name if kind == "models" else cell.drafter_name) == name


def _fetch_entry(client: Any, pin: Model | Drafter, sha: str, scratch: Path
                 ) -> dict[str, Any]:
    """A resolved lock entry for `sha` whose metadata lives in scratch (absolute paths)."""
    assert pin.repository
    res = client.resolve(pin.repository, sha)
    stored = client.download_metadata(pin.repository, res.sha, list(METADATA_FILES),
                                      scratch / pin.repository / res.sha)
    return {"repository": pin.repository, "revision": pin.revision, "track": pin.track,
            "sha": res.sha, "status": "resolved",
            "files": [{"path": f.path, "size": f.size, "lfs_sha256": f.lfs_sha256,
                       "blob_id": f.blob_id} for f in res.files],
            "metadata": sorted(str(p.resolve()) for p in stored)}


def _context_sha(client: Any, pin: Model | Drafter, entry: dict[str, Any] | None) -> str:
    if entry and entry.get("sha"):
        return str(entry["sha"])
    if pin.revision:
        return pin.revision
    assert pin.repository and pin.track
    return str(client.head_sha(pin.repository, pin.track))


def check_head(lm: LoadedMatrix, lock: Lock, client: Any, kind: str, name: str,
               head: str, scratch: Path) -> tuple[list[Cell], list[Finding], list[str]]:
    """Preflight of every cell using pin kind/name with `head` in place of the locked commit.

    Other pins those cells need that the lock has not resolved are fetched at their known
    commit (or tracked head) too, so the KV-cache check has both sides."""
    pins = dict(((k, n), p) for k, n, p in _hub_pins(lm))
    data = copy.deepcopy(lock.data)
    data.setdefault(kind, {})[name] = _fetch_entry(client, pins[(kind, name)], head, scratch)
    cells = [c for c in expand(lm) if _uses(c, kind, name)]
    context: list[str] = []
    for cell in cells:
        for k, n in (("models", cell.model_name), ("drafters", cell.drafter_name)):
            pin = pins.get((k, n))
            entry = data.get(k, {}).get(n)
            if pin is None or (entry and entry.get("status") == "resolved"):
                continue
            sha = _context_sha(client, pin, entry)
            data.setdefault(k, {})[n] = _fetch_entry(client, pin, sha, scratch)
            context.append(f"{k[:-1]} {n}@{data[k][n]['sha'][:12]}")
    findings = run_checks(lm, cells, Lock(data=data, path=lock.path))
    return cells, [f for f in findings if f.rule not in IGNORED_RULES], context


def watch_pin(lm: LoadedMatrix, lock: Lock, client: Any, kind: str, name: str,
              pin: Model | Drafter, scratch: Path) -> PinReport:
    assert pin.repository
    branch = pin.track or "main"
    entry = lock.entry(kind, name) or {}
    locked = entry.get("sha") if entry.get("repository") == pin.repository else None
    base = dict(kind=kind, name=name, repository=pin.repository, branch=branch,
                locked=locked, tracked=pin.track is not None)
    try:
        head = client.head_sha(pin.repository, branch)
        if head == locked:
            return PinReport(head=head, verdict="current", **base)  # type: ignore[arg-type]
        cells, findings, context = check_head(lm, lock, client, kind, name, head, scratch)
    except (HubUnreachable, UserError, OperationFailed) as exc:
        return PinReport(head=None, verdict="unreachable", reason=exc.message,
                         **base)  # type: ignore[arg-type]
    ids = tuple(cell_labels(cells))
    blocking = [f for f in findings if f.blocking]
    missing = [f for f in findings if f.rule == "metadata-missing"]
    if blocking:
        verdict, reason, rule = "fails", reason_of(blocking[0]), blocking[0].rule
    elif missing:
        verdict, reason, rule = "incomplete", missing[0].message, None
    else:
        verdict, reason, rule = "passes", "", None
    return PinReport(head=head, verdict=verdict, reason=reason, rule=rule, cells=ids,
                     findings=tuple(findings), context=tuple(context),
                     **base)  # type: ignore[arg-type]


def watch(lm: LoadedMatrix, lock: Lock | None, client: Any, *,
          only: Callable[[str, str], bool] | None = None) -> list[PinReport]:
    """One report per Hub pin of matrix.yaml (models first, then drafters)."""
    if lock is None:
        raise UserError(f"no {LOCK_NAME}", fix="run `python build.py lock` and commit the lock")
    with tempfile.TemporaryDirectory(prefix="imagebuild-pins-") as tmp:
        return [watch_pin(lm, lock, client, kind, name, pin, Path(tmp))
                for kind, name, pin in _hub_pins(lm) if only is None or only(kind, name)]


def slug(report: Report) -> str:
    which = (f"{report.kind}-{report.name}" if isinstance(report, PinReport)
             else f"{report.kind}-{report.name}-{report.target}")
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", which)


Report = PinReport | EngineReport


def write_issue_files(reports: list[Report], out: Path) -> list[Path]:
    """`<kind>-<name>.md` (issue body) and `.title` for each pin whose head moved: what the
    workflow turns into one open-or-updated issue per pin; and `watched.tsv`, the verdict
    and title of every pin watched, written last: the workflow closes a pin's issue only
    when this run saw that pin `current` (an unreachable Hub is no reason to close)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "watched.tsv").unlink(missing_ok=True)
    written = []
    for r in reports:
        if not r.moved:
            continue
        body = out / f"{slug(r)}.md"
        body.write_text(r.markdown())
        (out / f"{slug(r)}.title").write_text(r.title + "\n")
        written.append(body)
    (out / "watched.tsv").write_text("".join(f"{r.verdict}\t{r.title}\n" for r in reports))
    return written


def render(reports: list[Report], fmt: str) -> str:
    if fmt == "json":
        return json.dumps({"pins": [r.as_json() for r in reports if isinstance(r, PinReport)],
                           "engines": [r.as_json() for r in reports
                                       if isinstance(r, EngineReport)]}, indent=2)
    if fmt == "markdown":
        return "\n".join(f"## {r.title}\n\n{r.markdown()}" for r in reports)
    return "\n".join(f"{r.label} ({r.repository}@{r.branch}): {r.verdict}: {r.headline}"
                     if isinstance(r, PinReport) else
                     "\n  also newer: ".join([f"{r.label}: {r.verdict}: {r.headline}",
                                             *r.between_lines()])
                     for r in reports)


def check_only(lm: LoadedMatrix, only: list[str]) -> None:
    """`--only NAME`: a Hub-pinned model or drafter, or an engine (exit 2 otherwise)."""
    known = [name for _, name, _ in _hub_pins(lm)] + list(lm.matrix.engines)
    for name in only:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise UserError(f"--only {name}: no Hub-pinned model or drafter and no engine of "
                            f"that name{hint}", fix=f"use one of: {', '.join(known)}")


def run_watch(matrix: Path | None, only: list[str], out: Path | None, fmt: str) -> str:
    """`pins watch`: every Hub pin of the matrix against its branch head, and every engine
    against the newest release of its vLLM on the index (or those named in `only`); the
    issue files written to `out` when given; the report as text."""
    lm = mx.load(matrix.resolve() if matrix else None)
    check_only(lm, only)
    names = set(only)
    lock = read_lock(lm.root)
    reports: list[Report] = list(watch(lm, lock, HubClient(),
                                       only=(lambda kind, name: name in names) if names
                                       else None))
    reports += watch_engines(lm, lock, {n for n in names if n in lm.matrix.engines}
                             if names else None)
    if out:
        write_issue_files(reports, out)
    return render(reports, fmt)
