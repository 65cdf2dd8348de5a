"""How a serve image is run: one definition behind the compose file (smoke runs it, every
release ships it), the `docker run` line of the release notes and the gates' and the
bench's container (container.py).

Run the way an untrusted image should be run:
- root filesystem read-only: /model and /drafter are layers of the image, so they are
  read-only with it; vLLM's caches and temp files go to tmpfs mounts (gone with the
  container, so nothing outlives it unless the user asks for a cache volume);
- host network (our dockerd runs with --bridge=none), the server on 127.0.0.1 only;
- no environment beyond the image's own (so no credentials), no-new-privileges, every
  capability dropped, a memory limit with swap included, a pids limit;
- GPU targets: all GPUs and the host IPC namespace (vLLM's workers share memory through
  /dev/shm); CPU targets: a 2 GB /dev/shm instead of Docker's 64 MB default.
"""

from __future__ import annotations

import shlex
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import yaml

from imagebuild.spec.servecmd import with_listen

PORT_VAR = "IMAGEBUILD_PORT"  # compose: `${IMAGEBUILD_PORT:-8000}` picks the port
IMAGE_VAR = "IMAGEBUILD_IMAGE"  # compose: which image reference to run
# vLLM compiles kernels into these; exec is needed, size bounds what a bad image writes.
# Docker copies the image directory's mode onto a tmpfs mounted over it (`mode=` is lost),
# so the cache tmpfs is handed to the image's user by uid/gid instead.
TMP_DIR, TMP_OPTS = "/tmp", "rw,exec,nosuid,size=2g,mode=1777"
CACHE_DIR, CACHE_OPTS = "/home/vllm/.cache", "rw,exec,nosuid,size=4g,uid={uid},gid={gid},mode=0700"
CPU_SHM = "2g"
PIDS_LIMIT = 4096
SERVICE = "vllm"
SPEC_FLAG = "--speculative-config"  # the plain run of a speculating image drops it


@dataclass(frozen=True)
class Limits:
    """What starting an image needs of its cell (or of its labels): the memory limit,
    whether it gets the GPUs, how long its boot may take, its port."""

    memory: str | None
    gpu: bool
    boot_timeout_s: float = 600
    port: int = 8000

    @classmethod
    def of(cls, expect: Mapping[str, Any]) -> Limits:
        """From a cell's expectations (expectations.py)."""
        return cls(memory=expect.get("memory_limit"), gpu=bool(expect.get("gpu")),
                   boot_timeout_s=float(expect.get("boot_timeout_s") or 600),
                   port=int(expect.get("port") or 8000))


@dataclass(frozen=True)
class RunSpec:
    image: str  # the reference to run (tag or digest)
    command: tuple[str, ...]  # the serve argv (the image's CMD)
    memory: str | None
    gpu: bool
    user: tuple[int, int] = (1000, 1000)  # uid/gid the image runs as (owns the cache)
    port: int = 8000
    cpuset: str | None = None  # benchmarks keep the server off the load generator's cores
    cache_volume: str | None = None  # a named volume for vLLM's caches (restarts skip compiles)
    # multi-node cells: the interconnect settings each node adds (spec/nodecmd.py), and
    # the run-time variables the command may name (MASTER_ADDR), required when it runs
    env: tuple[tuple[str, str], ...] = ()
    runtime_vars: tuple[str, ...] = ()
    listen: bool = True  # False: the command is a shell line that says where it listens

    def at_port(self, port: int) -> RunSpec:
        return replace(self, port=port, command=tuple(with_listen(list(self.command), port)))


def _as_is(argv: list[str], port: int | str) -> list[str]:
    return argv


def _cache_opts(spec: RunSpec) -> str:
    return CACHE_OPTS.format(uid=spec.user[0], gid=spec.user[1])


def compose_literal(text: str) -> str:
    """`text` as compose reads it back unchanged: compose interpolates `$NAME` and
    `${NAME}` in every value, so each `$` of ours is written `$$`."""
    return text.replace("$", "$$")


def _compose_arg(arg: str, runtime_vars: tuple[str, ...]) -> str:
    """An argument as compose reads it back, except `${VAR}` of a run-time variable, which
    compose fills in (and refuses to start without)."""
    for var in runtime_vars:
        if arg == f"${{{var}}}":
            return _required(var)
    return compose_literal(arg)


def _required(var: str) -> str:
    """Compose's interpolation of a variable it refuses to start without."""
    return f"${{{var}:?set {var} to the head node's address (build.py launch does)}}"


