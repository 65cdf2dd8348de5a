"""Ctrl-C (SIGINT) or SIGTERM at any moment of `smoke`, `bench` and the whole job leaves no
container behind and exits 130 within seconds: the real command on the real cpu image,
interrupted before the server boots (while its container is being created), during the
boot, and during the checks or the measurement. Containers of smoke's compose projects
(imagebuild-smoke-*) and bench containers (label io.imagebuild.bench) are looked for
right after the exit and again a moment later (a create the engine finished late)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from tests.support.cpu_build import CPU_SERVE_REF, TAG
from tests.support.leftovers import containers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

EXIT_WITHIN_S = 20.0  # from the signal to the process gone, clean-up included
LATE_CREATE_S = 2.0


def _ours(docker: str, run_pid: int | None = None) -> set[str]:
    """Containers smoke or bench started (by compose project or bench label), but another
    run's (tests/support/leftovers.py); the run under test's count, after it exits too."""
    project, bench = "com.docker.compose.project", "io.imagebuild.bench"
    return {name for name, got in containers(project, bench, docker=docker,
                                             mine=[run_pid] if run_pid else [])
            if got[project].startswith("imagebuild-smoke-") or got[bench]}


class Run:
    """`build.py ARGS` in its own process; every output line kept as it arrives."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None):
        self.lines: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "build.py", *argv], cwd=REPO_ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**os.environ, **(env or {})})
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, seen: Callable[[], bool], limit: float = 300) -> None:
        deadline = time.monotonic() + limit
        while not seen():
            if self.proc.poll() is not None:
                pytest.fail(f"exited {self.proc.returncode} before the point:\n"
                            + self.output[-3000:])
            if time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail("the point never came:\n" + self.output[-3000:])
            time.sleep(0.05)

    def line(self, *words: str) -> Callable[[], bool]:
        return lambda: any(all(w in line for w in words) for line in self.lines)

    def interrupt(self, sig: int) -> float:
        start = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"still running 120 s after signal {sig}:\n" + self.output[-3000:])
        return time.monotonic() - start


def _check(run: Run, sig: int, docker: str, before: set[str]) -> None:
    seconds = run.interrupt(sig)
    left = _ours(docker, run.proc.pid) - before
    time.sleep(LATE_CREATE_S)
    late = _ours(docker, run.proc.pid) - before
    tail = run.output[-2500:]
    assert run.proc.returncode == 130, f"exit {run.proc.returncode}:\n{tail}"
    assert "Traceback" not in run.output, tail
    assert not left and not late, f"left behind: {left or late}\n{tail}"
    assert seconds < EXIT_WITHIN_S, f"{seconds:.1f} s after the signal:\n{tail}"


@pytest.fixture(scope="module")
def image(docker_engine: str, cpu_serve_image) -> str:
    assert cpu_serve_image.ref == CPU_SERVE_REF
    return CPU_SERVE_REF


# --------------------------------------------------------------------------- smoke

SMOKE_POINTS = {
    # the compose project is named and `up` starts the container right after
    "before-boot": (("compose project imagebuild-smoke-",), 0.0, signal.SIGINT),
    "during-boot": (("booting ",), 0.0, signal.SIGINT),
    "during-boot-sigterm": (("booting ",), 1.0, signal.SIGTERM),
    "during-checks": (("boot attempt 1:",), 1.0, signal.SIGINT),
}


@pytest.mark.parametrize("point", list(SMOKE_POINTS))
def test_smoke(point: str, image: str, docker_engine: str, tmp_path: Path) -> None:
    words, delay, sig = SMOKE_POINTS[point]
    before = _ours(docker_engine)
    run = Run(["smoke", image, "--out", str(tmp_path / "smoke")])
    run.wait_for(run.line(*words))
    time.sleep(delay)
    _check(run, sig, docker_engine, before)


# --------------------------------------------------------------------------- bench

BENCH = ["bench", "--concurrency", "1", "--requests", "6", "--max-tokens", "32",
         "--prompts", "structured"]


def _bench_container(docker: str, before: set[str], run: Run) -> Callable[[], bool]:
    return lambda: bool(_ours(docker, run.proc.pid) - before)


@pytest.mark.parametrize("point", ["while-starting", "container-created", "during-boot",
                                   "during-boot-sigterm", "during-measurement"])
def test_bench(point: str, image: str, docker_engine: str, tmp_path: Path) -> None:
    before = _ours(docker_engine)
    run = Run([*BENCH, image, "--out", str(tmp_path / "bench")])
    sig = signal.SIGTERM if point.endswith("sigterm") else signal.SIGINT
    if point == "while-starting":  # the stage has begun: the container is made next
        run.wait_for(run.line("bench", "started"))
    elif point == "container-created":  # the engine has it: created or starting
        run.wait_for(_bench_container(docker_engine, before, run))
    elif point.startswith("during-boot"):
        run.wait_for(run.line("boot: waiting for /health"))
        time.sleep(3)
    else:
        run.wait_for(run.line("bench c=1"))
        time.sleep(1)
    _check(run, sig, docker_engine, before)


# ---------------------------------------------------------------------- whole job

JOB_POINTS = {
    "building": (("build cpu/cpu-tiny-ngram", "started"), 0.0, signal.SIGINT),
    "smoke-before-boot": (("smoke cpu/cpu-tiny-ngram", "started"), 0.0, signal.SIGINT),
    "smoke-during-boot": (("smoke cpu/cpu-tiny-ngram", "boot: "), 0.0, signal.SIGTERM),
    "smoke-during-checks": (("checks: the smoke suite runs",), 1.0, signal.SIGINT),
}


@pytest.mark.parametrize("point", list(JOB_POINTS))
def test_whole_job(point: str, image: str, docker_engine: str, tmp_path: Path) -> None:
    """`build.py --tag T` (dry run: nothing is pushed before the interrupt anyway)."""
    words, delay, sig = JOB_POINTS[point]
    before = _ours(docker_engine)
    run = Run(["--tag", TAG, "--target", "cpu", "--dry-run", "--out", str(tmp_path / "b")])
    run.wait_for(run.line(*words))
    time.sleep(delay)
    _check(run, sig, docker_engine, before)
