"""A multi-node cell's nodes, run: its workers first (started, watched, taken down), then
its head, the way smoke, the release gates and the bench all run them.

Every node runs the same image from its own compose file (render's per-node files, head
first). A worker container that stops while the head boots or serves is a lost node:
vLLM's head does not notice a lost rank by itself until a collective times out, so the
head is stopped at once (smoke/nodes.py judges it; docs/multi-node-cpu.md).

Where the nodes run (node_hosts): all on this host (loopback; the cpu target, the tests) unless
IMAGEBUILD_PARTNERS names each worker's Docker engine (`ssh://runner@spark-b`: Docker over
SSH from a "pair" runner, docs/release-workflow.md); IMAGEBUILD_MASTER_ADDR is then the
head's address on the interconnect, which the workers reach it at.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from imagebuild.docker import DockerEngine, Engine, engine
from imagebuild.errors import OperationFailed, UserError
from imagebuild.runowner import owned_compose
from imagebuild.serving.boot import Container, wait_healthy
from imagebuild.serving.compose import PROJECT_LABEL, compose_argv, new_project, take_down
from imagebuild.serving.logwatch import LogWatcher, exceptions
from imagebuild.serving.nodefiles import node_files
from imagebuild.serving.runspec import (
    PORT_VAR,
    SERVICE,
    compose_literal,
    free_port,
    without_flag,
)
from imagebuild.spec.nodecmd import node_commands
from imagebuild.spec.servecmd import HOST

if TYPE_CHECKING:
    from imagebuild.spec.matrix import Cell

MASTER_ADDR_VAR = "MASTER_ADDR"
PARTNERS_VAR = "IMAGEBUILD_PARTNERS"
MASTER_VAR = "IMAGEBUILD_MASTER_ADDR"
WATCH_S = 0.25  # how often the workers' containers are looked at
UP_TIMEOUT_S = 120  # `compose up -d` of one worker (the image is local)


@dataclass(frozen=True)
class NodeFile:
    """One node's compose file: `head` (node-rank 0, the API server) or `workerN`."""

    name: str
    rank: int
    text: str


@dataclass(frozen=True)
class Lost:
    node: str
    rank: int
    exit_code: int | None
    at: float  # wall clock when the watch saw it stopped
    after_s: float  # since the workers were started
    raised: tuple[str, ...]  # exceptions its log printed


def cell_node_files(cell: Cell, image: str) -> list[NodeFile]:
    """Render's per-node compose files of a multi-node cell, running `image`."""
    nodes = node_commands(cell)
    return [NodeFile(node.name, node.rank, text)
            for node, (_path, text) in zip(nodes, node_files(cell, image), strict=True)]


def placement(nodes: int, cpus: Sequence[int]) -> list[dict[str, str]]:
    """Each node's share of this host's CPUs when every node runs here (the cpu target on
    one machine): vLLM's CPU workers bind their OpenMP threads to the listed cores
    (VLLM_CPU_OMP_THREADS_BIND), so nodes sharing a host get disjoint cores, not the same
    one each; VLLM_HOST_IP keeps vLLM's message queue on loopback."""
    cpus = sorted(cpus)
    if len(cpus) < nodes:
        raise UserError(f"{nodes} nodes on one host need a CPU each; this host has "
                        f"{len(cpus)}", fix="smoke the cell where each node has a machine "
                        f"({PARTNERS_VAR})")
    share = len(cpus) // nodes
    out = []
    for i in range(nodes):
        mine = cpus[i * share:(i + 1) * share]
        out.append({"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, mine)),
                    "VLLM_HOST_IP": HOST})
    return out


def placed(text: str, env: Mapping[str, str]) -> str:
    """A node's compose file with `env` added to its service (the run's placement)."""
    if not env:
        return text
    doc = yaml.safe_load(text)
    svc = doc["services"][SERVICE]
    svc["environment"] = {**(svc.get("environment") or {}),
                          **{k: compose_literal(v) for k, v in env.items()}}
    return yaml.safe_dump(doc, sort_keys=False, width=100)


def lost_message(lost: Lost) -> str:
    code = f"code {lost.exit_code}" if lost.exit_code is not None else "removed"
    return (f"node {lost.node} (node-rank {lost.rank}) was lost {lost.after_s:.1f}s into "
            f"the run: its container stopped ({code}); the head was stopped at once"
            + (f"; its log raised: {lost.raised[0]}" if lost.raised else ""))


