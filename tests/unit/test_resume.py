"""build.py resume (imagebuild/release/resume.py) against an in-memory registry: what a
release tag already holds, read-only, and the recorded verdict a re-run hands the notes."""

from __future__ import annotations

import json
from pathlib import Path

from imagebuild.bench import store
from imagebuild.buildfolder import verdict_path
from imagebuild.plan import load_plan
from imagebuild.registry import referrers
from imagebuild.release.resume import cell_state, github_output, write_recorded_verdict
from tests.support.memregistry import MemRegistry
from tools.rehearse_release.outputs import parse

REPO = "vllm-spark/cpu-tiny-ngram"
TAG = "2026-06-18-v0.23.0-dflashfix"
WRITES = ("PUT", "POST", "DELETE", "PATCH")


def _job(matrix_dir: Path):
    (job,) = load_plan(matrix_dir / "matrix.yaml", TAG, "cpu").jobs
    assert job.image.repository == REPO
    return job


def _state(reg: MemRegistry, job) -> dict[str, str]:
    return parse(github_output([cell_state(reg.client(), job)]))


def test_nothing_published_is_nothing_done(matrix_dir):
    reg = MemRegistry()
    reg.add_release(REPO, "2026-06-11-v0.23.0-pr41703")  # another release of the image
    assert _state(reg, _job(matrix_dir)) == {"published": "false", "tested": "false",
                                             "attested": "false", "benched": "false",
                                             "done": "false"}


def test_a_failed_smoke_recorded_is_published_but_not_done(matrix_dir):
    reg = MemRegistry()
    reg.add_release(REPO, TAG, smoke="failed")
    assert _state(reg, _job(matrix_dir)) == {"published": "true", "tested": "false",
                                             "attested": "false", "benched": "false",
                                             "done": "false"}


def test_passed_then_benched_and_read_only(matrix_dir, tmp_path):
    reg = MemRegistry()
    reg.add_release(REPO, TAG)
    job = _job(matrix_dir)
    client = reg.client()
    from imagebuild.registry.records import read_release
    rel = read_release(client, REPO, TAG)
    image_id = rel.image_id
    # done: its SBOM and provenance are stored too (signed too in the release workflow:
    # tests/unit/test_attest_standins.py)
    for kind in (referrers.SBOM_TYPE, referrers.PROVENANCE_TYPE):
        referrers.put_artifact(client, REPO, rel, b"{}", artifact_type=kind, file_name="f")
    start = len(reg.calls)
    assert _state(reg, job) == {"published": "true", "tested": "true", "attested": "true",
                                "benched": "false", "done": "true"}
    assert not [c for c in reg.calls[start:] if c[0] in WRITES]
    store.put_results(client, REPO, TAG, {"image": {"id": image_id, "tag": TAG}, "levels": []})
    assert _state(reg, job)["benched"] == "true"
    # the notes of a re-run read the recorded verdict; a report of this run is kept
    build = tmp_path / "build"
    path = write_recorded_verdict(client, job, build)
    assert path == verdict_path(build, job.cell)
    verdict = json.loads(path.read_text())
    assert verdict["passed"] is True and "not run again" in verdict["message"]
    path.write_text('{"passed": true, "message": "this run"}')
    assert write_recorded_verdict(client, job, build) is None
    assert json.loads(path.read_text())["message"] == "this run"
