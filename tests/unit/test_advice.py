"""Which cell to deploy per concurrency level (release/advice.py): per image family (one
model on one target and engine) the fastest trusted configuration at each level, by how
much, the drafters' acceptance that explains it, and a flag on a drafter slower than
plain serving at every level. The figures of the first tests are the public GB10 ones
(docs/domain.md: DFlash +8.5% over MTP at c=1, -7% at c=8, -26% at c=32; the 35B-A3B at
c=32: base ~430 tok/s, MTP ~541; MTP accepts ~66% of its drafts, DFlash ~25% of 11)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from imagebuild import REPO_ROOT
from imagebuild.release import advice
from imagebuild.release.advice import Member

ZLAB, MTP, AEON = "spark-heretic-zlab", "spark-heretic-mtp", "spark-heretic-aeon"
SETTINGS = {"prompts": "structured,prose", "max_tokens": 128, "requests": 64,
            "duration_s": None}


def _lv(c: int, tok_s: float, *, rate: float | None = None, k: int = 0,
        flags: tuple[str, ...] = (), errors: int = 0) -> dict[str, Any]:
    """A level summary as bench/results.py writes it; `rate` of `k` drafted tokens per
    step gives vLLM's counters (drafts, drafted and accepted tokens)."""
    spec = None
    if rate is not None:
        drafts = 100.0 * c
        drafted = drafts * k
        spec = {"drafts": drafts, "draft_tokens": drafted, "accepted_tokens": drafted * rate,
                "acceptance": rate, "mean_accepted_length": 1 + drafted * rate / drafts}
    return {"concurrency": c, "output_tok_s": tok_s, "requests": 64, "errors": errors,
            "spec_decode": spec, "flags": [{"code": f, "reason": f"{f}: why"} for f in flags]}


def _doc(levels: list[dict[str, Any]], plain: list[dict[str, Any]] | None = None,
         **settings: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"image": {"tag": "t"}, "hardware": {"model": "GB10"},
                           "settings": {**SETTINGS, **settings}, "levels": levels}
    if plain is not None:
        doc["plain"] = {"without": ["--speculative-config"], "levels": plain}
    return doc


def _spark(image: str, method: str, tok_s: dict[int, float], plain: dict[int, float] | None,
           rate: float = 0.0, k: int = 0, **kw: Any) -> Member:
    doc = _doc([_lv(c, t, rate=rate, k=k) for c, t in tok_s.items()],
               None if plain is None else [_lv(c, t) for c, t in plain.items()])
    return Member(image, "gb10", "dflashfix", "heretic", method, doc, **kw)


# the public figures: DFlash (zlab, 11 drafted, ~25% accepted) and MTP (2 drafted, ~66%)
PLAIN_TWIN = {1: 70.0, 8: 300.0, 32: 430.0}


def _public() -> list[Member]:
    return [_spark(ZLAB, "dflash", {1: 101.9, 8: 372.0, 32: 400.34}, PLAIN_TWIN, 0.25, 11),
            _spark(MTP, "mtp", {1: 93.9, 8: 400.0, 32: 541.0}, PLAIN_TWIN, 0.66, 2)]


def test_dflash_wins_only_at_c1_and_mtp_under_load():
    (fam,) = advice.advise(_public())
    assert fam["family"] == "heretic on gb10, engine dflashfix"
    assert [(lv["concurrency"], lv["winner"]) for lv in fam["levels"]] == [
        (1, ZLAB), (8, MTP), (32, MTP)]
    c1, c8, c32 = fam["levels"]
    assert c1["runner_up"] == MTP and c1["margin"] == pytest.approx(101.9 / 93.9 - 1)
    assert c32["runner_up"] == f"{ZLAB} without speculation"  # 430 plain > 400 DFlash
    md = advice.markdown([fam])
    assert "Deploy: c=1 `spark-heretic-zlab`; c=8, c=32 `spark-heretic-mtp`." in md
    # exactly what the public figures say of DFlash: +8.5% at c=1, -7% at c=8, -26% at c=32
    assert ("- `spark-heretic-zlab` (dflash): fastest at c=1 (by 8.5%); behind the fastest "
            "at c=8 (-7.0% vs `spark-heretic-mtp`), c=32 (-26.0% vs `spark-heretic-mtp`)"
            in md), md
    # the acceptance that explains it, from vLLM's counters at that level
    line = next(ln for ln in md.splitlines() if ln.startswith("- c=8:"))
    assert "`spark-heretic-mtp` (mtp) wins by 7.5% (+28.0 tok/s: 400.0 vs 372.0)" in line
    assert line.endswith("over `spark-heretic-zlab` (dflash); at this load fewer drafts "
                         "verified in vain (66% vs 25% of drafted tokens accepted) outweigh "
                         "longer accepted runs (2.32 vs 3.75 tokens per step)"), line
    c1 = next(ln for ln in md.splitlines() if ln.startswith("- c=1:"))
    assert c1.endswith("longer accepted runs (3.75 vs 2.32 tokens per step) outweigh a lower "
                       "acceptance rate (25% vs 66% of drafted tokens accepted)"), c1
    # each cell's column: tok/s, against its own plain twin, acceptance rate / mean length
    assert ("| 1 | 101.9 (+45.6% vs plain) · 0.25 / 3.75 | 93.9 (+34.1% vs plain) · 0.66 / "
            "2.32") in md
    assert not fam["flags"]  # both beat plain serving somewhere


