"""Issue 32: release.yml as GitHub (not act) runs it, read from the YAML and run through
its Makefile targets: where the attestation push finds its login, which attest release
signs, what the repository's plan and visibility allow, one approval per run, queues that
drop nothing, the runner's tools, the Latest badge, the schedule kept alive, signing away
from the code a cell runs, and a dispatch against another Makefile."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from imagebuild import REPO_ROOT
from tests.unit.test_workflows import (
    CAN_GUARD,
    GH_STANDIN,
    MAKEFILE,
    WORKFLOWS,
    _gh_env,
    _git,
    _make,
    checkout_of,
    load,
    needs,
    step_index,
    upstream,
)

ATTEST = "actions/attest@"
# actions/attest commit -> (tag, @sigstore/oci it bundles), read from its package-lock.json
# at that commit (fetched from github:actions/attest): 0.6.0 matches auths keys by
# substring, 0.7.1+ exactly
ATTEST_RELEASES = {"59d89421af93a897026c735860bf21b6eb4f7b26": ("v4.1.0", "0.6.0"),
                   "a1948c3f048ba23858d222213b7c278aabede763": ("v4.1.1", "0.7.1"),
                   "1e69f48acb82d1966a394da916b4c1698aa569d6": ("v4.2.2", "0.7.2")}


def _steps(job: str) -> list[dict]:
    return load("release.yml")["jobs"][job]["steps"]


# --- 1, 2: the login where @sigstore/oci reads it; an attest that matches exactly --------

def test_the_attestation_push_finds_the_jobs_login_in_the_jobs_home(tmp_path):
    """@sigstore/oci reads $HOME/.docker/config.json only. The sign job's attest steps get
    the job's home as HOME, and registry-login writes the registry's entry exactly there
    (no credential helper), which DOCKER_CONFIG names too: the stand-in's 0.7.2 lookup,
    run with that HOME, finds it; with the runner's HOME it finds nothing."""
    sys.path.insert(0, str(REPO_ROOT / ".github/act-standins/lib"))
    import oci_credentials

    sign = _steps("sign")
    attests = [s for s in sign if ATTEST in s.get("uses", "")]
    assert len(attests) == 2
    for s in attests:
        assert s["env"] == {"HOME": "${{ env.IMAGEBUILD_JOB_HOME }}"}, s["name"]
        assert s["with"]["push-to-registry"] is True
    order = [s.get("run", s.get("uses", "")) for s in sign]
    assert order.index('make -s job-env >> "$GITHUB_ENV"') < order.index("make registry-login") \
        < min(i for i, o in enumerate(order) if ATTEST in o)
    runner_home = tmp_path / "runner-home"
    runner_home.mkdir()
    env = {"RUNNER_TEMP": str(tmp_path), "GITHUB_RUN_ID": "9", "GITHUB_JOB": "sign",
           "GITHUB_REPOSITORY_OWNER": "Org", "HOME": str(runner_home)}
    job = dict(line.split("=", 1) for line in _make("job-env", tmp_path, **env).stdout.split())
    assert job["DOCKER_CONFIG"] == job["IMAGEBUILD_JOB_HOME"] + "/.docker"
    proc = _make("registry-login", tmp_path, **env, **job, IMAGEBUILD_REGISTRY="ghcr.io",
                 IMAGEBUILD_REGISTRY_USER="bot", IMAGEBUILD_REGISTRY_PASSWORD="s3:cr:et")
    assert proc.returncode == 0, proc.stderr
    config = Path(job["IMAGEBUILD_JOB_HOME"]) / ".docker" / "config.json"
    assert oct(config.stat().st_mode & 0o777) == "0o600"
    assert list(json.loads(config.read_text())["auths"]) == ["ghcr.io"]
    got = oci_credentials.get_registry_credentials("ghcr.io/org/img",
                                                   home=job["IMAGEBUILD_JOB_HOME"])
    assert (got.username, got.password) == ("bot", "s3:cr:et")
    with pytest.raises(oci_credentials.CredentialsError, match="No credential file"):
        oci_credentials.get_registry_credentials("ghcr.io/org/img", home=str(runner_home))
    assert not (runner_home / ".docker").exists()  # the runner user's home is untouched