def partners_from_env(workers: int) -> list[str | None]:
    """Each worker's Docker host (IMAGEBUILD_PARTNERS, comma-separated), None: this host."""
    raw = os.environ.get(PARTNERS_VAR, "").strip()
    if not raw:
        return [None] * workers
    hosts = [h.strip() for h in raw.split(",") if h.strip()]
    if len(hosts) != workers:
        raise UserError(f"{PARTNERS_VAR} names {len(hosts)} Docker host(s), the cell has "
                        f"{workers} worker node(s)",
                        fix=f"one Docker host per worker, e.g. {PARTNERS_VAR}=ssh://runner@"
                        "spark-b")
    return list(hosts)


def same_image(ref: str, partner: DockerEngine, host: str) -> str:
    """The image on a partner's engine, with the ID it has here: sent when missing (smoke
    runs an image before it is pushed), then compared. Its ID."""
    mine = engine().image_id(ref)
    if partner.image_id(ref) != mine:
        engine().send_image(ref, partner)
    theirs = partner.image_id(ref)
    if theirs != mine:
        raise UserError(f"{ref} is {theirs} on {host}, {mine} here: the nodes would not run "
                        "the same image", fix=f"remove {ref} on {host} and run smoke again")
    assert mine is not None
    return mine


def same_machine(host: str | None) -> bool:
    """A worker on this machine: no Docker host named, or this machine's own socket."""
    return host is None or host.startswith("unix://")


def node_hosts(workers: int, *, cpu: bool) -> tuple[list[str | None], str, bool]:
    """Each worker's Docker host, the head's address for them, and whether every node is
    on this machine."""
    hosts = partners_from_env(workers)
    local = all(same_machine(h) for h in hosts)
    master = os.environ.get(MASTER_VAR) or HOST
    if not local and master == HOST:
        raise UserError(f"{PARTNERS_VAR} puts workers on other machines, which cannot reach "
                        f"the head at {HOST}", fix=f"set {MASTER_VAR} to this machine's "
                        "address on the interconnect")
    if local and not cpu:
        raise UserError(f"a cell over {workers + 1} GPU nodes runs on {workers + 1} "
                        f"machines; {PARTNERS_VAR} names no other", fix=f"run it on a runner "
                        f"whose {PARTNERS_VAR} names its partners' Docker engines, e.g. "
                        "ssh://runner@spark-b (docs/release-workflow.md)")
    return hosts, master, local


def _engine_at(host: str | None) -> DockerEngine:
    if host is None:
        return engine()
    import docker  # deferred: the Docker SDK, only when a container is started

    return Engine(docker.DockerClient(base_url=host, use_ssh_client=host.startswith("ssh://"),
                                      version="auto", timeout=300))


@dataclass
class _Worker:
    file: NodeFile
    host: str | None
    project: str
    path: Path
    log: Path
    eng: DockerEngine
    container: str = ""
    watcher: LogWatcher | None = None