def test_a_drafter_slower_than_plain_serving_at_every_level_is_flagged():
    aeon = _spark(AEON, "dflash", {1: 65.0, 8: 280.0, 32: 380.0},
                  {1: 70.0, 8: 300.0, 32: 430.0}, 0.2, 11)
    (fam,) = advice.advise([*_public(), aeon])
    (flag,) = fam["flags"]
    assert flag.startswith("**`spark-heretic-aeon` (dflash) is slower than plain serving at "
                           "every level measured** (c=1 -7.1%, c=8 -6.7%, c=32 -11.6%)"), flag
    assert "serve the image without `--speculative-config`" in flag
    # a drafter that wins at one level and loses at the others is not flagged
    (vz, vm, va) = fam["versus_plain"]
    assert not vz["loses_everywhere"] and vz["deltas"]["32"] < 0 < vz["deltas"]["1"]
    assert va["loses_everywhere"] and not vm["loses_everywhere"]
    # with several cells the plain column says whose twin it is
    md = advice.markdown([fam])
    assert "| 430.0 (`spark-heretic-zlab`) |" in md


def test_a_win_under_the_targets_tie_margin_is_called_a_tie():
    # one of the cpu cell's back-to-back benches (docs/advice.md): ngram 2.0% ahead of its
    # plain twin at c=1, 15.3% behind it at c=4; cpu's tie_margin is 10%
    cell = Member("cpu-tiny-ngram", "cpu", "dflashfix", "tiny", "ngram",
                  _doc([_lv(1, 310.7, rate=0.52, k=3), _lv(4, 963.6, rate=0.52, k=3)],
                       [_lv(1, 304.6), _lv(4, 1137.7)]), tie_margin=0.10)
    (fam,) = advice.advise([cell])
    c1, c4 = fam["levels"]
    assert (c1["winner"], c1["tie"]) == ("cpu-tiny-ngram", True)
    assert (c4["winner"], c4["tie"]) == ("cpu-tiny-ngram without speculation", False)
    md = advice.markdown([fam])
    assert "Deploy: c=1 `cpu-tiny-ngram` (a tie); c=4 plain serving." in md
    assert "| **`cpu-tiny-ngram`** by 2.0% over plain serving (a tie) |" in md
    assert c1["explanation"].endswith(
        "a tie: under the target's tie margin of 10%, what back-to-back benches of one image "
        "differ by there; the ngram drafter of `cpu-tiny-ngram` makes no measurable "
        "difference at this load: 52% of drafted tokens accepted, 2.56 tokens per step")
    assert ("- `cpu-tiny-ngram` (ngram): fastest at c=1 (by 2.0%, a tie); behind the "
            "fastest at c=4 (-15.3% vs plain serving)") in md
    assert not fam["flags"]  # faster than plain at c=1, if only just


def test_untrusted_figures_never_pick_a_winner_and_are_said():
    zlab, mtp = _public()
    assert mtp.doc is not None
    bad = copy.deepcopy(mtp.doc)
    bad["levels"][1] = _lv(8, 999.0, rate=0.66, k=2, flags=("client-starved",))
    bad["levels"][2] = _lv(32, 541.0, rate=0.66, k=2, errors=3)
    (fam,) = advice.advise([zlab, Member(MTP, "gb10", "dflashfix", "heretic", "mtp", bad)])
    c8, c32 = fam["levels"][1:]
    assert c8["winner"] == ZLAB and c8["runner_up"] == f"{ZLAB} without speculation"
    assert ("`spark-heretic-mtp` (mtp) measured more (999.0 tok/s) but its figures cannot "
            "be used (untrusted: client-starved)") in c8["explanation"]
    assert c32["winner"] == f"{ZLAB} without speculation"
    assert "`spark-heretic-mtp` (mtp): 3 of 64 requests failed" in c32["untrusted"]
    md = advice.markdown([fam])
    assert "999.0 (+233.0% vs plain)" not in md  # an untrusted level is never compared
    assert "999.0 · 0.66 / 2.32 **untrusted: client-starved**" in md
    assert fam["versus_plain"][1]["uncompared"] == {"8": "untrusted figures",
                                                    "32": "untrusted figures"}
    # fewer than two trusted figures: no winner at all
    lone = Member(ZLAB, "gb10", "dflashfix", "heretic", "dflash",
                  _doc([_lv(1, 100.0, rate=0.25, k=11)],
                       [_lv(1, 120.0, flags=("ttft-diverges",))]))
    (fam,) = advice.advise([lone])
    (lv,) = fam["levels"]
    assert lv["winner"] is None and lv["explanation"].startswith("no winner: 1 trusted")
    assert "Deploy: c=1 no winner." in advice.markdown([fam])


