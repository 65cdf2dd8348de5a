"""Preflight results: named rules, the findings they produce, waivers, table and JSON output.

A finding is one line of `build.py check`: cell, rule id, severity, message, fix. Errors
block plan/build (exit 2) unless the cell's image family waives the rule with a written
reason; the waiver stays visible in the output.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

SEVERITIES = ("error", "warning", "info")
MATRIX = "matrix"  # the `cell` of findings that concern no single cell


@dataclass(frozen=True)
class Rule:
    """A named check, scoped to what it is about; None means no limit on that side.

    `hardware`: target traits it needs, all of them (spec/hardware.py: cuda,
    unified-memory, sm_121, native-fp4, ...); `model`: checkpoint traits it needs
    (preflight/families.py: vision, gdn, hybrid), read from the locked config.json, so
    such a rule is skipped (and said to be) while the model's metadata is unknown;
    `methods`: speculative methods it is about (`none` is plain serving)."""

    id: str
    severity: str
    why: str  # the measured fact behind the rule (docs/domain.md)
    fix: str
    hardware: tuple[str, ...] | None = None
    methods: tuple[str, ...] | None = None
    model: tuple[str, ...] | None = None
    waivable: bool = True
    # the parts of the cell's vLLM facts it reads (imagebuild/facts): its findings name
    # the version and folder those facts came from (Finding.facts)
    facts: tuple[str, ...] = ()

    def applies(self, hardware: frozenset[str], method: str,
                model: frozenset[str] | None = frozenset()) -> bool:
        """`model` None: the checkpoint's traits are unknown (no locked metadata)."""
        if self.model is not None and (model is None or not set(self.model) <= model):
            return False
        return ((self.hardware is None or set(self.hardware) <= hardware)
                and (self.methods is None or method in self.methods))

    def finding(self, cell: str, message: str, *, fix: str | None = None,
                where: str | None = None, severity: str | None = None) -> Finding:
        return Finding(cell=cell, rule=self.id, severity=severity or self.severity,
                       message=message, fix=fix if fix is not None else self.fix, where=where)


@dataclass(frozen=True)
class Finding:
    cell: str  # cell id (target/image), or MATRIX
    rule: str
    severity: str  # error | warning | info
    message: str
    fix: str | None = None
    where: str | None = None  # file:line:col in matrix.yaml when the cause sits there
    waived: str | None = None  # the family's written reason, when the rule is waived
    facts: str | None = None  # whose recorded vLLM facts the rule used (Rule.facts)

    @property
    def blocking(self) -> bool:
        return self.severity == "error" and self.waived is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def registry(*groups: Iterable[Rule]) -> dict[str, Rule]:
    out: dict[str, Rule] = {}
    for rule in (r for g in groups for r in g):
        assert rule.id not in out, f"duplicate rule id {rule.id}"
        assert rule.severity in SEVERITIES, rule
        out[rule.id] = rule
    return out


def has_errors(findings: Iterable[Finding]) -> bool:
    return any(f.blocking for f in findings)


def counts(findings: Iterable[Finding]) -> dict[str, int]:
    out = {"error": 0, "warning": 0, "info": 0, "waived": 0}
    for f in findings:
        out["waived" if f.waived else f.severity] += 1
    return out


def waive(findings: list[Finding], waivers: dict[str, dict[str, str]],
          rules: dict[str, Rule]) -> list[Finding]:
    """Mark findings whose cell waives their rule. waivers: cell id -> {rule id: reason}."""
    out = []
    for f in findings:
        reason = waivers.get(f.cell, {}).get(f.rule)
        rule = rules.get(f.rule)
        if reason and rule is not None and rule.waivable and f.severity != "info":
            f = replace(f, waived=reason)
        out.append(f)
    return out


SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def sort_key(f: Finding) -> tuple:
    return (f.cell == MATRIX, f.cell, f.waived is not None, SEVERITY_ORDER[f.severity], f.rule)


WIDTH = 100  # every line of the table fits (a finding's text wraps under its header)
INDENT = " " * 9
CELLS_SHOWN = 3  # a finding shared by more cells names these and counts the rest


def group(findings: list[Finding]) -> list[tuple[Finding, list[str]]]:
    """Each distinct finding once with every cell it concerns, in order of appearance: one
    mistake in a profile is one entry, not one per cell (per engine) it reaches."""
    out: dict[tuple, tuple[Finding, list[str]]] = {}
    for f in findings:
        key = (f.rule, f.severity, f.message, f.fix, f.where, f.waived, f.facts)
        if key in out:
            out[key][1].append(f.cell)
        else:
            out[key] = (f, [f.cell])
    return list(out.values())


def _wrapped(text: str) -> list[str]:
    """Lines of at most WIDTH, but a word longer than that (a file:line:column, a command,
    a reference) stays whole on its own line: a user copies it and an editor opens it."""
    return textwrap.wrap(text, WIDTH, initial_indent=INDENT, subsequent_indent=INDENT,
                         break_on_hyphens=False, break_long_words=False) or [INDENT.rstrip()]


def _cells(cells: list[str]) -> str:
    if len(cells) <= CELLS_SHOWN + 1:
        return ", ".join(cells)
    return (f"{', '.join(cells[:CELLS_SHOWN])} and {len(cells) - CELLS_SHOWN} more cells "
            "(--format json lists each)")


def format_table(findings: list[Finding], *, show_info: bool = True) -> str:
    """Per distinct finding: severity, rule id and the cells it concerns, then its message,
    where it sits, the facts it read and its fix, wrapped to WIDTH; then a summary counting
    one per cell (as `--format json` does)."""
    shown = [f for f in findings if show_info or f.severity != "info"]
    lines = []
    for f, cells in group(shown):
        sev = f"waived {f.severity}" if f.waived else f.severity
        lines += textwrap.wrap(f"{sev:<8} {f.rule}  {_cells(cells)}", WIDTH,
                               subsequent_indent=INDENT, break_on_hyphens=False,
                               break_long_words=False)
        lines += _wrapped(f.message)
        place = "; ".join(x for x in (f"at {f.where}" if f.where else "", f.facts or "") if x)
        if place:
            lines += _wrapped(place)
        if f.waived:
            lines += _wrapped(f"waived: {f.waived}")
        elif f.fix:
            lines += _wrapped(f"fix: {f.fix}")
    n = counts(findings)
    lines.append(f"{n['error']} error(s), {n['warning']} warning(s), {n['waived']} waived, "
                 f"{n['info']} info" + (" -- check FAILED" if n["error"] else " -- check passed"))
    return "\n".join(lines)


def format_json(findings: list[Finding], meta: dict[str, Any] | None = None,
                rules: dict[str, Rule] | None = None) -> str:
    doc: dict[str, Any] = dict(meta or {})
    doc["ok"] = not has_errors(findings)
    doc["counts"] = counts(findings)
    doc["findings"] = [f.to_dict() for f in findings]
    if rules is not None:
        used = {f.rule for f in findings}
        doc["rules"] = {rid: asdict(r) for rid, r in rules.items() if rid in used}
    return json.dumps(doc, indent=2)
