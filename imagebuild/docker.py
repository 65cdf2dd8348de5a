"""The one seam to the Docker engine.

Everything that touches images and containers goes through `Engine`, built on the Docker
SDK (the `docker` package): inspect, tag, remove, list, history, export, pull, import,
run, logs, stats, exec, and compose projects' clean-up. The Docker CLI is used in one
place only, `Engine.buildkit_build`: BuildKit's secret and cache mounts are not reachable
through the SDK's build API. What the rest of the package may ask of an engine is the
Protocol `DockerEngine`; `engine()` hands one out and tests install theirs with
`use_engine`: the one shared double, tests/support/memengine.py, which mypy checks against
the Protocol (model: cog's single docker command interface, pkg/docker). Beside it,
dockerstore.py reads an image's layers for a push, from dockerd's files when it may.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, Self

import docker
import docker.errors
import requests

from imagebuild.errors import OperationFailed, UserError
from imagebuild.interrupts import held_interrupts
from imagebuild.runowner import owner_labels

DOCKER_CLI = os.environ.get("IMAGEBUILD_DOCKER", "/usr/bin/docker")
ENGINE_FIX = "start a Docker engine: `bash scripts/setup.sh` (or `dockerd &`)"
# every container this tool starts carries it, so a clean-up finds them all
OWNER_LABEL = "io.imagebuild.owner"
# what talking to the engine can raise: the SDK's errors, and the transport's when the
# socket is gone or the daemon stops answering
ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)
REMOVAL_WAIT_S = 60.0  # a container another caller is removing is gone within this


def run_labels(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """What every container made through this seam carries: ours, and which run made it
    (runowner.py), so the next run reaps it if this one is killed."""
    return {**(extra or {}), OWNER_LABEL: "imagebuild", **owner_labels()}


class DockerEngine(Protocol):
    """What callers may ask of a Docker engine (`Engine` is the real one; the tests' double
    is tests/support/memengine.py). Methods raise OperationFailed/UserError, never the
    SDK's errors."""

    def info(self) -> dict[str, Any]: ...
    def on_this_machine(self) -> bool: ...

    # images
    def inspect_image(self, ref: str) -> dict[str, Any] | None: ...
    def image_id(self, ref: str) -> str | None: ...
    def send_image(self, ref: str, to: Self) -> None: ...
    def export_image(self, ref: str) -> Iterator[bytes]: ...
    def tag(self, image: str, repository: str, tag: str) -> None: ...
    def remove_image(self, ref: str, *, force: bool = False) -> bool: ...
    def images(self, *, label: str | None = None, reference: str | None = None
               ) -> list[dict[str, Any]]: ...
    def history(self, image_id: str) -> list[dict[str, Any]]: ...
    def registry_digest(self, ref: str) -> str: ...
    def pull(self, ref: str, *, timeout: float = 120) -> str | None: ...
    def pull_checked(self, ref: str, auth: Mapping[str, str] | None = None) -> str: ...
    def import_tar(self, tar_path: Path, repository: str, tag: str,
                   changes: list[str]) -> str: ...

    # containers
    def container_state(self, name: str) -> dict[str, Any] | None: ...
    def container_env(self, name: str) -> list[str]: ...
    def container_names(self, *, label: str) -> list[str]: ...
    def logs(self, name: str, *, follow: bool = True) -> Iterator[bytes]: ...
    def cpu_percent(self, name: str) -> float | None: ...
    def exec(self, name: str, argv: list[str]) -> tuple[int, str]: ...
    def copy_from(self, name: str, path: str, dest: Path) -> Path: ...
    def run(self, image: str, command: list[str], *, name: str, labels: Mapping[str, str],
            **kw: Any) -> str: ...
    def probe(self, image: str, argv: list[str], *, entrypoint: str,
              mounts: Mapping[str, str]) -> tuple[int, str]: ...
    def resolve_user(self, ref: str) -> tuple[int, int]: ...
    def remove_container(self, name: str) -> None: ...
    def labelled_leftovers(self, label: str) -> list[str]: ...
    def remove_labelled(self, label: str) -> list[str]: ...
    def listing(self, kind: str, *, label: str | None = None) -> list[dict[str, Any]]: ...
    def remove_object(self, kind: str, name: str) -> None: ...

    # builds
    def buildkit_build(self, argv: list[str], env: Mapping[str, str]
                       ) -> subprocess.Popen[str]: ...
    def has_buildx(self) -> bool: ...
    def build_cache(self) -> list[dict[str, Any]]: ...
    def prune_build_cache(self, record_id: str) -> int: ...


