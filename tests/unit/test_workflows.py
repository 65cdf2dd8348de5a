"""The GitHub workflows: the release matrix is the plan, promote needs every passing cell, and
the security rules of issue 7 hold in every workflow (read from the YAML, not assumed)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from imagebuild import REPO_ROOT
from imagebuild.cli import main

WORKFLOWS = REPO_ROOT / ".github" / "workflows"
TAG = "2026-06-18-dflashfix"
FULL_SHA_PIN = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}$")
GB10_RUNNER = ["self-hosted", "linux", "ARM64", "gb10"]


def load(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((WORKFLOWS / name).read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    return doc


def all_workflows() -> dict[str, dict[str, Any]]:
    return {p.name: load(p.name) for p in sorted(WORKFLOWS.glob("*.yml"))}


def violations(wf: dict[str, Any]) -> list[str]:
    """Issue 7's security rules, as data checks on one parsed workflow."""
    out = []
    triggers = wf["on"] if isinstance(wf["on"], dict) else {t: None for t in
                                                            ([wf["on"]] if isinstance(
                                                                wf["on"], str) else wf["on"])}
    if "pull_request_target" in triggers or "workflow_run" in triggers:
        out.append("privileged trigger")
    if wf.get("permissions") != {}:
        out.append("top-level permissions are not {}")
    untrusted = "pull_request" in triggers or (
        "push" in triggers and not set(triggers["push"] or {}) <= {"tags"})
    for jname, job in wf["jobs"].items():
        runs_on = json.dumps(job.get("runs-on"))
        if untrusted and ("self-hosted" in runs_on or "matrix." in runs_on):
            out.append(f"{jname}: self-hosted runner reachable from a branch push or PR")
        if "permissions" not in job:
            out.append(f"{jname}: no job permissions")
        if "secrets." in json.dumps(job.get("env", {})):
            out.append(f"{jname}: secret in job env")
        for step in job.get("steps", []):
            uses = step.get("uses")
            if uses and not FULL_SHA_PIN.match(uses):
                out.append(f"{jname}: {uses} not pinned to a commit")
            run = step.get("run", "")
            if "${{" in run:
                out.append(f"{jname}: expression inside run: {run!r}")
            if run and not re.match(r"(make |\.venv/bin/python build\.py )", run.strip()):
                out.append(f"{jname}: step is not thin: {run!r}")
            if "secrets." in json.dumps(step.get("with", {})):
                out.append(f"{jname}: secret passed to an action")
            if step.get("continue-on-error"):
                out.append(f"{jname}: continue-on-error")
    if "secrets." in json.dumps(wf.get("env", {})):
        out.append("secret in workflow env")
    return out


@pytest.mark.parametrize("name", ["ci.yml", "release.yml", "rollback.yml", "pins.yml"])
def test_workflow_follows_the_security_rules(name):
    assert violations(load(name)) == []


def test_the_checker_catches_what_it_looks_for():
    bad = yaml.safe_load("""
on: {pull_request_target: {}, push: {branches: [main]}}
permissions: write-all
env: {T: "${{ secrets.X }}"}
jobs:
  b:
    runs-on: [self-hosted, gb10]
    steps:
      - uses: actions/checkout@v4
      - run: echo "${{ github.event.pull_request.title }}"
        continue-on-error: true
""")
    bad["on"] = bad.pop(True)
    found = "\n".join(violations(bad))
    for what in ("privileged trigger", "top-level permissions", "self-hosted runner",
                 "no job permissions", "not pinned", "expression inside run", "not thin",
                 "continue-on-error", "secret in workflow env"):
        assert what in found


def test_least_privilege_per_job():
    writes: dict[tuple[str, str], dict[str, str]] = {}
    for name, wf in all_workflows().items():
        for jname, job in wf["jobs"].items():
            perms = {k: v for k, v in (job.get("permissions") or {}).items() if v == "write"}
            if perms:
                writes[(name, jname)] = perms
            runs = " ".join(s.get("run", "") for s in job.get("steps", []))
            if perms.get("packages"):  # only jobs that write to the registry
                assert re.search(r"build\.py publish|build\.py promote|make rollback", runs)
            if perms.get("contents"):  # only the job that creates the GitHub release
                assert "make github-release" in runs
    assert writes == {
        ("release.yml", "cell"): {"packages": "write"},
        ("release.yml", "promote"): {"contents": "write", "packages": "write"},
        ("rollback.yml", "rollback"): {"packages": "write"},
        ("pins.yml", "watch"): {"issues": "write"},
    }


