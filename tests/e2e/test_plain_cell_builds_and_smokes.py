"""Plain serving end to end: a cell without speculative decoding, added to the real
matrix as a team would (its drafter `none`, a profile that extends the cpu one with
`methods: [none]`), builds on the cpu engine already built, and passes smoke with the
speculative check reported not applicable (and still run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from tests.support.cpu_build import TAG

pytestmark = pytest.mark.slow

PLAIN = (("      drafter: [ngram]\n      profile: [cpu-ngram]\n",
          "      drafter: [none, ngram]\n      profile: [cpu-plain, cpu-ngram]\n"
          "      exclude:\n        - {drafter: none, profile: cpu-ngram}\n"
          "        - {drafter: ngram, profile: cpu-plain}\n"),
         ("\nimages:\n", "\n  cpu-plain:\n    description: the tiny model served plainly\n"
                         "    extends: cpu-ngram\n    methods: [none]\n\nimages:\n"))
CELL = "cpu/cpu-tiny-none"


def _run(*args: str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "build.py", *args, "--tag", TAG, "--target", "cpu",
                           "--only", CELL, "--out", str(out)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=3000)


def test_a_plain_cell_builds_and_passes_smoke(cpu_serve_image, matrix_dir: Path,
                                              tmp_path: Path) -> None:
    path = matrix_dir / "matrix.yaml"
    text = path.read_text()
    for old, new in PLAIN:
        assert old in text
        text = text.replace(old, new)
    path.write_text(text)
    out = tmp_path / "build"
    build = _run("build", "--matrix", str(path), out=out)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    assert "engine" in build.stdout and "reused (same inputs)" in build.stdout
    smoke = _run("smoke", "--matrix", str(path), out=out)
    assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-3000:]
    (verdict_path,) = (out / "smoke").rglob("cpu-tiny-none/verdict.json")
    verdict = json.loads(verdict_path.read_text())
    assert verdict["passed"] and not verdict["missing"], verdict["message"]
    assert verdict["not_applicable"]["speculative_decoding_fires"].startswith(
        "the cell serves without speculative decoding")
    assert verdict["checks"]["forced_tool_call_is_parsed"]["passed"]
    ref = verdict["image_ref"]
    cmd = json.loads(subprocess.run(
        ["/usr/bin/docker", "image", "inspect", "--format", "{{json .Config.Cmd}}", ref],
        capture_output=True, text=True, check=True).stdout)
    assert "--speculative-config" not in cmd and cmd[:3] == ["vllm", "serve", "/model"]
    # the release gates of a cell without a drafter: no boot of their own (smoke recorded
    # the requests), lossless not applicable, the long generation judged on its own
    gates = _run("gates", "--matrix", str(path), out=out)
    assert gates.returncode == 0, gates.stdout[-3000:] + gates.stderr[-3000:]
    doc = json.loads(verdict_path.with_name("gates.json").read_text())
    assert doc["summary"]["lossless"]["status"] == "not-applicable"
    assert doc["summary"]["long_generation"]["status"] == "pass", doc["summary"]
    assert [(r["what"], r["source"]) for r in doc["runs"]] == [("plain", "smoke's server")]
