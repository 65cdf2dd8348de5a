"""The compatibility table of a release: one row per cell, what each gate says about it,
and a verdict.

Columns (docs/release-gates.md says what each proves):
- smoke: the release record's smoke verdict (the image boots and answers);
- lossless, long generation: the release record's gates annotation (`A_GATES`, written by
  the release gates); absent (an older release, gates not run) is `not run`, never pass;
  the lossless cell also says which of its conditions (gates/conditions.py) failed, ran
  and did not run;
- tok/s at c=1 and at the highest concurrency: the stored bench results;
- acceptance: the drafter's acceptance rate and mean accepted length per level, against
  the release before it (the acceptance gate, bench/acceptance.py);
- verdict: `fail` (a gate failed), `incomplete` (something not run or not trustworthy),
  `accepted` (passed only with a written reason), `pass`;
under the rows, per image family, which cell to deploy at each bench level
(release/advice.py); and, per cell, the newest release of every other engine the registry
holds for it beside this one (`engines`: the same columns, so an upgrade of vLLM is
compared cell by cell with the engine it replaces).

The table is built from the registry alone (release records and stored results), goes
into the release notes, and is stored with each cell's release as an OCI referrer of its
manifest (artifact type below) beside the bench results: `oras discover` lists both,
`build.py releases` shows the verdict, `prune` deletes it with its release.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from imagebuild.bench import acceptance, compare, store, trust
from imagebuild.gates import NOT_RUN as NOT_RUN_CONDITION
from imagebuild.registry import documents, referrers
from imagebuild.registry.client import RegistryClient
from imagebuild.registry.errors import NotFound
from imagebuild.registry.records import (
    A_GATES,
    A_TAG,
    Release,
    list_releases,
    read_release,
)
from imagebuild.release import advice
from imagebuild.release.latest import acceptance_threshold_for, threshold_for
from imagebuild.release.notes import previous_release
from imagebuild.safetext import safe
from imagebuild.spec.config import NO_SPECULATION
from imagebuild.spec.tags import parse_release_tag

if TYPE_CHECKING:
    from imagebuild.plan import Job

SCHEMA = "imagebuild.compat/v1"
ARTIFACT_TYPE = referrers.COMPAT_TYPE
FILE_NAME = "compat.json"
A_VERDICT = "io.imagebuild.compat.verdict"  # the cell's verdict, on the artifact itself
GATE_STATUSES = ("pass", "fail", "untrusted", "not-applicable")
CONDITION_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")  # gates/conditions.py's names
NOT_RUN = "not run"
VERDICTS = ("passed", "accepted", "incomplete", "failed")  # worst last
# what tables stored before the one vocabulary (smoke's "passed") said for the same verdicts
OLD_VERDICTS = {"pass": "passed", "fail": "failed"}


@dataclass(frozen=True)
class Thresholds:
    regression: float
    acceptance: float


def gate_checks(rel: Release | None) -> dict[str, dict[str, Any]]:
    """The release gates' summary from the release record: lossless and long_generation,
    each {status, reason, ...}; `not run` where the record has none, `untrusted` where
    it cannot be read (registry text: never taken as a pass)."""
    raw = rel.annotations.get(A_GATES) if rel is not None else None
    out: dict[str, dict[str, Any]] = {
        k: {"status": NOT_RUN, "reason": "the release record has no gates summary"}
           for k in ("lossless", "long_generation")}
    if raw is None:
        return out
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    for key in out:
        entry = doc.get(key) if isinstance(doc, dict) else None
        if not isinstance(entry, dict) or entry.get("status") not in GATE_STATUSES:
            out[key] = {"status": "untrusted",
                        "reason": f"the release record's {key} summary is unreadable"}
            continue
        out[key] = {k: (safe(v) if isinstance(v, str) else v) for k, v in entry.items()
                    if k in ("status", "reason", "requests", "compared_tokens", "ties",
                             "tie_rate", "tokens")
                    and isinstance(v, str | int | float) and not isinstance(v, bool)}
        if "conditions" in entry:
            conds = _conditions(entry["conditions"])
            if conds is None:
                out[key] = {"status": "untrusted",
                            "reason": f"the release record's {key} conditions are unreadable"}
            else:
                out[key]["conditions"] = conds
    return out


def _conditions(raw: object) -> dict[str, str] | None:
    """The lossless gate's conditions as the record names them: name -> status; None when
    any entry is not a condition name with a known status (registry text)."""
    if not isinstance(raw, dict):
        return None
    out = {}
    for name, entry in raw.items():
        status = entry.get("status") if isinstance(entry, dict) else None
        if not (isinstance(name, str) and CONDITION_NAME.fullmatch(name)
                and status in (*GATE_STATUSES, NOT_RUN_CONDITION)):
            return None
        out[name] = str(status)
    return out


def _bench(doc: dict[str, Any] | None, ann: dict[str, str], rel: Release | None,
           base: dict[str, Any] | None, threshold: float) -> dict[str, Any]:
    if doc is None:
        why = (f"promoted unmeasured: {safe(rel.unmeasured)}" if rel and rel.unmeasured
               else "no bench results are stored with this release")
        return {"status": NOT_RUN, "reason": why, "tok_s": {}, "regressions": [],
                "accepted": safe(rel.unmeasured) if rel and rel.unmeasured else None}
    tok_s = {str(lv["concurrency"]): float(lv["output_tok_s"]) for lv in doc.get("levels", [])}
    flagged = trust.untrusted(doc)
    out: dict[str, Any] = {"status": "untrusted" if flagged else "measured",
                           "reason": trust.summary(doc).replace("\n", "; "),
                           "tok_s": tok_s, "untrusted_levels": sorted(flagged),
                           "regressions": [], "accepted": None}
    if base is not None:
        skip = set(flagged) | set(trust.untrusted(base))
        mine, theirs = ({**d, "levels": [lv for lv in d.get("levels", [])
                                         if int(lv["concurrency"]) not in skip]}
                        for d in (doc, base))
        out["regressions"] = [r.line() for r in compare.regressions(mine, theirs, threshold)]
    accepted = [ann.get(a) for a in (store.A_ACCEPTED, store.A_UNTRUSTED, store.A_UNCOMPARED)]
    out["accepted"] = "; ".join(safe(a) for a in accepted if a) or None
    return out


def _acceptance(doc: dict[str, Any] | None, ann: dict[str, str], base: dict[str, Any] | None,
                base_tag: str | None, drafter: bool, threshold: float) -> dict[str, Any]:
    if not drafter:
        return {"status": "not-applicable", "reason": "no drafter", "levels": {}}
    if doc is None:
        return {"status": NOT_RUN, "reason": "no bench results", "levels": {}}
    levels: dict[str, dict[str, float]] = {}
    problems: dict[int, list[str]] = {}
    for c, (acc, why) in sorted(acceptance.by_level(doc).items()):
        if acc is not None:
            levels[str(c)] = {"rate": acc.rate, "mean_length": acc.mean_length}
        else:
            problems[c] = [str(why)]
    out: dict[str, Any] = {"levels": levels, "baseline": base_tag, "drops": []}
    if base is not None:
        cmp = acceptance.compare(doc, base, threshold, drafter=True)
        problems.update(cmp.problems)
        out["drops"] = [d.line() for d in cmp.drops]
    if problems:
        why = "; ".join(f"c={c}: {' / '.join(r)}" for c, r in sorted(problems.items()))
        accepted = ann.get(store.A_UNTRUSTED)
        return {**out, "status": "accepted" if accepted else "untrusted",
                "reason": why + (f" (accepted: {safe(accepted)})" if accepted else "")}
    if out["drops"]:
        accepted = ann.get(store.A_ACCEPTED_DROP)
        return {**out, "status": "accepted" if accepted else "drop",
                "reason": "; ".join(out["drops"])
                + (f" (accepted: {safe(accepted)})" if accepted else "")}
    if base is None:
        return {**out, "status": "pass", "reason": "no earlier release with results to "
                                                   "compare with"}
    return {**out, "status": "pass", "reason": f"within {threshold:.0%} of {base_tag}"}


def verdict(row: dict[str, Any]) -> tuple[str, list[str]]:
    """The cell's verdict and why: the worst of what its columns say."""
    fail: list[str] = []
    incomplete: list[str] = []
    accepted: list[str] = []
    if row["smoke"] != "passed":
        fail.append(f"smoke {row['smoke']}")
    for key, name in (("lossless", "lossless"), ("long_generation", "long generation")):
        g = row[key]
        if g["status"] == "fail":
            fail.append(f"{name} failed: {g.get('reason', '')}")
        elif g["status"] in ("untrusted", NOT_RUN):
            incomplete.append(f"{name} {g['status']}: {g.get('reason', '')}")
    b = row["bench"]
    if b["regressions"] and not b["accepted"]:
        fail.append("slower than the release before: " + "; ".join(b["regressions"]))
    if b["status"] == NOT_RUN:
        (accepted if b["accepted"] else incomplete).append(f"bench not run: {b['reason']}")
    elif b["status"] == "untrusted":
        (accepted if b["accepted"] else incomplete).append(
            f"bench figures untrusted: {b['reason']}")
    elif b["accepted"]:
        accepted.append(f"bench gate passed with a reason: {b['accepted']}")
    a = row["acceptance"]
    if a["status"] == "drop":
        fail.append(f"acceptance dropped: {a['reason']}")
    elif a["status"] in ("untrusted", NOT_RUN) and b["status"] != NOT_RUN:
        incomplete.append(f"acceptance {a['status']}: {a['reason']}")
    elif a["status"] == "accepted":
        accepted.append(f"acceptance: {a['reason']}")
    if fail:
        return "failed", fail + incomplete + accepted
    if incomplete:
        return "incomplete", incomplete + accepted
    if accepted:
        return "accepted", accepted
    return "passed", []


