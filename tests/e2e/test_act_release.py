"""release.yml, rollback.yml and pins.yml run by act (host mode) on this machine, against a
local clone with real tags and a real registry (the conftest's, htpasswd auth): the jobs,
`needs`, `if`, matrices and $GITHUB_OUTPUT are act's; only GitHub's hosted services are
the stand-ins of .github/act-standins. One module-scoped sequence of runs shares one cpu
engine (build avoidance), and each test reads what those runs left:

  1. 2026-06-17-dflashfix on a commit whose cpu cell cannot boot in time: smoke fails,
     nothing is published or promoted, no GitHub release; the run's summary says so
  2. the fix lands on main; 2026-06-18-dflashfix made on it: latest is set, the release
     has every linked asset
  3. 2026-06-18 again, nothing changed: nothing is built, smoked or benched again
  4. the fix: 2026-06-17 moved to the commit that boots, the same dispatch again while
     2026-06-18 is latest (two tags in flight, the older one finishing last): it is built,
     published and gets its notes, latest stays at the newer (one run proves both; a
     release run of its own for each cost two more vLLM boots)
  5. rollback.yml to 2026-06-17: latest moves back
  6. a promote-only dispatch of 2026-06-18: nothing built, and latest stays where the
     rollback put it (a re-run never undoes a rollback)
  7. the same dispatch passing the rolled-back gate with a reason: latest forward again
gb10 cells are planned by the plan job of a tag push but not run here (no GB10 runner):
the rehearsal dispatches with the workflow's own `target` input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from tools.rehearse_release.act import ActRun, Rehearsal

pytestmark = pytest.mark.slow
OLD, NEW = "2026-06-17-dflashfix", "2026-06-18-dflashfix"
OLD_FULL, NEW_FULL = "2026-06-17-v0.23.0-dflashfix", "2026-06-18-v0.23.0-dflashfix"
IMAGE = "cpu-tiny-ngram"
NAMESPACE = "actrehearsal"  # the owner ActRehearsal, lowercased by `make job-env`
UNTRUSTED = {"accept": "untrusted-bench", "accept_reason": "act rehearsal on a shared CI host"}


@pytest.fixture(scope="module")
def registry(shared_registry):
    """The session's registry shared by the modules pushing the cpu engine (conftest)."""
    return shared_registry


def _plan_runners() -> list[list[str]]:
    out = subprocess.run([sys.executable, "build.py", "plan", "--tag", NEW, "--target", "all",
                          "--format", "github"], cwd=REPO_ROOT, check=True,
                         capture_output=True, text=True).stdout
    return [c["runner"] for c in json.loads(out)["include"]]


class Runs:
    """The rehearsal and every act run of the sequence, by name."""

    def __init__(self, reh: Rehearsal, registry) -> None:
        self.reh, self.registry = reh, registry
        self.runs: dict[str, ActRun] = {}
        self.seen: dict[str, object] = {}  # what a test reads between two runs
        self.runners = _plan_runners()

    def release(self, name: str, tag: str, **inputs: str) -> ActRun:
        run = self.reh.run("release.yml", "workflow_dispatch", "refs/heads/main", run=tag,
                           inputs={"tag": tag, "target": "cpu", **inputs},
                           plan_runners=self.runners, timeout=5400)
        self.runs[name] = run
        return run

    def latest(self) -> str | None:
        from imagebuild.registry.client import RegistryClient
        from imagebuild.registry.records import list_releases

        client = RegistryClient(self.registry.host, username=self.registry.user,
                                password=self.registry.password)
        rels = list_releases(client, f"{NAMESPACE}/{IMAGE}")
        return next((r.tag for r in rels if r.is_latest), None)

    def badge(self) -> str | None:
        """The GitHub release marked Latest (the gh stand-in's latest-release)."""
        f = self.reh.gh / "latest-release"
        return f.read_text() if f.exists() else None


