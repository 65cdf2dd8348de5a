"""The whole job SIGKILLed at every stage, then run again (issue 39): the next run reaps
everything the killed one left (its containers, volumes, networks and the processes it
started: the smoke suite, a `docker build` client), finishes, and `latest` points at a
release that passed; the same with the registry killed mid-publish and started again (one
link of the chain).

One chain on one tag, as a runner killed by the OOM killer sees it: each run is killed at
the next stage, so every stage is reached by a run that resumes the one before (resume
skips what the registry already holds). What a killed run left is looked for once the
next run has started its first build (it reaps before building). Real engine, real
registry (the session's, in a namespace of its own), the real cpu cell."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from imagebuild.registry.records import LATEST, read_release
from imagebuild.runowner import PID_LABEL, START_LABEL, marked_processes, process_start
from tests.e2e.test_interrupts_e2e import Run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

TAG = "2026-06-25-dflashfix"
NAMESPACE = "vllm-spark-sweep"
REPO = f"{NAMESPACE}/cpu-tiny-ngram"
CELL = "cpu/cpu-tiny-ngram"
# (stage, words of the line the kill waits for, seconds after it): each while the stage
# has something of its own going (a build client, a server container, the smoke suite)
KILL_POINTS = (
    ("build", (f"build {CELL}", "started"), 1.0),
    ("smoke", ("checks: the smoke suite runs",), 1.0),
    ("gates", (f"gates {CELL}", "started"), 6.0),
    ("publish", (f"publish {CELL}", "started"), 1.0),
    ("registry", (), 0.0),  # not a SIGKILL: the registry process dies mid-publish
    ("sbom", (f"sbom {CELL}", "started"), 0.0),
    ("bench", ("bench c=",), 0.5),
    ("promote", ("stored with",), 0.0),  # bench stored; latest is moved next
)
REAPED_BY = (f"build {CELL}", "started")  # the next run has reaped by then


@pytest.fixture(scope="module")
def env(shared_registry, docker_engine, cpu_serve_image, tmp_path_factory):
    return {"IMAGEBUILD_REGISTRY": shared_registry.host,
            "IMAGEBUILD_REGISTRY_USER": shared_registry.user,
            "IMAGEBUILD_REGISTRY_PASSWORD": shared_registry.password,
            "IMAGEBUILD_NAMESPACE": NAMESPACE,
            "DOCKER_CONFIG": str(tmp_path_factory.mktemp("docker-config"))}


def _job(env: dict[str, str], tag: str, out: Path) -> Run:
    return Run(["--tag", tag, "--target", "cpu", "--out", str(out)], env)


def _docker(*args: str) -> list[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True,
                          check=True).stdout.split()


def _left_by(pid: int, start: str) -> list[str]:
    """What of the run (pid, start) is still on this host: objects by their run labels,
    processes by the owner they were started with."""
    left = []
    for kind, ls in (("container", ["ps", "-a"]), ("volume", ["volume", "ls"]),
                     ("network", ["network", "ls"])):
        for name in _docker(*ls, "--filter", f"label={PID_LABEL}={pid}", "--format",
                            "{{.Name}}" if kind != "container" else "{{.Names}}"):
            left.append(f"{kind} {name}")
    left += [f"process {p.pid} ({p.command})" for p in marked_processes()
             if p.labels[PID_LABEL] == str(pid) and p.labels[START_LABEL] == start]
    return left


def _owner_start(pid: int) -> str:
    start = process_start(pid)
    assert start, f"run {pid} is not running"
    return start


def _kill_at(run: Run, words: tuple[str, ...], delay: float) -> tuple[int, str]:
    run.wait_for(run.line(*words), limit=900)
    start = _owner_start(run.proc.pid)
    time.sleep(delay)
    run.proc.send_signal(signal.SIGKILL)
    run.proc.wait()
    return run.proc.pid, start


def _latest_passed(client) -> str:
    rel = read_release(client, REPO, LATEST)
    assert rel is not None, "no latest"
    tag = rel.annotations["io.imagebuild.release.tag"]
    released = read_release(client, REPO, tag)
    assert released is not None and released.passed, tag
    return tag


def test_killed_at_every_stage_the_next_run_reaps_and_finishes(
        env, shared_registry, tmp_path: Path) -> None:
    out = tmp_path / "build"
    client = shared_registry.client()
    killed: list[tuple[str, int, str]] = []  # (stage, pid, start) of each killed run
    took: list[str] = []
    for stage, words, delay in KILL_POINTS:
        begun = time.monotonic()
        run = _job(env, TAG, out)
        if killed:
            prev_stage, pid, start = killed[-1]
            run.wait_for(run.line(*REAPED_BY), limit=900)
            left = _left_by(pid, start)
            assert not left, f"the run killed at {prev_stage} left {left}:\n{run.output[-2000:]}"
        if stage == "registry":
            killed.append((stage, *_registry_killed_at_publish(run, shared_registry)))
        else:
            killed.append((stage, *_kill_at(run, words, delay)))
        took.append(f"{stage} {time.monotonic() - begun:.0f} s")
    begun = time.monotonic()
    final = _job(env, TAG, out)
    assert final.proc.wait(timeout=1800) == 0, final.output[-4000:]
    took.append(f"final {time.monotonic() - begun:.0f} s")
    print("runs:", ", ".join(took))
    for stage, pid, start in killed:
        assert not _left_by(pid, start), (stage, _left_by(pid, start))
    assert _latest_passed(client) == "2026-06-25-v0.23.0-dflashfix"
    assert "Traceback" not in final.output, final.output[-4000:]


def _registry_killed_at_publish(run: Run, registry) -> tuple[int, str]:
    """The registry dies as publish starts: a clear error naming it (exit 1) and nothing
    of the run left; started again on the same port and storage for the next run."""
    run.wait_for(run.line(f"publish {CELL}", "started"), limit=900)
    start = _owner_start(run.proc.pid)
    registry.process.kill()
    registry.process.wait()
    try:
        assert run.proc.wait(timeout=600) == 1, run.output[-3000:]
        assert "registry" in run.output and registry.host in run.output, run.output[-3000:]
        assert "Traceback" not in run.output, run.output[-3000:]
    finally:
        registry.restart()
    return run.proc.pid, start
