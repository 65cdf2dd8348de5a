"""The one conftest: fixtures every kind of test shares.

tests/unit (no Docker, seconds), tests/render (golden files), tests/conformance (against
the pinned vLLM source), tests/e2e (the real Docker engine, registry and vLLM: marked
`slow`/`vllm`, run in CI). Support code lives in tests/support, data in tests/data.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from tests.support.cpu_build import (
    CA_MARKER,
    CPU_SERVE_REF,
    HF_TOKEN_MARKER,
    CpuBuild,
    run_cpu_build,
)
from tests.support.hub.fake import FakeHub
from tests.support.hub.server import ReplayServer
from tests.support.matrices import copy_lock, copy_matrix, lock_matrix
from tests.support.memengine import MemoryEngine, installed
from tests.support.registry.server import RunningRegistry, start_registry

# after the run: seconds per module and folder (`.ci/run` shows where CI's time goes);
# two lanes: module order, the `alone` mark and locks the lanes share
pytest_plugins = ["tests.support.timing", "tests.support.lanes"]

# No test may reach the real Hub: offline unless a test points a client at the replay
# server on 127.0.0.1 (set before huggingface_hub is first imported: it reads these once).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# the tool's own caches (GPU-code tables by image id) stay in this run, out of the user's
# home: test doubles stamp made-up image ids
if "IMAGEBUILD_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["IMAGEBUILD_CACHE_DIR"] = tempfile.mkdtemp(prefix="imagebuild-test-cache-")
    # the process that made it removes it (the lanes inherit it): ~360 MB of pinned wheels
    atexit.register(shutil.rmtree, os.environ["IMAGEBUILD_CACHE_DIR"], ignore_errors=True)

# Ctrl-C as in a terminal: a suite started in the background by a non-interactive shell
# (`cmd &`) inherits SIGINT ignored, in itself and in every build.py the interrupt tests
# start (an ignored signal survives exec; a handler does not)
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# files matrix.yaml refers to; copied so a test can edit its own matrix in isolation
MATRIX_FILES = ("matrix.yaml", "matrix.lock.json", "locked", "patches", "images/engine/cpu",
                "scripts/make_tiny_model.py")


@pytest.fixture
def matrix_dir(tmp_path: Path) -> Path:
    """A copy of the real matrix.yaml with everything it references, editable per test."""
    for rel in MATRIX_FILES:
        src, dst = REPO_ROOT / rel, tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
    return tmp_path


@pytest.fixture
def hub_online_loopback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Let huggingface_hub make requests, but only to 127.0.0.1 (the replay server)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))

    def guard(request) -> None:  # type: ignore[no-untyped-def]
        if request.url.host != "127.0.0.1":
            raise AssertionError(f"test tried to reach {request.url}")

    session = get_session()
    session.event_hooks["request"].insert(0, guard)
    yield
    session.event_hooks["request"].remove(guard)


@pytest.fixture
def hub_replay() -> Iterator[ReplayServer]:
    """The fake Hub over HTTP on 127.0.0.1, for the real huggingface_hub client."""
    with FakeHub().serve() as replay:
        yield replay


@pytest.fixture(scope="session")
def locked_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real matrix locked once per session against the fake Hub (read-only)."""
    root = copy_matrix(tmp_path_factory.mktemp("locked"))
    lock_matrix(root)
    return root


@pytest.fixture
def locked(matrix_dir: Path, locked_template: Path) -> Path:
    """An editable copy of the matrix with that lock and its metadata."""
    copy_lock(locked_template, matrix_dir)
    return matrix_dir


# --------------------------------------------------- the real Docker engine and registry

DOCKER = "/usr/bin/docker"


def require(ok: bool, why: str) -> None:
    """Skip a test whose machine lacks `why`; in CI (which must provide it) fail it."""
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"{why} (CI must provide it: scripts/setup-tests.sh)")
        pytest.skip(why)


@pytest.fixture
def memory_engine() -> Iterator[MemoryEngine]:
    """The Docker seam's one double (tests/support/memengine.py), installed as the engine."""
    with installed(MemoryEngine()) as double:
        yield double


@pytest.fixture(scope="session")
def docker_engine() -> str:
    ok = subprocess.run([DOCKER, "info"], capture_output=True).returncode == 0
    require(ok, "no Docker engine running")
    return DOCKER


def _running_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRegistry]:
    for tool in ("docker-registry", "htpasswd"):
        require(shutil.which(tool) is not None, f"{tool} not installed")
    os.environ["IMAGEBUILD_LOCK_DIR"] = str(tmp_path_factory.mktemp("locks"))
    reg = start_registry(tmp_path_factory.mktemp("registry"))
    yield reg
    reg.stop()
    # pushed engines are GBs of layers: CI machines have less disk than one would like
    shutil.rmtree(reg.root / "data", ignore_errors=True)


@pytest.fixture(scope="module")
def registry(docker_engine: str, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[RunningRegistry]:
    """A distribution registry with htpasswd auth on 127.0.0.1, shared by a test module;
    leases and locks of its runs stay in a tmp dir; its data is deleted afterwards."""
    yield from _running_registry(tmp_path_factory)


@pytest.fixture(scope="session")
def _session_registry(docker_engine: str, tmp_path_factory: pytest.TempPathFactory
                      ) -> Iterator[RunningRegistry]:
    yield from _running_registry(tmp_path_factory)


@pytest.fixture(scope="module")
def shared_registry(_session_registry: RunningRegistry,
                    tmp_path_factory: pytest.TempPathFactory) -> RunningRegistry:
    """One registry for the modules that push the ~3 GB cpu engine and serve images, each
    in a namespace of its own: a push uploads a layer to a registry once and mounts it
    into every later repository there (the session's IMAGEBUILD_CACHE_DIR keeps where it
    went: registry/pushrecords.py), where a registry per module sent the same engine
    layers again. Leases and locks of a module's runs still get a dir of their own."""
    os.environ["IMAGEBUILD_LOCK_DIR"] = str(tmp_path_factory.mktemp("locks"))
    return _session_registry


@pytest.fixture
def fresh_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRegistry]:
    """The same, empty for each test (tests that count what a registry holds)."""
    yield from _running_registry(tmp_path_factory)


@pytest.fixture(scope="session")
def cpu_serve_image(docker_engine, tmp_path_factory) -> CpuBuild:
    """The cpu cell built by the real command, once per session and first with canary
    secrets (so on a fresh machine the real build is the one the leak test inspects).
    One lane builds at a time: the second finds every layer in BuildKit's cache."""
    out = tmp_path_factory.mktemp("build")
    bundle = out / "ca-bundle.pem"  # the host bundle plus a canary line PEM readers skip
    bundle.write_text(Path("/etc/ssl/certs/ca-certificates.crt").read_text()
                      + f"\n# {CA_MARKER}\n")
    from tests.support.lanes import shared_lock  # a plugin: pytest imports it (rewritten) first

    with shared_lock("cpu-serve-image"):
        proc = run_cpu_build(out, {"HF_TOKEN": HF_TOKEN_MARKER,
                                   "IMAGEBUILD_CA_BUNDLE": str(bundle)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return CpuBuild(out, CPU_SERVE_REF, proc.stdout + proc.stderr)
