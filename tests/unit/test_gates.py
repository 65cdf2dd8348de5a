"""The gates that must not open by accident, without Docker, through the real registry
client against an in-memory registry (tests/support/memregistry.py):

- publish pushes nothing, and asks the registry nothing, unless smoke passed for exactly
  the image being pushed;
- promotion refuses a release slower than latest beyond the threshold (a reason lets it
  through and is recorded);
- promotion refuses when the release or latest has no bench results, unless the user
  says so (`--accept-unmeasured REASON`): then the release record says unmeasured, or
  the release's results say they were not compared, and the notes say it;
- the whole job refuses `--no-bench` (or a target without `bench:`) without that reason,
  before anything is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from imagebuild.bench import store
from imagebuild.cli import main
from imagebuild.errors import OperationFailed, UserError
from imagebuild.plan import load_plan
from imagebuild.registry import push as push_mod
from imagebuild.registry.credentials import Credentials
from imagebuild.registry.records import read_release
from imagebuild.release import publish as publish_mod
from imagebuild.release.latest import promote_jobs
from imagebuild.release.notes import gather, release_notes
from imagebuild.spec.tags import parse_release_tag
from tests.support.localimage import MemImage, tar_of
from tests.support.memengine import image_doc
from tests.support.memregistry import MemRegistry, latest_and_candidate

REPO = "vllm-spark/cpu-tiny-ngram"
OLD, NEW = "2026-06-11-v0.23.0-pr41703", "2026-06-18-v0.23.0-dflashfix"
WRITES = ("PUT", "POST", "DELETE", "PATCH")


@pytest.fixture
def reg() -> MemRegistry:
    return latest_and_candidate(REPO, OLD, NEW)


@pytest.fixture
def job(matrix_dir: Path):
    (job,) = load_plan(matrix_dir / "matrix.yaml", NEW, "cpu").jobs
    assert job.image.repository == REPO and str(job.tag) == NEW
    return job


def _lm(matrix_dir: Path):
    return load_plan(matrix_dir / "matrix.yaml", NEW, "cpu").lm


def _spec(accepted: float, drafted: float = 293.0, drafts: float = 105.0) -> dict:
    """vLLM's counters over one level as bench stores them (the cpu image's figures:
    docs/data/placement-before-after.json)."""
    return {"drafts": drafts, "draft_tokens": drafted, "accepted_tokens": accepted,
            "acceptance": accepted / drafted if drafted else None,
            "mean_accepted_length": 1 + accepted / drafts if drafts else None}


STARVED = {"code": "client-starved",
           "reason": "the load generator waited for a CPU 1% of the time (event-loop lag "
                     "p90 5.0 ms): chunks were read late"}  # a CI run's c=4 (commit 7699312)


def _bench(reg: MemRegistry, tag: str, tok_s: float,
           spec: dict[int, dict | None] | None = None, flagged: tuple[int, ...] = ()) -> None:
    """Results for `tag`; `spec`: the speculative counters per level (default: the cpu
    image's 183 of 293 drafted tokens accepted at every level); `flagged`: levels whose
    client timing is flagged client-starved."""
    client = reg.client()
    image_id = read_release(client, REPO, tag).image_id
    stats = {"median": 10.0, "p90": 12.0, "mean": 10.5}
    spec = {1: _spec(183.0), 4: _spec(183.0)} if spec is None else spec
    doc = {"image": {"id": image_id, "tag": tag}, "hardware": {"model": "a test CPU"},
           "settings": {"prompts": "structured", "max_tokens": 64}, "levels": [
               {"concurrency": c, "output_tok_s": tok_s * c,
                "flags": [STARVED] if c in flagged else [], "errors": 0,
                "requests": 16, "request_rate": 1.0, "ttft_ms": stats, "tpot_ms": stats,
                "itl_ms": stats, "e2e_ms": stats, "client_cpu_ms_per_request": 5.0,
                "spec_decode": spec.get(c)}
               for c in (1, 4)]}
    store.put_results(client, REPO, tag, doc)


def _latest(reg: MemRegistry) -> str:
    return reg.tags[REPO]["latest"]


def _promote(reg: MemRegistry, job, **kw: Any):
    kw.setdefault("accept_regression", None)
    return promote_jobs(reg.client(), (job,), default_threshold=0.05, log=lambda _: None, **kw)


def _writes_after(reg: MemRegistry, start: int) -> list[tuple[str, str]]:
    return [c for c in reg.calls[start:] if c[0] in WRITES]


# ------------------------------------------------------------------ regression gate


def test_a_slower_release_does_not_become_latest(reg, job):
    _bench(reg, OLD, 100.0)
    _bench(reg, NEW, 40.0)  # cpu's threshold is 0.5: 40 % of latest is a regression
    before, start = _latest(reg), len(reg.calls)
    with pytest.raises(UserError) as info:
        _promote(reg, job)
    assert "is slower than latest by more than 50%" in info.value.message
    assert "--accept-regression" in info.value.fix
    assert _latest(reg) == before and _writes_after(reg, start) == []


def test_a_reason_lets_a_slower_release_through_and_is_recorded(reg, job):
    _bench(reg, OLD, 100.0)
    _bench(reg, NEW, 40.0)
    _promote(reg, job, accept_regression="known: smaller batch on purpose")
    assert _latest(reg) == reg.tags[REPO][NEW]
    stored = store.stored(reg.client(), REPO, NEW)
    assert stored.annotations[store.A_ACCEPTED] == "known: smaller batch on purpose"


def test_an_equal_release_moves_latest_without_a_reason(reg, job):
    _bench(reg, OLD, 100.0)
    _bench(reg, NEW, 99.0)
    _promote(reg, job)
    assert _latest(reg) == reg.tags[REPO][NEW]
    assert read_release(reg.client(), REPO, NEW).unmeasured is None


# ------------------------------------------------------------------ acceptance gate
# cpu's acceptance_threshold is 0.05 (matrix.yaml): 183 -> 160 of 293 accepted is -12.6 %


def test_lower_acceptance_does_not_become_latest(reg, job):
    _bench(reg, OLD, 100.0)
    _bench(reg, NEW, 100.0, {1: _spec(183.0), 4: _spec(160.0)})  # as fast, accepts fewer
    before, start = _latest(reg), len(reg.calls)
    with pytest.raises(UserError) as info:
        _promote(reg, job)
    assert "accepts fewer drafted tokens than latest, by more than 5%" in info.value.message
    assert "c=4: acceptance 0.55 vs 0.62 (-12.6%)" in info.value.message
    assert "c=1" not in info.value.message  # an unchanged level is no drop
    assert "--accept-acceptance-drop" in info.value.fix
    assert _latest(reg) == before and _writes_after(reg, start) == []
    # a regression reason is no answer to an acceptance drop
    with pytest.raises(UserError, match="accepts fewer drafted tokens"):
        _promote(reg, job, accept_regression="slower is fine")


def test_a_drop_in_mean_accepted_length_alone_is_a_drop(reg, job):
    _bench(reg, OLD, 100.0)
    # the same rate, but each draft round yields fewer tokens (more, shorter drafts)
    _bench(reg, NEW, 100.0, {1: _spec(183.0, drafts=140.0), 4: _spec(183.0)})
    with pytest.raises(UserError, match=r"c=1: .*mean accepted length 2.31 vs 2.74"):
        _promote(reg, job)


def test_a_reason_lets_lower_acceptance_through_and_is_recorded(reg, job, tmp_path,
                                                                matrix_dir):
    _bench(reg, OLD, 100.0)
    _bench(reg, NEW, 100.0, {1: _spec(160.0), 4: _spec(160.0)})
    _promote(reg, job, accept_acceptance_drop="new prompt set drafts longer")
    client = reg.client()
    assert _latest(reg) == reg.tags[REPO][NEW]
    stored = store.stored(client, REPO, NEW)
    assert stored.annotations[store.A_ACCEPTED_DROP] == "new prompt set drafts longer"
    notes = release_notes(_lm(matrix_dir), (job,), gather(client, (job,), tmp_path))
    assert "**Accepted drop in speculative acceptance:** new prompt set drafts longer" in notes


def test_higher_or_equal_acceptance_passes_freely(reg, job):
    _bench(reg, OLD, 100.0)
    _bench(reg, NEW, 100.0, {1: _spec(180.0), 4: _spec(250.0)})  # -1.6 % is within 5 %
    _promote(reg, job)
    assert _latest(reg) == reg.tags[REPO][NEW]
    assert store.A_ACCEPTED_DROP not in store.stored(reg.client(), REPO, NEW).annotations


def test_a_client_timing_flag_neither_hides_nor_skips_the_acceptance_gate(reg, job):
    """A flag on client timing (tok/s, latency) leaves vLLM's own counters as they are:
    the acceptance drop at the flagged level is judged, and one refusal names both."""
    _bench(reg, OLD, 100.0, flagged=(4,))  # latest's c=4 load generator was starved
    _bench(reg, NEW, 100.0, {1: _spec(183.0), 4: _spec(160.0)})
    before = _latest(reg)
    with pytest.raises(UserError) as info:
        _promote(reg, job)
    msg, fix = info.value.message, info.value.fix or ""
    assert "cannot be trusted at 1 of 2 shared level(s)" in msg
    assert "c=4: latest: the load generator waited" in msg
    assert "accepts fewer drafted tokens than latest, by more than 5%" in msg
    assert "c=4: acceptance 0.55 vs 0.62 (-12.6%)" in msg
    assert "--accept-untrusted-bench" in fix and "--accept-acceptance-drop" in fix
    # "we could not tell" the tok/s is no answer to the drop the counters show
    with pytest.raises(UserError) as info:
        _promote(reg, job, accept_untrusted="shared runner")
    assert "c=4: acceptance 0.55 vs 0.62" in info.value.message
    assert "cannot be trusted" not in info.value.message
    # and the other way round: the drop accepted, the flag still asks its own reason
    with pytest.raises(UserError) as info:
        _promote(reg, job, accept_acceptance_drop="longer drafts on purpose")
    assert "cannot be trusted" in info.value.message
    assert "accepts fewer" not in info.value.message
    assert _latest(reg) == before
    _promote(reg, job, accept_untrusted="shared runner",
             accept_acceptance_drop="longer drafts on purpose")
    assert _latest(reg) == reg.tags[REPO][NEW]
    ann = store.stored(reg.client(), REPO, NEW).annotations
    assert ann[store.A_UNTRUSTED] == "shared runner"
    assert ann[store.A_ACCEPTED_DROP] == "longer drafts on purpose"


def test_a_slower_release_with_lower_acceptance_is_told_both_at_once(reg, job):
    _bench(reg, OLD, 100.0)
    _bench(reg, NEW, 40.0, {1: _spec(183.0), 4: _spec(160.0)})
    with pytest.raises(UserError) as info:
        _promote(reg, job)
    assert "slower than latest" in info.value.message
    assert "accepts fewer drafted tokens" in info.value.message
    assert "--accept-regression" in info.value.fix and "--accept-acceptance-drop" in \
        info.value.fix


@pytest.mark.parametrize("spec,words", [
    ({1: None, 4: None}, "c=1: no speculative metrics"),
    ({1: _spec(183.0), 4: _spec(-40.0, drafted=-120.0, drafts=-50.0)},
     "c=4: speculative counters went backwards"),
    ({1: _spec(183.0), 4: _spec(300.0)}, "c=4: speculative counters went backwards or "
                                         "exceed what was drafted (300 accepted of 293)"),
    ({1: _spec(10.0, drafted=12.0, drafts=4.0), 4: _spec(183.0)},
     "c=1: only 12 tokens drafted"),
], ids=["no-metrics", "server-restarted", "more-accepted-than-drafted", "too-few-drafts"])
def test_acceptance_that_cannot_be_compared_never_passes_silently(reg, job, spec, words):
    _bench(reg, OLD, 100.0)
    _bench(reg, NEW, 100.0, spec)
    before = _latest(reg)
    with pytest.raises(UserError) as info:
        _promote(reg, job, accept_acceptance_drop="a drop reason is no answer here")
    assert "speculative acceptance cannot be compared" in info.value.message
    assert words in info.value.message and "--accept-untrusted-bench" in info.value.fix
    assert _latest(reg) == before
    _promote(reg, job, accept_untrusted="the bench server was restarted by hand")
    assert _latest(reg) == reg.tags[REPO][NEW]
    assert store.stored(reg.client(), REPO, NEW).annotations[store.A_UNTRUSTED] == \
        "the bench server was restarted by hand"


def test_latest_without_acceptance_is_said_too(reg, job):
    _bench(reg, OLD, 100.0, {1: None, 4: None})
    _bench(reg, NEW, 100.0)
    with pytest.raises(UserError, match="c=1: latest: no speculative metrics"):
        _promote(reg, job)


def test_a_plain_cell_has_no_acceptance_to_gate(reg, job):
    import dataclasses

    plain = dataclasses.replace(job, cell=dataclasses.replace(job.cell, drafter=None))
    assert plain.cell.method == "none"
    _bench(reg, OLD, 100.0)
    _bench(reg, NEW, 100.0, {1: None, 4: None})
    _promote(reg, plain)
    assert _latest(reg) == reg.tags[REPO][NEW]


# ------------------------------------------------------------------ unmeasured gate


@pytest.mark.parametrize("measured", [(), (OLD,), (NEW,)],
                         ids=["neither-side", "release-unmeasured", "latest-unmeasured"])
def test_nothing_to_compare_refuses_and_moves_nothing(reg, job, measured):
    for tag in measured:
        _bench(reg, tag, 100.0)
    before, start = _latest(reg), len(reg.calls)
    with pytest.raises(UserError) as info:
        _promote(reg, job)
    assert "has no bench results" in info.value.message
    assert "latest does not move" in info.value.message
    assert "--accept-unmeasured" in info.value.fix
    assert _latest(reg) == before and _writes_after(reg, start) == []


def test_a_first_release_without_results_is_refused_too(reg, job):
    del reg.tags[REPO]["latest"]
    with pytest.raises(UserError, match="has no bench results"):
        _promote(reg, job)
    assert "latest" not in reg.tags[REPO]


def test_accepted_unmeasured_is_recorded_in_the_release_and_its_notes(reg, job, tmp_path,
                                                                      matrix_dir):
    client = reg.client()
    image_id = read_release(client, REPO, NEW).image_id
    _bench(reg, OLD, 100.0)
    _promote(reg, job, accept_unmeasured="the bench runner is down; measured by hand")
    rel = read_release(client, REPO, NEW)
    assert _latest(reg) == rel.digest  # latest is the recorded release
    assert rel.passed and rel.image_id == image_id  # the same tested image
    assert rel.unmeasured == "the bench runner is down; measured by hand"
    assert rel.annotations["io.imagebuild.release.bench"] == "unmeasured"
    notes = release_notes(_lm(matrix_dir), (job,), gather(client, (job,), tmp_path))
    bench = notes.split("Benchmark:")[1]
    assert "**UNMEASURED:** promoted without a measurement: the bench runner is down" in bench


def test_a_measured_release_over_an_unmeasured_latest_says_so_on_its_results(reg, job,
                                                                              tmp_path,
                                                                              matrix_dir):
    _bench(reg, NEW, 100.0)
    _promote(reg, job, accept_unmeasured="latest predates the bench")
    client = reg.client()
    assert _latest(reg) == reg.tags[REPO][NEW]
    assert read_release(client, REPO, NEW).unmeasured is None  # it was measured
    stored = store.stored(client, REPO, NEW)
    assert stored.annotations[store.A_UNCOMPARED] == "latest predates the bench"
    notes = release_notes(_lm(matrix_dir), (job,), gather(client, (job,), tmp_path))
    assert "**Promoted without a comparison**" in notes and "latest predates" in notes


def test_a_dry_run_records_nothing(reg, job):
    start = len(reg.calls)
    _promote(reg, job, accept_unmeasured="why", dry_run=True)
    assert _writes_after(reg, start) == []
    assert read_release(reg.client(), REPO, NEW).unmeasured is None


@pytest.mark.parametrize("edit,args,words", [
    (None, ["--no-bench"], "--no-bench measures nothing"),
    ("      regression_threshold: 0.5\n", [], "target(s) cpu have no `bench:` settings"),
], ids=["no-bench", "target-without-bench"])
def test_the_whole_job_refuses_to_start_without_a_reason(matrix_dir, capsys, memory_engine,
                                                          edit, args, words):
    memory_engine.refuse = True  # Docker asked anything before the refusal: a failure
    if edit:
        path = matrix_dir / "matrix.yaml"
        text = path.read_text()
        start = text.index("    bench:\n      concurrency: [1, 4]")
        path.write_text(text[:start] + text[text.index(edit, start) + len(edit):])
    argv = ["--tag", "2026-06-18-dflashfix", "--target", "cpu", "--matrix",
            str(matrix_dir / "matrix.yaml"), "--out", str(matrix_dir / "out"), *args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "--accept-unmeasured" in err and "Traceback" not in err
    assert not (matrix_dir / "out").exists()


# ----------------------------------------------------------------------- smoke gate


@pytest.fixture
def pushing(memory_engine, monkeypatch, tmp_path):
    """(registry, image ids whose layers were read for a push, image id) for publishing a
    fresh release: the Docker seam's double holds the image, its layers come from an
    in-memory image (what dockerstore.local_image reads from dockerd's store)."""
    monkeypatch.setenv("IMAGEBUILD_CACHE_DIR", str(tmp_path / "cache"))
    reg = MemRegistry()
    image = MemImage([tar_of({"layer": b"layer"})])
    memory_engine.add_image(image_doc(image.image_id), f"127.0.0.1:5999/{REPO}:{NEW}")
    pushed: list[str] = []

    def local_image(image_id: str):
        pushed.append(image_id)
        return image.local_image(image_id)

    monkeypatch.setattr(push_mod, "local_image", local_image)
    return reg, pushed, image.image_id


def _publish(reg: MemRegistry, verdict: dict[str, Any]):
    return publish_mod.publish(reg.client(), REPO, local_ref=f"127.0.0.1:5999/{REPO}:{NEW}",
                               release_tag=parse_release_tag(NEW), verdict=verdict,
                               credentials=Credentials("u", "p"), log=lambda _: None,
                               settle=0)


@pytest.mark.parametrize("verdict", [
    {"passed": False, "checks": {"chat": {"passed": False}}},
    {"passed": "true"},  # not the boolean: a hand-edited verdict
    {},
    {"passed": True, "image_id": "sha256:" + "9" * 64},  # another image was tested
], ids=["failed", "string-true", "empty", "other-image"])
def test_nothing_is_pushed_or_asked_unless_smoke_passed_for_this_image(pushing, verdict):
    reg, pushed, image_id = pushing
    verdict = {"image_id": image_id, **verdict}
    with pytest.raises(OperationFailed) as info:
        _publish(reg, verdict)
    assert "nothing pushed" in info.value.message or "not the one tested" in info.value.message
    assert reg.calls == [] and pushed == []


def test_a_passed_verdict_for_this_image_is_pushed_and_recorded(pushing):
    """The control: the same double and registry do record a push when smoke passed."""
    reg, pushed, image_id = pushing
    res = _publish(reg, {"passed": True, "image_id": image_id, "checks": {}})
    assert res.pushed and pushed
    rel = read_release(reg.client(), REPO, NEW)
    assert rel.passed and rel.image_id == image_id
    assert "latest" not in reg.tags[REPO]  # publish never moves latest itself