def test_attestations_use_an_attest_release_that_matches_logins_exactly():
    """attest-build-provenance/attest-sbom v4.1.0 run actions/attest v4.1.0, which bundles
    @sigstore/oci 0.6.0 (credentials for `mirror-ghcr.io.example.net` sent to ghcr.io).
    Every attestation step is actions/attest at a commit whose @sigstore/oci is 0.7.1+,
    named in its comment; Dependabot moves the pins (actions and pip)."""
    text = (WORKFLOWS / "release.yml").read_text()
    assert "attest-build-provenance" not in text and "attest-sbom" not in text
    pins = re.findall(r"uses: actions/attest@([0-9a-f]{40})\s+# (v[\d.]+)", text)
    assert len(pins) == 2
    for sha, comment in pins:
        tag, oci = ATTEST_RELEASES[sha]
        assert comment == tag and tuple(map(int, oci.split("."))) >= (0, 7, 1), (sha, oci)
    from tools.rehearse_release.act import STANDIN_OF

    assert STANDIN_OF["actions/attest"] in {s for s, _ in pins}  # the stand-in's code
    bot = yaml.safe_load((REPO_ROOT / ".github/dependabot.yml").read_text())
    assert {u["package-ecosystem"] for u in bot["updates"]} >= {"github-actions", "pip"}
    assert all(u["directory"] == "/" for u in bot["updates"])


# --- 3: what the repository's plan and visibility allow, refused first ------------------

def _can(visibility: str, owner: str = "Organization",
         plan: str = "") -> subprocess.CompletedProcess[str]:
    step = next(s for s in _steps("plan") if s.get("name") == CAN_GUARD)
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                           step["run"]],
                          env={"PATH": os.environ["PATH"], "VISIBILITY": visibility,
                               "OWNER_TYPE": owner, "GITHUB_PLAN": plan},
                          capture_output=True, text=True, timeout=10)


@pytest.mark.parametrize("visibility,owner,plan,ok,says", [
    ("public", "Organization", "", True, "self-hosted runners serve it only"),
    ("public", "User", "free", True, "GitHub advises against"),
    ("private", "Organization", "", False, "only on GitHub Enterprise Cloud"),
    ("private", "Organization", "team", False, "IMAGEBUILD_GITHUB_PLAN=enterprise"),
    ("private", "Organization", "Enterprise", True, ""),
    ("private", "User", "enterprise", False, "personal account"),
    ("private", "User", "pro", False, "personal account"),
    ("internal", "Organization", "", True, ""),
    ("", "Organization", "", False, "no repository visibility"),
    ("public", "Organization", "gold", False, "one of free, pro, team, enterprise"),
])
def test_the_plan_refuses_what_the_repository_cannot_do(visibility, owner, plan, ok, says):
    proc = _can(visibility, owner, plan)
    assert (proc.returncode == 0) is ok, proc.stderr
    assert says in proc.stdout + proc.stderr


def test_the_refusal_comes_before_anything_is_checked_out_or_built():
    wf = load("release.yml")
    plan = wf["jobs"]["plan"]
    guard = step_index(plan, lambda s: s.get("name") == CAN_GUARD)
    assert guard == 0
    assert plan["steps"][guard]["env"] == {
        "VISIBILITY": "${{ github.event.repository.visibility }}",
        "OWNER_TYPE": "${{ github.event.repository.owner.type }}",
        "GITHUB_PLAN": "${{ vars.IMAGEBUILD_GITHUB_PLAN }}"}
    assert "${{" not in plan["steps"][guard]["run"]
    jobs = wf["jobs"]
    assert all("plan" in upstream(jobs, j) for j in jobs if j != "plan")


# --- 4, 5, 6: one approval; queues that drop nothing ------------------------------------

def test_one_approval_per_run_and_none_for_the_report():
    jobs = load("release.yml")["jobs"]
    envs = {n: j.get("environment") for n, j in jobs.items()}
    assert [n for n, e in envs.items() if e == "release"] == ["approve"]
    assert jobs["approve"]["needs"] == "plan" and jobs["approve"]["permissions"] == {}
    for name in ("engine", "cell", "sign", "promote"):
        assert "approve" in upstream(jobs, name), name
        assert envs[name] == "release-secrets", name  # the secrets, no second wait
        assert "needs.approve.result == 'success'" in jobs[name].get("if", "") or \
            "approve" in needs(jobs[name]) and name in ("engine", "sign"), name
    # the report of a failed release never waits for reviewers of its own
    assert "approve" not in needs(jobs["not-promoted"]) and envs["not-promoted"] != "release"
    rollback = load("rollback.yml")["jobs"]["rollback"]
    assert rollback["environment"] == "release"  # its only job: one approval
    secrets = {m for j in jobs.values() for m in re.findall(r"secrets\.(\w+)", json.dumps(j))}
    assert secrets and "secrets." not in json.dumps(jobs["approve"])


