"""One smoke run: write the image's compose file, run the check suite (which brings the
container up and down through pytest-docker), judge, write the verdict.

The verdict is `passed` only when the boot was healthy, pytest itself exited 0 and every
check the suite must run for this image ran (passed, or not applicable with a reason): a
crashed pytest, zero collected checks, an error in a check or a missing check fail it.

Whatever happens (failure, Ctrl-C, SIGTERM) the compose project is taken down before
returning: pytest-docker's own clean-up first, then ours as a backstop (`down`, and every
container still labelled with the project).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from imagebuild import PACKAGE_DIR, REPO_ROOT, buildfolder
from imagebuild.buildfolder import CAPTURE_FILE, SMOKE_OUTPUTS, cell_dir, ref_dir
from imagebuild.docker import inspect_image
from imagebuild.expectations import expectations_from_labels
from imagebuild.interrupts import held_interrupts, interrupts_as_keyboard_interrupt
from imagebuild.render import render_compose
from imagebuild.runowner import owned_compose
from imagebuild.serving.compose import new_project, take_down
from imagebuild.serving.container import image_run_spec
from imagebuild.serving.nodes import NodeFile, cell_node_files, node_hosts, placement
from imagebuild.serving.runspec import Limits, compose_yaml, free_port, speculates
from imagebuild.smoke.checks import missing_checks
from imagebuild.smoke.nodes import JudgedNodes, NodeJudge
from imagebuild.smoke.report import read_junit, write_junit, write_verdict
from imagebuild.spec.nodecmd import multi_node

if TYPE_CHECKING:
    from imagebuild.plan import Job
    from imagebuild.spec.matrix import LoadedMatrix

SUITE = Path(__file__).resolve().parent / "suite"
CHECK_TIMEOUT_S = 900  # per check (pytest-timeout); a gb10 burst at c=32 is the longest
INTERRUPT_GRACE_S = 5  # pytest's own teardown (compose down) gets this long after Ctrl-C


def default_stall_s(boot_timeout_s: float) -> float:
    """How long a silent log may last before boot counts as the spawn hang."""
    return min(180.0, max(60.0, boot_timeout_s / 4))


def _run_suite(out: Path, config: dict[str, Any], env: dict[str, str], console: Console,
               timeout_s: float) -> tuple[Path, int]:
    cfg = out / "config.json"
    cfg.write_text(json.dumps(config, indent=1))
    junit = out / "checks-junit.xml"
    # junit_family xunit1: the family that keeps record_property figures in the XML
    cmd = [sys.executable, "-m", "pytest", str(SUITE), "-p", "no:cacheprovider", "-q",
           "-c", str(SUITE / "pytest.ini"), "--rootdir", str(SUITE),
           f"--junitxml={junit}", "-o", "junit_family=xunit1",
           f"--timeout={timeout_s:.0f}", "-W", "ignore::DeprecationWarning"]
    full_env = {**os.environ, **env, "IMAGEBUILD_SMOKE_CONFIG": str(cfg),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_DIR.parent),
                                                           os.environ.get("PYTHONPATH")]))}
    with (out / "checks.log").open("w") as log:
        # its own session: an interrupt reaches pytest and the compose command it runs
        # together, from us, after we have seen it (a terminal's Ctrl-C reaches us only)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=full_env, cwd=out, start_new_session=True)
        try:
            assert proc.stdout
            for line in proc.stdout:
                log.write(line)
                console.print(line.rstrip("\n"), markup=False, highlight=False)
            code = proc.wait()
        except KeyboardInterrupt:
            # let pytest run its own teardown (compose down) for a few seconds, then stop
            # the whole group; take_down (the caller's finally) removes what is left
            with held_interrupts():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=INTERRUPT_GRACE_S)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            raise
    return junit, code


def _verdict(image_ref: str, image_id: str, expect: dict[str, Any], boot: dict[str, Any],
             checks: list[dict[str, Any]], pytest_code: int, out_dir: Path, *,
             t0: float, suite_s: float = 0.0) -> dict[str, Any]:
    ready = boot.get("kind") == "ready"
    bad = [ch for ch in checks if ch["outcome"] in ("failed", "error")]
    missing = missing_checks([ch["name"] for ch in checks], expect)
    passed = ready and not bad and not missing and pytest_code == 0
    if not boot:
        outcome = "suite failed"
        message = (f"the check suite exited {pytest_code} before the server booted; "
                   "see checks.log")
    elif not ready:
        outcome, message = f"boot {boot['kind']}", boot["message"]
    elif bad:
        outcome = "checks failed"
        message = f"{len(bad)} check(s) failed: " + ", ".join(ch["name"] for ch in bad)
    elif missing:
        outcome = "checks missing"
        message = f"{len(missing)} expected check(s) did not run: {', '.join(missing)}"
    elif pytest_code != 0:
        outcome = "suite failed"
        message = f"pytest exited {pytest_code} although every check passed; see checks.log"
    else:
        outcome = "passed"
        message = (f"{sum(ch['outcome'] == 'passed' for ch in checks)} checks passed, "
                   f"{sum(ch['outcome'] == 'skipped' for ch in checks)} not applicable")
    now = time.time()
    boot_s = float(boot.get("seconds") or 0.0)
    boot_case = {"name": "boot", "outcome": "passed" if ready else "failed",
                 "seconds": round(boot_s, 2), "message": "" if ready else boot.get(
                     "message", "no boot record")}
    return {
        "image_ref": image_ref,
        "image_id": image_id,  # publish pushes only the digest of this id
        "cell": expect.get("cell"), "engine": expect.get("engine"),
        "target": expect.get("target"), "expect_source": expect.get("source"),
        "passed": passed, "outcome": outcome, "message": message,
        "pytest_exit_code": pytest_code,
        "boot": {k: boot.get(k) for k in ("kind", "message", "phase", "seconds", "excerpt",
                                          "exit_code", "fatal_line_s")} if boot else
                {"kind": "none", "message": "no boot record", "phase": "none",
                 "seconds": 0.0, "excerpt": ""},
        "relaunched": len(boot.get("attempts") or []) > 1, "attempts": boot.get("attempts"),
        # name -> result for every check that ran (publish's gate and release notes read
        # `passed`); checks that do not apply to this cell are listed apart with the reason
        "checks": {ch["name"]: {"passed": ch["outcome"] == "passed", **ch}
                   for ch in [boot_case] + checks if ch["outcome"] != "skipped"},
        "not_applicable": {ch["name"]: ch["message"] for ch in checks
                           if ch["outcome"] == "skipped"},
        "missing": missing,
        "timings": {"boot_s": round(boot_s, 2),
                    # the suite brings the container up, waits for the boot, then checks
                    "checks_s": round(max(0.0, suite_s - boot_s), 2),
                    "total_s": round(now - t0, 2),
                    "fatal_to_verdict_s": (round(now - boot["fatal_line_at"], 2)
                                           if boot.get("fatal_line_at") else None)},
        "files": {name: str(out_dir / f) for name, f in
                  (("junit", "junit.xml"), ("summary", "summary.md"),
                   ("log", "container.log"), ("compose", "compose.yaml"))},
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def smoke_image(image_ref: str, expect: dict[str, Any], out_dir: Path, *,
                boot_timeout_s: float | None = None, stall_s: float | None = None,
                console: Console | None = None, compose_text: str | None = None,
                gates: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                project: str | None = None, nodes: NodeJudge | None = None
                ) -> dict[str, Any]:
    """Smoke-test one local image; returns the verdict (also written to out_dir).
    `compose_text`: the cell's rendered compose file (the one users get); without it (an
    image known only by reference) the same settings are derived from the image.
    `gates`: the target's release-gate settings; the suite then sends the gates' requests
    and records the answers for them (gates/capture.py).
    A multi-node cell (smoke_nodes) runs its head here: `env` for compose (the head's
    address), `project` (its workers take the head down when one is lost) and `nodes`,
    which adds the node checks to the verdict before it is written."""
    console = console or Console(stderr=True, soft_wrap=True)  # CI logs: no hard wraps
    t0 = time.time()
    info = inspect_image(image_ref)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in SMOKE_OUTPUTS:
        (out_dir / name).unlink(missing_ok=True)
    timeout_s = boot_timeout_s or expect["boot_timeout_s"]
    port = free_port()
    compose_file = out_dir / "compose.yaml"
    # this run's labels on what compose makes (runowner.py): a SIGKILLed run's is reaped
    compose_file.write_text(owned_compose(compose_text or compose_yaml(
        image_run_spec(image_ref, info, Limits.of(expect)), name=expect.get("image") or "serve")))
    project = project or new_project()
    config = {"image_ref": image_ref, "image_id": info["Id"], "expect": expect,
              "compose_file": str(compose_file), "project": project, "port": port,
              "out_dir": str(out_dir), "boot_path": str(out_dir / "boot.json"),
              "boot_timeout_s": timeout_s, "stall_s": stall_s or default_stall_s(timeout_s)}
    if gates is not None:
        config["gates_capture"] = {"settings": gates, "path": str(out_dir / CAPTURE_FILE),
                                   "what": "speculative" if speculates(info) else "plain",
                                   "command": list((info.get("Config") or {}).get("Cmd")
                                                   or [])}
    env = {**(env or {}), "IMAGEBUILD_PORT": str(port), "IMAGEBUILD_IMAGE": image_ref}
    console.print(f"smoke {image_ref}: compose project {project} on 127.0.0.1:{port}",
                  markup=False, highlight=False)
    with interrupts_as_keyboard_interrupt():
        t1 = time.time()
        finished = False
        try:
            checks_xml, code = _run_suite(out_dir, config, env, console,
                                          max(CHECK_TIMEOUT_S, timeout_s + 300))
            finished = True
        finally:
            if nodes is not None:  # from here on a worker stopping is the run's end
                nodes.stop_watching()
            take_down(project, compose_file, env, suite_finished=finished)
        suite_s = time.time() - t1
    boot_path = out_dir / "boot.json"
    boot = json.loads(boot_path.read_text()) if boot_path.exists() else {}
    checks = read_junit(checks_xml) if checks_xml.exists() else []
    if boot.get("kind") != "ready":  # the suite's checks only echo the failed boot
        checks = []
    verdict = _verdict(image_ref, info["Id"], expect, boot, checks, code, out_dir, t0=t0,
                       suite_s=suite_s)
    extra: list[dict[str, Any]] = []
    if nodes is not None:
        verdict, extra = nodes.judge(verdict)
    write_junit(out_dir / "junit.xml", image_ref, verdict["boot"],
                checks_xml if checks else None, extra)
    write_verdict(out_dir, verdict)
    console.print(f"{'PASSED' if verdict['passed'] else 'FAILED'} {image_ref}: "
                  f"{verdict['message']}\n  verdict: {out_dir / 'verdict.json'}",
                  markup=False, highlight=False)
    return verdict


def smoke_ref(image_ref: str, *, out_dir: Path | None = None, matrix: Path | None = None,
              **kw: Any) -> dict[str, Any]:
    """`build.py smoke IMAGE_REF`: expectations from the image's labels (and its cell in
    the matrix in effect: `matrix`, else spec.matrix.matrix_path's default)."""
    expect = expectations_from_labels(image_ref, inspect_image(image_ref), matrix=matrix)
    return smoke_image(image_ref, expect,
                       out_dir or ref_dir(buildfolder.default(REPO_ROOT), image_ref), **kw)