def test_results_measured_otherwise_are_not_compared():
    zlab, mtp = _public()
    assert mtp.doc is not None
    other = {**mtp.doc, "settings": {**SETTINGS, "max_tokens": 64}}
    (fam,) = advice.advise([zlab, Member(MTP, "gb10", "dflashfix", "heretic", "mtp", other)])
    assert all(lv["winner"] != MTP for lv in fam["levels"])
    why = fam["levels"][0]["untrusted"][0]
    assert "measured with other settings than `spark-heretic-zlab` (max_tokens 64 vs 128)" in why


def test_missing_results_and_plain_baselines_are_said():
    zlab = _spark(ZLAB, "dflash", {1: 101.9}, None, 0.25, 11, plain_baseline=False)
    mtp = _spark(MTP, "mtp", {1: 93.9}, None, 0.66, 2)
    gone = Member(AEON, "gb10", "dflashfix", "heretic", "dflash", None)
    (fam,) = advice.advise([zlab, mtp, gone])
    assert fam["levels"][0]["winner"] == ZLAB
    assert fam["flags"] == [
        "`spark-heretic-aeon` (dflash): no bench results are stored with this release; not "
        "compared",
        "`spark-heretic-zlab` (dflash): not compared with plain serving (its target's "
        "`bench.plain_baseline` is off)",
        "`spark-heretic-mtp` (mtp): not compared with plain serving (c=1 no plain serving "
        "measured)"]
    assert "plain serving |" not in advice.markdown([fam])  # no plain column
    (empty,) = advice.advise([gone])
    assert "_no bench results stored: nothing to compare_" in advice.markdown([empty])
    (alone,) = advice.advise([mtp])  # one cell, no plain twin: no table of one column
    md = advice.markdown([alone])
    assert "_one configuration measured: nothing to compare_" in md and "| c |" not in md
    assert "not compared with plain serving (c=1 no plain serving measured)" in md


def test_a_plain_cell_of_the_family_is_the_baseline_without_twins():
    spec = _spark(ZLAB, "dflash", {1: 101.9, 8: 280.0}, None, 0.25, 11)
    plain = _spark("spark-heretic-plain", "none", {1: 70.0, 8: 300.0}, None)
    (fam,) = advice.advise([spec, plain])
    assert [lv["winner"] for lv in fam["levels"]] == [ZLAB, "spark-heretic-plain"]
    (v,) = fam["versus_plain"]
    assert v["deltas"] == pytest.approx({"1": 101.9 / 70 - 1, "8": 280 / 300 - 1})
    assert "the dflash drafter of `spark-heretic-zlab` does not pay at this load" in \
        fam["levels"][1]["explanation"]


def test_families_are_one_model_on_one_target_and_engine():
    zlab, mtp = _public()
    old = Member("spark-heretic-zlab-old", "gb10", "pr41703", "heretic", "dflash", zlab.doc)
    nv = Member("spark-nvfp4-mtp", "gb10", "dflashfix", "nvfp4", "mtp", mtp.doc)
    fams = advice.advise([zlab, old, mtp, nv])
    assert [(f["model"], f["engine"], [c["image"] for c in f["cells"]]) for f in fams] == [
        ("heretic", "dflashfix", [ZLAB, MTP]), ("heretic", "pr41703", ["spark-heretic-zlab-old"]),
        ("nvfp4", "dflashfix", ["spark-nvfp4-mtp"])]
    assert advice.markdown([]) == ""


# ------------------------------------------------------------------ gb10 notes, stored results

