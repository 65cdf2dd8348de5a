"""`build.py releases`: one row per release of a repository, read from the registry once,
printed as JSON or as the table made from those very rows, so both say the same words.

A row is the release record (registry/records.py `as_json`) plus what is kept beside it:
the verdict of its compatibility table, its bench results (tok/s per concurrency level)
and whether it was rolled back (the rollbacks record, as `history` and the notes read it).
The table's columns are the row's keys: TAG, CREATED, SMOKE, GATES_VERDICT, BENCH, then a
line with the full DIGEST (what to pin) and the pins.
"""

from __future__ import annotations

import textwrap
from typing import Any

from imagebuild.bench import store
from imagebuild.registry.client import RegistryClient
from imagebuild.registry.records import Release, list_releases, pins_text
from imagebuild.release.compat import stored_verdict
from imagebuild.release.rollbacks import rolled_back
from imagebuild.safetext import safe

WIDTH = 100


def _bench(client: RegistryClient, rel: Release) -> dict[str, Any] | None:
    """The bench results stored with the release: tok/s per level, and where they are."""
    found = store.stored(client, rel.repo, rel.tag)
    if found is None:
        return None
    levels = [lv for lv in found.doc.get("levels") or [] if isinstance(lv, dict)]
    return {"digest": found.digest,
            "tok_s": {str(lv.get("concurrency")): lv.get("output_tok_s") for lv in levels}}


def rows(client: RegistryClient, repo: str) -> list[dict[str, Any]]:
    """Every release of `repo`, newest first, as `releases --format json` prints it."""
    rels = list_releases(client, repo)
    rolled = rolled_back(client, repo) if rels else {}
    return [{**r.as_json(), "smoke": r.verdict, "gates_verdict": stored_verdict(client, r),
             "bench": _bench(client, r), "rolled_back": rolled.get(r.tag)} for r in rels]


def bench_text(row: dict[str, Any]) -> str:
    """The BENCH column: tok/s at c=1 and at the highest level measured."""
    if row["unmeasured"]:
        return "unmeasured"
    tok = (row["bench"] or {}).get("tok_s") or {}
    levels = sorted((int(c), v) for c, v in tok.items() if str(c).isdigit()
                    and isinstance(v, int | float))
    if not levels:
        return "none"
    shown = [levels[0]] + ([levels[-1]] if len(levels) > 1 else [])
    return ", ".join(f"c={c} {v:,.1f}" for c, v in shown) + " tok/s"


def _line(mark: str, cells: tuple[str, ...], widths: tuple[int, ...]) -> str:
    return mark + "  ".join(safe(c).ljust(w) for c, w in zip(cells, widths, strict=False)) \
        + "  " + safe(cells[-1])


def table(repo: str, found: list[dict[str, Any]]) -> str:
    latest = next((r["tag"] for r in found if r["latest"]), None)
    widths = (max([3] + [len(r["tag"]) for r in found]), 10, 10, 13)
    out = [f"{repo}  (latest -> {latest or 'no release'})",
           _line("  ", ("TAG", "CREATED", "SMOKE", "GATES_VERDICT", "BENCH"), widths)]
    for r in found:
        out.append(_line("* " if r["latest"] else "  ", (
            r["tag"], (r["created"] or "-")[:10], r["smoke"], r["gates_verdict"],
            bench_text(r)), widths))
        detail = [f"digest {r['digest']}"]
        if r["unmeasured"]:
            detail.append(f"unmeasured: {r['unmeasured']}")
        if r["rolled_back"]:
            back = r["rolled_back"]
            detail.append(f"rolled back to {back.get('to', '?')}"
                          + (f" at {back['at']}" if back.get("at") else ""))
        detail.append(f"pins: {pins_text(r['pins'])}")
        out += textwrap.wrap(safe("; ".join(detail), 1000), WIDTH, initial_indent=" " * 4,
                             subsequent_indent=" " * 6, break_on_hyphens=False,
                             break_long_words=False)  # a digest or a reference stays whole
    return "\n".join(out)
