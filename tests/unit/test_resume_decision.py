"""The one resume decision (release/resume.py `decide`) against an in-memory registry,
and the whole job (job.run_release) following it: a re-run of a released tag reads the
release record instead of smoking and gating the same image again, a release of another
image stops before smoke with publish's refusal, `--resmoke` runs both again."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from imagebuild import job as whole_job
from imagebuild.bench import store
from imagebuild.buildfolder import GATES_FILE, verdict_path
from imagebuild.errors import UserError
from imagebuild.plan import load_plan
from imagebuild.registry import referrers
from imagebuild.registry.records import read_release
from imagebuild.release.resume import cell_state, decide, record_files
from tests.support.memengine import image_doc
from tests.support.memregistry import MemRegistry

REPO = "vllm-spark/cpu-tiny-ngram"
TAG = "2026-06-18-v0.23.0-dflashfix"
WRITES = ("PUT", "POST", "DELETE", "PATCH")
CONFIG = b'{"config":{}}'  # add_release's default config: the image id below
IMAGE_ID = "sha256:" + hashlib.sha256(CONFIG).hexdigest()
GATES = {"lossless": {"status": "pass", "reason": "identical tokens"},
         "long_generation": {"status": "pass", "reason": "512 tokens, no repeat"}}


def _job(matrix_dir: Path):
    (job,) = load_plan(matrix_dir / "matrix.yaml", TAG, "cpu").jobs
    return job


def _released(*, gates=GATES, benched=True, documented=True, latest=True) -> MemRegistry:
    """The tag as a finished whole job leaves it (each part can be left out)."""
    reg = MemRegistry()
    reg.add_release(REPO, TAG, gates=gates, benched=benched)
    client = reg.client()
    rel = read_release(client, REPO, TAG)
    if documented:
        for kind in (referrers.SBOM_TYPE, referrers.PROVENANCE_TYPE):
            referrers.put_artifact(client, REPO, rel, b"{}", artifact_type=kind, file_name="f")
    if latest:
        reg.point_latest(REPO, TAG)
    return reg


def test_same_image_skips_every_stage_it_holds_reading_only(matrix_dir):
    reg = _released()
    start = len(reg.calls)
    d = decide(reg.client(), _job(matrix_dir), image_id=IMAGE_ID)
    assert set(d.skip) == {"smoke", "gates", "sbom", "bench", "latest"}
    assert not [c for c in reg.calls[start:] if c[0] in WRITES]
    # each line names the record it read
    assert f"release record {REPO}:{TAG}" in d.skip["smoke"] and IMAGE_ID[:19] in d.skip["smoke"]
    assert "lossless pass" in d.skip["gates"]
    assert "bench results stored" in d.skip["bench"]
    assert f"{REPO}:latest is already" in d.skip["latest"]


def test_another_image_stops_with_publishs_refusal(matrix_dir):
    reg = _released()
    with pytest.raises(UserError, match="already exists for image .*never overwritten"):
        decide(reg.client(), _job(matrix_dir), image_id="sha256:" + "1" * 64)
    # `resume --tag` (no local image): the tag as it stands, no refusal
    assert cell_state(reg.client(), _job(matrix_dir)).tested


def test_no_release_skips_nothing(matrix_dir):
    reg = MemRegistry()
    reg.add_release(REPO, "2026-06-11-v0.23.0-pr41703")  # another release of the image
    d = decide(reg.client(), _job(matrix_dir), image_id=IMAGE_ID)
    assert d.release is None and d.skip == {}


def test_a_failed_smoke_recorded_skips_nothing(matrix_dir):
    reg = MemRegistry()
    reg.add_release(REPO, TAG, smoke="failed", gates=GATES)
    assert decide(reg.client(), _job(matrix_dir), image_id=IMAGE_ID).skip == {}


@pytest.mark.parametrize("gates", [None, {**GATES, "lossless": {"status": "fail",
                                                                  "reason": "differs"}}])
def test_gates_absent_or_failed_in_the_record_run_again(matrix_dir, gates):
    """A release older than the gates records none: absent is not passed."""
    reg = _released(gates=gates)
    d = decide(reg.client(), _job(matrix_dir), image_id=IMAGE_ID)
    assert "smoke" in d.skip and "gates" not in d.skip
    assert not cell_state(reg.client(), _job(matrix_dir)).gated


def test_forced_runs_smoke_and_gates_but_resumes_the_rest(matrix_dir):
    reg = _released()
    d = decide(reg.client(), _job(matrix_dir), image_id=IMAGE_ID, force=True)
    assert set(d.skip) == {"sbom", "bench", "latest"}


def test_resume_state_is_the_same_decision(matrix_dir):
    reg = _released(benched=False, documented=False, gates=None)
    s = cell_state(reg.client(), _job(matrix_dir))
    assert (s.published, s.tested, s.gated, s.attested, s.benched) == \
        (True, True, False, False, False)


def test_recorded_files_replace_another_images_verdict_but_keep_this_ones(matrix_dir,
                                                                          tmp_path):
    reg = _released()
    rel = read_release(reg.client(), REPO, TAG)
    job = _job(matrix_dir)
    path = verdict_path(tmp_path, job.cell)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"passed": True, "image_id": "sha256:" + "2" * 64}))
    record_files(rel, job, tmp_path, replace=True)  # a stale one: publish would refuse it
    assert json.loads(path.read_text())["source"] == "release record"
    gates = json.loads((path.parent / GATES_FILE).read_text())
    assert gates["image_id"] == IMAGE_ID and gates["summary"] == GATES
    mine = {"passed": True, "image_id": IMAGE_ID, "message": "this checkout's run"}
    path.write_text(json.dumps(mine))
    record_files(rel, job, tmp_path, replace=True)
    assert json.loads(path.read_text()) == mine


# ------------------------------------------------------------------ the whole job follows it


@pytest.fixture
def job_run(matrix_dir, tmp_path, monkeypatch, memory_engine):
    """run_release on the cpu cell against `reg`, with the local image `image_id`: no
    build, no Docker; smoke and the gates recorded when they run."""
    ran: list[str] = []

    def run(reg: MemRegistry, image_id: str = IMAGE_ID, **opts) -> list[str]:
        ran.clear()
        plan = load_plan(matrix_dir / "matrix.yaml", TAG, "cpu")
        monkeypatch.setattr(whole_job, "buildable", lambda p: p)
        monkeypatch.setattr(whole_job, "registry_client", lambda p: reg.client())
        monkeypatch.setattr("imagebuild.builder.builder.build_jobs", lambda *a, **k: None)
        for j in plan.jobs:  # the local image each job built
            memory_engine.add_image(image_doc(image_id), j.release_ref)

        def smoke(lm, jobs, out_root):
            ran.append("smoke")
            return {j.id: {"passed": True, "image_id": image_id, "image_ref": j.release_ref,
                           "message": "ran", "checks": {}} for j in jobs}

        def gates(jobs, out):
            ran.append("gates")
            return {j.id: {"summary": GATES} for j in jobs}

        monkeypatch.setattr("imagebuild.smoke.runner.smoke_jobs", smoke)
        monkeypatch.setattr("imagebuild.gates.run.gate_jobs", gates)
        assert whole_job.run_release(plan, whole_job.ReleaseOptions(
            out=tmp_path / "build", **opts)) == 0
        return ran

    run.ran = ran  # type: ignore[attr-defined]  # what ran before an error
    return run


def test_a_rerun_of_a_released_tag_smokes_gates_and_writes_nothing(job_run, capsys):
    reg = _released()
    assert job_run(reg) == []  # the first re-run stores the table (none was stored)
    capsys.readouterr()
    start = len(reg.calls)
    assert job_run(reg) == []
    assert not [c for c in reg.calls[start:] if c[0] in WRITES], reg.calls[start:]
    out = capsys.readouterr().out
    for stage in ("smoke", "gates", "sbom", "bench", "latest", "table"):
        assert f"{stage} skipped  cpu/cpu-tiny-ngram: " in out, (stage, out)


def test_resmoke_runs_smoke_and_gates_again(job_run):
    assert job_run(_released(), resmoke=True) == ["smoke", "gates"]


def test_a_record_without_gates_runs_the_gates_only(job_run):
    assert job_run(_released(gates=None)) == ["gates"]


def test_a_release_of_another_image_stops_before_smoke(job_run):
    with pytest.raises(UserError, match="never overwritten"):
        job_run(_released(), image_id="sha256:" + "3" * 64)
    assert job_run.ran == []  # not after smoke and the gates, as publish alone would


def test_the_stored_bench_is_what_resume_reads(matrix_dir):
    reg = _released(benched=False)
    client = reg.client()
    job = _job(matrix_dir)
    assert "bench" not in decide(client, job, image_id=IMAGE_ID).skip
    store.put_results(client, REPO, TAG, {"image": {"id": IMAGE_ID}, "levels": []})
    assert "bench" in decide(client, job, image_id=IMAGE_ID).skip
