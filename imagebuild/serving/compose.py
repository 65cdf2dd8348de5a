"""Compose, the one way a serve image's file is run: which compose this machine has
(detected once), a run's own project name, and the backstop clean-up of a project.

Smoke's suite runs the file through pytest-docker, a multi-node cell's nodes and
`build.py launch` through `compose -f FILE -p PROJECT`; all of them ask compose_argv."""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

from imagebuild.docker import engine
from imagebuild.errors import OperationFailed
from imagebuild.interrupts import held_interrupts

PROJECT_LABEL = "com.docker.compose.project"  # compose's own label: a project's containers
SWEEP_SETTLE_S = 1.0  # a create the engine accepted before compose was stopped lands by then


@functools.cache
def compose_argv() -> list[str]:
    """Compose v2 (`docker compose`) where the plugin exists, else Debian's docker-compose
    (asked once per process)."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True
                                 ).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise OperationFailed("no docker compose: install the compose plugin or docker-compose")


def new_project() -> str:
    """A compose project name of this run's own (labels find its containers)."""
    return f"imagebuild-smoke-{secrets.token_hex(4)}"


def take_down(project: str, compose_file: Path, env: dict[str, str] | None = None, *,
              suite_finished: bool = False) -> None:
    """Backstop clean-up: every container labelled with the project goes first (killed,
    not stopped: seconds), then compose down for what else it made; a second sweep after
    a moment catches a container the engine was still creating when compose was stopped.
    Its own session: a second Ctrl-C on the terminal does not cut it short.
    `suite_finished`: the suite ended by itself, so its own `down` ran and nothing was cut
    short mid-create; when it left nothing labelled, there is nothing to back stop (a
    second compose process and the settle cost 1.7 s of every smoke with compose 1.29)."""
    label = f"{PROJECT_LABEL}={project}"
    if suite_finished and not engine().labelled_leftovers(label):
        return
    engine().remove_labelled(label)
    with held_interrupts():
        try:
            # `env`: the variables the file requires (a multi-node file's MASTER_ADDR)
            subprocess.run([*compose_argv(), "-f", str(compose_file), "-p",
                            project, "down", "--volumes", "--timeout", "5"],
                           capture_output=True, timeout=120, start_new_session=True,
                           env={**os.environ, **(env or {})})
        except Exception:  # noqa: BLE001 - the label sweeps still run
            pass
    time.sleep(SWEEP_SETTLE_S)
    engine().remove_labelled(label)