class Engine:
    """A Docker engine. Methods raise OperationFailed/UserError, never docker errors."""

    def __init__(self, client: docker.DockerClient | None = None):
        self._client = client
        self._lock = threading.Lock()

    # -- connection

    @property
    def client(self) -> docker.DockerClient:
        with self._lock:
            if self._client is None:
                try:
                    self._client = docker.from_env(version="auto", timeout=300)
                except ENGINE_ERRORS as exc:
                    raise OperationFailed(f"no Docker engine answers ({exc})",
                                          fix=ENGINE_FIX) from None
            return self._client

    @property
    def api(self) -> docker.APIClient:
        return self.client.api

    def info(self) -> dict[str, Any]:
        try:
            return dict(self.client.info())
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"no Docker engine answers ({exc})", fix=ENGINE_FIX) from None

    def on_this_machine(self) -> bool:
        """The engine answers on this machine's unix socket (its files are on this disk)."""
        return str(self.api.base_url).startswith("http+docker://localhost")

    # -- images

    def inspect_image(self, ref: str) -> dict[str, Any] | None:
        """The image's inspect document, or None when the engine has no such image."""
        try:
            return dict(self.api.inspect_image(ref))
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.NotFound:
            return None
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"cannot inspect {ref}: {exc}", fix=ENGINE_FIX) from None

    def image_id(self, ref: str) -> str | None:
        info = self.inspect_image(ref)
        return info["Id"] if info else None

    def send_image(self, ref: str, to: Engine) -> None:
        """`docker save REF | docker --host OTHER load`, streamed: the image as it is (its
        ID unchanged) on another engine, a partner node's over SSH (serving/nodes.py)."""
        try:
            to.api.load_image(self.api.get_image(ref))
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"cannot send {ref} to the Docker engine at "
                                  f"{to.api.base_url}: {exc}", fix=ENGINE_FIX) from None

    def export_image(self, ref: str) -> Iterator[bytes]:
        """`docker save REF`, streamed (dockerstore.py reads the layers from it)."""
        try:
            yield from self.api.get_image(ref, chunk_size=1 << 20)
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"cannot export {ref} from the Docker engine: {exc}",
                                  fix=ENGINE_FIX) from None

    def tag(self, image: str, repository: str, tag: str) -> None:
        try:
            self.api.tag(image, repository, tag)
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"cannot tag {image} as {repository}:{tag}: {exc}") from None

    def remove_image(self, ref: str, *, force: bool = False) -> bool:
        """Remove a tag (or an image); False when it was not there."""
        try:
            self.api.remove_image(ref, force=force, noprune=False)
            return True
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.APIError as exc:
            raise OperationFailed(f"cannot remove {ref}: {exc.explanation or exc}") from None

    def images(self, *, label: str | None = None, reference: str | None = None
               ) -> list[dict[str, Any]]:
        """`docker image ls` rows (Id, RepoTags, Labels, Created, Size) by label/reference."""
        filters: dict[str, Any] = {}
        if label:
            filters["label"] = label
        if reference:
            filters["reference"] = reference
        try:
            return list(self.api.images(filters=filters or None))
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"cannot list images: {exc}", fix=ENGINE_FIX) from None

    def history(self, image_id: str) -> list[dict[str, Any]]:
        try:
            return list(self.api.history(image_id))
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"cannot read the history of {image_id}: {exc}") from None

    def registry_digest(self, ref: str) -> str:
        """The digest `ref` has in its registry now (a multi-platform image: its index's),
        asked through the engine, which uses its own credentials, mirrors and proxy."""
        try:
            self.api.reload_config()  # credentials as the Docker config says them now
            return str(self.api.inspect_distribution(ref)["Descriptor"]["digest"])
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"cannot look up the digest of {ref}: {exc}",
                                  fix="run `build.py lock --update TARGET` where the Docker "
                                      "engine can reach that registry (`docker pull` "
                                      "works)") from None

    def pull(self, ref: str, *, timeout: float = 120) -> str | None:
        """Pull `ref`; None (with the reason in the exception text swallowed) when the
        registry does not have it or is unreachable: the caller decides what then."""
        try:
            return str(self.client.images.pull(ref).id)
        except ENGINE_ERRORS:
            return None

    def pull_checked(self, ref: str, auth: Mapping[str, str] | None = None) -> str:
        """Pull `ref` with these credentials (in the X-Registry-Auth header only); the
        local image id, or OperationFailed with the registry's reason."""
        try:
            return str(self.client.images.pull(ref, auth_config=dict(auth) if auth else None).id)
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"docker pull {ref} failed: {exc}",
                                  fix="check the reference and the registry credentials "
                                      "(IMAGEBUILD_REGISTRY_USER/_PASSWORD or `docker "
                                      "login`)") from None

    def import_tar(self, tar_path: Path, repository: str, tag: str,
                   changes: list[str]) -> str:
        """`docker import` of a rootfs tarball with Dockerfile `changes`; the new image id."""
        try:
            with open(tar_path, "rb") as fh:
                out = self.api.import_image_from_data(fh, repository=repository, tag=tag,
                                                      changes=changes)
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"docker import of {tar_path} failed: {exc}") from None
        image_id = self.image_id(f"{repository}:{tag}")
        if not image_id:
            raise OperationFailed(f"docker import of {tar_path} made no image: {out!r:.300}")
        return image_id

    # -- containers

    def container_state(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.api.inspect_container(name)["State"])
        except docker.errors.NotFound:
            return None
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"cannot inspect container {name}: {exc}") from None

    def container_env(self, name: str) -> list[str]:
        """The container's environment as it was started (KEY=value lines)."""
        try:
            return list(self.api.inspect_container(name)["Config"]["Env"] or [])
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"cannot inspect container {name}: {exc}") from None

    def container_names(self, *, label: str) -> list[str]:
        try:
            return [c["Names"][0].lstrip("/")
                    for c in self.api.containers(all=True, filters={"label": label})]
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"cannot list containers: {exc}", fix=ENGINE_FIX) from None

    def logs(self, name: str, *, follow: bool = True) -> Iterator[bytes]:
        """The container's stdout+stderr, chunk by chunk, until it ends (follow)."""
        try:
            yield from self.api.logs(name, stream=True, follow=follow, stdout=True,
                                     stderr=True)
        except ENGINE_ERRORS:
            return

    def cpu_percent(self, name: str) -> float | None:
        """CPU use since the previous sample, on `docker stats`' scale (100 = one core)."""
        try:
            s = self.api.stats(name, stream=False)
        except ENGINE_ERRORS:
            return None
        try:
            cpu = s["cpu_stats"]["cpu_usage"]["total_usage"] - \
                s["precpu_stats"]["cpu_usage"]["total_usage"]
            system = s["cpu_stats"]["system_cpu_usage"] - s["precpu_stats"]["system_cpu_usage"]
            cores = s["cpu_stats"].get("online_cpus") or 1
        except (KeyError, TypeError):
            return None
        return 100.0 * cpu / system * cores if system > 0 else 0.0

    def exec(self, name: str, argv: list[str]) -> tuple[int, str]:
        try:
            res = self.client.containers.get(name).exec_run(argv, demux=False)
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"docker exec in {name} failed: {exc}") from None
        return int(res.exit_code or 0), (res.output or b"").decode(errors="replace")

    def copy_from(self, name: str, path: str, dest: Path) -> Path:
        """Copy `path` out of a container into the directory `dest` (`docker cp`)."""
        try:
            stream, _stat = self.api.get_archive(name, path)
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"cannot copy {path} out of {name}: {exc}") from None
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            tar.extractall(dest, filter="data")
        return dest / Path(path).name

    def run(self, image: str, command: list[str], *, name: str, labels: Mapping[str, str],
            **kw: Any) -> str:
        """Create and start a detached container (SDK keyword arguments); its id. An
        interrupt waits until the engine has answered (the caller removes the container
        by its name), never lands between the engine making it and us knowing it."""
        client = self.client  # connect before holding: that may take a while
        with held_interrupts():
            try:
                c = client.containers.run(image, command, name=name, detach=True,
                                          labels=run_labels(labels), **kw)
            except docker.errors.ImageNotFound:
                raise UserError(f"no local image {image}",
                                fix="build it first (`build.py build`) or pull it") from None
            except ENGINE_ERRORS as exc:
                self._remove(name)
                raise OperationFailed(f"docker run {image} failed: {exc}") from None
        return str(c.id)

    def probe(self, image: str, argv: list[str], *, entrypoint: str,
              mounts: Mapping[str, str]) -> tuple[int, str]:
        """Run `argv` once in a local image, read-only, without network, as root, with
        host files mounted read-only ({host path: container path}); (exit code, stdout
        or the error output). Never pulls: a missing image is refused first."""
        if self.inspect_image(image) is None:
            raise UserError(f"no local image {image}", fix="build it first (`build.py build`)")
        volumes = {host: {"bind": dest, "mode": "ro"} for host, dest in mounts.items()}
        # detached, then its whole log, then removed: the SDK's run(remove=True) removes
        # the container before it reads the log stream, which loses output beyond what
        # the socket had buffered (~150 KB: an SBOM probe's dpkg status and packages)
        try:
            c = self.client.containers.run(
                image, argv, entrypoint=entrypoint, detach=True, network_mode="none",
                read_only=True, user="0", volumes=volumes, labels=run_labels())
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"docker run {image} failed: {exc}") from None
        try:
            code = int(c.wait().get("StatusCode", 1))
            out = c.logs(stdout=code == 0, stderr=code != 0)
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"docker run {image} failed: {exc}") from None
        finally:
            with held_interrupts():
                self._remove(str(c.name))
        return code, (out or b"").decode(errors="replace")

    def resolve_user(self, ref: str) -> tuple[int, int]:
        """uid and gid the image's USER resolves to, asked of the image (`id -u; id -g`)."""
        try:
            out = self.client.containers.run(ref, ["-c", "id -u; id -g"], entrypoint="sh",
                                             remove=True, network_mode="host",
                                             labels=run_labels())
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"cannot tell which user {ref} runs as: {exc}") from None
        uid, gid = out.decode().split()[:2]
        return int(uid), int(gid)

    def remove_container(self, name: str) -> None:
        """Kill and delete with its anonymous volumes; fine if it is gone already. A
        second Ctrl-C waits until it is gone."""
        with held_interrupts():
            self._remove(name)

    def labelled_leftovers(self, label: str) -> list[str]:
        """Containers, volumes and networks carrying `label` (key=value), by kind and name:
        what compose made for a project and has not removed."""
        try:
            found = [f"container {n}" for n in self.container_names(label=label)]
            found += [f"volume {v['Name']}" for v in
                      self.api.volumes(filters={"label": label}).get("Volumes") or []]
            found += [f"network {n['Name']}" for n in
                      self.api.networks(filters={"label": label})]
            return found
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"cannot list what is labelled {label}: {exc}",
                                  fix=ENGINE_FIX) from None

    def remove_labelled(self, label: str) -> list[str]:
        """Remove every container carrying `label` (key=value): the sweep after a run."""
        with held_interrupts():
            names = self.container_names(label=label)
            for name in names:
                self._remove(name)
        return names

    def listing(self, kind: str, *, label: str | None = None) -> list[dict[str, Any]]:
        """`docker KIND ls -a` rows (kind: container, volume, network), each with Name,
        Labels, and for containers State and Created (epoch seconds)."""
        filters = {"label": label} if label else None
        try:
            if kind == "container":
                rows = self.api.containers(all=True, filters=filters)
                return [{**r, "Name": r["Names"][0].lstrip("/")} for r in rows]
            if kind == "volume":
                return list(self.api.volumes(filters=filters).get("Volumes") or [])
            return list(self.api.networks(filters=filters))
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"cannot list {kind}s: {exc}", fix=ENGINE_FIX) from None

    def remove_object(self, kind: str, name: str) -> None:
        """Remove a container (killed, with its anonymous volumes), volume or network;
        fine if it is gone already."""
        if kind == "container":
            return self.remove_container(name)
        try:
            with held_interrupts():
                if kind == "volume":
                    self.api.remove_volume(name, force=True)
                else:
                    self.api.remove_network(name)
        except docker.errors.NotFound:
            return
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"cannot remove {kind} {name}: {exc}") from None

    def _remove(self, name: str) -> None:
        for attempt in (1, 2):
            try:
                self.api.remove_container(name, force=True, v=True)
                return
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as exc:
                if "removal of container" in str(exc) and "in progress" in str(exc):
                    # another removal (an auto-remove, a second caller) is under way: it is
                    # removed once it is gone, which on a busy engine takes seconds
                    return self._wait_gone(name)
                if attempt == 2:
                    raise OperationFailed(f"cannot remove container {name}: {exc}") from None

    def _wait_gone(self, name: str, timeout: float = REMOVAL_WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.api.inspect_container(name)
            except docker.errors.NotFound:
                return
            except ENGINE_ERRORS as exc:
                raise OperationFailed(f"cannot remove container {name}: {exc}") from None
            time.sleep(0.2)
        raise OperationFailed(f"container {name} is still being removed after {timeout:.0f} s",
                              fix=f"`docker rm -f {name}` once the engine is less busy")

    # -- builds: the one use of the CLI

    def buildkit_build(self, argv: list[str], env: Mapping[str, str]) -> subprocess.Popen[str]:
        """`docker [buildx] build ...` through BuildKit; output merged into stdout."""
        try:
            return subprocess.Popen([DOCKER_CLI, *argv], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, bufsize=1,
                                    env={**os.environ, **env, "DOCKER_BUILDKIT": "1"})
        except FileNotFoundError:
            raise OperationFailed(f"no docker client at {DOCKER_CLI}",
                                  fix="install docker.io (scripts/setup.sh)") from None

    def has_buildx(self) -> bool:
        try:
            return subprocess.run([DOCKER_CLI, "buildx", "version"], capture_output=True,
                                  timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def build_cache(self) -> list[dict[str, Any]]:
        """BuildKit's cache records (`docker system df -v`): ID, Description, Size, InUse,
        Shared, Type, CreatedAt, LastUsedAt."""
        try:
            return list(self.api.df().get("BuildCache") or [])
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"cannot list BuildKit's cache: {exc}",
                                  fix=ENGINE_FIX) from None

    def prune_build_cache(self, record_id: str) -> int:
        """Remove that one BuildKit cache record (the engine matches the id as a prefix:
        a full one names one record); the bytes it freed."""
        try:
            with held_interrupts():
                out = self.api.prune_builds(filters={"id": record_id}, all=True)
        except ENGINE_ERRORS as exc:
            raise OperationFailed(f"cannot prune BuildKit's cache record {record_id}: {exc}",
                                  fix=ENGINE_FIX) from None
        return int((out or {}).get("SpaceReclaimed") or 0)


_engine: DockerEngine | None = None
_engine_lock = threading.Lock()


def engine() -> DockerEngine:
    """The process-wide engine (created on first use)."""
    global _engine
    with _engine_lock:
        if _engine is None:
            _engine = Engine()
        return _engine


def use_engine(new: DockerEngine | None) -> DockerEngine | None:
    """Swap the process-wide engine (tests install a double); returns the old one."""
    global _engine
    with _engine_lock:
        old, _engine = _engine, new
        return old


def image_user(ref: str, user: str) -> tuple[int, int]:
    """uid and gid an image runs as; its USER may be a name only its /etc/passwd resolves."""
    m = re.fullmatch(r"(\d+)(?::(\d+))?", user or "0")
    if m:
        return int(m[1]), int(m[2] or m[1])
    return engine().resolve_user(ref)


def inspect_image(ref: str) -> dict[str, Any]:
    """The inspect document of a local image; UserError when there is none."""
    info = engine().inspect_image(ref)
    if info is None:
        raise UserError(f"image {ref} is not in the local Docker engine",
                        fix="build it first (`python build.py build --tag ...`) or pull it")
    return info
