"""The gate runs for every cell before any latest moves; the whole job never moves latest
backwards; per-target thresholds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from imagebuild.errors import UserError
from imagebuild.release import promotion


def _cell(threshold=None):
    """A cell whose target's bench settings override the threshold (None: the global)."""
    return SimpleNamespace(target=SimpleNamespace(
        bench=SimpleNamespace(regression_threshold=threshold)))


LM = SimpleNamespace(matrix=SimpleNamespace(publish=SimpleNamespace(regression_threshold=0.05)))
ROWS = [{"repository": "127.0.0.1:5000/vllm-spark/a", "release_tag": "2026-06-18-v0.23.0-x"},
        {"repository": "127.0.0.1:5000/vllm-spark/b", "release_tag": "2026-06-18-v0.23.0-x"}]


@pytest.fixture
def calls(monkeypatch):
    seen: dict[str, list] = {"gate": [], "moved": []}

    def gate(client, repo, tag, *, threshold, accept_regression):
        seen["gate"].append((repo, threshold))
        if repo.endswith("/b") and not accept_regression:
            raise UserError(f"{repo}: slower than latest", fix="--accept-regression")

    monkeypatch.setattr(promotion, "check_promotion", gate)
    monkeypatch.setattr(promotion, "set_latest",
                        lambda client, repo, tag, **kw: seen["moved"].append(repo))
    monkeypatch.setattr(promotion, "latest_release",
                        lambda client, repo: (None, "2026-06-11-v0.23.0-y"))
    return seen


def test_a_refused_cell_moves_no_latest_at_all(calls):
    with pytest.raises(UserError, match="slower than latest"):
        promotion.promote_rows(LM, None, [_cell(), _cell(0.25)], ROWS, accept_regression=None)
    assert calls["moved"] == []  # cell a passed its gate, but b's refusal stops both
    assert calls["gate"] == [("vllm-spark/a", 0.05), ("vllm-spark/b", 0.25)]


def test_with_a_reason_every_cell_moves(calls):
    promotion.promote_rows(LM, None, [_cell(), _cell()], ROWS, accept_regression="known")
    assert calls["moved"] == ["vllm-spark/a", "vllm-spark/b"]


def test_the_whole_job_leaves_a_newer_latest_alone(calls, monkeypatch, capsys):
    monkeypatch.setattr(promotion, "latest_release",
                        lambda client, repo: (None, "2026-07-01-v0.23.0-z"))
    promotion.promote_rows(LM, None, [_cell(), _cell()], ROWS, accept_regression=None,
                           forward_only=True)
    assert calls["moved"] == [] and calls["gate"] == []
    assert "latest stays at the newer 2026-07-01-v0.23.0-z" in capsys.readouterr().out
