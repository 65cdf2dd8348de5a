"""`build.py launch`: start a multi-node cell on the hosts a user names (docs/multi-node.md).

In this order, and nothing is started until every check passed:
1. the per-node compose files (rendered, or edited by hand) are read back and must agree
   (spec/nodecmd.node_differences: every worker runs the head's flags but its own rank,
   every node the same interconnect settings), one file per host;
2. every host has the image, and the same one: its image ID (the digest of its config)
   is read on each host (`docker image inspect`) and must be the same everywhere (two
   nodes on different builds disagree on the model, and fail or hang in NCCL);
3. workers start first, the head last (`docker compose up -d` against each host's engine),
   with MASTER_ADDR set to the head's address and IMAGEBUILD_IMAGE to the image.

A host is reached the way Docker reaches engines: `NAME` means `ssh://NAME` (the transport
of NVIDIA's and eugr's two-Spark scripts); a Docker host URL (`ssh://user@spark2`,
`unix:///var/run/docker.sock`, `tcp://...`) is used as given. Commands go through a Runner,
so tests can stand in for hosts.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from imagebuild.errors import OperationFailed, UserError
from imagebuild.serving.compose import compose_argv
from imagebuild.serving.nodefiles import read_node_file
from imagebuild.spec.nodecmd import MASTER_ADDR_VAR, NodeCommand, node_differences

log = logging.getLogger(__name__)
IMAGE_VAR = "IMAGEBUILD_IMAGE"  # runspec.IMAGE_VAR: the compose files' image override
LOCAL_ADDR = "127.0.0.1"  # the head's address when it is this machine's engine

# (argv, extra environment) -> (exit code, stdout, stderr)
Runner = Callable[[Sequence[str], Mapping[str, str]], tuple[int, str, str]]


def run_local(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int, str, str]:
    proc = subprocess.run(list(argv), env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=600)
    return proc.returncode, proc.stdout, proc.stderr


@dataclass(frozen=True)
class Host:
    given: str  # as the user wrote it

    @property
    def url(self) -> str:
        return self.given if "://" in self.given else f"ssh://{self.given}"

    @property
    def address(self) -> str:
        """The address other nodes reach it at: its name, or loopback for a local engine."""
        if self.url.startswith(("unix://", "npipe://")):
            return LOCAL_ADDR
        rest = self.url.split("://", 1)[1]
        return rest.rsplit("@", 1)[-1].split(":", 1)[0].split("/", 1)[0]


def parse_hosts(text: str) -> list[Host]:
    hosts = [Host(h.strip()) for h in text.split(",")]
    if not text.strip() or any(not h.given for h in hosts):
        raise UserError(f"--hosts {text!r} names an empty host",
                        fix="give the hosts comma-separated, head first: --hosts "
                            "spark1,spark2")
    return hosts


def read_nodes(files: Sequence[Path], hosts: Sequence[Host]) -> list[tuple[NodeCommand, Path]]:
    """The per-node files, by rank; they must agree and be one per host."""
    nodes = sorted(((read_node_file(p), p) for p in files), key=lambda np: np[0].rank)
    if len(nodes) != len(hosts):
        raise UserError(f"{len(files)} per-node compose file(s) but {len(hosts)} host(s) "
                        f"in --hosts", fix="give one host per node, head (node-rank 0) "
                                           "first, and every node's file")
    problems = node_differences([n for n, _ in nodes])
    if problems:
        raise UserError("the per-node files disagree:\n  " + "\n  ".join(problems),
                        fix="render them again (`python build.py render`) instead of "
                            "editing them", where=str(nodes[0][1]))
    return nodes


def image_ids(image: str, hosts: Sequence[Host], runner: Runner) -> dict[Host, str]:
    """Each host's image ID of `image`; a host without it is a failed step."""
    ids = {}
    for host in hosts:
        code, out, err = runner(["docker", "image", "inspect", "--format", "{{.Id}}", image],
                                {"DOCKER_HOST": host.url})
        if code != 0 or not out.strip().startswith("sha256:"):
            raise OperationFailed(f"{host.given}: cannot inspect {image}: "
                             f"{(err or out).strip()[:300] or f'exit {code}'}",
                             fix=f"pull it there first: DOCKER_HOST={host.url} docker pull "
                                 f"{image}")
        ids[host] = out.strip()
    return ids


def check_same_image(image: str, hosts: Sequence[Host], runner: Runner) -> str:
    """The image ID every host has; differing IDs are a failed step naming each."""
    ids = image_ids(image, hosts, runner)
    if len(set(ids.values())) > 1:
        shown = ", ".join(f"{h.given}: {i[:19]}" for h, i in ids.items())
        raise OperationFailed(f"the hosts hold different images under {image} ({shown})",
                         fix="pull the release by digest on every host (REF@sha256:...), "
                             "then launch that reference")
    return next(iter(ids.values()))


def launch(image: str, files: Sequence[Path], hosts: Sequence[Host], *,
           master_addr: str | None = None, project: str | None = None,
           runner: Runner = run_local, dry_run: bool = False,
           say: Callable[[str], None] = print) -> int:
    nodes = read_nodes(files, hosts)
    image_id = check_same_image(image, hosts, runner)
    say(f"every host has {image} as {image_id[:19]}")
    head = master_addr or hosts[0].address
    env = {MASTER_ADDR_VAR: head, IMAGE_VAR: image}
    name = project or files[0].name.split(".", 1)[0]
    # workers first: the head's engine waits for them at the master port, not the reverse
    order = [*range(1, len(nodes)), 0]
    for rank in order:
        node, path = nodes[rank]
        host = hosts[rank]
        argv = [*compose_argv(), "-f", str(path), "-p", f"{name}-{node.name}", "up", "-d"]
        say(f"{node.name} on {host.given}: DOCKER_HOST={host.url} "
            f"{MASTER_ADDR_VAR}={head} {IMAGE_VAR}={image} {shlex.join(argv)}")
        if dry_run:
            continue
        code, out, err = runner(argv, {**env, "DOCKER_HOST": host.url})
        if code != 0:
            raise OperationFailed(f"{node.name} on {host.given} did not start: "
                             f"{(err or out).strip()[-500:]}",
                             fix=f"see `DOCKER_HOST={host.url} {' '.join(compose_argv())} "
                                 f"-f {path} logs`")
    return 0
