"""Start a serve image for a benchmark the way smoke does (hardened, loopback, free port),
wait for /health, and always remove it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import requests

from imagebuild.errors import OperationFailed
from imagebuild.smoke.container import Container, image_user, launch
from imagebuild.smoke.dockercli import docker


def without_flag(argv: list[str], flag: str) -> list[str]:
    """argv minus `flag VALUE` / `flag=VALUE` (e.g. --speculative-config for a baseline)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return out


@contextlib.contextmanager
def serving(image: str, info: dict[str, Any], expect: dict[str, Any], *,
            drop_flags: tuple[str, ...] = (), set_flags: tuple[tuple[str, str], ...] = (),
            cpuset: str | None = None, log=print) -> Iterator[Container]:
    """The image's own serve command, minus `drop_flags`, with `set_flags` (flag, value)
    replacing or adding values: how a variant of a release is measured without a rebuild.
    `cpuset` (docker --cpuset-cpus) keeps the server off the load generator's cores."""
    command = list(info.get("Config", {}).get("Cmd") or [])
    for flag in drop_flags + tuple(f for f, _ in set_flags):
        command = without_flag(command, flag)
    for flag, value in set_flags:
        command += [flag, value]
    user = image_user(image, info.get("Config", {}).get("User") or "")
    c = launch(image, command, memory=expect["memory_limit"], gpu=expect["gpu"], user=user,
               cpuset=cpuset)
    try:
        t0 = time.monotonic()
        timeout = float(expect.get("boot_timeout_s") or 600)
        while True:
            try:
                if requests.get(c.base_url + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if not c.running():
                tail = docker("logs", "--tail", "20", c.name, check=False).stderr[-1500:]
                raise OperationFailed(f"{image} exited while booting:\n{tail}",
                                      fix=f"run `build.py smoke {image}` for a diagnosis")
            if time.monotonic() - t0 > timeout:
                raise OperationFailed(f"{image} not healthy after {timeout:.0f} s",
                                      fix=f"run `build.py smoke {image}` for a diagnosis")
            time.sleep(1)
        log(f"server up in {time.monotonic() - t0:.1f} s on {c.base_url}")
        yield c
    finally:
        c.remove()
