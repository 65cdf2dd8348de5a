"""Serve an image for the release gates and the bench the way it is run everywhere
(runspec.py: hardened, loopback, a free port), wait for /health, and always remove it: on
failure, Ctrl-C or SIGTERM (the Docker seam holds an interrupt while the container is
being created, and the clean-up removes it by name and by this run's label).

`server_for` picks how a cell is served: one container from the image's command, or a
multi-node cell on all its nodes the way its smoke runs them (nodes.py serving_nodes)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imagebuild import REPO_ROOT, work_root
from imagebuild.docker import engine, image_user
from imagebuild.errors import OperationFailed
from imagebuild.serving.boot import Container, wait_healthy
from imagebuild.serving.nodes import cell_node_files, serving_nodes
from imagebuild.serving.runspec import Limits, RunSpec, free_port, sdk_run_kwargs, without_flag
from imagebuild.spec.nodecmd import multi_node

if TYPE_CHECKING:
    from imagebuild.spec.matrix import Cell

LABEL = "io.imagebuild.bench"
# The key `make teardown` sweeps by (smoke's compose sets it to the compose file's dir):
# a bench server carries this workspace under it, so a job cancelled mid-bench leaves no
# container behind, and the sweep still never touches another workspace's.
WORKSPACE_LABEL = "com.docker.compose.project.working_dir"
Log = Callable[[str], None]
# a server for the image minus some flags (the plain run drops --speculative-config)
Server = Callable[[tuple[str, ...]], AbstractContextManager[Container]]


def workspace_labels() -> dict[str, str]:
    """This checkout's workspace (where build/ goes) under the teardown sweep's key."""
    return {WORKSPACE_LABEL: str(work_root(REPO_ROOT).resolve())}


def image_run_spec(image: str, info: dict[str, Any], limits: Limits, *,
                   command: Sequence[str] | None = None, cpuset: str | None = None) -> RunSpec:
    """How this image runs: its own CMD (or `command`), the cell's memory limit, GPU
    setting and port, as the user its image names (smoke's compose file of an image known
    only by reference, and the servers here)."""
    cfg = info.get("Config") or {}
    argv = cfg.get("Cmd") or () if command is None else command
    return RunSpec(image=image, command=tuple(argv),
                   memory=limits.memory, gpu=limits.gpu,
                   user=image_user(image, cfg.get("User") or ""), port=limits.port,
                   cpuset=cpuset)


@contextlib.contextmanager
def serving(image: str, info: dict[str, Any], limits: Limits, *,
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
    spec = image_run_spec(image, info, limits, command=command,
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
        timeout = limits.boot_timeout_s

        def exited() -> OperationFailed:
            tail = b"".join(engine().logs(c.name, follow=False))[-1500:]
            return OperationFailed(f"{image} exited while booting:\n"
                                   f"{tail.decode(errors='replace')}",
                                   fix=f"run `build.py smoke {image}` for a diagnosis")

        up_s = wait_healthy(
            c, timeout_s=timeout, waiting=lambda s: f"waiting for /health ({s:.0f}s)",
            exited=exited,
            timed_out=lambda: OperationFailed(f"{image} not healthy after {timeout:.0f} s",
                                              fix=f"run `build.py smoke {image}` for a "
                                                  "diagnosis"))
        log(f"server up in {up_s:.1f} s on {c.base_url}")
        yield c
    finally:  # whatever ended the run: failure, Ctrl-C, SIGTERM
        engine().remove_container(c.name)
        engine().remove_labelled(f"{LABEL}={token}")


def one_container(image: str, info: dict[str, Any], limits: Limits, *,
                  log: Log = print) -> Server:
    """A single-node cell's server: the image's own command in one container."""
    return lambda drop_flags: serving(image, info, limits, drop_flags=drop_flags, log=log)


def server_for(cell: Cell, image_ref: str, info: dict[str, Any], out_dir: Path, *,
               limits: Limits, what: str = "gates", log: Log = print) -> Server:
    """How a cell's image is served for the gates and the bench: a multi-node cell on all
    its nodes the way its smoke runs them (nodes.py serving_nodes: workers first, then
    the head), any other cell in one container from the image's command (which for a
    TP>1 layout over several nodes could not serve alone)."""
    par = multi_node(cell)
    if par is None:
        return one_container(image_ref, info, limits, log=log)
    files = cell_node_files(cell, image_ref)
    timeout = limits.boot_timeout_s
    return lambda drop_flags: serving_nodes(
        image_ref, files, out_dir / f"nodes-{what}", drop_flags=drop_flags,
        tensor_parallel_size=par.tensor_parallel_size, cpu=not cell.target.gpu,
        boot_timeout_s=timeout, log=log)
