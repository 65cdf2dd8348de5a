"""`pins watch` with the real huggingface_hub client against the recorded-Hub server.

The recordings' z-lab `main` is the retrained drafter (8 KV heads, sliding window 4096);
the pin is the small-page commit 31977fbe. The watch must say the new head fails preflight
with the page-size assert, name the rule and the pin to keep.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imagebuild import cli
from imagebuild.cli import main
from imagebuild.lock.hub import HubClient
from imagebuild.lock.lockfile import read_lock
from imagebuild.pinwatch import watch, write_issue_files
from imagebuild.spec import matrix as mx

ZLAB_SMALL_PAGE = "31977fbe13a86e8b961774f773058175676d89b8"
ZLAB_RETRAINED = "fa6ed3e5c0476db4d4a45dfaf0a230d3f2acc3a8"  # the recordings' main


@pytest.fixture
def locked(hub_replay, hub_online_loopback, monkeypatch, matrix_dir: Path):
    """matrix_dir with every pin resolved against the replay (as `lock` does online)."""
    monkeypatch.setenv("HF_ENDPOINT", hub_replay.endpoint)
    assert main(["lock", "--matrix", str(matrix_dir / "matrix.yaml")]) == 0
    return matrix_dir


def _watch(matrix_dir: Path, endpoint: str):
    lm = mx.load(matrix_dir / "matrix.yaml")
    return {(r.kind, r.name): r for r in watch(lm, read_lock(lm.root),
                                               HubClient(endpoint=endpoint))}


def test_retrained_drafter_head_fails_with_page_size_assert(locked, hub_replay):
    reports = _watch(locked, hub_replay.endpoint)
    z = reports[("drafters", "zlab")]
    assert (z.locked, z.head, z.branch) == (ZLAB_SMALL_PAGE, ZLAB_RETRAINED, "main")
    assert z.verdict == "fails" and z.rule == "kv-page-unify"
    assert z.keep == ZLAB_SMALL_PAGE
    assert z.headline.startswith(
        f"new head {ZLAB_RETRAINED[:12]} fails preflight: page-size assert (kv-page-unify)")
    assert f"keep the pin {ZLAB_SMALL_PAGE}" in z.headline
    # stock vLLM (pr41703) asserts; the dflashfix engine pads instead: both are reported
    unify = [f for f in z.findings if f.rule == "kv-page-unify"]
    assert unify and all("@pr41703" in f.cell for f in unify)
    assert any(f.rule == "kv-page-padding" and "@dflashfix" in f.cell for f in z.findings)
    # the repository's lock and locked/ are untouched: the head lived in a scratch dir
    assert json.loads((locked / "matrix.lock.json").read_text())["drafters"]["zlab"][
        "sha"] == ZLAB_SMALL_PAGE
    assert not (locked / "locked" / "z-lab/Qwen3.6-35B-A3B-DFlash" / ZLAB_RETRAINED).exists()


def test_unmoved_pins_are_current_and_get_no_issue(locked, hub_replay, tmp_path):
    reports = _watch(locked, hub_replay.endpoint)
    # tracked branches were just locked at their heads; nvidia's main is its pinned commit
    for key in (("models", "heretic"), ("models", "ornith"), ("drafters", "aeon"),
                ("models", "nvfp4")):
        assert reports[key].verdict == "current", reports[key].headline
    written = write_issue_files(list(reports.values()), tmp_path / "issues")
    assert [p.name for p in written] == ["drafters-zlab.md"]
    body = written[0].read_text()
    assert "fails preflight: page-size assert" in body and f"`{ZLAB_SMALL_PAGE}`" in body
    assert (tmp_path / "issues" / "drafters-zlab.title").read_text().strip() == (
        "pins watch: drafter zlab (z-lab/Qwen3.6-35B-A3B-DFlash)")


def test_head_that_keeps_the_small_page_layout_passes(locked, hub_replay):
    """A tracked drafter whose head moved to a layout that fits (AEON: full attention,
    small pages) is reported as passing, with how to move the pin."""
    lock = json.loads((locked / "matrix.lock.json").read_text())
    lock["drafters"]["aeon"]["sha"] = "0" * 40  # as if main moved on since the lock
    (locked / "matrix.lock.json").write_text(json.dumps(lock))
    aeon = _watch(locked, hub_replay.endpoint)[("drafters", "aeon")]
    assert aeon.verdict == "passes", aeon.headline
    assert aeon.keep is None and aeon.cells
    assert "lock --update aeon" in aeon.markdown()


def test_cli_json_and_issue_dir(locked, hub_replay, tmp_path, capsys, monkeypatch):
    out = tmp_path / "pins"
    # the engines' index: one on disk without newer releases (tests/unit/test_enginewatch.py)
    from imagebuild import enginewatch

    monkeypatch.setattr(enginewatch, "index_urls", lambda _: ((tmp_path / "index").as_uri(),))
    from imagebuild.cliparser import parser

    args = parser().parse_args(["pins", "watch", "--matrix", str(locked / "matrix.yaml"),
                          "--format", "json", "--out", str(out)])
    assert cli.cmd_pins(args) == 0
    data = json.loads(capsys.readouterr().out)
    z = next(p for p in data["pins"] if p["name"] == "zlab")
    assert z["verdict"] == "fails" and z["keep"] == ZLAB_SMALL_PAGE
    assert z["rule"] == "kv-page-unify" and "page-size assert" in z["headline"]
    assert (out / "drafters-zlab.md").exists()


def test_unreachable_hub_is_reported_per_pin(matrix_dir, hub_online_loopback):
    lm = mx.load(matrix_dir / "matrix.yaml")
    reports = watch(lm, read_lock(lm.root), HubClient(endpoint="http://127.0.0.1:9",
                                                      timeout=2))
    assert reports and all(r.verdict == "unreachable" and r.head is None for r in reports)
    assert all(not r.moved for r in reports)