def _commit(reh: Rehearsal, old: str, new: str, message: str) -> str:
    """A commit on the rehearsal's main changing matrix.yaml (as a maintainer would)."""
    path = reh.work / "matrix.yaml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    git = ["git", "-C", str(reh.work), "-c", "user.name=r", "-c", "user.email=r@localhost"]
    subprocess.run([*git, "commit", "-qam", message], check=True)
    subprocess.run([*git, "push", "-q", str(reh.origin), "HEAD:refs/heads/main"], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture(scope="module")
def runs(docker_engine, registry, cpu_serve_image, tmp_path_factory) -> Runs:
    # cpu_serve_image first: the session's build (with the canary secrets the leak test
    # looks for) makes the cpu base and engine; the engine job here finds that engine by
    # its inputs and pushes it, as a runner that built it before would
    root = tmp_path_factory.mktemp("act")
    reh = Rehearsal(root, registry=registry.host, user=registry.user,
                    password=registry.password,
                    extra_env={"IMAGEBUILD_LOCK_DIR": os.environ["IMAGEBUILD_LOCK_DIR"]})
    reh.prepare()
    r = Runs(reh, registry)
    # 1. a commit whose cell cannot boot within its timeout: smoke fails
    _commit(reh, "    boot_timeout_s: 300", "    boot_timeout_s: 10", "cpu: boot in 10 s")
    reh.tag(OLD)
    r.release("broken", OLD)
    r.seen["latest after broken"] = r.latest()
    r.seen["gh after broken"] = sorted(p.name for p in (reh.gh / "releases").glob("*"))
    r.seen["verdicts after broken"] = [json.loads(p.read_text()) for p in reh.artifacts(OLD).glob(
        f"cell-cpu-{IMAGE}/smoke/**/verdict.json")]
    report = reh.artifacts(OLD) / "not-promoted" / "not-promoted.md"
    r.seen["report after broken"] = report.read_text() if report.is_file() else None
    # 2. the fix on main, and a newer tag made on it
    _commit(reh, "    boot_timeout_s: 10", "    boot_timeout_s: 300", "cpu: boot timeout back")
    reh.tag(NEW)
    # figures of a shared 2-core CI host may be flagged untrusted (that refusal:
    # tests/e2e/test_bench_store.py); passed as a user would
    r.release("new", NEW, **UNTRUSTED)
    r.seen["latest after new"] = r.latest()
    r.seen["badge after new"] = r.badge()
    # 3. the same tag again, nothing changed
    r.release("rerun", NEW)
    # 4. the fix: the older tag moved to it and dispatched again while the newer is latest
    reh.tag(OLD)
    r.runs["older again"] = r.release("fixed", OLD)
    r.seen["latest after older again"] = r.latest()
    r.seen["badge after older again"] = r.badge()
    # 5. rollback.yml
    r.runs["rollback"] = reh.run("rollback.yml", "workflow_dispatch", "refs/heads/main",
                                 run="rollback", inputs={"to": OLD, "image": ""},
                                 plan_runners=r.runners)
    r.seen["latest after rollback"] = r.latest()
    r.seen["badge after rollback"] = r.badge()
    # 6. a promote-only dispatch of the newer tag: nothing built, the rollback stays
    # (inputs travel as strings in the event, as GitHub sends them; act types them)
    r.runs["promote only"] = reh.run("release.yml", "workflow_dispatch", "refs/heads/main",
                                     run="promote-only", inputs={"tag": NEW, "target": "cpu",
                                                                 "promote_only": "true"},
                                     plan_runners=r.runners)
    r.seen["latest after promote only"] = r.latest()
    # 7. the same, on purpose: the rolled-back gate passed with a reason
    r.runs["promote on purpose"] = reh.run(
        "release.yml", "workflow_dispatch", "refs/heads/main", run="promote-on-purpose",
        inputs={"tag": NEW, "target": "cpu", "promote_only": "true",
                "accept": "rolled-back untrusted-bench regression",
                "accept_reason": "the rollback was a drill; a shared CI host's figures (the "
                                 "two releases were benched beside the other test lane)"},
        plan_runners=r.runners)
    r.seen["latest after promote on purpose"] = r.latest()
    r.seen["badge after promote on purpose"] = r.badge()
    # pins.yml twice, in a network namespace with only loopback: act clones and pulls
    # nothing
    for name in ("pins", "pins again"):
        r.runs[name] = reh.run("pins.yml", "workflow_dispatch", "refs/heads/main", run=name,
                               plan_runners=r.runners, isolated=True)
        r.seen[f"issues after {name}"] = sorted(
            (json.loads(p.read_text())["title"], json.loads(p.read_text())["body"])
            for p in (reh.gh / "issues").glob("*.json"))
    return r


def _fail(run: ActRun) -> str:
    return run.log[-6000:]


def test_a_cell_failing_smoke_promotes_nothing(runs):
    run = runs.runs["broken"]
    assert run.returncode != 0
    assert run.job_result("plan") == "succeeded" and run.job_result("engine cpu") == "succeeded"
    assert run.job_result("cpu/cpu-tiny-ngram") == "failed", _fail(run)
    assert re.search(r"Failure - Main Smoke", run.log)
    assert run.job_result("promote and release") is None  # never started
    assert runs.seen["latest after broken"] is None
    assert runs.seen["gh after broken"] == []
    # the smoke report was still uploaded (if: always()) and says why
    (verdict,) = runs.seen["verdicts after broken"]
    assert verdict["passed"] is False and verdict["outcome"] == "boot timeout"
    # the run says so: the not-promoted job's summary (kept as an artifact, and in its
    # log) names the failed cell and how it failed, and that latest stayed
    assert run.job_result("not promoted") == "succeeded", _fail(run)
    report = runs.seen["report after broken"]
    assert report is not None, _fail(run)
    assert report.startswith(f"# {OLD}: not released\n"), report
    assert "**Nothing was promoted**" in report and "No GitHub release was made" in report
    row = next(line for line in report.splitlines() if f"`cpu/{IMAGE}`" in line)
    assert "FAILED: boot timeout" in row and "not healthy after 10s" in row, row
    assert row.rstrip().endswith("| _no latest yet_ |"), row
    # the job's step summary as act read it from $GITHUB_STEP_SUMMARY: the report, and
    # nothing else (no Make echo)
    assert "Summary - " + report.rstrip("\n") + "\n" in run.log, _fail(run)
    summary = run.log.split("Summary - " + report.rstrip("\n"))[1].split("\n[")[0]
    assert not summary.strip(), summary


def test_the_rerun_after_the_fix_releases_it(runs):
    run = runs.runs["fixed"]
    assert run.returncode == 0, _fail(run)
    assert "Success - Main Push by digest" in run.log  # built and published now
    assert run.job_result("not promoted") is None  # every cell passed: nothing to say
    assert (runs.reh.gh / "releases" / OLD / "notes.md").exists()


def test_release_end_to_end_with_every_linked_asset(runs):
    run = runs.runs["new"]
    assert run.returncode == 0, _fail(run)
    for job in ("plan", "engine cpu", "cpu/cpu-tiny-ngram", "promote and release"):
        assert run.job_result(job) == "succeeded", job
    assert "invalid format" not in run.log
    rel = runs.reh.gh / "releases" / NEW
    notes = (rel / "notes.md").read_text()
    assert NEW_FULL in notes or NEW in notes
    prefix = f"https://github.com/ActRehearsal/imagebuild/releases/download/{NEW}/"
    linked = set(re.findall(re.escape(prefix) + r"([\w.-]+)", notes))
    assert linked, notes[:2000]
    assets = {p.name for p in (rel / "assets").iterdir()}
    assert linked <= assets, linked - assets
    assert f"{IMAGE}.compose.yaml" in assets
    # the notes cover every target of the release, not only the one this dispatch built
    assert "spark-heretic-zlab" in notes
    assert runs.seen["latest after new"] == NEW_FULL  # the first release to pass
    assert runs.seen["badge after new"] == NEW  # GitHub's Latest is the registry's
    _signed_under_act(runs, run)


def _signed_under_act(runs: Runs, run: ActRun) -> None:
    """The sign job ran on its own (hosted) runner with a runner HOME that held no login
    of this host: actions/attest's stand-in found the login where @sigstore/oci reads it
    (the job's home, `make registry-login`), recorded both attestations with GitHub's API
    stand-in, pushed both bundles beside the release's digest, and gh's verify (by repo,
    signer workflow, hosted runner) passed; the job's home is gone afterwards."""
    from imagebuild.registry import referrers
    from imagebuild.registry.client import RegistryClient
    from imagebuild.registry.records import read_release

    assert run.job_result(f"sign cpu/{IMAGE}") == "succeeded", _fail(run)
    for step in ("Sign the build provenance", "Sign the SBOM", "Verify both attestations"):
        assert re.search(rf"Success - Main {step}", run.log), _fail(run)
    agreed = re.findall(r"✓ Verification succeeded! \(stand-in[^)]*\) oci://\S+:"
                        + re.escape(NEW_FULL) + r" (any predicate|\S+) for "
                        r"ActRehearsal/imagebuild", run.log)
    assert sorted(agreed) == ["any predicate", "https://cyclonedx.org/bom"], _fail(run)
    reg = runs.registry
    client = RegistryClient(reg.host, username=reg.user, password=reg.password)
    rel = read_release(client, f"{NAMESPACE}/{IMAGE}", NEW_FULL)
    assert rel is not None
    found = referrers.listed(client, rel.repo, rel.digest, referrers.SIGSTORE_BUNDLE_TYPE)
    assert sorted(d["annotations"][referrers.A_BUNDLE_PREDICATE] for d in found) == [
        "https://cyclonedx.org/bom", "https://slsa.dev/provenance/v1"]
    recorded = runs.reh.gh / "attestations" / rel.digest.replace(":", "-")
    assert len(list(recorded.glob("*.json"))) == 2  # once each: no failed attempt before
    for home in runs.reh.homes:  # every run's runner HOME: no login was ever put there
        assert not (home / ".docker" / "config.json").exists(), home
    assert not list(runs.reh.root.rglob("imagebuild-job-*/home/.docker/config.json"))


def test_a_rerun_that_changes_nothing_builds_smokes_and_benches_nothing(runs):
    run = runs.runs["rerun"]
    assert run.returncode == 0, _fail(run)
    for step in (r"Build the engine once.*", r"Build the serve layers.*", r"Smoke",
                 r"Push by digest.*", r"Sign the .*", r"Bench, stored.*", r"Release notes",
                 r"GitHub release"):
        assert not re.search(rf"Success - Main {step} \[", run.log), step
    assert "done=true" in run.log and run.job_result("promote and release") == "succeeded"
    assert run.seconds < 30, run.seconds  # benchmarks/time_act_rerun.py measures it (< 15 s)


def test_two_tags_in_flight_end_with_latest_at_the_newer(runs):
    run = runs.runs["older again"]
    assert run.returncode == 0, _fail(run)  # the older release finishes; latest stays
    assert run.job_result("promote and release") == "succeeded"
    assert re.search(r"latest stays: .*older than latest", run.log), _fail(run)
    assert runs.seen["latest after older again"] == NEW_FULL
    assert (runs.reh.gh / "releases" / OLD / "notes.md").exists()
    assert runs.seen["badge after older again"] == NEW  # the older release never takes it


def test_rollback_dispatch_moves_latest_back(runs):
    run = runs.runs["rollback"]
    assert run.returncode == 0, _fail(run)
    assert runs.seen["latest after rollback"] == OLD_FULL
    assert runs.seen["badge after rollback"] == OLD  # the badge follows the rollback


def test_promote_only_dispatch_builds_nothing_and_respects_the_rollback(runs):
    run = runs.runs["promote only"]
    assert run.returncode == 0, _fail(run)
    assert run.job_result("engine cpu") is None and run.job_result("cpu/cpu-tiny-ngram") is None
    assert run.job_result("promote and release") == "succeeded"
    assert re.search(r"latest stays: .*rolled back", run.log), _fail(run)
    assert runs.seen["latest after promote only"] == OLD_FULL


def test_promote_on_purpose_moves_latest_past_the_rollback(runs):
    run = runs.runs["promote on purpose"]
    assert run.returncode == 0, _fail(run)
    assert run.job_result("cpu/cpu-tiny-ngram") is None
    assert runs.seen["latest after promote on purpose"] == NEW_FULL
    assert runs.seen["badge after promote on purpose"] == NEW


def test_pins_workflow_runs_offline_and_opens_no_issue_for_an_unreachable_hub(runs):
    """act in a namespace with loopback only: the workflow runs (no action cloned, no image
    pulled), the watch words the unreachable Hub in its report, and an unknown head is not
    a moved pin (opening and closing issues: tests/unit/test_workflows.py, same Makefile
    and gh stand-in)."""
    for name in ("pins", "pins again"):
        run = runs.runs[name]
        assert run.returncode == 0, _fail(run)
        assert "could not read main" in run.log  # the Hub, unreachable or offline
        assert "Success - Main One issue per moved pin" in run.log
        # the step summary act read: the watch's report, never Make's echo of the recipe
        (summary,) = [part.split("\n[")[0] for part in run.log.split("Summary - ")[1:]]
        assert summary.startswith("## pins watch"), summary[:500]
        assert "build.py pins watch --format" not in summary, summary[:500]
    assert runs.seen["issues after pins again"] == []


def test_the_verify_step_fails_when_the_attestations_name_another_digest(registry, tmp_path):
    """The sign job's attest steps (actions/attest's stand-in, as act runs it) and its
    verify step (`make attest-verify` verbatim, the gh stand-in) outside act, on two
    releases stored here: a subject naming the wrong digest gets its attestations for
    that digest, and the verify of the release tag fails; the right digest verifies.
    (~3 s, no act run)"""
    import base64

    import yaml

    from imagebuild.registry.client import RegistryClient
    from tests.support.memregistry import add_release
    from tools.rehearse_release.act import STANDINS

    client = RegistryClient(registry.host, username=registry.user, password=registry.password)
    repo = f"{NAMESPACE}-wrong-subject/{IMAGE}"
    image, other = (add_release(client, repo, tag, config=tag.encode())
                    for tag in (NEW_FULL, OLD_FULL))
    home = tmp_path / "job-home"
    (home / ".docker").mkdir(parents=True)
    auth = base64.b64encode(f"{registry.user}:{registry.password}".encode()).decode()
    (home / ".docker/config.json").write_text(
        json.dumps({"auths": {registry.host: {"auth": auth}}}))
    (tmp_path / "bom.json").write_text(json.dumps({
        "bomFormat": "CycloneDX", "specVersion": "1.6",
        "serialNumber": "urn:uuid:3e671687-395b-41f5-a30f-a58921a69b79"}))
    subject = tmp_path / "build/supply-chain/cpu" / IMAGE / "subject.txt"
    subject.parent.mkdir(parents=True)
    release = yaml.safe_load((REPO_ROOT / ".github/workflows/release.yml").read_text())
    (tmp_path / "event.json").write_text(json.dumps({"repository": {
        "visibility": "public", "owner": {"login": "ActRehearsal", "type": "Organization"}}}))
    (tmp_path / "temp").mkdir()
    env = {**os.environ, "HOME": str(home), "DOCKER_CONFIG": str(home / ".docker"),
           "RUNNER_TEMP": str(tmp_path / "temp"), "GITHUB_WORKSPACE": str(tmp_path),
           "GITHUB_REPOSITORY": "ActRehearsal/imagebuild", "CELL": f"cpu/{IMAGE}",
           "REPOSITORY": "ActRehearsal/imagebuild", "GITHUB_JOB": "sign",
           "GITHUB_EVENT_PATH": str(tmp_path / "event.json"),
           "GITHUB_WORKFLOW_REF": "ActRehearsal/imagebuild/.github/workflows/release.yml"
                                  "@refs/heads/main",
           "IMAGEBUILD_REHEARSAL_WORKFLOW": str(REPO_ROOT / ".github/workflows/release.yml"),
           "IMAGEBUILD_REHEARSAL_GH": str(tmp_path / "gh"),
           "PATH": f"{STANDINS / 'bin'}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
    step = next(s for s in release["jobs"]["sign"]["steps"] if s.get("name", "").startswith(
        "Sign the SBOM"))
    assert step["with"]["push-to-registry"] is True

    def sign_and_verify(digest: str) -> subprocess.CompletedProcess[str]:
        name = f"{registry.host}/{repo}"
        subject.write_text(f"name={name}\ndigest={digest}\nsbom=bom.json\ntag={NEW_FULL}\n")
        for sbom in ("", "bom.json"):
            inputs = {"INPUT_SUBJECT-NAME": name, "INPUT_SUBJECT-DIGEST": digest,
                      "INPUT_SBOM-PATH": sbom, "INPUT_PUSH-TO-REGISTRY": "true",
                      "INPUT_CREATE-STORAGE-RECORD": "true", "INPUT_SHOW-SUMMARY": "true"}
            subprocess.run([sys.executable, str(STANDINS / "attest/attest.py")],
                           env={**env, **inputs}, check=True, capture_output=True, text=True)
        return subprocess.run(["make", "-s", "-f", str(REPO_ROOT / "Makefile"), "attest-verify"],
                              cwd=tmp_path, env=env, capture_output=True, text=True)

    wrong = sign_and_verify(other)
    assert wrong.returncode != 0, wrong.stdout
    assert f"No attestations found for subject {image}" in wrong.stderr, wrong.stderr
    right = sign_and_verify(image)
    assert right.returncode == 0, right.stdout + right.stderr
    assert right.stdout.count("Verification succeeded") == 2, right.stdout


CANCELLED = "2026-06-19-dflashfix"


def _containers_under(root: Path) -> list[str]:
    out = subprocess.run(["docker", "ps", "-a", "--filter",
                          "label=com.docker.compose.project.working_dir", "--format",
                          '{{.ID}} {{.Label "com.docker.compose.project.working_dir"}}'],
                         check=True, capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.split()[1:] and line.split()[1].startswith(str(root))]


def test_a_cancelled_cell_leaves_no_container(runs):
    """Ctrl-C to act while the cell's smoke container runs (act cancels the run as GitHub
    does): the job's `if: always()` teardown removes this job's containers."""
    import signal
    import time

    reh = runs.reh
    reh.tag(CANCELLED)
    cmd = reh.command("release.yml", "workflow_dispatch", "refs/heads/main", CANCELLED,
                      inputs={"tag": CANCELLED, "target": "cpu"}, plan_runners=runs.runners)
    log = reh.root / "cancel.log"
    with log.open("w") as fh:
        home = Path(tempfile.mkdtemp(prefix="runner-home-", dir=reh.root))
        proc = subprocess.Popen(cmd, cwd=reh.work, stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "HOME": str(home)})
        deadline = time.monotonic() + 1200
        while not _containers_under(reh.root) and proc.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(1)
        assert proc.poll() is None, log.read_text()[-4000:]  # the smoke container is up
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=300)
    text = log.read_text()
    assert proc.returncode != 0
    assert "Tear down this job's containers" in text, text[-4000:]
    assert _containers_under(reh.root) == [], text[-4000:]
