"""Start a serve image for a benchmark the way it is run everywhere (runspec.py: hardened,
loopback, a free port), wait for /health, and always remove it: on failure, Ctrl-C or
SIGTERM (the Docker seam holds an interrupt while the container is being created, and
the clean-up removes it by name and by this run's label)."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator
from typing import Any

import requests

from imagebuild import REPO_ROOT, progress, work_root
from imagebuild.docker import engine, image_user
from imagebuild.errors import OperationFailed
from imagebuild.runspec import RunSpec, sdk_run_kwargs, without_flag
from imagebuild.smoke.boot import POLL_S, Container
from imagebuild.smoke.runner import free_port

LABEL = "io.imagebuild.bench"
# The key `make teardown` sweeps by (smoke's compose sets it to the compose file's dir):
# a bench server carries this workspace under it, so a job cancelled mid-bench leaves no
# container behind, and the sweep still never touches another workspace's.
WORKSPACE_LABEL = "com.docker.compose.project.working_dir"


def workspace_labels() -> dict[str, str]:
    """This checkout's workspace (where build/ goes) under the teardown sweep's key."""
    return {WORKSPACE_LABEL: str(work_root(REPO_ROOT).resolve())}


@contextlib.contextmanager
def serving(image: str, info: dict[str, Any], expect: dict[str, Any], *,
            drop_flags: tuple[str, ...] = (), set_flags: tuple[tuple[str, str], ...] = (),
            cpuset: str | None = None, environment: dict[str, str] | None = None,
            log=print) -> Iterator[Container]:
    """The image's own serve command, minus `drop_flags`, with `set_flags` (flag, value)
    replacing or adding values: how a variant of a release is measured without a rebuild.
    `cpuset` (docker --cpuset-cpus) keeps the server off the load generator's cores;
    `environment` adds to the image's own (how a profile's env setting is tried out)."""
    command = list(info.get("Config", {}).get("Cmd") or [])
    for flag in drop_flags + tuple(f for f, _ in set_flags):
        command = without_flag(command, flag)
    for flag, value in set_flags:
        command += [flag, value]
    spec = RunSpec(image=image, command=tuple(command), memory=expect.get("memory_limit"),
                   gpu=bool(expect.get("gpu")),
                   user=image_user(image, info.get("Config", {}).get("User") or ""),
                   cpuset=cpuset).at_port(free_port())
    token = secrets.token_hex(4)
    c = Container(f"imagebuild-bench-{token}", spec.port)
    try:
        # the label carries this run's token: the clean-up below finds the container
        # even if its name was never confirmed (an interrupt during creation)
        engine().run(image, list(spec.command), name=c.name,
                     labels={LABEL: token, **workspace_labels()},
                     **sdk_run_kwargs(spec), **({"environment": environment}
                                                if environment else {}))
        t0 = time.monotonic()
        timeout = float(expect.get("boot_timeout_s") or 600)
        while True:
            progress.wait("boot", f"waiting for /health ({time.monotonic() - t0:.0f}s)")
            try:
                if requests.get(c.base_url + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if not c.running():
                tail = b"".join(engine().logs(c.name, follow=False))[-1500:]
                raise OperationFailed(f"{image} exited while booting:\n"
                                      f"{tail.decode(errors='replace')}",
                                      fix=f"run `build.py smoke {image}` for a diagnosis")
            if time.monotonic() - t0 > timeout:
                raise OperationFailed(f"{image} not healthy after {timeout:.0f} s",
                                      fix=f"run `build.py smoke {image}` for a diagnosis")
            # smoke's poll step (boot.py): a 1 s step cost half a second per boot on average
            time.sleep(POLL_S)
        log(f"server up in {time.monotonic() - t0:.1f} s on {c.base_url}")
        yield c
    finally:  # whatever ended the run: failure, Ctrl-C, SIGTERM
        engine().remove_container(c.name)
        engine().remove_labelled(f"{LABEL}={token}")
