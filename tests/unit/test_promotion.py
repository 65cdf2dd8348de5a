"""The gate runs for every job before any latest moves; the whole job never moves latest
backwards; per-target thresholds."""

from __future__ import annotations

import dataclasses

import pytest

from imagebuild.bench.gate import GateResult
from imagebuild.errors import UserError
from imagebuild.plan import load_plan
from imagebuild.release import latest


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
def calls(monkeypatch, jobs):
    seen: dict[str, list] = {"gate": [], "moved": []}
    slow = jobs[1].image.repository

    def gate(client, repo, tag, *, threshold, accept_regression, accept_untrusted=None,
             accept_unmeasured=None, log=print):
        seen["gate"].append((repo, threshold))
        if repo == slow and not accept_regression:
            raise UserError(f"{repo}: slower than latest", fix="--accept-regression")
        return GateResult()

    monkeypatch.setattr(latest, "check_promotion", gate)
    monkeypatch.setattr(latest, "set_latest",
                        lambda client, repo, tag, **kw: seen["moved"].append(repo))
    monkeypatch.setattr(latest, "latest_release",
                        lambda client, repo: (None, "2026-06-11-v0.23.0-y"))
    return seen


def test_a_refused_job_moves_no_latest_at_all(calls, jobs):
    with pytest.raises(UserError, match="slower than latest"):
        latest.promote_jobs(None, jobs, default_threshold=0.05, accept_regression=None)
    assert calls["moved"] == []  # job a passed its gate, but b's refusal stops both
    assert calls["gate"] == [(jobs[0].image.repository, 0.05),
                             (jobs[1].image.repository, 0.25)]


def test_with_a_reason_every_job_moves(calls, jobs):
    latest.promote_jobs(None, jobs, default_threshold=0.05, accept_regression="known")
    assert calls["moved"] == [j.image.repository for j in jobs]


def test_the_whole_job_leaves_a_newer_latest_alone(calls, jobs, monkeypatch, capsys):
    monkeypatch.setattr(latest, "latest_release",
                        lambda client, repo: (None, "2026-07-01-v0.23.0-z"))
    latest.promote_jobs(None, jobs, default_threshold=0.05, accept_regression=None,
                        forward_only=True)
    assert calls["moved"] == [] and calls["gate"] == []
    assert "latest stays at the newer 2026-07-01-v0.23.0-z" in capsys.readouterr().out
