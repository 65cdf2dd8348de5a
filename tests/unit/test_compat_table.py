"""The compatibility table of a release (release/compat.py): each column read from where
it lives (release record, stored results, the gates annotation), the verdict's logic
(nothing missing ever reads as pass), the markdown, and the stored table through the
real registry client against the in-memory registry: stored as a referrer of each
release, read back by `build.py releases`, kept or deleted with its release by prune."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from imagebuild.bench import store
from imagebuild.cli import main
from imagebuild.plan import load_plan
from imagebuild.registry import referrers
from imagebuild.registry.records import A_GATES, amended_manifest, read_release
from imagebuild.release import compat

# the acceptance gate's fixtures: OLD is latest, NEW the candidate; the cpu image's counters
from tests.support.memregistry import MemRegistry, latest_and_candidate
from tests.unit.test_gates import NEW, OLD, REPO, _spec

TH = compat.Thresholds(regression=0.5, acceptance=0.05)
PASSING = {"lossless": {"status": "pass", "reason": "", "requests": 8, "compared_tokens": 1536,
                        "ties": 1, "tie_rate": 0.0007},
           "long_generation": {"status": "pass", "reason": "", "tokens": 448}}


def _doc(tok_s: float, accepted: float | None = 183.0, flagged: bool = False) -> dict:
    return {"image": {"tag": "t"}, "levels": [
        {"concurrency": c, "output_tok_s": tok_s * c,
         "spec_decode": None if accepted is None else _spec(accepted),
         "flags": [{"code": "gaps-collapse", "reason": "burst"}] if flagged and c == 4 else []}
        for c in (1, 4)]}


@pytest.fixture
def reg() -> MemRegistry:
    return latest_and_candidate(REPO, OLD, NEW)


def _gated(reg: MemRegistry, tag: str, gates: Any) -> None:
    """Write the gates summary into the release record, as the release gates do (a new
    manifest digest: before anything is attached to it)."""
    client = reg.client()
    rel = read_release(client, REPO, tag)
    value = gates if isinstance(gates, str) else json.dumps(gates)
    client.put_manifest(REPO, tag, amended_manifest(rel, {A_GATES: value}), rel.media_type)


def _row(reg: MemRegistry, *, cand: dict | None, base: dict | None = None,
         ann: dict[str, str] | None = None, drafter: bool = True) -> dict[str, Any]:
    rel = read_release(reg.client(), REPO, NEW)
    return compat.make_row(image="cpu-tiny-ngram", cell="cpu/cpu-tiny-ngram", repo=REPO,
                           drafter=drafter, rel=rel,
                           bench=(cand, ann or {}) if cand is not None else None,
                           baseline=base, baseline_tag=OLD if base else None, thresholds=TH)


# ------------------------------------------------------------------ verdict logic


def test_every_gate_passing_is_pass(reg):
    _gated(reg, NEW, PASSING)
    row = _row(reg, cand=_doc(100.0), base=_doc(100.0))
    assert (row["verdict"], row["why"]) == ("passed", [])
    assert row["lossless"]["compared_tokens"] == 1536
    assert row["acceptance"]["status"] == "pass"
    assert row["acceptance"]["levels"]["4"]["rate"] == pytest.approx(183 / 293)


def test_no_gates_summary_is_not_run_and_never_pass(reg):
    row = _row(reg, cand=_doc(100.0), base=_doc(100.0))  # an older release: no annotation
    assert row["lossless"]["status"] == row["long_generation"]["status"] == "not run"
    assert row["verdict"] == "incomplete"
    assert any("lossless not run" in w for w in row["why"])


@pytest.mark.parametrize("gates,status,verdict", [
    ({**PASSING, "lossless": {"status": "fail", "reason": "diverged at token 17"}}, "fail",
     "failed"),
    ({**PASSING, "lossless": {"status": "untrusted", "reason": "server restarted"}},
     "untrusted", "incomplete"),
    ({**PASSING, "lossless": {"status": "not-applicable", "reason": "no drafter"}},
     "not-applicable", "passed"),
    ({**PASSING, "lossless": {"status": "passed?"}}, "untrusted", "incomplete"),
    # (an annotation that is not a JSON object at all is refused when the release is read:
    # a registry fault, tests/unit/test_registry_untrusted.py)
    ({**PASSING, "lossless": "pass"}, "untrusted", "incomplete"),
], ids=["fail", "untrusted", "not-applicable", "unknown-status", "malformed"])
def test_the_gates_summary_decides_its_columns(reg, gates, status, verdict):
    _gated(reg, NEW, gates)
    row = _row(reg, cand=_doc(100.0), base=_doc(100.0))
    assert row["lossless"]["status"] == status
    assert row["verdict"] == verdict


def test_a_long_generation_failure_fails_the_cell(reg):
    _gated(reg, NEW, {**PASSING, "long_generation": {"status": "fail",
                                                     "reason": "repetition loop at 300"}})
    row = _row(reg, cand=_doc(100.0), base=_doc(100.0))
    assert row["verdict"] == "failed" and "repetition loop at 300" in row["why"][0]


def test_an_acceptance_drop_fails_unless_accepted(reg):
    _gated(reg, NEW, PASSING)
    row = _row(reg, cand=_doc(100.0, accepted=150.0), base=_doc(100.0))
    assert row["acceptance"]["status"] == "drop" and row["verdict"] == "failed"
    assert "acceptance 0.51 vs 0.62" in row["why"][0]
    ok = _row(reg, cand=_doc(100.0, accepted=150.0), base=_doc(100.0),
              ann={store.A_ACCEPTED_DROP: "longer drafts on purpose"})
    assert ok["acceptance"]["status"] == "accepted" and ok["verdict"] == "accepted"
    assert "longer drafts on purpose" in ok["why"][0]


def test_missing_acceptance_of_a_drafter_cell_is_incomplete(reg):
    _gated(reg, NEW, PASSING)
    row = _row(reg, cand=_doc(100.0, accepted=None), base=_doc(100.0))
    assert row["acceptance"]["status"] == "untrusted" and row["verdict"] == "incomplete"
    assert "no speculative metrics" in row["acceptance"]["reason"]


def test_a_plain_cell_has_no_acceptance_column_to_fail(reg):
    _gated(reg, NEW, {k: {"status": "not-applicable", "reason": "no drafter"}
                      for k in ("lossless",)} | {"long_generation": PASSING["long_generation"]})
    row = _row(reg, cand=_doc(100.0, accepted=None), base=_doc(100.0, accepted=None),
               drafter=False)
    assert row["acceptance"]["status"] == "not-applicable" and row["verdict"] == "passed"


def test_a_regression_fails_and_a_reason_makes_it_accepted(reg):
    _gated(reg, NEW, PASSING)
    row = _row(reg, cand=_doc(40.0), base=_doc(100.0))  # threshold 0.5
    assert row["verdict"] == "failed" and "slower than the release before" in row["why"][0]
    ok = _row(reg, cand=_doc(40.0), base=_doc(100.0), ann={store.A_ACCEPTED: "smaller batch"})
    assert ok["verdict"] == "accepted"


def test_untrusted_bench_figures_are_incomplete_unless_accepted(reg):
    _gated(reg, NEW, PASSING)
    row = _row(reg, cand=_doc(100.0, flagged=True), base=_doc(100.0))
    assert row["bench"]["status"] == "untrusted" and row["verdict"] == "incomplete"
    ok = _row(reg, cand=_doc(100.0, flagged=True), base=_doc(100.0),
              ann={store.A_UNTRUSTED: "shared runner"})
    assert ok["verdict"] == "accepted"


def test_no_bench_results_and_a_failed_smoke(reg):
    _gated(reg, NEW, PASSING)
    row = _row(reg, cand=None)
    assert row["bench"]["status"] == "not run" and row["verdict"] == "incomplete"
    reg.add_release(REPO, "2026-06-19-v0.23.0-broken", config=b'{"b":1}', smoke="failed")
    rel = read_release(reg.client(), REPO, "2026-06-19-v0.23.0-broken")
    bad = compat.make_row(image="i", cell="c", repo=REPO, drafter=True, rel=rel,
                          bench=(_doc(100.0), {}), baseline=None, baseline_tag=None,
                          thresholds=TH)
    assert bad["smoke"] == "failed" and bad["verdict"] == "failed"


def test_the_first_release_has_nothing_to_compare_and_says_so(reg):
    _gated(reg, NEW, PASSING)
    row = _row(reg, cand=_doc(100.0))
    assert row["acceptance"]["status"] == "pass" and row["verdict"] == "passed"
    assert "no earlier release" in row["acceptance"]["reason"]


def test_markdown_has_every_column_and_says_why():
    rows = []
    for verdict_ in ("passed", "failed"):
        r = {"image": f"img-{verdict_}", "smoke": "passed", "lossless": PASSING["lossless"],
             "long_generation": PASSING["long_generation"],
             "bench": {"status": "measured", "tok_s": {"1": 150.25, "4": 410.0},
                       "regressions": [], "accepted": None},
             "acceptance": {"status": "pass", "levels": {"1": {"rate": 0.6246,
                                                               "mean_length": 2.743}}}}
        r["verdict"], r["why"] = verdict_, ([] if verdict_ == "passed" else ["smoke failed"])
        rows.append(r)
    md = compat.markdown(compat.table(NEW, rows))
    assert md.splitlines()[0] == ("| image | smoke | lossless | long generation | tok/s c=1 | "
                                  "tok/s c=4 | acceptance rate / mean length | verdict |")
    assert ("| `img-passed` | passed | passed (8 req, 1,536 tokens, 1 ties) | passed (448 "
            "tokens) | 150.2 | 410.0 | c=1 0.62 / 2.74 | passed |") in md
    assert "| **FAILED** |" in md and "- `img-failed` failed: smoke failed" in md


# ------------------------------------------------------------------ stored with the release


@pytest.fixture
def job(matrix_dir: Path):
    (job,) = load_plan(matrix_dir / "matrix.yaml", NEW, "cpu").jobs
    return job


def test_stored_read_back_listed_and_pruned_with_its_release(reg, job, matrix_dir):
    client = reg.client()
    publish = load_plan(matrix_dir / "matrix.yaml", NEW, "cpu").lm.matrix.publish
    _gated(reg, NEW, PASSING)  # before the results: they are referrers of this manifest
    store.put_results(client, REPO, OLD, _doc(100.0))
    store.put_results(client, REPO, NEW, _doc(100.0, accepted=150.0))
    doc = compat.gather(client, (job,), publish)
    [row] = doc["rows"]
    assert row["acceptance"]["baseline"] == OLD and row["verdict"] == "failed"
    compat.store_tables(client, (job,), doc, log=lambda _: None)
    start = len(reg.calls)  # a re-run with the same rows writes nothing
    compat.store_tables(client, (job,), {**doc, "created": "later"}, log=lambda _: None)
    assert not [c for c in reg.calls[start:] if c[0] in ("PUT", "POST", "DELETE")]
    compat.store_tables(client, (job,), {**doc, "rows": []}, log=lambda _: None)  # replaced
    assert compat.stored_table(client, REPO, NEW)["rows"] == []
    compat.store_tables(client, (job,), doc, log=lambda _: None)
    assert compat.stored_table(client, REPO, NEW)["rows"] == json.loads(json.dumps(doc))["rows"]
    assert compat.stored_verdict(client, read_release(client, REPO, NEW)) == "failed"
    assert compat.stored_verdict(client, read_release(client, REPO, OLD)) == "no table"
    # storing the table leaves the bench results, re-storing results leaves the table
    assert store.stored(client, REPO, NEW) is not None
    store.annotate(client, REPO, NEW, {store.A_ACCEPTED_DROP: "why"})
    assert compat.stored_table(client, REPO, NEW) is not None
    ours, _ = referrers._ours(client, REPO, read_release(client, REPO, NEW).digest,
                              compat.ARTIFACT_TYPE)
    assert len(ours) == 1

    # prune: a deleted release takes its table along; a kept one keeps it
    from imagebuild.release.prune import prune

    for tag in (OLD, NEW):
        compat.put_table(client, REPO, tag, doc)
    third = "2026-06-25-v0.23.0-next"
    reg.add_release(REPO, third, config=b'{"next":1}')
    reg.point_latest(REPO, third)
    old_digest = read_release(client, REPO, OLD).digest
    tables = {t: referrers._ours(client, REPO, read_release(client, REPO, t).digest,
                                 compat.ARTIFACT_TYPE)[0][0]["digest"] for t in (OLD, NEW)}
    plan = prune(client, REPO, 1, log=lambda _: None, settle=0)
    assert plan.delete == [OLD]  # NEW is the rollback target
    assert referrers.referrers_tag(old_digest) not in client.tags(REPO)
    with pytest.raises(Exception, match="not found|404|unknown"):
        client.get_manifest(REPO, tables[OLD])
    assert compat.stored_table(client, REPO, NEW) is not None


def test_releases_shows_the_verdict_column(reg, job, matrix_dir, capsys, monkeypatch):
    client = reg.client()
    _gated(reg, NEW, PASSING)
    store.put_results(client, REPO, NEW, _doc(100.0))
    publish = load_plan(matrix_dir / "matrix.yaml", NEW, "cpu").lm.matrix.publish
    compat.store_tables(client, (job,), compat.gather(client, (job,), publish),
                        log=lambda _: None)
    from imagebuild import cli

    monkeypatch.setattr(cli, "_repositories", lambda args: (client, [REPO]))
    assert main(["releases", "--matrix", str(matrix_dir / "matrix.yaml")]) == 0
    out = capsys.readouterr().out
    head, new_line, old_line = (next(ln for ln in out.splitlines() if ln[2:].startswith(w))
                                for w in ("TAG ", NEW, OLD))
    # the columns are the JSON's keys, the values its words ("passed", as smoke says)
    assert head.split() == ["TAG", "CREATED", "SMOKE", "GATES_VERDICT", "BENCH"]
    assert new_line[2:].split()[2:5] == ["passed", "passed", "c=1"]
    assert old_line[2:].split()[2:5] == ["passed", "no", "table"]
    assert main(["releases", "--matrix", str(matrix_dir / "matrix.yaml"),
                 "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)[REPO]
    assert {r["tag"]: r["gates_verdict"] for r in listed} == {NEW: "passed", OLD: "no table"}


def test_the_notes_show_the_table_first(reg, job, matrix_dir, tmp_path):
    from imagebuild.release.notes import gather, release_notes

    client = reg.client()
    _gated(reg, NEW, PASSING)
    doc = _doc(100.0)  # as `bench` writes it: the notes' bench table needs every figure
    doc.update(hardware={"model": "a test CPU"}, settings={"prompts": "structured"})
    for lv in doc["levels"]:
        lv.update(requests=16, errors=0, request_rate=1.0, ttft_ms=None, tpot_ms=None,
                  itl_ms=None, e2e_ms=None, client_cpu_ms_per_request=1.0)
    store.put_results(client, REPO, NEW, doc)
    plan = load_plan(matrix_dir / "matrix.yaml", NEW, "cpu")
    table = compat.markdown(compat.gather(client, (job,), plan.lm.matrix.publish))
    notes = release_notes(plan.lm, (job,), gather(client, (job,), tmp_path), table)
    section = notes.split("## Compatibility\n", 1)[1].split("\n## ", 1)[0]
    assert "| `cpu-tiny-ngram` | passed | passed (8 req, 1,536 tokens, 1 ties) |" in section
    assert notes.index("## Compatibility") < notes.index("## cpu-tiny-ngram")


# ------------------------------------------------------------------ across engines


def test_each_cell_is_compared_with_the_newest_release_of_every_other_engine(
        reg, job, matrix_dir):
    """NEW (dflashfix, 0.23) beside pr41703's newest release (not its older one) and
    vllm032's (0.32, listed first: newest vLLM first), from what the registry holds."""
    client = reg.client()
    older_same = "2026-06-01-v0.23.0-pr41703"  # OLD is pr41703's newer release
    reg.add_release(REPO, older_same, config=b'{"older":1}', created=1.0)
    v032 = "2026-06-20-v0.32.0-vllm032"
    reg.add_release(REPO, v032, config=b'{"v032":1}', gates=PASSING)
    _gated(reg, NEW, PASSING)
    store.put_results(client, REPO, NEW, _doc(100.0))
    store.put_results(client, REPO, OLD, _doc(80.0))
    store.put_results(client, REPO, v032, _doc(125.0, accepted=150.0))
    publish = load_plan(matrix_dir / "matrix.yaml", NEW, "cpu").lm.matrix.publish
    doc = compat.gather(client, (job,), publish)
    [cell] = doc["engines"]
    releases = cell["releases"]
    assert [(e["engine"], e["vllm"], e["tag"], e["this"]) for e in releases] == [
        ("dflashfix", "0.23.0", NEW, True), ("vllm032", "0.32.0", v032, False),
        ("pr41703", "0.23.0", OLD, False)]
    assert [e["tok_s"]["4"] for e in releases] == [400.0, 500.0, 320.0]
    assert releases[1]["lossless"] == "pass" and releases[2]["lossless"] == "not run"
    # the other engines' verdicts are their own (no gates summary: incomplete)
    assert [e["verdict"] for e in releases] == ["passed", "passed", "incomplete"]
    assert releases[1]["acceptance"]["1"]["rate"] == pytest.approx(150.0 / 293.0)
    md = compat.markdown(doc)
    across = md.split("Across engines", 1)[1]
    assert f"| `cpu-tiny-ngram` | **dflashfix** (0.23.0) | `{NEW}` | passed |" in across
    # this release's 100 tok/s at c=1 is 20 % below vllm032's 125 and 25 % above pr41703's 80
    assert "| 125.0 (-20 %) | 500.0 (-20 %) |" in across
    assert "| 80.0 (+25 %) | 320.0 (+25 %) |" in across
    # stored with the release and read back through the registry's document checks
    compat.store_tables(client, (job,), doc, log=lambda _: None)
    assert compat.stored_table(client, REPO, NEW)["engines"] == json.loads(
        json.dumps(doc))["engines"]


def test_a_cell_no_other_engine_released_has_no_comparison(job, matrix_dir):
    from tests.support.memregistry import MemRegistry

    reg = MemRegistry()
    reg.add_release(REPO, NEW, config=b'{"new":1}')
    reg.add_release(REPO, "2026-06-01-v0.23.0-dflashfix", config=b'{"older":1}', created=1.0)
    publish = load_plan(matrix_dir / "matrix.yaml", NEW, "cpu").lm.matrix.publish
    doc = compat.gather(reg.client(), (job,), publish)
    assert doc["engines"] == [] and "Across engines" not in compat.markdown(doc)
