"""A cell over several machines goes to a runner that drives its partners (a `pair` for
two Sparks): the plan's runner labels, the workflow step that checks the partners first,
and what that step says when the runner names none (docs/release-workflow.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from imagebuild import REPO_ROOT
from imagebuild.spec import hardware
from imagebuild.spec.matrix import load
from tests.unit.test_workflows import load as load_workflow

PAIR = REPO_ROOT / "examples" / "two-spark-tp2" / "matrix.yaml"


def _plan(matrix, tag: str, target: str) -> list[dict]:
    out = subprocess.run([sys.executable, "build.py", "plan", "--tag", tag, "--target", target,
                          "--format", "github", "--matrix", str(matrix)], cwd=REPO_ROOT,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["include"]


def test_a_two_spark_cell_runs_on_a_pair_runner():
    (entry,) = _plan(PAIR, "2026-06-18-spark", "gb10")
    assert entry["runner"] == ["self-hosted", "linux", "ARM64", "gb10", "pair"]
    assert entry["nodes"] == 2


def test_single_node_and_hosted_cells_keep_their_targets_labels(tmp_path):
    from tests.support.multinode import cpu_two_nodes

    for entry in _plan(REPO_ROOT / "matrix.yaml", "2026-06-18-dflashfix", "all"):
        assert entry["nodes"] == 1 and "pair" not in entry["runner"]
    # a hosted runner takes no custom label: the cpu cell's two nodes share its machine
    two = _plan(cpu_two_nodes(tmp_path), "2026-06-18-dflashfix", "cpu")
    assert [(e["runner"], e["nodes"]) for e in two if e["image"] == "cpu-tiny-ngram"] == [
        (["ubuntu-24.04"], 2)]


def test_more_than_two_nodes_get_a_label_of_their_own():
    gb10 = load(PAIR).matrix.targets["gb10"]
    assert hardware.cell_runner(gb10, 4)[-1] == "nodes-4"
    assert hardware.cell_runner(gb10, 1) == hardware.runner(gb10)


def test_the_cell_job_checks_the_partners_before_smoke():
    steps = load_workflow("release.yml")["jobs"]["cell"]["steps"]
    names = [s.get("name") for s in steps]
    check = steps[names.index("Partner nodes answer (Docker over SSH)")]
    assert names.index(check["name"]) < names.index("Smoke")
    assert check["run"] == "make partners-check"
    assert "matrix.nodes > 1" in check["if"] and "self-hosted" in check["if"]
    # whenever a step serving the cell on every node runs, the partners were checked: a
    # resumed cell (tested, not benched) serves them in its bench
    serving = [s for s in steps if s.get("name") in (
        "Smoke", "Release gates (lossless speculative decoding, long generation)")
        or str(s.get("name", "")).startswith("Bench")]
    assert len(serving) == 3
    for step in serving:
        assert step["if"] in check["if"], (step["name"], step["if"])


def test_a_pair_runner_without_partners_is_told_what_to_set():
    env = {k: v for k, v in os.environ.items()
           if k not in ("IMAGEBUILD_PARTNERS", "IMAGEBUILD_MASTER_ADDR")}
    proc = subprocess.run(["make", "-s", "partners-check"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert "IMAGEBUILD_PARTNERS (ssh://user@host, one per worker node" in proc.stderr
    assert "IMAGEBUILD_MASTER_ADDR" in proc.stderr and "docs/release-workflow.md" in proc.stderr