TAG = "2026-06-18-dflashfix"
# the whole job's stored results of a cpu release (every field `bench` writes, the plain
# twin's too): the shape the gb10 documents below take, with GB10's figures
REAL = json.loads((REPO_ROOT / "tests" / "data" / "bench" / "cpu-release.json").read_text())
GATES = {"lossless": {"status": "pass", "reason": "", "requests": 5, "compared_tokens": 2560,
                      "ties": 0, "tie_rate": 0.0},
         "long_generation": {"status": "pass", "reason": "", "tokens": 16384}}


def _stored(image_id: str, tok_s: dict[int, float], plain: dict[int, float], rate: float,
            k: int) -> dict[str, Any]:
    """The real document with a gb10 cell's levels (1, 8, 32, 64), 64 requests of 128
    tokens each, and vLLM's counters for `rate` of `k` drafted tokens per step."""
    doc = copy.deepcopy(REAL)
    doc["image"].update(id=image_id, tag=TAG)
    doc["settings"].update(concurrency=list(tok_s), requests=64, max_tokens=128)

    def level(c: int, t: float, spec: bool) -> dict[str, Any]:
        lv = copy.deepcopy((REAL["plain"]["levels"] if not spec else REAL["levels"])[0])
        lv.update(concurrency=c, output_tok_s=t, requests=64, completed=64,
                  output_tokens=64 * 128, flags=[])
        if spec:
            lv["spec_decode"] = _lv(c, t, rate=rate, k=k)["spec_decode"]
        return lv

    doc["levels"] = [level(c, t, True) for c, t in tok_s.items()]
    doc["plain"]["levels"] = [level(c, t, False) for c, t in plain.items()]
    return doc


def test_gb10_notes_say_which_cell_wins_per_level_from_stored_results(tmp_path):
    from imagebuild.bench import store
    from imagebuild.plan import load_plan
    from imagebuild.registry.records import read_release
    from imagebuild.release import compat
    from imagebuild.release.notes import gather, release_notes
    from tests.support.memregistry import MemRegistry, add_release

    plan = load_plan(REPO_ROOT / "matrix.yaml", TAG, "gb10")
    assert plan.jobs[0].cell.target.bench.concurrency == [1, 8, 32, 64]  # matrix.yaml
    jobs = tuple(j for j in plan.jobs if j.cell.model_name == "heretic")
    twin = {1: 70.0, 8: 300.0, 32: 430.0, 64: 560.0}
    figures = {"zlab": ({1: 101.9, 8: 372.0, 32: 400.34, 64: 480.0}, twin, 0.25, 11),
               "mtp": ({1: 93.9, 8: 400.0, 32: 541.0, 64: 700.0}, twin, 0.66, 2),
               "aeon": ({1: 65.0, 8: 280.0, 32: 380.0, 64: 500.0}, twin, 0.2, 11)}
    client = MemRegistry().client()
    for job in jobs:
        repo, tag = job.image.repository, str(job.tag)
        add_release(client, repo, tag, config=job.id.encode(), gates=GATES)
        image_id = read_release(client, repo, tag).image_id
        store.put_results(client, repo, tag, _stored(image_id, *figures[job.cell.drafter_name]))
    table = compat.gather(client, jobs, plan.lm.matrix.publish)
    notes = release_notes(plan.lm, jobs, gather(client, jobs, tmp_path),
                          compat.markdown(table))
    section = notes.split("## Compatibility\n", 1)[1].split("\n## ", 1)[0]
    assert "### Which cell to deploy" in section
    assert "#### heretic on gb10, engine dflashfix" in section
    assert ("Deploy: c=1 `spark-heretic-zlab`; c=8, c=32, c=64 `spark-heretic-mtp`."
            in section), section
    assert ("- `spark-heretic-zlab` (dflash): fastest at c=1 (by 8.5%); behind the fastest at "
            "c=8 (-7.0% vs `spark-heretic-mtp`), c=32 (-26.0% vs `spark-heretic-mtp`), c=64 "
            "(-31.4% vs `spark-heretic-mtp`)") in section
    assert ("**`spark-heretic-aeon` (dflash) is slower than plain serving at every level "
            "measured** (c=1 -7.1%, c=8 -6.7%, c=32 -11.6%, c=64 -10.7%)") in section
    # each image's own bench table compares it with its plain twin and shows the twin
    bench = notes.split("## spark-heretic-mtp")[1].split("Benchmark:")[1]
    assert "| tok/s | vs plain |" in bench and "its plain twin), measured right after" in bench
    # the table stored with the release carries the same advice
    compat.store_tables(client, jobs, table, log=lambda _: None)
    stored = compat.stored_table(client, jobs[0].image.repository, str(jobs[0].tag))
    assert stored is not None and stored["advice"] == json.loads(json.dumps(table["advice"]))
