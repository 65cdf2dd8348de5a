"""Run a serve image the way users are told to run an untrusted one (DOMAIN.md, issue 4).

- root filesystem read-only: /model and /drafter are layers of the image, so they are
  read-only with it; vLLM's caches and temp files go to tmpfs mounts (gone with the
  container, so no volume outlives it);
- host network (dockerd runs with --bridge=none), the server forced onto 127.0.0.1 and a
  free port by rewriting `--host`/`--port` in the image's CMD;
- no environment beyond the image's own (nothing from this shell, so no credentials),
  no-new-privileges, every capability dropped, the cell's memory limit (swap included);
- gb10: `--gpus all --ipc host` (vLLM's workers share memory through /dev/shm).
"""

from __future__ import annotations

import secrets
import socket
import subprocess
from dataclasses import dataclass

from imagebuild.errors import OperationFailed
from imagebuild.smoke.dockercli import docker

HOST = "127.0.0.1"
LABEL = "io.imagebuild.smoke"  # every smoke container carries it, for a manual clean-up
# vLLM compiles kernels into these; exec is needed, size bounds what a bad image writes.
# Docker copies the image directory's mode onto a tmpfs mounted over it (`mode=` is lost),
# so the cache tmpfs is handed to the image's user by uid/gid instead.
TMP = ("/tmp", "rw,exec,nosuid,size=2g,mode=1777")
CACHE = ("/home/vllm/.cache", "rw,exec,nosuid,size=4g,uid={uid},gid={gid},mode=0700")
CPU_SHM = "2g"  # vLLM's CPU workers exchange tensors via /dev/shm; Docker's default is 64 MB


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def with_listen(argv: list[str], port: int) -> list[str]:
    """The serve argv with `--host 127.0.0.1 --port PORT`, whatever it said before."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--host", "--port"):
            skip = True
            continue
        if arg.startswith(("--host=", "--port=")):
            continue
        out.append(arg)
    return out + ["--host", HOST, "--port", str(port)]


def image_user(image: str, user: str) -> tuple[int, int]:
    """uid and gid the image runs as (its USER may be a name only /etc/passwd resolves)."""
    uid, _, gid = (user or "0").partition(":")
    if uid.isdigit() and (gid.isdigit() or not gid):
        return int(uid), int(gid or uid)
    proc = docker("run", "--rm", "--network", "host", "--entrypoint", "sh", image, "-c",
                  "id -u; id -g", timeout=60)
    out = proc.stdout.split()
    return int(out[0]), int(out[1])


def run_args(image: str, command: list[str], *, name: str, memory: str, gpu: bool,
             user: tuple[int, int] = (0, 0), cpuset: str | None = None) -> list[str]:
    args = ["run", "--detach", "--name", name, "--label", f"{LABEL}=1",
            "--network", "host", "--read-only",
            "--security-opt", "no-new-privileges", "--cap-drop", "ALL",
            "--memory", memory, "--memory-swap", memory,
            "--pids-limit", "4096", "--no-healthcheck"]  # we poll /health on our port
    args += ["--tmpfs", f"{TMP[0]}:{TMP[1]}",
             "--tmpfs", f"{CACHE[0]}:{CACHE[1].format(uid=user[0], gid=user[1])}"]
    args += ["--gpus", "all", "--ipc", "host"] if gpu else ["--shm-size", CPU_SHM]
    if cpuset:  # benchmarks keep the server off the load generator's cores
        args += ["--cpuset-cpus", cpuset]
    return args + [image, *command]


@dataclass
class Container:
    name: str
    port: int
    image: str
    id: str = ""

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def running(self) -> bool:
        proc = docker("inspect", "--format", "{{.State.Running}}", self.name, check=False)
        return proc.stdout.strip() == "true"

    def exit_code(self) -> int | None:
        proc = docker("inspect", "--format", "{{.State.ExitCode}}", self.name, check=False)
        return int(proc.stdout.strip()) if proc.stdout.strip().lstrip("-").isdigit() else None

    def cpu_percent(self) -> float | None:
        proc = docker("stats", "--no-stream", "--format", "{{.CPUPerc}}", self.name,
                      check=False, timeout=30)
        try:
            return float(proc.stdout.strip().rstrip("%"))
        except ValueError:
            return None

    def remove(self) -> None:
        """Kill and delete, anonymous volumes included; fine if it is already gone. A
        container still being started when Ctrl-C lands can hold `rm` up: ask again."""
        for attempt in (1, 2):
            try:
                docker("rm", "--force", "--volumes", self.name, check=False,
                       timeout=30 * attempt)
                return
            except OperationFailed:
                if attempt == 2:
                    raise


def launch(image: str, command: list[str], *, memory: str, gpu: bool,
           user: tuple[int, int], cpuset: str | None = None) -> Container:
    port = free_port()
    name = f"imagebuild-smoke-{secrets.token_hex(4)}"
    c = Container(name=name, port=port, image=image)
    try:
        proc = docker(*run_args(image, with_listen(command, port), name=name, memory=memory,
                                gpu=gpu, user=user, cpuset=cpuset), check=False)
    except BaseException:  # Ctrl-C during `docker run`: the container may exist already
        c.remove()
        raise
    if proc.returncode != 0:
        c.remove()
        raise OperationFailed(f"docker run {image} failed: {proc.stderr.strip()[-500:]}")
    c.id = proc.stdout.strip()
    return c


def exec_in(c: Container, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return docker("exec", c.name, *argv, check=False, timeout=timeout)