def test_self_hosted_jobs_only_on_tags_and_dispatch():
    wf = load("release.yml")
    assert set(wf["on"]) == {"push", "workflow_dispatch"}
    assert set(wf["on"]["push"]) == {"tags"}
    assert "startsWith(github.ref, 'refs/tags/')" in wf["jobs"]["plan"]["if"]
    ci = load("ci.yml")
    assert all("self-hosted" not in json.dumps(j["runs-on"]) for j in ci["jobs"].values())


def test_release_concurrency_never_cancels():
    for name in ("release.yml", "rollback.yml", "pins.yml"):
        conc = load(name)["concurrency"]
        assert conc["cancel-in-progress"] is False, name
    assert "inputs.tag || github.ref_name" in load("release.yml")["concurrency"]["group"]


def test_release_matrix_is_the_plan_of_the_tag(capsys):
    wf = load("release.yml")
    plan, cell = wf["jobs"]["plan"], wf["jobs"]["cell"]
    # no hand-written matrix: the whole strategy.matrix is the plan job's output
    assert cell["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert cell["needs"] == "plan" and cell["runs-on"] == "${{ matrix.runner }}"
    assert plan["outputs"]["matrix"] == "${{ steps.plan.outputs.matrix }}"
    step = next(s for s in plan["steps"] if s.get("id") == "plan")
    assert step["run"].startswith("make release-matrix")
    # every job builds the tagged release's tree
    for job in (plan, cell, wf["jobs"]["promote"]):
        checkout = next(s for s in job["steps"] if "actions/checkout" in s.get("uses", ""))
        assert checkout["with"]["ref"] == "${{ env.RELEASE_TAG }}"
    assert wf["env"]["RELEASE_TAG"] == "${{ inputs.tag || github.ref_name }}"
    # what that step prints is exactly `build.py plan --format github` of the tag
    env = {**os.environ, "RELEASE_TAG": TAG, "PY": str(REPO_ROOT / ".venv/bin/python")}
    env.pop("IMAGEBUILD_TARGET", None)
    out = subprocess.run(["make", "-s", "release-matrix"], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout
    key, _, value = out.strip().partition("=")
    assert key == "matrix" and "\n" not in value
    capsys.readouterr()
    assert main(["plan", "--tag", TAG, "--target", "gb10", "--format", "github"]) == 0
    assert json.loads(value) == json.loads(capsys.readouterr().out)
    include = json.loads(value)["include"]
    assert include and all(c["runner"] == GB10_RUNNER for c in include)
    assert len({c["image"] for c in include}) == len(include)  # artifact names are unique


def test_promote_runs_only_when_every_cell_passed():
    wf = load("release.yml")
    promote, cell = wf["jobs"]["promote"], wf["jobs"]["cell"]
    assert set(promote["needs"]) == {"plan", "cell"}
    # the default `success()` condition: a failed, cancelled or skipped cell stops it
    assert "if" not in promote
    assert not cell.get("continue-on-error")
    assert all(not s.get("continue-on-error") for s in cell["steps"])
    # cells push without moving latest; promote moves it, last
    runs = [s.get("run", "") for s in cell["steps"]]
    assert any("build.py publish" in r and "--no-latest" in r for r in runs)
    order = [s.get("run", s.get("uses", "")) for s in promote["steps"]]
    moves = next(i for i, r in enumerate(order) if "build.py promote" in r)
    release = next(i for i, r in enumerate(order) if "github-release" in r)
    assert moves < release
    # artifacts are kept for failed cells too (the only `always()` in the workflow)
    upload = next(s for s in cell["steps"] if "upload-artifact" in s.get("uses", ""))
    assert upload["if"] == "always()"
    assert "always()" not in json.dumps({k: v for k, v in wf["jobs"].items() if k != "cell"})


def test_lint_workflows_script():
    """actionlint and zizmor (from requirements-dev.txt) pass on every workflow."""
    venv = REPO_ROOT / ".venv" / "bin"
    tools = {"ACTIONLINT": os.environ.get("ACTIONLINT", str(venv / "actionlint")),
             "ZIZMOR": os.environ.get("ZIZMOR", str(venv / "zizmor"))}
    missing = [t for t in tools.values() if not shutil.which(t)]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"workflow linters missing in CI: {missing}")
        pytest.skip(f"workflow linters not installed: {missing}")
    proc = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "lint-workflows.sh")],
                          env={**os.environ, **tools}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 workflow(s) clean" in proc.stdout