def test_a_dispatch_for_one_target_waits_for_no_other_target_and_nothing_queued_is_dropped():
    wf = load("release.yml")
    conc = wf["concurrency"]
    assert conc == {"group": "release-${{ inputs.tag || github.ref_name }}-"
                             "${{ inputs.target || 'all' }}",
                    "cancel-in-progress": False, "queue": "max"}
    for job in (wf["jobs"]["promote"], load("rollback.yml")["jobs"]["rollback"]):
        assert job["concurrency"]["queue"] == "max"  # a waiting move of latest is kept


# --- 8, 9: what a runner keeps; what it must have -----------------------------------------

def test_the_docs_say_what_an_ephemeral_bare_metal_runner_keeps():
    text = (REPO_ROOT / "docs/release-workflow.md").read_text()
    section = text.split("## Securing the GB10 runners")[1]
    assert "never meets the next job" not in section
    for kept in ("Docker engine", "BuildKit's cache", "IMAGEBUILD_VENV", "~/.docker",
                 "root"):
        assert kept in section, kept
    assert "make job-clean" in section


def _fake_tools(tmp_path: Path, **versions: str) -> Path:
    """git, make (the real ones), and python3 / docker answering as told."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("git", "make", "bash", "sh", "env", "cat", "sed", "awk", "rm", "mkdir"):
        real = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True,
                              text=True).stdout.strip()
        if real and tool not in versions.get("missing", ""):
            (bin_ / tool).symlink_to(real)
    py = versions.get("python", "3.11")
    (bin_ / "python3").write_text(
        "#!/bin/bash\n"
        f"case \"$*\" in *'import venv'*) {versions.get('venv', 'exit 0')};; "
        f"*) echo {py};; esac\n")
    (bin_ / "docker").write_text(f"#!/bin/bash\necho {versions.get('docker', '28.1.1')}\n")
    for f in ("python3", "docker"):
        (bin_ / f).chmod(0o755)
    return bin_


@pytest.mark.parametrize("tools,ok,says", [
    ({}, True, "runner-check: git, make, Python 3.11 with venv, Docker 28.1.1"),
    ({"python": "3.12"}, False, "python3 is 3.12, the jobs run 3.11"),
    ({"venv": "exit 1"}, False, "apt-get install python3-venv"),
    ({"docker": "20.10.24"}, False, "Docker Engine 20.10.24: the release needs 23+"),
    ({"missing": "git"}, False, "this runner lacks: git"),
])
def test_runner_check_stops_a_job_before_hours_of_build(tmp_path, tools, ok, says):
    bin_ = _fake_tools(tmp_path, **tools)
    proc = subprocess.run([str(bin_ / "make"), "-s", "-f", str(MAKEFILE), "runner-check"],
                          cwd=tmp_path, env={"PATH": str(bin_)}, capture_output=True,
                          text=True, timeout=30)
    assert (proc.returncode == 0) is ok, proc.stdout + proc.stderr
    assert says in proc.stdout + proc.stderr


def test_runner_check_accepts_the_docker_its_owner_vouches_for(tmp_path):
    bin_ = _fake_tools(tmp_path, docker="20.10.24")
    proc = subprocess.run([str(bin_ / "make"), "-s", "-f", str(MAKEFILE), "runner-check"],
                          cwd=tmp_path, env={"PATH": str(bin_),
                                             "IMAGEBUILD_RUNNER_DOCKER": "20.10.24"},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_self_hosted_jobs_check_the_runner_first_and_run_python_3_11():
    """Engine and cell run on the target's runners: runner-check before the venv, and
    setup-python 3.11 as every job that makes a venv; no job on them runs gh (the
    attestation verify moved to the hosted sign job)."""
    for name, wf in (("release.yml", load("release.yml")), ("rollback.yml", load("rollback.yml")),
                     ("pins.yml", load("pins.yml")), ("ci.yml", load("ci.yml"))):
        for jname, job in wf["jobs"].items():
            runs = [s.get("run", "") for s in job["steps"]]
            uses = [s.get("uses", "") for s in job["steps"]]
            venv = next((i for i, r in enumerate(runs) if r.startswith("make venv")), None)
            if venv is None:
                continue
            setup = next(i for i, u in enumerate(uses) if "actions/setup-python@" in u)
            assert setup < venv and job["steps"][setup]["with"]["python-version"] == "3.11", (
                name, jname)
    jobs = load("release.yml")["jobs"]
    for name in ("engine", "cell"):
        runs = [s.get("run", "") for s in jobs[name]["steps"]]
        assert runs.index("make runner-check") < runs.index("make venv"), name
        assert "attest-verify" not in " ".join(runs)
    readme = (REPO_ROOT / "README.md").read_text().split("## CI set-up checklist")[1]
    for need in ("`git`", "`make`", "`python3-venv`", "Docker Engine 23+", "make runner-check"):
        assert need in readme, need


def test_a_job_venv_never_installs_into_the_shared_one_nor_takes_a_wrong_python(tmp_path):
    def fake_venv(path: Path, version: str, stamp: str | None) -> None:
        (path / "bin").mkdir(parents=True)
        (path / "bin" / "python").write_text(
            f"#!/bin/bash\ncase \"$1\" in -c) echo {version};; "
            f"-m) echo \"$*\" >> {tmp_path}/pip.log;; esac\n")
        (path / "bin" / "python").chmod(0o755)
        if stamp is not None:
            (path / ".runtime-requirements.txt").write_text(stamp)

    req = "requests==2.0\n"
    (tmp_path / "requirements.txt").write_text(req)
    (tmp_path / "requirements-gpu.txt").write_text("cuda-tool==1\n")
    (tmp_path / "requirements-dev.txt").write_text("ruff==1\n")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    # python3 -m venv DIR makes a fake venv of Python 3.11
    made = (f"#!/bin/bash\\ncase \"$1\" in -c) echo 3.11;; "
            f"-m) echo \"$*\" >> {tmp_path}/pip.log;; esac\\n")
    (bin_ / "python3").write_text(
        "#!/bin/bash\n[ \"$1 $2\" = '-m venv' ] && mkdir -p \"$3/bin\" && "
        f"printf '{made}' > \"$3/bin/python\" && chmod +x \"$3/bin/python\"\n")
    (bin_ / "python3").chmod(0o755)
    env = {"PATH": f"{bin_}:{os.environ['PATH']}"}

    def make(target: str, ws: Path, **extra: str) -> subprocess.CompletedProcess[str]:
        for f in ("requirements.txt", "requirements-gpu.txt", "requirements-dev.txt"):
            (ws / f).write_text((tmp_path / f).read_text())
        return subprocess.run(["make", "-s", "-f", str(MAKEFILE), target], cwd=ws,
                              env={**os.environ, **env, **extra}, capture_output=True,
                              text=True, timeout=60)

    shared = tmp_path / "shared"
    fake_venv(shared, "3.11", req)
    ws = tmp_path / "ws1"
    ws.mkdir()
    proc = make("venv", ws, IMAGEBUILD_VENV=str(shared))
    assert proc.returncode == 0, proc.stderr
    assert (ws / ".venv").resolve() == shared and not (tmp_path / "pip.log").exists()
    # the GPU tools are not in the shared venv: this job makes its own, the shared stays
    proc = make("venv-gpu", ws, IMAGEBUILD_VENV=str(shared))
    assert proc.returncode == 0, proc.stderr
    assert not (ws / ".venv").is_symlink()
    assert not (shared / ".gpu-requirements.txt").exists()
    ws = tmp_path / "ws-dev"  # nor the linters (venv-dev)
    ws.mkdir()
    proc = make("venv-dev", ws, IMAGEBUILD_VENV=str(shared))
    assert proc.returncode == 0, proc.stderr
    assert not (ws / ".venv").is_symlink() and not (shared / ".dev-requirements.txt").exists()
    assert "requirements-dev.txt" in (tmp_path / "pip.log").read_text()
    # stamped for other requirements, or another Python: not linked
    for name, version, stamp in (("other-reqs", "3.11", "requests==1.0\n"),
                                 ("other-python", "3.12", req), ("no-stamp", "3.11", None)):
        fake_venv(tmp_path / name, version, stamp)
        ws = tmp_path / f"ws-{name}"
        ws.mkdir()
        proc = make("venv", ws, IMAGEBUILD_VENV=str(tmp_path / name))
        assert proc.returncode == 0, proc.stderr
        assert not (ws / ".venv").is_symlink() and "this job makes its own" in proc.stderr
    # a .venv of another Python is refused, not used
    ws = tmp_path / "ws-wrong"
    fake_venv(ws / ".venv", "3.12", req)
    proc = make("venv", ws)
    assert proc.returncode == 2 and "runs Python 3.12, the jobs run 3.11" in proc.stderr


# --- 10: GitHub's Latest badge is the registry's latest -----------------------------------

def test_a_new_github_release_never_takes_the_badge_by_itself(tmp_path):
    (tmp_path / "build" / "release-assets").mkdir(parents=True)
    (tmp_path / "build" / "release-notes.md").write_text("notes")
    env = _gh_env(tmp_path)
    for tag in ("2026-06-18-x", "2026-06-11-x"):
        proc = _make("github-release", tmp_path, RELEASE_TAG=tag, **env)
        assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "gh" / "latest-release").exists()
    # the gh stand-in keeps GitHub's default: a plain create takes it
    subprocess.run([str(GH_STANDIN / "gh"), "release", "create", "2026-06-19-x"], check=True,
                   env={**os.environ, **env})
    assert (tmp_path / "gh" / "latest-release").read_text() == "2026-06-19-x"


def test_release_badge_follows_the_registry_latest(tmp_path):
    shim = tmp_path / "py"
    held = tmp_path / "held"
    shim.write_text(f"#!/bin/bash\n[ \"$*\" = '-m imagebuild.release.badge' ] && cat {held}\n")
    shim.chmod(0o755)
    env = {**_gh_env(tmp_path), "PY": str(shim)}
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "release-notes.md").write_text("n")
    (tmp_path / "build" / "release-assets").mkdir()
    for tag in ("2026-06-11-x", "2026-06-18-x"):
        assert _make("github-release", tmp_path, RELEASE_TAG=tag, **env).returncode == 0
    for latest in ("2026-06-18-x", "2026-06-11-x"):  # promote, then a rollback
        held.write_text(latest + "\n")
        proc = _make("release-badge", tmp_path, **env)
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "gh" / "latest-release").read_text() == latest
    held.write_text("2026-06-25-never-released\n")  # a tag with no GitHub release
    assert _make("release-badge", tmp_path, **env).returncode == 0
    assert (tmp_path / "gh" / "latest-release").read_text() == "2026-06-11-x"
    for wf, job in (("release.yml", "promote"), ("rollback.yml", "rollback")):
        runs = [s.get("run", "") for s in load(wf)["jobs"][job]["steps"]]
        mover = next(i for i, r in enumerate(runs) if r in ("make promote", "make rollback"))
        assert runs.index("make release-badge") > mover, wf


def test_the_badge_goes_to_the_newest_release_latest_holds():
    from imagebuild.release.badge import badge_tag

    assert badge_tag([]) is None
    assert badge_tag(["2026-06-11-v0.23.0-x"]) == "2026-06-11-x"
    assert badge_tag(["2026-06-11-v0.23.0-x", "2026-06-18-v0.23.0-y", "not-a-tag"]) == \
        "2026-06-18-y"


# --- 12, 13: ci triggers and cancels; the schedule kept alive -------------------------------

def test_ci_runs_once_per_change_and_never_cancels_main():
    ci = load("ci.yml")
    assert ci["on"] == {"push": {"branches": ["main"]}, "pull_request": None}
    conc = ci["concurrency"]
    assert conc["group"] == "ci-${{ github.event.pull_request.number || github.ref }}"
    assert conc["cancel-in-progress"] == "${{ github.event_name == 'pull_request' }}"


def test_pins_keeps_its_schedule_alive(tmp_path):
    job = load("pins.yml")["jobs"]["watch"]
    assert job["permissions"]["actions"] == "write"
    runs = [s.get("run", "") for s in job["steps"]]
    assert runs[-1] == "make pins-keepalive"
    step = job["steps"][-1]
    assert step["env"] == {"GH_TOKEN": "${{ github.token }}"}
    proc = _make("pins-keepalive", tmp_path, GITHUB_REPOSITORY="Org/imagebuild",
                 **_gh_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "gh" / "workflows" / "pins.yml.enabled").read_text() == "1"


# --- 14: signing away from the cell's code; verify by workflow; the tag's Makefile ----------

def test_signing_runs_on_a_hosted_runner_that_only_gets_digests():
    jobs = load("release.yml")["jobs"]
    cell, sign = jobs["cell"], jobs["sign"]
    assert "id-token" not in cell["permissions"] and "attestations" not in cell["permissions"]
    assert not any(ATTEST in s.get("uses", "") for s in cell["steps"])
    assert sign["runs-on"] == "ubuntu-24.04" and "cell" in needs(sign)
    assert sign["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.cells) }}"
    # what it signs comes from the registry, never from an artifact of the cell job
    assert not any("download-artifact" in s.get("uses", "") for s in sign["steps"])
    subject = next(s for s in sign["steps"] if s.get("id") == "subject")
    assert subject["run"] == 'make -s attest-subject >> "$GITHUB_OUTPUT"'
    for s in sign["steps"]:
        if ATTEST in s.get("uses", ""):
            assert s["with"]["subject-digest"] == "${{ steps.subject.outputs.digest }}"
    assert checkout_of(sign)["with"]["persist-credentials"] is False


def test_attest_verify_checks_the_repository_and_its_release_workflow(tmp_path):
    """--owner alone accepts an attestation signed by any workflow of that owner."""
    log = tmp_path / "gh.log"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "gh").write_text(f"#!/bin/bash\necho \"$*\" >> {log}\n")
    (fake / "gh").chmod(0o755)
    sub = tmp_path / "build/supply-chain/cpu/img"
    sub.mkdir(parents=True)
    (sub / "subject.txt").write_text("name=ghcr.io/org/img\ndigest=sha256:x\nsbom=s\ntag=T\n")
    proc = _make("attest-verify", tmp_path, CELL="cpu/img", REPOSITORY="Org/imagebuild",
                 PATH=f"{fake}:{os.environ['PATH']}")
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 2
    for call in calls:
        assert call.startswith("attestation verify oci://ghcr.io/org/img:T --repo Org/imagebuild "
                               "--signer-workflow Org/imagebuild/.github/workflows/release.yml "
                               "--deny-self-hosted-runners"), call
        assert "--owner" not in call
    docs = (REPO_ROOT / "docs/supply-chain.md").read_text()
    shown = [line for block in re.findall(r"```sh\n(.*?)```", docs, re.S)
             for line in block.replace("\\\n", " ").splitlines() if "attestation verify" in line]
    assert shown and all("--signer-workflow" in line and "--repo" in line for line in shown)


def test_a_dispatch_never_runs_another_release_yml_against_the_tags_makefile(tmp_path):
    repo = tmp_path / "repo"
    (repo / ".github/workflows").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    (repo / ".github/workflows/release.yml").write_text("steps: [make a]\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "one")
    _git(repo, "tag", "2026-06-18-x")
    tagged = _git(repo, "rev-parse", "HEAD")
    (repo / "README").write_text("docs only")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "docs")
    docs_only = _git(repo, "rev-parse", "HEAD")
    (repo / ".github/workflows/release.yml").write_text("steps: [make b]\n")
    _git(repo, "commit", "-qam", "the workflow calls a target the tag's Makefile lacks")
    changed = _git(repo, "rev-parse", "HEAD")
    _git(repo, "update-ref", "refs/remotes/origin/main", "main")
    _git(repo, "checkout", "-q", "--detach", "2026-06-18-x")
    for sha, ok in ((tagged, True), (docs_only, True), (changed, False), ("", True)):
        proc = _make("release-commit", repo, RELEASE_TAG="2026-06-18-x",
                     GITHUB_WORKFLOW_SHA=sha)
        assert (proc.returncode == 0) is ok, proc.stderr
        if ok:
            assert proc.stdout == f"commit={tagged}\n"
        else:
            assert "a dispatch runs main's workflow against the tag's Makefile" in proc.stderr


def test_every_upload_replaces_its_own_on_a_rerun():
    for name in ("release.yml",):
        for job in load(name)["jobs"].values():
            for s in job["steps"]:
                if "upload-artifact@" in s.get("uses", ""):
                    assert s["with"].get("overwrite") is True, s.get("name")
