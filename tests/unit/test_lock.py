"""`build.py lock` with the real huggingface_hub client against the recorded-Hub server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imagebuild.cli import main

ZLAB_SMALL_PAGE = "31977fbe13a86e8b961774f773058175676d89b8"
NVIDIA = "491c2f1ea524c639598bf8fa787a93fed5a6fbce"


@pytest.fixture
def online(hub_replay, hub_online_loopback, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub_replay.endpoint)
    return hub_replay


def _lock(matrix_dir: Path, *extra: str) -> int:
    return main(["lock", "--matrix", str(matrix_dir / "matrix.yaml"), *extra])


def test_lock_resolves_every_pin_deterministically(online, matrix_dir, capsys):
    assert _lock(matrix_dir) == 0
    first = (matrix_dir / "matrix.lock.json").read_text()
    data = json.loads(first)
    zlab = data["drafters"]["zlab"]
    assert zlab["sha"] == ZLAB_SMALL_PAGE and zlab["status"] == "resolved"
    assert any(f["lfs_sha256"] for f in zlab["files"])
    heretic = data["models"]["heretic"]
    assert heretic["track"] == "main" and len(heretic["sha"]) == 40
    assert data["models"]["nvfp4"]["sha"] == NVIDIA
    # small metadata of each pinned revision is stored for offline checks
    cfg = matrix_dir / "locked" / "z-lab/Qwen3.6-35B-A3B-DFlash" / ZLAB_SMALL_PAGE / "config.json"
    assert json.loads(cfg.read_text())["num_key_value_heads"] == 4
    assert (matrix_dir / "locked" / "nvidia/Qwen3.6-35B-A3B-NVFP4" / NVIDIA /
            "hf_quant_config.json").exists()
    assert data["engines"]["dflashfix"]["gb10"]["source"]["commit"].startswith("91df0fad")
    assert all(len(p["sha256"]) == 64 for p in data["engines"]["dflashfix"]["cpu"]["patches"])
    assert data["models"]["tiny"]["files"]  # generated model hashed file by file
    assert _lock(matrix_dir) == 0
    assert (matrix_dir / "matrix.lock.json").read_text() == first  # same bytes
    assert _lock(matrix_dir, "--check") == 0


def test_tracked_branch_only_moves_on_update(online, matrix_dir):
    assert _lock(matrix_dir) == 0
    lock = json.loads((matrix_dir / "matrix.lock.json").read_text())
    lock["models"]["heretic"]["sha"] = "0" * 40  # as if main moved on since
    (matrix_dir / "matrix.lock.json").write_text(json.dumps(lock))
    assert _lock(matrix_dir) == 0
    kept = json.loads((matrix_dir / "matrix.lock.json").read_text())["models"]["heretic"]
    assert kept["sha"] == "0" * 40
    assert _lock(matrix_dir, "--update", "heretic") == 0
    moved = json.loads((matrix_dir / "matrix.lock.json").read_text())["models"]["heretic"]
    assert moved["sha"] != "0" * 40


def test_revision_that_does_not_exist_exits_2(online, matrix_dir, capsys):
    path = matrix_dir / "matrix.yaml"
    path.write_text(path.read_text().replace(ZLAB_SMALL_PAGE, "deadbeef" * 5))
    assert _lock(matrix_dir) == 2
    err = capsys.readouterr().err
    assert "deadbeef" in err and "fix:" in err


def test_lock_that_disagrees_with_matrix_is_refused(online, matrix_dir, capsys):
    assert _lock(matrix_dir) == 0
    path = matrix_dir / "matrix.yaml"
    path.write_text(path.read_text().replace(
        "    repository: AEON-7/AEON-DFlash-Qwen3.6-35B-A3B\n    track: main",
        "    repository: AEON-7/AEON-DFlash-Qwen3.6-35B-A3B\n    track: dev"))
    assert _lock(matrix_dir, "--check") == 2
    err = capsys.readouterr().err
    assert "build.py lock --update aeon" in err
    assert "matrix.yaml:" in err


def test_offline_lock_records_known_shas_and_marks_the_rest(matrix_dir, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert _lock(matrix_dir) == 0
    data = json.loads((matrix_dir / "matrix.lock.json").read_text())
    zlab, aeon = data["drafters"]["zlab"], data["drafters"]["aeon"]
    assert zlab["status"] == "unresolved" and zlab["sha"] == ZLAB_SMALL_PAGE
    assert aeon["status"] == "unresolved" and aeon["sha"] is None  # never invented
    assert data["models"]["tiny"]["status"] == "resolved"  # cpu cells resolve offline
    # building a cell with unresolved pins refuses and names the command to run
    code = main(["build", "--matrix", str(matrix_dir / "matrix.yaml"), "--tag",
                 "2026-06-18-dflashfix", "--target", "gb10", "--only", "*heretic-aeon"])
    err = capsys.readouterr().err
    assert code == 2
    # one command resolves every pin the build needs (preflight/pins.py)
    assert "lock --update gb10 --update heretic --update aeon" in err
