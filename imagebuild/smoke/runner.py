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
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from imagebuild import PACKAGE_DIR, REPO_ROOT, buildfolder
from imagebuild.buildfolder import CAPTURE_FILE, SMOKE_OUTPUTS, cell_dir, ref_dir
from imagebuild.docker import engine, image_user, inspect_image
from imagebuild.errors import OperationFailed
from imagebuild.interrupts import held_interrupts, interrupts_as_keyboard_interrupt
from imagebuild.runspec import PORT_VAR, RunSpec, compose_yaml
from imagebuild.smoke.checks import missing_checks
from imagebuild.smoke.expect import expectations_from_labels
from imagebuild.smoke.report import read_junit, write_junit, write_verdict

if TYPE_CHECKING:
    from imagebuild.plan import Job
    from imagebuild.smoke.boot import Container
    from imagebuild.smoke.nodes import NodeFile, NodeJudge, NodeRun
    from imagebuild.spec.matrix import LoadedMatrix

SUITE = Path(__file__).resolve().parent / "suite"
CHECK_TIMEOUT_S = 900  # per check (pytest-timeout); a gb10 burst at c=32 is the longest
PROJECT_LABEL = "com.docker.compose.project"
INTERRUPT_GRACE_S = 5  # pytest's own teardown (compose down) gets this long after Ctrl-C
SWEEP_SETTLE_S = 1.0  # a create the engine accepted before compose was stopped lands by then


def default_stall_s(boot_timeout_s: float) -> float:
    """How long a silent log may last before boot counts as the spawn hang."""
    return min(180.0, max(60.0, boot_timeout_s / 4))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_spec(image_ref: str, info: dict[str, Any], expect: dict[str, Any]) -> RunSpec:
    """How this image runs: its own CMD, the cell's memory limit and GPU setting."""
    cfg = info.get("Config") or {}
    return RunSpec(image=image_ref, command=tuple(cfg.get("Cmd") or ()),
                   memory=expect.get("memory_limit"), gpu=bool(expect.get("gpu")),
                   user=image_user(image_ref, cfg.get("User") or ""),
                   port=int(expect.get("port") or 8000))


