"""A patch that does not apply stops the engine build with one line naming it, exit 1,
and moves no tag (the serve image's release tag keeps pointing where it did)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from imagebuild import REPO_ROOT

# it checks that the engine's images did not change while it built: no test of the other lane
# builds meanwhile (tests/support/lanes.py)
pytestmark = [pytest.mark.slow, pytest.mark.alone]
TAG = "2026-06-18-dflashfix"
REF = "127.0.0.1:5000/vllm-spark/cpu-tiny-ngram:2026-06-18-v0.23.0-dflashfix"


def _image_id(ref: str) -> str:
    return subprocess.run(["/usr/bin/docker", "image", "inspect", "-f", "{{.Id}}", ref],
                          capture_output=True, text=True).stdout.strip()


def test_patch_that_does_not_apply_names_itself_and_tags_nothing(docker_engine, matrix_dir,
                                                                   tmp_path):
    good = (matrix_dir / "patches" / "cpu-ngram-fp64-gumbel.patch").read_text()
    # same hunk, but its context no longer matches vLLM 0.23.0's file
    bad = good.replace("     NO_DRAFT_PROBS=False,\n", "     NO_DRAFT_PROBS=True,\n", 1)
    assert bad != good
    (matrix_dir / "patches" / "stale-fix.patch").write_text(bad)
    path = matrix_dir / "matrix.yaml"
    path.write_text(path.read_text().replace(
        "          - kv-page-size-pad-mamba.patch\n          - cpu-ngram-fp64-gumbel.patch",
        "          - kv-page-size-pad-mamba.patch\n          - stale-fix.patch", 1))
    env = {"HF_HUB_OFFLINE": "1"}
    lock = subprocess.run([sys.executable, "build.py", "lock", "--matrix", str(path)],
                          cwd=REPO_ROOT, capture_output=True, text=True,
                          env={**os.environ, **env})
    assert lock.returncode == 0, lock.stderr
    before = _image_id(REF)
    engines_before = subprocess.run(
        ["/usr/bin/docker", "image", "ls", "-q", "imagebuild/engine-cpu-dflashfix"],
        capture_output=True, text=True).stdout.split()
    proc = subprocess.run(
        [sys.executable, "build.py", "build", "--matrix", str(path), "--tag", TAG,
         "--target", "cpu", "--out", str(tmp_path / "out")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "stale-fix.patch" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert _image_id(REF) == before  # the release tag did not move (or appear)
    engines_after = subprocess.run(
        ["/usr/bin/docker", "image", "ls", "-q", "imagebuild/engine-cpu-dflashfix"],
        capture_output=True, text=True).stdout.split()
    assert sorted(engines_after) == sorted(engines_before)
