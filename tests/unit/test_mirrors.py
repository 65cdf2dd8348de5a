"""Mirrors, not hosts: no package-registry host is named anywhere in the repository, and
no image keeps an index location. Index and mirror locations come from the machine (pip
configuration, apt sources) or an explicit setting, and reach builds as the pip_conf
secret.

The hosts looked for are the ones this machine's own clients name (pip's built-in index
and its configured ones, apt's sources, debootstrap's default mirror), so this file names
none either; and any index location written into a file (after an index option, in an apt
source line, as a URL pip installs from) is refused whatever its host."""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

from imagebuild import REPO_ROOT
from imagebuild.builder.aptsources import apt_entries
from imagebuild.lock.lockfile import read_lock
from imagebuild.pipconfig import builtin_index, pip_indexes
from imagebuild.render import render_all
from imagebuild.spec import matrix as mx
from tests.support.dockerfile_text import logical_lines

INDEX_SETTINGS = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS",
                  "PIP_CONFIG_FILE", "UV_INDEX", "UV_EXTRA_INDEX_URL")
DEBOOTSTRAP = Path("/usr/sbin/debootstrap")
# an index location written down: after an index option, in an apt source, installed by URL
URL = r"""['"]?([a-z][a-z0-9+.-]*://[^\s'"]+)"""
WRITTEN_INDEX = re.compile(
    r"(?:--index-url|--extra-index-url|--find-links|\bindex-url\s*=|\bextra-index-url\s*="
    r"|\bfind-links\s*=|torch_index\s*:)[\s=]*" + URL
    + r"|^\s*deb(?:-src)?\s+(?:\[[^\]]*\]\s+)?" + URL
    + r"|\bpip3?\s+install\b[^\n]*?\s" + URL, re.M)
# hosts that are no registry: this machine, and names reserved for examples (RFC 2606)
NOT_A_REGISTRY = re.compile(r"^(?:127\.\d+\.\d+\.\d+|localhost|\[::1\])?$"
                            r"|\.(?:example|invalid|test|localhost)$")


def _host(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


def _machine_registry_hosts() -> set[str]:
    """The package-registry hosts this machine's own clients would use."""
    urls = [builtin_index(), *pip_indexes().urls(), *(uri for uri, _ in apt_entries())]
    if DEBOOTSTRAP.is_file():  # its default mirror, as the script itself sets it
        urls += re.findall(r'^DEF_(?:HTTPS_)?MIRROR="([^"]+)"', DEBOOTSTRAP.read_text(),
                           re.M)
    return {h for h in map(_host, urls) if not NOT_A_REGISTRY.search(h)}


def _tracked_files() -> list[Path]:
    if (REPO_ROOT / ".git").exists():
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
        return [REPO_ROOT / p for p in out if p]
    skip = {".git", ".venv", ".venv-vllm", "build", ".cache", "__pycache__"}
    return [Path(d) / f for d, dirs, files in os.walk(REPO_ROOT)
            if not dirs.__setitem__(slice(None), [x for x in dirs if x not in skip])
            for f in files]


@functools.cache  # both scans read the same files
def _texts() -> tuple[tuple[str, str], ...]:
    files = [p for p in _tracked_files() if p.is_file()]
    assert len(files) > 100, "the repository's files were not found"
    return tuple((str(p.relative_to(REPO_ROOT)),
                  p.read_bytes().decode("utf-8", errors="ignore")) for p in files)


def test_no_package_registry_host_is_named_in_the_repository():
    hosts = _machine_registry_hosts()
    assert hosts, "this machine's pip names no index host"
    found = []
    for rel, text in _texts():
        lower = text.lower()
        for host in sorted(hosts):
            at = lower.find(host)
            if at >= 0:
                found.append(f"{rel}:{lower.count(chr(10), 0, at) + 1}: {host}")
    assert not found, "package-registry hosts named (take them from the machine):\n" + \
        "\n".join(found)


def test_no_index_location_is_written_into_any_file():
    found = []
    for rel, text in _texts():
        for m in WRITTEN_INDEX.finditer(text):
            url = next(u for u in m.groups() if u)
            if not NOT_A_REGISTRY.search(_host(url)):
                found.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {url}")
    assert not found, "index locations written into files (take them from the machine's " \
        "pip configuration or apt sources):\n" + "\n".join(found)


def test_the_written_index_pattern_finds_what_it_is_for():
    # hosts under .example (reserved, RFC 2606): the pattern must find them all the same
    written = ["RUN pip install --extra-index-url https://wheels.example/cu130 torch",
               "[global]\nindex-url = http://pkgs.example/simple",
               "deb [arch=arm64] http://ports.example/ubuntu noble main",
               "  torch_index: https://torch.example/whl",
               "RUN pip3 install https://files.example/flashinfer-0.1-py3-none-any.whl"]
    for text in written:
        m = WRITTEN_INDEX.search(text)
        assert m and _host(next(u for u in m.groups() if u)).endswith(".example"), text
    assert not WRITTEN_INDEX.search("pip config set global.extra-index-url URL")
    assert NOT_A_REGISTRY.search(_host("http://127.0.0.1:9/simple"))
    assert NOT_A_REGISTRY.search(_host("https://mirror.example/simple"))


def _rendered_dockerfiles() -> list[tuple[str, str]]:
    out = []
    for matrix in [REPO_ROOT / "matrix.yaml", *sorted((REPO_ROOT / "examples").glob(
            "*/matrix.yaml"))]:
        lm = mx.load(matrix)
        rendered, _ = render_all(lm, mx.expand(lm), read_lock(lm.root))
        out += [(f"{matrix.parent.name}/{r.path}", r.text) for r in rendered]
    return out


def test_no_image_keeps_an_index_location():
    """ENV and ARG persist into the image (or its history): neither may name an index;
    every pip install that asks an index reads the pip_conf secret instead (one that
    installs downloaded wheels with --no-index asks none)."""
    bad = []
    files = _rendered_dockerfiles()
    assert any("wheel.txt" in text for _, text in files), "the cpu engine was not rendered"
    for path, text in files:
        for line in logical_lines(text):
            word = line.split(" ", 1)[0]
            if word in ("ENV", "ARG") and ("://" in line or any(
                    s in line for s in INDEX_SETTINGS)):
                bad.append(f"{path}: {line[:120]}")
        for line in logical_lines(text):
            if line.startswith("RUN ") and "pip install" in line:
                if all("--no-index" in cmd for cmd in line.split("pip install")[1:]):
                    continue
                if "id=pip_conf" not in line or "PIP_CONFIG_FILE=/run/secrets/pip_conf" not in line:
                    bad.append(f"{path}: a pip install without the pip_conf secret: {line[:120]}")
    assert not bad, "\n".join(bad)