def take_down(project: str, compose_file: Path, env: dict[str, str] | None = None, *,
              suite_finished: bool = False) -> None:
    """Backstop clean-up: every container labelled with the project goes first (killed,
    not stopped: seconds), then compose down for what else it made; a second sweep after
    a moment catches a container the engine was still creating when compose was stopped.
    Its own session: a second Ctrl-C on the terminal does not cut it short.
    `suite_finished`: the suite ended by itself, so its own `down` ran and nothing was cut
    short mid-create; when it left nothing labelled, there is nothing to back stop (a
    second compose process and the settle cost 1.7 s of every smoke with compose 1.29)."""
    from imagebuild.smoke.suite.conftest import compose_command

    label = f"{PROJECT_LABEL}={project}"
    if suite_finished and not engine().labelled_leftovers(label):
        return
    engine().remove_labelled(label)
    with held_interrupts():
        try:
            # `env`: the variables the file requires (a multi-node file's MASTER_ADDR)
            subprocess.run([*shlex.split(compose_command()), "-f", str(compose_file), "-p",
                            project, "down", "--volumes", "--timeout", "5"],
                           capture_output=True, timeout=120, start_new_session=True,
                           env={**os.environ, **(env or {})})
        except Exception:  # noqa: BLE001 - the label sweeps still run
            pass
    time.sleep(SWEEP_SETTLE_S)
    engine().remove_labelled(label)


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
    A multi-node cell (smoke/nodes.py) runs its head here: `env` for compose (the head's
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
    compose_file.write_text(compose_text or compose_yaml(
        run_spec(image_ref, info, expect), name=expect.get("image") or "serve"))
    project = project or new_project()
    config = {"image_ref": image_ref, "image_id": info["Id"], "expect": expect,
              "compose_file": str(compose_file), "project": project, "port": port,
              "out_dir": str(out_dir), "boot_path": str(out_dir / "boot.json"),
              "boot_timeout_s": timeout_s, "stall_s": stall_s or default_stall_s(timeout_s)}
    if gates is not None:
        from imagebuild.gates.runrecord import speculates

        config["gates_capture"] = {"settings": gates, "path": str(out_dir / CAPTURE_FILE),
                                   "what": "speculative" if speculates(info) else "plain"}
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


def new_project() -> str:
    """A compose project name of this run's own (labels find its containers)."""
    return f"imagebuild-smoke-{secrets.token_hex(4)}"


def smoke_ref(image_ref: str, *, out_dir: Path | None = None, **kw: Any) -> dict[str, Any]:
    """`build.py smoke IMAGE_REF`: expectations from the image's labels (and its cell)."""
    expect = expectations_from_labels(image_ref)
    return smoke_image(image_ref, expect,
                       out_dir or ref_dir(buildfolder.default(REPO_ROOT), image_ref), **kw)


def smoke_jobs(lm: LoadedMatrix, jobs: tuple[Job, ...], *, out_root: Path, **kw: Any
               ) -> dict[str, dict[str, Any]]:
    """`build.py smoke --tag T [--only GLOB]` and the whole job: each job's local image
    (`job.release_ref`, as `build` tagged it) run from the cell's compose file, one
    container at a time."""
    from imagebuild.render import render_compose
    from imagebuild.smoke.nodes import cell_node_files
    from imagebuild.spec.nodecmd import multi_node

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
    from imagebuild.smoke.nodes import NodeRun, node_hosts, placement

    out_dir.mkdir(parents=True, exist_ok=True)
    files = sorted(files, key=lambda f: f.rank)
    hosts, master, local = node_hosts(len(files) - 1, cpu=cpu)
    env = placement(len(files), sorted(os.sched_getaffinity(0))) if cpu and local else []
    run = NodeRun(image_ref, list(files), out_dir, new_project(), master, env, hosts,
                  tensor_parallel_size // len(files))
    try:
        run.start_workers()
        run.watch()
        return smoke_image(image_ref, expect, out_dir, compose_text=run.head_text(),
                           env=run.compose_env(), project=run.head_project, nodes=run, **kw)
    finally:
        run.take_down()


@contextlib.contextmanager
def serving_nodes(image_ref: str, files: Sequence[NodeFile], out_dir: Path, *,
                  tensor_parallel_size: int, cpu: bool, boot_timeout_s: float,
                  drop_flags: tuple[str, ...] = (), log: Callable[[str], None] = print
                  ) -> Iterator[Container]:
    """A multi-node cell served for the release gates and the bench, the way its smoke
    runs it: the same NodeRun starts and watches the workers (same hosts, same
    placement), then the head comes up detached from its per-node file on a free
    loopback port; yields it once /health answers. A lost worker ends the boot (and
    stops the head, so requests in flight fail rather than hang); everything is taken
    down after, whatever ended the run."""
    from imagebuild.smoke.boot import Container
    from imagebuild.smoke.nodes import (
        PROJECT_LABEL,
        UP_TIMEOUT_S,
        LogWatcher,
        NodeFile,
        NodeRun,
        _Worker,
        lost_message,
        node_hosts,
        placement,
        without_flags,
    )

    out_dir.mkdir(parents=True, exist_ok=True)
    files = [NodeFile(f.name, f.rank, without_flags(f.text, drop_flags))
             for f in sorted(files, key=lambda f: f.rank)]
    hosts, master, local = node_hosts(len(files) - 1, cpu=cpu)
    env = placement(len(files), sorted(os.sched_getaffinity(0))) if cpu and local else []
    run = NodeRun(image_ref, files, out_dir, new_project(), master, env, hosts,
                  tensor_parallel_size // len(files))
    port = free_port()
    head_file = out_dir / f"{files[0].name}.compose.yaml"
    head_env = {**run.compose_env(), PORT_VAR: str(port)}
    try:
        run.start_workers()
        run.watch()
        head_file.write_text(run.head_text())
        head = _Worker(files[0], None, run.head_project, head_file,
                       out_dir / f"{files[0].name}.log", engine())
        proc = run._compose(head, "up", "--detach", "--no-build", timeout=UP_TIMEOUT_S,
                            extra_env={PORT_VAR: str(port)})
        if proc.returncode != 0:
            raise OperationFailed(f"the head did not start: {proc.stderr.strip()[-800:]}",
                                  fix=f"run the file by hand: {head_file}")
        names = engine().container_names(label=f"{PROJECT_LABEL}={run.head_project}")
        c = Container(names[0] if names else "", port)
        head.watcher = LogWatcher(c.name, head.log).start()
        try:
            _wait_healthy(run, c, image_ref, boot_timeout_s, log)
            yield c
        finally:
            head.watcher.stop(timeout=2)
        if run.lost is not None:
            raise OperationFailed(lost_message(run.lost),
                                  fix=f"see the node's log: {out_dir}")
    finally:
        run.stop_watching()
        take_down(run.head_project, head_file, head_env)
        run.take_down()


def _wait_healthy(run: NodeRun, c: Container, image_ref: str, timeout_s: float,
                  log: Callable[[str], None]) -> None:
    import requests

    from imagebuild import progress
    from imagebuild.smoke.boot import POLL_S
    from imagebuild.smoke.nodes import lost_message

    t0 = time.monotonic()
    while True:
        elapsed = time.monotonic() - t0
        progress.wait("boot", f"{len(run.files)} nodes, waiting for the head's /health "
                      f"({elapsed:.0f}s)")
        if run.lost is not None:
            raise OperationFailed(lost_message(run.lost), fix=f"see {run.out_dir}")
        try:
            if requests.get(c.base_url + "/health", timeout=2).status_code == 200:
                log(f"{len(run.files)} nodes up in {elapsed:.1f} s, head on {c.base_url}")
                return
        except requests.RequestException:
            pass
        if not c.running():
            raise OperationFailed(f"{image_ref}: the head exited while booting; its log: "
                                  f"{run.out_dir / (run.files[0].name + '.log')}",
                                  fix="run `build.py smoke --tag T` for a diagnosis")
        if elapsed > timeout_s:
            raise OperationFailed(f"{image_ref}: the head was not healthy after "
                                  f"{timeout_s:.0f} s", fix="run `build.py smoke --tag T` "
                                  "for a diagnosis")
        time.sleep(POLL_S)  # as a single node's boot (boot.py)
