"""Mirrors, not hosts: no package-registry host is named anywhere in the repository (this
file excepted: it lists what must be absent), and no image keeps an index location. Index
and mirror locations come from the machine (pip configuration, apt sources) or an explicit
setting, and reach builds as the pip_conf secret."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from imagebuild import REPO_ROOT
from imagebuild.lock.lockfile import read_lock
from imagebuild.render import render_all
from imagebuild.spec import matrix as mx
from tests.support.dockerfile_text import logical_lines

# Package registries and archive mirrors teams replace with their own. GitHub (source
# pins) and nvcr.io (base images) are pins, not registries, and may be named.
REGISTRY_HOSTS = (
    "pypi.org", "pythonhosted.org", "pypi.python.org", "download.pytorch.org",
    "deb.debian.org", "security.debian.org", "ftp.debian.org", "httpredir.debian.org",
    "archive.ubuntu.com", "ports.ubuntu.com", "security.ubuntu.com",
    "conda.anaconda.org", "repo.anaconda.com", "registry.npmjs.org", "proxy.golang.org",
    "crates.io", "pypi.nvidia.com", "pypi.ngc.nvidia.com", "flashinfer.ai",
    "wheels.vllm.ai", "developer.download.nvidia.com", "torch-wheels.example",
)
INDEX_SETTINGS = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS",
                  "PIP_CONFIG_FILE", "UV_INDEX", "UV_EXTRA_INDEX_URL")
SELF = Path(__file__).resolve()


def _tracked_files() -> list[Path]:
    if (REPO_ROOT / ".git").exists():
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
        return [REPO_ROOT / p for p in out if p]
    skip = {".git", ".venv", ".venv-vllm", "build", ".cache", "__pycache__"}
    return [Path(d) / f for d, dirs, files in os.walk(REPO_ROOT)
            if not dirs.__setitem__(slice(None), [x for x in dirs if x not in skip])
            for f in files]


def test_no_package_registry_host_is_named_in_the_repository():
    found = []
    files = [p for p in _tracked_files() if p.resolve() != SELF and p.is_file()]
    assert len(files) > 100, "the repository's files were not found"
    for path in files:
        text = path.read_bytes().decode("utf-8", errors="ignore").lower()
        for host in REGISTRY_HOSTS:
            at = text.find(host)
            if at >= 0:
                line = text.count("\n", 0, at) + 1
                found.append(f"{path.relative_to(REPO_ROOT)}:{line}: {host}")
    assert not found, "package-registry hosts named (take them from the machine):\n" + \
        "\n".join(found)


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
    every pip install reads the pip_conf secret instead."""
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
                if "id=pip_conf" not in line or "PIP_CONFIG_FILE=/run/secrets/pip_conf" not in line:
                    bad.append(f"{path}: a pip install without the pip_conf secret: {line[:120]}")
    assert not bad, "\n".join(bad)
