"""The smoke suite: one serve container, brought up and down by pytest-docker from the
image's compose file (the same file every release ships), checked by the tests here.

It is driven by `python build.py smoke ...` (imagebuild/smoke/runner.py), which writes
the compose file and a JSON config and points IMAGEBUILD_SMOKE_CONFIG at it. Without that
variable there is nothing to test and nothing is collected.

The `smoke` fixture waits for the boot with the fail-fast log watcher: a fatal engine line
or a container exit ends the wait within seconds, a silent spawn hang gets one clean
relaunch. The boot outcome goes to boot.json for the runner's verdict; a boot that fails
fails every check that needs the server.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import requests

from imagebuild.docker import engine
from imagebuild.errors import OperationFailed
from imagebuild.serving.boot import BootOutcome, Container, wait_ready
from imagebuild.serving.compose import PROJECT_LABEL, compose_argv
from imagebuild.serving.logwatch import LogWatcher
from imagebuild.smoke.probes import quote_log

CONFIG_ENV = "IMAGEBUILD_SMOKE_CONFIG"

if not os.environ.get(CONFIG_ENV):
    collect_ignore_glob = ["test_*.py"]


def _config() -> dict[str, Any]:
    return json.loads(Path(os.environ[CONFIG_ENV]).read_text())


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "concurrency" in metafunc.fixturenames:
        levels = _config()["expect"]["concurrency"]
        metafunc.parametrize("concurrency", levels, ids=[f"c{n}" for n in levels])


# -- pytest-docker: which file, which project, which commands


@pytest.fixture(scope="session")
def smoke_config() -> dict[str, Any]:
    return _config()


@pytest.fixture(scope="session")
def docker_compose_file(smoke_config: dict[str, Any]) -> str:
    return str(smoke_config["compose_file"])


@pytest.fixture(scope="session")
def docker_compose_project_name(smoke_config: dict[str, Any]) -> str:
    return str(smoke_config["project"])


@pytest.fixture(scope="session")
def docker_compose_command() -> str:
    """pytest-docker's compose: the one serving/compose.py detects."""
    try:
        return " ".join(compose_argv())
    except OperationFailed as exc:
        raise pytest.UsageError(exc.message) from None


@pytest.fixture(scope="session")
def docker_setup() -> list[str]:
    return ["up --detach --no-build"]  # the image is built and tested as it is


@pytest.fixture(scope="session")
def docker_cleanup() -> list[str]:
    return ["down --volumes --timeout 5"]


# -- the booted server


def _container(project: str, deadline: float) -> str:
    while True:
        names = engine().container_names(label=f"{PROJECT_LABEL}={project}")
        if names:
            return names[0]
        if time.monotonic() > deadline:
            raise RuntimeError(f"compose project {project} started no container")
        time.sleep(0.2)


def _say(config: pytest.Config, text: str) -> None:
    """A progress line on the terminal now, past pytest's output capture: the smoke
    runner streams it to the user and the CI log while the boot goes on."""
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print(text, flush=True)


def _wait(cfg: dict[str, Any], name: str, log_path: Path, say: Callable[[str], None]
          ) -> tuple[LogWatcher, BootOutcome]:
    watcher = LogWatcher(name, log_path).start()
    c = Container(name, int(cfg["port"]))
    seen = [""]

    def tick(elapsed: float, phase: str) -> None:  # one line per phase change (CI logs)
        if phase != seen[0]:
            seen[0] = phase
            say(f"booting {cfg['image_ref']} · {elapsed:5.1f}s · {phase}")

    outcome = wait_ready(c, watcher, timeout_s=float(cfg["boot_timeout_s"]),
                         stall_s=float(cfg["stall_s"]), tick=tick)
    return watcher, outcome


@pytest.fixture(scope="session")
def smoke(docker_services: Any, smoke_config: dict[str, Any], docker_compose_command: str,
          docker_compose_file: str, docker_compose_project_name: str,
          pytestconfig: pytest.Config) -> Iterator[dict[str, Any]]:
    """The running, healthy server: {container, base_url, log_path, ...config}."""
    cfg = smoke_config
    out = Path(cfg["out_dir"])
    log_path = out / "container.log"

    def say(text: str) -> None:
        _say(pytestconfig, text)

    attempts: list[dict[str, Any]] = []
    t0 = time.time()
    watcher: LogWatcher | None = None
    outcome: BootOutcome | None = None
    name = ""
    for attempt in (1, 2):
        started = time.time()
        name = _container(docker_compose_project_name, time.monotonic() + 60)
        watcher, outcome = _wait(cfg, name, log_path, say)
        attempts.append({"attempt": attempt, "container": name, "kind": outcome.kind,
                         "message": outcome.message})
        say(f"boot attempt {attempt}: {outcome.message}")
        if outcome.kind != "stalled" or attempt == 2:
            break
        # the silent spawn hang clears on a clean relaunch; a real failure reproduces
        say("relaunching once: a silent hang at spawn clears on a clean start")
        log_path.rename(out / "container-attempt1.log")
        subprocess.run([*shlex.split(docker_compose_command), "-f", docker_compose_file,
                        "-p", docker_compose_project_name, "up", "--detach", "--no-build",
                        "--force-recreate"], check=True, capture_output=True)
        watcher.stop(timeout=1)
    assert watcher is not None and outcome is not None
    boot = {**asdict(outcome), "attempts": attempts, "container": name,
            "fatal_line_at": (started + outcome.fatal_line_s
                              if outcome.fatal_line_s is not None else None),
            "t0": t0}
    Path(cfg["boot_path"]).write_text(json.dumps(boot, indent=1))
    if not outcome.ready:
        watcher.stop(timeout=1)
        pytest.fail(f"boot {outcome.kind}: {outcome.message}", pytrace=False)
    yield {**cfg, "container": name, "base_url": f"http://127.0.0.1:{cfg['port']}",
           "log_path": str(log_path)}
    watcher.stop(timeout=1)


@pytest.fixture(scope="session")
def expect(smoke: dict[str, Any]) -> dict[str, Any]:
    return smoke["expect"]


@pytest.fixture(scope="session")
def api(smoke: dict[str, Any]) -> Callable[..., requests.Response]:
    """`api(method, path, **kw)` against the container; generous timeout for a CPU engine."""
    session = requests.Session()

    def call(method: str, path: str, **kw: Any) -> requests.Response:
        kw.setdefault("timeout", smoke.get("request_timeout_s", 120))
        return session.request(method, smoke["base_url"] + path, **kw)

    return call


@pytest.fixture
def log(smoke: dict[str, Any]) -> Callable[..., str]:
    """`log(pattern=None)`: container log lines to quote in a failure message."""
    def quote(pattern: str | None = None) -> str:
        lines = Path(smoke["log_path"]).read_text(errors="replace").splitlines()
        return quote_log(lines, pattern)
    return quote


@pytest.fixture
def log_lines(smoke: dict[str, Any]) -> list[str]:
    return Path(smoke["log_path"]).read_text(errors="replace").splitlines()


@pytest.fixture(scope="session")
def model(expect: dict[str, Any]) -> str:
    return expect["served_names"][0]


@pytest.fixture(scope="session")
def chat(api: Callable[..., requests.Response], model: str) -> Callable[..., requests.Response]:
    """A greedy chat request with thinking off unless asked, so answers are reproducible."""
    def send(content: Any, *, thinking: bool = False, **extra: Any) -> requests.Response:
        body: dict[str, Any] = {
            "model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": 32, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": thinking},
        }
        body.update(extra)
        return api("POST", "/v1/chat/completions", json=body)
    return send