def smoke_jobs(lm: LoadedMatrix, jobs: tuple[Job, ...], *, out_root: Path, **kw: Any
               ) -> dict[str, dict[str, Any]]:
    """`build.py smoke --tag T [--image GLOB]` and the whole job: each job's local image
    (`job.release_ref`, as `build` tagged it) run from the cell's compose file, one
    container at a time."""
    verdicts = {}
    for job in jobs:
        out = cell_dir(out_root, job.cell)
        gates = job.cell.target.gates.model_dump()
        par = multi_node(job.cell)
        if par is not None:  # its nodes from render's per-node files (smoke/nodes.py)
            verdicts[job.id] = smoke_nodes(
                job.release_ref, dict(job.expect), out,
                cell_node_files(job.cell, job.release_ref),
                tensor_parallel_size=par.tensor_parallel_size, cpu=not job.cell.target.gpu,
                gates=gates, **kw)
            continue
        verdicts[job.id] = smoke_image(job.release_ref, dict(job.expect), out,
                                       compose_text=render_compose(lm, job.cell).text,
                                       gates=gates, **kw)
    return verdicts


def smoke_nodes(image_ref: str, expect: dict[str, Any], out_dir: Path,
                files: list[NodeFile], *, tensor_parallel_size: int, cpu: bool,
                **kw: Any) -> dict[str, Any]:
    """Smoke one multi-node cell: workers up, then the head through runner.smoke_image
    (its suite, its verdict), the node checks added; everything taken down after."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = sorted(files, key=lambda f: f.rank)
    hosts, master, local = node_hosts(len(files) - 1, cpu=cpu)
    env = placement(len(files), sorted(os.sched_getaffinity(0))) if cpu and local else []
    run = JudgedNodes(image_ref, list(files), out_dir, new_project(), master, env, hosts,
                      tensor_parallel_size // len(files))
    try:
        run.start_workers()
        run.watch()
        return smoke_image(image_ref, expect, out_dir, compose_text=run.head_text(),
                           env=run.compose_env(), project=run.head_project, nodes=run, **kw)
    finally:
        run.take_down()
