"""SOURCE_DATE_EPOCH: where the build time comes from, and the build contexts' mtimes
clamped to it (docs/reproducibility.md)."""

from __future__ import annotations

import os
import subprocess

import pytest

from imagebuild.builder import timestamps
from imagebuild.errors import UserError


def test_the_environment_wins_and_a_bad_value_is_refused(tmp_path):
    assert timestamps.source_date_epoch(tmp_path, {"SOURCE_DATE_EPOCH": "1700000000"}) \
        == 1700000000
    with pytest.raises(UserError) as info:
        timestamps.source_date_epoch(tmp_path, {"SOURCE_DATE_EPOCH": "2026-12-01"})
    assert info.value.exit_code == 2
    assert "SOURCE_DATE_EPOCH='2026-12-01'" in info.value.message
    assert "git log -1 --format=%ct" in info.value.fix


def test_else_the_commit_time_of_the_checkout(tmp_path):
    assert timestamps.source_date_epoch(tmp_path, {}) is None  # not a checkout
    env = {**os.environ, "GIT_AUTHOR_DATE": "@1750000000 +0000",
           "GIT_COMMITTER_DATE": "@1760000000 +0000", "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, env=env)
    subprocess.run(["git", "-C", str(tmp_path), "commit", "-q", "--allow-empty", "-m", "x"],
                   check=True, env=env)
    assert timestamps.source_date_epoch(tmp_path, {}) == 1760000000  # the commit's time


def test_clamp_tree_sets_what_is_newer_and_keeps_what_is_older(tmp_path):
    (tmp_path / "model").mkdir()
    new, old = tmp_path / "model" / "config.json", tmp_path / "old.txt"
    new.write_text("{}")
    old.write_text("x")
    os.utime(old, (1000, 1000))
    (tmp_path / "link").symlink_to("model/config.json")
    changed = timestamps.clamp_tree(tmp_path, 1_700_000_000)
    assert changed == 4  # root, model/, config.json, the link itself (not its target twice)
    assert new.stat().st_mtime == 1_700_000_000
    assert (tmp_path / "model").stat().st_mtime == 1_700_000_000
    assert (tmp_path / "link").lstat().st_mtime == 1_700_000_000
    assert old.stat().st_mtime == 1000


def test_the_config_epoch_needs_docker_23():
    assert not timestamps.supports_config_epoch("20.10.24")
    assert timestamps.supports_config_epoch("23.0.1")
    assert timestamps.supports_config_epoch("27.5.1")
    assert not timestamps.supports_config_epoch("unknown")
