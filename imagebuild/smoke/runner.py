"""One smoke run: boot the image hardened, watch it, run tests/smoke/, write the verdict.

The container and its log follower live here, outside pytest, so a boot that fails is
judged from the log within seconds and the check suite only ever sees a healthy server.
Whatever happens (failure, Ctrl-C, SIGTERM) the container is removed before returning.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from imagebuild import REPO_ROOT
from imagebuild.docker import inspect_image
from imagebuild.smoke.boot import BootOutcome, wait_ready
from imagebuild.smoke.container import Container, image_user, launch
from imagebuild.smoke.expect import expectations_from_labels
from imagebuild.smoke.logwatch import LogWatcher
from imagebuild.smoke.paths import cell_dir, ref_dir
from imagebuild.smoke.report import read_junit, write_junit, write_verdict

if TYPE_CHECKING:
    from imagebuild.plan import Job

SUITE = REPO_ROOT / "tests" / "smoke"
CHECK_TIMEOUT_S = 900  # per check (pytest-timeout); a gb10 burst at c=32 is the longest
OUTPUTS = ("junit.xml", "summary.md", "verdict.json", "container.log",
           "container-attempt1.log", "checks.log", "config.json", "checks-junit.xml")


def default_stall_s(boot_timeout_s: float) -> float:
    """How long a silent log may last before boot counts as the spawn hang."""
    return min(180.0, max(60.0, boot_timeout_s / 4))


def out_dir_for(expect: dict[str, Any], image_ref: str | None = None) -> Path:
    build = REPO_ROOT / "build"
    if image_ref:
        return ref_dir(build, image_ref)
    return build / "smoke" / expect["target"] / expect["engine"] / expect["image"]


@contextmanager
def _sigterm_as_interrupt():
    """SIGTERM (a CI cancel) takes the same clean-up path as Ctrl-C."""
    def handler(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt
    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _run_checks(out: Path, config: dict[str, Any], console: Console) -> tuple[Path, int]:
    cfg = out / "config.json"
    cfg.write_text(json.dumps(config, indent=1))
    junit = out / "checks-junit.xml"
    # junit_family xunit1: the family that keeps record_property figures in the XML
    cmd = [sys.executable, "-m", "pytest", str(SUITE), "-p", "no:cacheprovider", "-q",
           "--rootdir", str(REPO_ROOT), f"--junitxml={junit}", "-o", "junit_family=xunit1",
           f"--timeout={CHECK_TIMEOUT_S}", "-W", "ignore::DeprecationWarning"]
    env = {**os.environ, "IMAGEBUILD_SMOKE_CONFIG": str(cfg)}
    with (out / "checks.log").open("w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, cwd=REPO_ROOT)
        assert proc.stdout
        for line in proc.stdout:
            log.write(line)
            console.print(line.rstrip("\n"), markup=False, highlight=False)
        code = proc.wait()
    return junit, code


def _wait(image_ref: str, c: Container, watcher: LogWatcher, timeout_s: float,
          stall_s: float, console: Console) -> BootOutcome:
    """wait_ready with one status line: live on a terminal, phase changes elsewhere (CI)."""
    if console.is_terminal:
        with console.status(f"booting {image_ref}") as status:
            return wait_ready(c, watcher, timeout_s=timeout_s, stall_s=stall_s,
                              tick=lambda elapsed, phase: status.update(
                                  f"booting {image_ref} · {elapsed:5.1f}s · {phase}"))
    seen = [""]

    def tick(elapsed: float, phase: str) -> None:
        if phase != seen[0]:
            seen[0] = phase
            console.print(f"booting {image_ref} · {elapsed:5.1f}s · {phase}", markup=False,
                          highlight=False)

    return wait_ready(c, watcher, timeout_s=timeout_s, stall_s=stall_s, tick=tick)


def _boot(image_ref: str, command: list[str], user: tuple[int, int], expect: dict[str, Any],
          out: Path,
          timeout_s: float, stall_s: float, console: Console,
          attempts: list[dict[str, Any]]) -> tuple[Container, LogWatcher, BootOutcome, float]:
    """Launch and wait; relaunch once after a silent spawn hang (DOMAIN.md)."""
    for attempt in (1, 2):
        launched_at = time.monotonic()
        c = launch(image_ref, command, memory=expect["memory_limit"], gpu=expect["gpu"],
                   user=user)
        watcher: LogWatcher | None = None
        try:  # from the first moment the container exists: Ctrl-C removes it
            watcher = LogWatcher(c.name, out / "container.log").start()
            outcome = _wait(image_ref, c, watcher, timeout_s, stall_s, console)
        except BaseException:
            c.remove()
            if watcher is not None:
                watcher.stop()
            raise
        attempts.append({"attempt": attempt, "container": c.name, "kind": outcome.kind,
                         "message": outcome.message})
        console.print(f"boot attempt {attempt}: {outcome.message}", markup=False,
                      highlight=False)
        if outcome.kind != "stalled" or attempt == 2:
            return c, watcher, outcome, launched_at
        c.remove()
        watcher.stop()
        (out / "container.log").rename(out / "container-attempt1.log")
        console.print("relaunching once: a silent hang at spawn clears on a clean start",
                      markup=False, highlight=False)
    raise AssertionError("unreachable")


def _verdict(image_ref: str, image_id: str, expect: dict[str, Any], boot: BootOutcome,
             checks: list[dict[str, Any]], attempts: list[dict[str, Any]], out_dir: Path, *,
             t0: float, checks_s: float, fatal_abs: float | None) -> dict[str, Any]:
    boot_d = asdict(boot)
    bad = [ch for ch in checks if ch["outcome"] in ("failed", "error")]
    passed = boot.ready and not bad
    if not boot.ready:
        outcome, message = f"boot {boot.kind}", boot.message
    elif bad:
        outcome = "checks failed"
        message = f"{len(bad)} check(s) failed: " + ", ".join(ch["name"] for ch in bad)
    else:
        outcome = "passed"
        message = (f"{sum(ch['outcome'] == 'passed' for ch in checks)} checks passed, "
                   f"{sum(ch['outcome'] == 'skipped' for ch in checks)} not applicable")
    now = time.monotonic()
    verdict = {
        "image_ref": image_ref,
        "image_id": image_id,  # publish pushes only the digest of this id
        "cell": expect.get("cell"), "engine": expect.get("engine"),
        "target": expect.get("target"), "expect_source": expect.get("source"),
        "passed": passed, "outcome": outcome, "message": message,
        "boot": boot_d, "relaunched": len(attempts) > 1, "attempts": attempts,
        # name -> result for every check that ran (publish's gate and release notes read
        # `passed`); checks that do not apply to this cell are listed apart with the reason
        "checks": {ch["name"]: {"passed": ch["outcome"] == "passed", **ch} for ch in
                   [{"name": "boot", "outcome": "passed" if boot.ready else "failed",
                     "seconds": round(boot.seconds, 2),
                     "message": "" if boot.ready else boot.message}] + checks
                   if ch["outcome"] != "skipped"},
        "not_applicable": {ch["name"]: ch["message"] for ch in checks
                           if ch["outcome"] == "skipped"},
        "timings": {"boot_s": round(boot.seconds, 2), "checks_s": round(checks_s, 2),
                    "total_s": round(now - t0, 2),
                    "fatal_to_verdict_s": (round(now - fatal_abs, 2)
                                           if fatal_abs is not None else None)},
        "files": {name: str(out_dir / f) for name, f in
                  (("junit", "junit.xml"), ("summary", "summary.md"),
                   ("log", "container.log"))},
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    return verdict


def smoke_image(image_ref: str, expect: dict[str, Any], out_dir: Path, *,
                boot_timeout_s: float | None = None, stall_s: float | None = None,
                console: Console | None = None) -> dict[str, Any]:
    """Smoke-test one local image; returns the verdict (also written to out_dir)."""
    console = console or Console(stderr=True, soft_wrap=True)  # CI logs: no hard wraps
    t0 = time.monotonic()
    info = inspect_image(image_ref)
    command = list(info.get("Config", {}).get("Cmd") or [])
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in OUTPUTS:
        (out_dir / name).unlink(missing_ok=True)
    timeout_s = boot_timeout_s or expect["boot_timeout_s"]
    stall = stall_s or default_stall_s(timeout_s)
    attempts: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    checks_xml: Path | None = None
    checks_s = 0.0
    fatal_abs: float | None = None
    with _sigterm_as_interrupt():
        user = image_user(image_ref, info.get("Config", {}).get("User") or "")
        c, watcher, boot, launched_at = _boot(image_ref, command, user, expect, out_dir,
                                              timeout_s, stall, console, attempts)
        try:
            if boot.fatal_line_s is not None:
                fatal_abs = launched_at + boot.fatal_line_s
            if boot.ready:
                config = {"image_ref": image_ref, "image_id": info["Id"], "container": c.name,
                          "base_url": c.base_url, "log_path": str(out_dir / "container.log"),
                          "expect": expect}
                t1 = time.monotonic()
                checks_xml, _ = _run_checks(out_dir, config, console)
                checks_s = time.monotonic() - t1
                checks = read_junit(checks_xml) if checks_xml.exists() else [
                    {"name": "checks", "outcome": "error", "seconds": checks_s,
                     "message": "pytest wrote no JUnit XML; see checks.log"}]
            # judged before the clean-up: a dying vLLM can take seconds to be removed
            verdict = _verdict(image_ref, info["Id"], expect, boot, checks, attempts, out_dir,
                               t0=t0, checks_s=checks_s, fatal_abs=fatal_abs)
            write_junit(out_dir / "junit.xml", image_ref, verdict["boot"], checks_xml)
            write_verdict(out_dir, verdict)
        finally:
            c.remove()
            watcher.stop()
    console.print(f"{'PASSED' if verdict['passed'] else 'FAILED'} {image_ref}: "
                  f"{verdict['message']}\n  verdict: {out_dir / 'verdict.json'}",
                  markup=False, highlight=False)
    return verdict


def smoke_ref(image_ref: str, *, out_dir: Path | None = None, **kw: Any) -> dict[str, Any]:
    """`build.py smoke IMAGE_REF`: expectations from the image's labels (and its cell)."""
    expect = expectations_from_labels(image_ref)
    return smoke_image(image_ref, expect, out_dir or out_dir_for(expect, image_ref), **kw)


def smoke_jobs(jobs: tuple[Job, ...], *, out_root: Path | None = None, **kw: Any
               ) -> dict[str, dict[str, Any]]:
    """`build.py smoke --tag T [--only GLOB]` and the whole job: each job's local image
    (`job.release_ref`, as `build` tagged it), one container at a time."""
    verdicts = {}
    for job in jobs:
        out = cell_dir(out_root or REPO_ROOT / "build", job.cell)
        verdicts[job.id] = smoke_image(job.release_ref, dict(job.expect), out, **kw)
    return verdicts
