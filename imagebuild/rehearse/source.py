"""The pinned vLLM source in the shape the gb10 recipe builds it from.

The recipe fetches one commit with `git fetch --depth 1` (no tags) and applies the patch
series with images/engine/files/apply-patches.sh. GitHub is unreachable here, so the
checkout is recreated from the sha256-pinned sdist (imagebuild.vllm_source): the files
only an sdist has (PKG-INFO, *.egg-info, the generated vllm/_version.py) are removed and
the rest is committed once, without tags. Its commit id is necessarily not the pinned one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .. import REPO_ROOT
from ..patches import touched_files

APPLY_PATCHES = REPO_ROOT / "images" / "engine" / "files" / "apply-patches.sh"
# What `python setup.py sdist` adds on top of the repository's files.
SDIST_ONLY = ("PKG-INFO", "vllm.egg-info", "vllm/_version.py")
# A patch that touches these changes the CMake build (arch selection among it).
CMAKE_FILES = re.compile(r"^(CMakeLists\.txt|cmake/)")


@dataclass(frozen=True)
class Checkout:
    root: Path
    head: str  # the commit id of the recreated checkout
    sdist_commit: str | None  # what the sdist's _version.py says it was built from
    applied: list[str]  # apply-patches.sh's lines


def sdist_commit(sdist_root: Path) -> str | None:
    """The commit the sdist was built from (setuptools-scm's `commit_id`, "g<hex>")."""
    version_py = sdist_root / "vllm" / "_version.py"
    if not version_py.is_file():
        return None
    match = re.search(r"commit_id = '(?:g)?([0-9a-f]{7,40})'", version_py.read_text())
    return match.group(1) if match else None


def _git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(root.parent),
           "GIT_AUTHOR_NAME": "imagebuild rehearsal", "GIT_AUTHOR_EMAIL": "rehearsal@imagebuild",
           "GIT_COMMITTER_NAME": "imagebuild rehearsal",
           "GIT_COMMITTER_EMAIL": "rehearsal@imagebuild",
           "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}
    proc = subprocess.run(["git", "-c", "init.defaultBranch=main", *args], cwd=root, env=env,
                          capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def recipe_checkout(sdist_root: Path, dest: Path, version: str) -> tuple[Path, str]:
    """`dest` as the recipe's clone would be before patching: one commit, no tags."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(sdist_root, dest, symlinks=True,
                    ignore=shutil.ignore_patterns(".imagebuild-sdist-sha256"))
    for rel in SDIST_ONLY:
        path = dest / rel
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    _git(dest, "init", "-q", ".")
    _git(dest, "add", "-A", "-f", ".")  # a clone holds tracked files whatever .gitignore says
    _git(dest, "commit", "-q", "--no-gpg-sign", "-m", f"vLLM {version}, recreated from its sdist")
    return dest, _git(dest, "rev-parse", "HEAD")


def apply_series(tree: Path, patches: list[Path]) -> list[str]:
    """apply-patches.sh (the image's own script) on `tree`; raises CalledProcessError."""
    if not patches:
        return []
    proc = subprocess.run(["sh", str(APPLY_PATCHES), str(tree), *map(str, patches)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
    return proc.stdout.strip().splitlines()


def prepare(sdist_root: Path, dest: Path, version: str, patches: list[Path]) -> Checkout:
    root, head = recipe_checkout(sdist_root, dest, version)
    applied = apply_series(root, patches)
    return Checkout(root, head, sdist_commit(sdist_root), applied)


def cmake_patches(patches: list[Path]) -> list[Path]:
    """The patches of a series that change vLLM's CMake files."""
    return [p for p in patches if any(CMAKE_FILES.match(f) for f in touched_files(p))]


def cmake_only_tree(sdist_root: Path, dest: Path, patches: list[Path]) -> Path:
    """CMakeLists.txt, cmake/ and csrc/ (linked) of the sdist with `patches` applied: enough
    for the arch probe, without copying the whole tree again."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    shutil.copy2(sdist_root / "CMakeLists.txt", dest / "CMakeLists.txt")
    shutil.copytree(sdist_root / "cmake", dest / "cmake")
    (dest / "csrc").symlink_to(sdist_root / "csrc", target_is_directory=True)
    apply_series(dest, patches)
    return dest