def make_row(*, image: str, cell: str, repo: str, drafter: bool, rel: Release | None,
             bench: tuple[dict[str, Any], dict[str, str]] | None,
             baseline: dict[str, Any] | None, baseline_tag: str | None,
             thresholds: Thresholds) -> dict[str, Any]:
    """One cell's row from what the registry holds (pure: no registry access)."""
    doc, ann = bench if bench else (None, {})
    gates = gate_checks(rel)
    row: dict[str, Any] = {
        "image": image, "cell": cell, "repository": repo,
        "digest": rel.digest if rel else None,
        "smoke": safe(rel.verdict) if rel else "not published",
        "lossless": gates["lossless"], "long_generation": gates["long_generation"],
        "bench": _bench(doc, ann, rel, baseline, thresholds.regression),
        "acceptance": _acceptance(doc, ann, baseline, baseline_tag, drafter,
                                  thresholds.acceptance),
    }
    row["verdict"], row["why"] = verdict(row)
    return row


def table(tag: str, rows: list[dict[str, Any]],
          families: list[dict[str, Any]] | None = None,
          engines: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """`families`: which cell to deploy per image family and level (release/advice.py);
    `engines`: each cell across engines (`across_engines`)."""
    return {"schema": SCHEMA, "tag": tag, "rows": rows, "advice": families or [],
            "engines": engines or [],
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def engine_entry(row: dict[str, Any], tag: str, this: bool) -> dict[str, Any]:
    """One engine's release of a cell, as the comparison shows it: the row's columns."""
    rt = parse_release_tag(tag)
    return {"engine": rt.name if rt else "?", "vllm": rt.vllm_version if rt else "?",
            "tag": tag, "this": this, "smoke": row["smoke"], "verdict": row["verdict"],
            "lossless": row["lossless"]["status"],
            "long_generation": row["long_generation"]["status"],
            "tok_s": row["bench"]["tok_s"], "acceptance": row["acceptance"].get("levels", {})}


def newest_per_engine(rels: list[Release], tag: str) -> list[Release]:
    """The newest recorded release of each engine other than `tag`'s (newest vLLM
    first): what this release is compared with, cell by cell."""
    mine = parse_release_tag(tag)
    newest: dict[str, Release] = {}
    for rel in rels:
        rt = rel.release_tag
        if rt is None or not rel.recorded or (mine is not None and rt.name == mine.name):
            continue
        if rt.name not in newest or rel.order_key() > newest[rt.name].order_key():
            newest[rt.name] = rel
    return sorted(newest.values(), key=lambda r: (r.release_tag.sort_key()  # type: ignore[union-attr]
                                                  if r.release_tag else ()), reverse=True)


def thresholds_for(job: Job, publish: Any) -> Thresholds:
    return Thresholds(threshold_for(job, publish.regression_threshold),
                      acceptance_threshold_for(job, publish.acceptance_threshold))


def gather(client: RegistryClient, jobs: tuple[Job, ...], publish: Any) -> dict[str, Any]:
    """The table of the jobs' release tag, from the registry."""
    rows, members, engines = [], [], []
    for job in jobs:
        repo, cell = job.image.repository, job.cell
        rels = list_releases(client, repo)
        mine = next((r for r in rels if r.tag == str(job.tag)), None)
        prev = previous_release(rels, job.tag)
        found = store.release_stored(client, repo, mine.tag) if mine else None
        base = store.release_results(client, repo, prev) if prev else None
        drafter = cell.method != NO_SPECULATION
        rows.append(make_row(image=cell.image, cell=job.id, repo=repo, drafter=drafter,
                             rel=mine, bench=found, baseline=base, baseline_tag=prev,
                             thresholds=thresholds_for(job, publish)))
        others = [engine_entry(make_row(
            image=cell.image, cell=job.id, repo=repo, drafter=drafter, rel=other,
            bench=store.release_stored(client, repo, other.tag), baseline=None,
            baseline_tag=None, thresholds=thresholds_for(job, publish)), other.tag, False)
            for other in newest_per_engine(rels, str(job.tag))]
        if others:
            engines.append({"image": cell.image, "repository": repo, "releases": [
                engine_entry(rows[-1], str(job.tag), True), *others]})
        members.append(advice.Member(
            image=cell.image, target=cell.target_name, engine=cell.engine_name,
            model=cell.model_name, method=cell.method, doc=found[0] if found else None,
            plain_baseline=bool(cell.target.bench and cell.target.bench.plain_baseline),
            tie_margin=cell.target.bench.tie_margin if cell.target.bench else 0.0))
    return table(str(jobs[0].tag) if jobs else "", rows, advice.advise(members), engines)


# ------------------------------------------------------------------ stored with the release


def put_table(client: RegistryClient, repo: str, tag: str, doc: dict[str, Any]) -> str | None:
    """Attach the table to release repo:tag (replacing an earlier one); the artifact's
    digest, None when the release is not in the registry."""
    rel = read_release(client, repo, tag)
    if rel is None:
        return None
    mine = next((r for r in doc["rows"] if r["repository"] == repo), None)
    body = json.dumps(doc, sort_keys=True, indent=1).encode()
    ann = {A_TAG: rel.annotations.get(A_TAG, tag),
           A_VERDICT: mine["verdict"] if mine else "not in the table"}
    return referrers.put_artifact(client, repo, rel, body, artifact_type=ARTIFACT_TYPE,
                                  file_name=FILE_NAME, annotations=ann)


def same_table(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    """The same table but for when it was made (`created` is not part of what it says)."""
    return a is not None and {k: v for k, v in a.items() if k != "created"} == \
        {k: v for k, v in b.items() if k != "created"}


def store_tables(client: RegistryClient, jobs: tuple[Job, ...], doc: dict[str, Any],
                 log: Any = print) -> None:
    """Each job's release gets the table, unless the one stored with it already says the
    same (a re-run): then nothing is written."""
    for job in jobs:
        repo, tag = job.image.repository, str(job.tag)
        rel = read_release(client, repo, tag)
        if rel is not None and same_table(table_of(client, rel), doc):
            log(f"table skipped  {job.id}: the compatibility table stored with {repo}:{tag} "
                "already has these rows; not rewritten")
            continue
        digest = put_table(client, repo, tag, doc)
        if digest:
            log(f"{repo}: compatibility table stored with {job.tag} ({digest[:19]})")


def stored_table(client: RegistryClient, repo: str, tag: str) -> dict[str, Any] | None:
    """The table stored with release repo:tag, None when there is none."""
    rel = read_release(client, repo, tag)
    return None if rel is None else table_of(client, rel)


def table_of(client: RegistryClient, rel: Release) -> dict[str, Any] | None:
    """The table stored with release `rel` (already read), None when there is none."""
    repo = rel.repo
    ours, _how = referrers._ours(client, repo, rel.digest, ARTIFACT_TYPE)
    for desc in ours:
        try:
            raw, _media, digest = client.get_manifest(repo, desc["digest"])
        except NotFound:
            continue
        manifest = json.loads(raw)
        if manifest.get("artifactType") != ARTIFACT_TYPE or not manifest.get("layers"):
            continue
        doc = documents.compat_table(client.get_blob(repo, manifest["layers"][0]["digest"]),
                                     client.host, f"compatibility table {repo}@{digest}")
        for row in doc["rows"]:  # an older table's words read as today's
            row["verdict"] = OLD_VERDICTS.get(row["verdict"], row["verdict"])
        return doc
    return None


def stored_verdict(client: RegistryClient, rel: Release) -> str:
    """`build.py releases`' verdict column: the stored table's verdict of this image."""
    doc = table_of(client, rel)
    if doc is None:
        return "no table"
    mine = next((r for r in doc["rows"] if r.get("repository") == rel.repo), None)
    return str(mine["verdict"]) if mine else "not in its table"


# ------------------------------------------------------------------ markdown


def _num(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _gate_cell(g: dict[str, Any], detail: str) -> str:
    s = g["status"]
    head = {"pass": "passed", "fail": "**FAILED**", "untrusted": "untrusted",
            "not-applicable": "n/a", NOT_RUN: "not run"}.get(s, s)
    return head + (f" ({detail})" if detail and s in ("pass", "fail", "untrusted") else "")


def _lossless(g: dict[str, Any]) -> str:
    """The fresh requests' figures, then which conditions failed, which ran, which not."""
    if "compared_tokens" not in g:
        return _gate_cell(g, "")
    ties = g.get("ties", 0)
    conds: dict[str, str] = g.get("conditions") or {}
    said = [(what, [n for n, s in conds.items() if s in statuses]) for what, statuses in
            (("failed", ("fail",)), ("untrusted", ("untrusted",)),
             ("ran", ("pass", "fail", "untrusted")), ("not run", (NOT_RUN_CONDITION,)))]
    return _gate_cell(g, f"{g.get('requests', '?')} req, {g['compared_tokens']:,} tokens"
                         + (f", {ties} ties" if ties else "")
                         + "".join(f"; {what}: {', '.join(names)}" for what, names in said
                                   if names))


def _long(g: dict[str, Any]) -> str:
    return _gate_cell(g, f"{g['tokens']:,} tokens" if "tokens" in g else "")


def _acc_cell(a: dict[str, Any]) -> str:
    if a["status"] == "not-applicable":
        return "n/a (no drafter)"
    if a["status"] == NOT_RUN:
        return "not run"
    figures = " · ".join(f"c={c} {v['rate']:.2f} / {v['mean_length']:.2f}"
                         for c, v in sorted(a["levels"].items(), key=lambda kv: int(kv[0])))
    mark = {"pass": "", "drop": "**DROP** ", "accepted": "accepted: ",
            "untrusted": "untrusted: "}.get(a["status"], "")
    return mark + (figures or "no figures")


def markdown(doc: dict[str, Any]) -> str:
    rows = doc["rows"]
    top = max((int(c) for r in rows for c in r["bench"]["tok_s"]), default=None)
    head = ["image", "smoke", "lossless", "long generation", "tok/s c=1",
            f"tok/s c={top}" if top else "tok/s max c", "acceptance rate / mean length",
            "verdict"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        tok = r["bench"]["tok_s"]
        mark = " (untrusted)" if r["bench"]["status"] == "untrusted" else ""
        verdict_cell = {"failed": "**FAILED**", "incomplete": "**incomplete**"}.get(
            r["verdict"], r["verdict"])
        out.append("| " + " | ".join([
            f"`{r['image']}`", r["smoke"], _lossless(r["lossless"]),
            _long(r["long_generation"]), _num(tok.get("1")) + mark,
            _num(tok.get(str(top))) + mark if top else "-", _acc_cell(r["acceptance"]),
            verdict_cell]) + " |")
    why = [f"- `{r['image']}` {r['verdict']}: " + "; ".join(r["why"])
           for r in rows if r["why"]]
    text = "\n".join(out) + "\n" + ("\n" + "\n".join(why) + "\n" if why else "")
    section = advice.markdown(doc.get("advice") or [])
    text += "\n" + section if section else ""
    across = across_engines(doc.get("engines") or [])
    return text + ("\n" + across if across else "")


def _ratio(mine: float | None, theirs: float | None) -> str:
    return "" if not mine or not theirs else f" ({(mine / theirs - 1) * 100:+.0f} %)"


def across_engines(cells: list[dict[str, Any]]) -> str:
    """Each cell on this release's engine beside the newest release of every other
    engine: verdict, gates, tok/s (and how this release compares) and acceptance."""
    if not cells:
        return ""
    levels = sorted({int(c) for cell in cells for e in cell["releases"] for c in e["tok_s"]})
    top = levels[-1] if levels else None
    head = ["image", "engine (vLLM)", "release", "verdict", "lossless", "long generation",
            "tok/s c=1", f"tok/s c={top}" if top else "tok/s max c", "acceptance rate"]
    out = ["Across engines: this release (in bold), then the newest release of each other "
           "engine of the same cell; beside their tok/s, how this release's compares:", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell in cells:
        this = cell["releases"][0]["tok_s"]
        for e in cell["releases"]:
            tok = e["tok_s"]
            rate = " · ".join(f"c={c} {v['rate']:.2f}" for c, v in
                              sorted(e["acceptance"].items(), key=lambda kv: int(kv[0])))
            cols = [f"`{cell['image']}`", f"{'**' if e['this'] else ''}{e['engine']}"
                    f"{'**' if e['this'] else ''} ({e['vllm']})", f"`{e['tag']}`",
                    e["verdict"], e["lossless"], e["long_generation"],
                    _num(tok.get("1")) + ("" if e["this"] else
                                          _ratio(this.get("1"), tok.get("1"))),
                    (_num(tok.get(str(top))) + ("" if e["this"] else
                                                _ratio(this.get(str(top)), tok.get(str(top)))))
                    if top else "-", rate or "-"]
            out.append("| " + " | ".join(cols) + " |")
    return "\n".join(out) + "\n"