def compose_document(spec: RunSpec, *, name: str) -> dict[str, Any]:
    """A compose file whose one service runs the image exactly as `docker_run_argv` does;
    `${IMAGEBUILD_IMAGE}` and `${IMAGEBUILD_PORT}` may override the image and the port.
    Those two are the only interpolations: every other `$` is escaped."""
    svc: dict[str, Any] = {
        "image": f"${{{IMAGE_VAR}:-{compose_literal(spec.image)}}}",
        "command": (with_listen if spec.listen else _as_is)(
            [_compose_arg(a, spec.runtime_vars) for a in spec.command],
            f"${{{PORT_VAR}:-{spec.port}}}"),
        "network_mode": "host",
        "read_only": True,
        "security_opt": ["no-new-privileges"],
        "cap_drop": ["ALL"],
        "pids_limit": PIDS_LIMIT,
        "tmpfs": [f"{TMP_DIR}:{TMP_OPTS}"],
        "labels": {"io.imagebuild.service": compose_literal(name)},
        "stop_grace_period": "10s",
    }
    if spec.env or spec.runtime_vars:
        svc["environment"] = {
            **{k: compose_literal(v) for k, v in spec.env},
            **{var: _required(var) for var in spec.runtime_vars}}
    if spec.cache_volume:
        svc["volumes"] = [f"{spec.cache_volume}:{CACHE_DIR}"]
    else:
        svc["tmpfs"].append(f"{CACHE_DIR}:{_cache_opts(spec)}")
    if spec.memory:
        svc["mem_limit"] = spec.memory
        svc["memswap_limit"] = spec.memory
    if spec.gpu:
        svc["ipc"] = "host"
        svc["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]}}}
    else:
        svc["shm_size"] = CPU_SHM
    if spec.cpuset:
        svc["cpuset"] = spec.cpuset
    # no `version:` key: the Compose Specification, which Debian's docker-compose 1.29 and
    # compose v2 both read (GPU reservations included)
    doc: dict[str, Any] = {"services": {SERVICE: svc}}
    if spec.cache_volume:
        doc["volumes"] = {spec.cache_volume: {}}
    return doc


def compose_yaml(spec: RunSpec, *, name: str, header: str = "") -> str:
    body = yaml.safe_dump(compose_document(spec, name=name), sort_keys=False, width=100)
    return header + body


def docker_run_argv(spec: RunSpec, *, name: str) -> list[list[str]]:
    """`docker run` in lines of related flags (for a readable notes block)."""
    lines = [["docker", "run", "--detach", "--name", name],
             ["--network", "host", "--read-only"],
             ["--security-opt", "no-new-privileges", "--cap-drop", "ALL",
              "--pids-limit", str(PIDS_LIMIT)],
             ["--tmpfs", f"{TMP_DIR}:{TMP_OPTS}"],
             ["--gpus", "all", "--ipc", "host"] if spec.gpu else ["--shm-size", CPU_SHM]]
    if spec.memory:
        lines.append(["--memory", spec.memory, "--memory-swap", spec.memory])
    if spec.cache_volume:
        lines.append(["--volume", f"{spec.cache_volume}:{CACHE_DIR}"])
    else:
        lines.append(["--tmpfs", f"{CACHE_DIR}:{_cache_opts(spec)}"])
    if spec.cpuset:
        lines.append(["--cpuset-cpus", spec.cpuset])
    lines.append([spec.image])
    return lines


def docker_run_text(spec: RunSpec, *, name: str) -> str:
    return " \\\n  ".join(shlex.join(line) for line in docker_run_argv(spec, name=name))


def sdk_run_kwargs(spec: RunSpec) -> dict[str, Any]:
    """The same settings as keyword arguments of the Docker SDK's `containers.run`."""
    kw: dict[str, Any] = {
        "network_mode": "host", "read_only": True,
        "security_opt": ["no-new-privileges"], "cap_drop": ["ALL"],
        "pids_limit": PIDS_LIMIT,
        "tmpfs": {TMP_DIR: TMP_OPTS},
    }
    if spec.cache_volume:
        kw["volumes"] = {spec.cache_volume: {"bind": CACHE_DIR, "mode": "rw"}}
    else:
        kw["tmpfs"][CACHE_DIR] = _cache_opts(spec)
    if spec.memory:
        kw["mem_limit"] = spec.memory
        kw["memswap_limit"] = spec.memory
    if spec.gpu:
        import docker.types  # deferred: the Docker SDK, only when a container is started

        kw["ipc_mode"] = "host"
        kw["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    else:
        kw["shm_size"] = CPU_SHM
    if spec.cpuset:
        kw["cpuset_cpus"] = spec.cpuset
    return kw


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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def speculates(info: dict[str, Any]) -> bool:
    cmd = (info.get("Config") or {}).get("Cmd") or []
    return any(a == SPEC_FLAG or str(a).startswith(SPEC_FLAG + "=") for a in cmd)
