"""The gate runs for every job before any latest moves; the whole job never moves latest
backwards; per-target thresholds. Against the in-memory registry."""

from __future__ import annotations

import dataclasses

import pytest

from imagebuild.bench.gate import GateResult
from imagebuild.errors import UserError
from imagebuild.plan import load_plan
from imagebuild.registry.records import A_TAG, LATEST, read_release
from imagebuild.release import latest
from tests.support.memregistry import MemRegistry

OLD = "2026-06-11-v0.23.0-y"


@pytest.fixture
def jobs(matrix_dir):
    """Two gb10 jobs of the real matrix; the second one's target overrides the threshold."""
    first, second = load_plan(matrix_dir / "matrix.yaml", "2026-06-18-dflashfix", "gb10").jobs[:2]
    target = second.cell.target
    own = target.model_copy(update={"bench": target.bench.model_copy(
        update={"regression_threshold": 0.25})})
    return (first, dataclasses.replace(second, cell=dataclasses.replace(second.cell,
                                                                        target=own)))


@pytest.fixture
def reg(jobs, monkeypatch, tmp_path):
    monkeypatch.setenv("IMAGEBUILD_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("IMAGEBUILD_LEASE_SETTLE", "0")
    reg = MemRegistry()
    for job in jobs:
        repo = job.image.repository
        reg.add_release(repo, OLD)
        reg.point_latest(repo, OLD)
        reg.add_release(repo, str(job.tag))
    return reg


@pytest.fixture
def calls(monkeypatch, jobs):
    seen: dict[str, list] = {"gate": []}
    slow = jobs[1].image.repository

    def gate(client, repo, tag, *, threshold, accept_regression, accept_untrusted=None,
             accept_unmeasured=None, dry_run=False, log=print, **acceptance):
        seen["gate"].append((repo, threshold))
        if repo == slow and not accept_regression:
            raise UserError(f"{repo}: slower than latest", fix="--accept-regression")
        return GateResult()

    monkeypatch.setattr(latest, "check_promotion", gate)
    return seen


def _latest(reg, jobs):
    return [read_release(reg.client(), j.image.repository, LATEST).annotations[A_TAG]
            for j in jobs]


def test_a_refused_job_moves_no_latest_at_all(reg, calls, jobs):
    with pytest.raises(UserError, match="slower than latest"):
        latest.promote_jobs(reg.client(), jobs, default_threshold=0.05,
                            accept_regression=None)
    assert _latest(reg, jobs) == [OLD, OLD]  # job a passed its gate, but b's refusal stops both
    assert calls["gate"] == [(jobs[0].image.repository, 0.05),
                             (jobs[1].image.repository, 0.25)]


def test_with_a_reason_every_job_moves(reg, calls, jobs):
    latest.promote_jobs(reg.client(), jobs, default_threshold=0.05, accept_regression="known")
    assert _latest(reg, jobs) == [str(j.tag) for j in jobs]


def test_the_whole_job_leaves_a_newer_latest_alone(reg, calls, jobs, capsys):
    newer = "2026-07-01-v0.23.0-z"
    for job in jobs:
        reg.add_release(job.image.repository, newer)
        reg.point_latest(job.image.repository, newer)
    latest.promote_jobs(reg.client(), jobs, default_threshold=0.05, accept_regression=None,
                        forward_only=True)
    assert _latest(reg, jobs) == [newer, newer] and calls["gate"] == []
    assert f"is older than latest ({newer})" in capsys.readouterr().out