@dataclass
class NodeRun:
    """The workers of one multi-node run: started, watched, taken down (smoke's judged:
    smoke/nodes.py JudgedNodes)."""

    image_ref: str
    files: list[NodeFile]
    out_dir: Path
    head_project: str
    master_addr: str = HOST
    env: list[dict[str, str]] = field(default_factory=list)  # per node, head first
    hosts: list[str | None] = field(default_factory=list)  # per worker
    ranks_per_node: int = 1
    lost: Lost | None = None
    workers: list[_Worker] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _started: float = 0.0

    def compose_env(self, host: str | None = None) -> dict[str, str]:
        env = {MASTER_ADDR_VAR: self.master_addr, "IMAGEBUILD_IMAGE": self.image_ref}
        if host:
            env["DOCKER_HOST"] = host
        return env

    def head_text(self) -> str:
        return placed(self.files[0].text, self.env[0] if self.env else {})

    def _compose(self, w: _Worker, *args: str, timeout: float,
                 extra_env: Mapping[str, str] | None = None
                 ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*compose_argv(), "-f", str(w.path), "-p",
                               w.project, *args], capture_output=True, text=True,
                              timeout=timeout, start_new_session=True,
                              env={**os.environ, **self.compose_env(w.host),
                                   **(extra_env or {})})

    def start_workers(self) -> None:
        """Every worker up (detached), its log followed into WORKER.log in out_dir."""
        self._started = time.time()
        hosts = self.hosts or [None] * (len(self.files) - 1)
        for i, (f, host) in enumerate(zip(self.files[1:], hosts, strict=True), start=1):
            path = self.out_dir / f"{f.name}.compose.yaml"
            path.write_text(owned_compose(placed(f.text, self.env[i] if self.env else {})))
            w = _Worker(f, host, f"{self.head_project}-{f.name}", path,
                        self.out_dir / f"{f.name}.log", _engine_at(host))
            self.workers.append(w)
            if host is not None:
                same_image(self.image_ref, w.eng, host)
            proc = self._compose(w, "up", "--detach", "--no-build", timeout=UP_TIMEOUT_S)
            if proc.returncode != 0:
                raise UserError(f"{f.name} did not start: {proc.stderr.strip()[-800:]}",
                                fix=f"run the file by hand: {path}")
            names = w.eng.container_names(label=f"{PROJECT_LABEL}={w.project}")
            w.container = names[0] if names else ""
            w.watcher = LogWatcher(w.container, w.log, eng=w.eng).start()

    def watch(self) -> None:
        """Look at the workers every WATCH_S until stop_watching; a stopped one is lost."""
        def loop() -> None:
            while not self._stop.wait(WATCH_S):
                try:
                    for w in self.workers if self.lost is None else ():
                        state = w.eng.container_state(w.container)
                        if not (state and state.get("Running")):
                            self._lose(w, state)
                            break
                    if self.lost is not None:
                        # an idle head keeps answering /health without its peer: stop it
                        # (again, if compose was still creating it), the suite ends now
                        engine().remove_labelled(f"{PROJECT_LABEL}={self.head_project}")
                except OperationFailed:
                    continue  # the engine did not answer this time: look again
        self._thread = threading.Thread(target=loop, name="node-watch", daemon=True)
        self._thread.start()

    def _lose(self, w: _Worker, state: dict[str, Any] | None) -> None:
        now = time.time()
        if w.watcher:
            w.watcher.stop(timeout=2)
        lines = w.log.read_text(errors="replace").splitlines() if w.log.exists() else []
        code = state.get("ExitCode") if state else None
        self.lost = Lost(w.file.name, w.file.rank, int(code) if code is not None else None,
                         now, now - self._started, tuple(exceptions(lines)))

    def stop_watching(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def take_down(self) -> None:
        """Every worker's containers, the compose project and its volumes."""
        self.stop_watching()
        for w in self.workers:
            w.eng.remove_labelled(f"{PROJECT_LABEL}={w.project}")
            try:
                self._compose(w, "down", "--volumes", "--timeout", "5", timeout=120)
            except (OSError, subprocess.TimeoutExpired):
                pass  # the label sweep above removed its containers already
            if w.watcher:
                w.watcher.stop(timeout=2)


@contextlib.contextmanager
def serving_nodes(image_ref: str, files: Sequence[NodeFile], out_dir: Path, *,
                  tensor_parallel_size: int, cpu: bool, boot_timeout_s: float,
                  drop_flags: tuple[str, ...] = (), log: Callable[[str], None] = print
                  ) -> Iterator[Container]:
    """A multi-node cell served for the release gates and the bench, the way its smoke
    runs it (smoke/runner.py smoke_nodes): the same NodeRun starts and watches the workers
    (same hosts, same placement), then the head comes up detached from its per-node file
    on a free loopback port; yields it once /health answers. A lost worker ends the boot (and
    stops the head, so requests in flight fail rather than hang); everything is taken
    down after, whatever ended the run."""
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
        head_file.write_text(owned_compose(run.head_text()))
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
    def lost() -> None:
        if run.lost is not None:
            raise OperationFailed(lost_message(run.lost), fix=f"see {run.out_dir}")

    up_s = wait_healthy(
        c, timeout_s=timeout_s, check=lost,
        waiting=lambda s: f"{len(run.files)} nodes, waiting for the head's /health ({s:.0f}s)",
        exited=lambda: OperationFailed(
            f"{image_ref}: the head exited while booting; its log: "
            f"{run.out_dir / (run.files[0].name + '.log')}",
            fix="run `build.py smoke --tag T` for a diagnosis"),
        timed_out=lambda: OperationFailed(
            f"{image_ref}: the head was not healthy after {timeout_s:.0f} s",
            fix="run `build.py smoke --tag T` for a diagnosis"))
    log(f"{len(run.files)} nodes up in {up_s:.1f} s, head on {c.base_url}")


def without_flags(text: str, flags: tuple[str, ...]) -> str:
    """A node's compose file with `flags` (and their values) out of its command: the
    release gates' plain server drops --speculative-config on every node alike (a worker
    that kept it would disagree with its head)."""
    if not flags:
        return text
    doc = yaml.safe_load(text)
    svc = doc["services"][SERVICE]
    command = [str(a) for a in svc["command"]]
    for flag in flags:
        command = without_flag(command, flag)
    svc["command"] = command
    return yaml.safe_dump(doc, sort_keys=False, width=100)
