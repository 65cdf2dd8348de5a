"""Start a real distribution registry (Debian's docker-registry) with htpasswd auth on a
free 127.0.0.1 port, storage in a temp dir."""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from imagebuild.registry.client import RegistryClient

REGISTRY_BIN = "docker-registry"



@dataclass
class RunningRegistry:
    url: str  # http://127.0.0.1:PORT
    host: str  # 127.0.0.1:PORT (what docker and image refs use)
    user: str
    password: str = field(repr=False)
    root: Path = field(repr=False)
    process: subprocess.Popen = field(repr=False)
    owns_root: bool = field(default=False, repr=False)

    @property
    def log_path(self) -> Path:
        return self.root / "registry.log"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def client(self, url: str | None = None, **kw: Any) -> RegistryClient:
        """A RegistryClient with this registry's credentials (`url`: e.g. a proxy's)."""
        return RegistryClient(url or self.url, username=self.user, password=self.password,
                              **kw)

    def restart(self, timeout: float = 15) -> None:
        """Start it again after it died: same port, storage and credentials (a registry
        killed mid-push and brought back, as a runner's service would be)."""
        assert not self.alive(), "restart() is for a registry that died"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([REGISTRY_BIN, "serve", str(self.root / "config.yml")],
                                            stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)
        if not _wait_ready(self.url, self.process, timeout):
            raise RuntimeError("docker-registry did not come back; log tail:\n"
                               + self.log_text()[-2000:])

    def stop(self) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if self.owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> RunningRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(root: Path, port: int, delete_enabled: bool) -> str:
    return f"""version: 0.1
log:
  level: info
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {root / "data"}
  delete:
    enabled: {"true" if delete_enabled else "false"}
  cache:
    blobdescriptor: inmemory
http:
  addr: 127.0.0.1:{port}
  secret: {secrets.token_hex(16)}
auth:
  htpasswd:
    realm: imagebuild-test
    path: {root / "htpasswd"}
"""


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            r = requests.get(url + "/v2/", timeout=1, proxies={"http": "", "https": ""})
            if r.status_code == 401:
                return True
        except requests.ConnectionError:
            pass
        time.sleep(0.05)
    return False


def start_registry(
    root: Path | None = None,
    *,
    user: str = "imagebuild-test",
    password: str | None = None,
    delete_enabled: bool = True,
    timeout: float = 15,
) -> RunningRegistry:
    """Start a registry; the caller must stop() it (or use running_registry)."""
    if shutil.which(REGISTRY_BIN) is None or shutil.which("htpasswd") is None:
        raise RuntimeError("docker-registry and htpasswd (apache2-utils) must be installed")
    owns = root is None
    root = Path(tempfile.mkdtemp(prefix="registry-")) if root is None else Path(root)
    root.mkdir(parents=True, exist_ok=True)
    password = password or secrets.token_urlsafe(12)
    # -i: the password goes in on stdin, never on a command line; -B: bcrypt (required)
    htpasswd = subprocess.run(
        ["htpasswd", "-Bin", user], input=password, capture_output=True, text=True, check=True
    ).stdout
    (root / "htpasswd").write_text(htpasswd)
    for _ in range(5):  # a free port can be taken between probe and bind: try another
        port = free_port()
        (root / "config.yml").write_text(_config(root, port, delete_enabled))
        with open(root / "registry.log", "ab") as log:
            proc = subprocess.Popen(
                [REGISTRY_BIN, "serve", str(root / "config.yml")],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        url = f"http://127.0.0.1:{port}"
        if _wait_ready(url, proc, timeout):
            return RunningRegistry(url, f"127.0.0.1:{port}", user, password, root, proc, owns)
        proc.kill()
        proc.wait()
    log_tail = (root / "registry.log").read_text(errors="replace")[-2000:]
    raise RuntimeError(f"docker-registry did not come up; log tail:\n{log_tail}")


@contextmanager
def running_registry(**kwargs: object) -> Iterator[RunningRegistry]:
    reg = start_registry(**kwargs)  # type: ignore[arg-type]
    try:
        yield reg
    finally:
        reg.stop()
