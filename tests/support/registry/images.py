"""Push tiny real images into a test registry with the Docker CLI.

There is no Docker Hub here, so the image is `docker import`ed from a tarball holding one
file of random bytes (incompressible, so the layer's size is known), with labels set by
`--change LABEL`. The Docker CLI logs in with a throwaway DOCKER_CONFIG under the
registry's root, which leaves ~/.docker alone and gives tests a real config.json to read.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from .server import RunningRegistry

DOCKER = "/usr/bin/docker"  # the Debian client, matching the engine's API version


@dataclass(frozen=True)
class PushedImage:
    repo: str  # repository path inside the registry, e.g. "test/tiny"
    tags: tuple[str, ...]
    digest: str  # manifest digest reported by docker push
    manifest_size: int
    layer_size: int  # bytes of the one (uncompressed random) file inside


def _docker(config: Path | None, *args: str, input: str | bytes | None = None) -> str:
    cmd = [DOCKER, *(["--config", str(config)] if config else []), *args]
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    proc = subprocess.run(cmd, input=input, capture_output=True, env=env, check=False)
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace") if isinstance(proc.stderr, bytes) else ""
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}): {err[-800:]}")
    return proc.stdout.decode(errors="replace")


def docker_login(reg: RunningRegistry) -> Path:
    """`docker login` into reg with a private config dir; returns that dir."""
    config = reg.root / "docker-config"
    config.mkdir(exist_ok=True)
    _docker(
        config, "login", "-u", reg.user, "--password-stdin", reg.host, input=reg.password.encode()
    )
    return config


def _tarball(size: int, name: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = size
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(os.urandom(size)))
    return buf.getvalue()


def push_tiny_image(
    reg: RunningRegistry,
    repo: str,
    tags: tuple[str, ...] | list[str] = ("v1",),
    *,
    labels: dict[str, str] | None = None,
    size: int = 256 * 1024,
    keep_local: bool = False,
) -> PushedImage:
    """Import a one-file image, tag it repo:tag for every tag, push all; returns its digest."""
    config = docker_login(reg)
    refs = [f"{reg.host}/{repo}:{t}" for t in tags]
    changes: list[str] = []
    for k, v in (labels or {}).items():
        changes += ["--change", f"LABEL {k}={_quote(v)}"]
    _docker(None, "import", *changes, "-", refs[0], input=_tarball(size, "payload.bin"))
    for ref in refs[1:]:
        _docker(None, "tag", refs[0], ref)
    digest, msize = "", 0
    try:
        for ref in refs:
            out = _docker(config, "push", ref)
            m = re.search(r"digest: (sha256:[0-9a-f]{64}) size: (\d+)", out)
            if not m:
                raise RuntimeError(f"docker push {ref}: no digest in output:\n{out[-800:]}")
            digest, msize = m.group(1), int(m.group(2))
    finally:
        if not keep_local:
            _docker(None, "rmi", *refs)
    return PushedImage(repo, tuple(tags), digest, msize, size)


def _quote(value: str) -> str:
    """A Dockerfile-instruction double-quoted string."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
