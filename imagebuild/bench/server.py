"""Start a serve image for a benchmark the way it is run everywhere (runspec.py: hardened,
loopback, a free port), wait for /health, and always remove it."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator
from typing import Any

import requests

from imagebuild.docker import engine, image_user
from imagebuild.errors import OperationFailed
from imagebuild.runspec import RunSpec, sdk_run_kwargs
from imagebuild.smoke.boot import Container
from imagebuild.smoke.runner import free_port

LABEL = "io.imagebuild.bench"


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
    spec = RunSpec(image=image, command=tuple(command), memory=expect.get("memory_limit"),
                   gpu=bool(expect.get("gpu")),
                   user=image_user(image, info.get("Config", {}).get("User") or ""),
                   cpuset=cpuset).at_port(free_port())
    c = Container(f"imagebuild-bench-{secrets.token_hex(4)}", spec.port)
    try:
        engine().run(image, list(spec.command), name=c.name, labels={LABEL: "1"},
                     **sdk_run_kwargs(spec))
        t0 = time.monotonic()
        timeout = float(expect.get("boot_timeout_s") or 600)
        while True:
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
            time.sleep(1)
        log(f"server up in {time.monotonic() - t0:.1f} s on {c.base_url}")
        yield c
    finally:
        engine().remove_container(c.name)
