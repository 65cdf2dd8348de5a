"""The pinned vLLM source, fetched and patched by the recipe's own scripts.

The gb10 engine's `source` stage runs fetch-vllm-source.sh (one commit, `--depth 1`, no
tags), apply-patches.sh and check-source-tree.sh. GitHub is unreachable here, so the
repository it fetches from is recreated from the sha256-pinned sdist: the files only an
sdist has (PKG-INFO, *.egg-info, the generated vllm/_version.py) are removed, the rest is
committed once and tagged v<version> as upstream is; the scripts then fetch that commit
over file:// exactly as they fetch GitHub's. That recreated commit's id is necessarily not
upstream's; what ties the tree to the pin is the commit the sdist records it was built
from (`sdist_commit`), which the source step requires to be the pinned one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from imagebuild import REPO_ROOT
from imagebuild.vllmsource.patches import touched_files
from imagebuild.vllmsource.sdist import sdist_commit

FILES = REPO_ROOT / "images" / "engine" / "files"
# What `python setup.py sdist` adds on top of the repository's files.
SDIST_ONLY = ("PKG-INFO", "vllm.egg-info", "vllm/_version.py")
# A patch that touches these changes the CMake build (arch selection among it).
CMAKE_FILES = re.compile(r"^(CMakeLists\.txt|cmake/)")


class ScriptFailed(Exception):
    """One of the recipe's scripts exited non-zero (its output is kept)."""

    def __init__(self, script: str, proc: subprocess.CompletedProcess[str]):
        super().__init__(f"{script} exited {proc.returncode}")
        self.script = script
        self.output = (proc.stdout + proc.stderr).strip()


@dataclass(frozen=True)
class Checkout:
    root: Path
    head: str  # the commit the recipe's fetch checked out
    sdist_commit: str | None  # what the sdist's _version.py says it was built from
    log: list[str]  # the scripts' own lines


def _git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(root.parent),
           "GIT_AUTHOR_NAME": "imagebuild rehearsal", "GIT_AUTHOR_EMAIL": "rehearsal@imagebuild",
           "GIT_COMMITTER_NAME": "imagebuild rehearsal",
           "GIT_COMMITTER_EMAIL": "rehearsal@imagebuild",
           "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}
    proc = subprocess.run(["git", "-c", "init.defaultBranch=main", *args], cwd=root, env=env,
                          capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def make_origin(sdist_root: Path, dest: Path, version: str) -> str:
    """A repository at `dest` holding the sdist's tree as one tagged commit; its SHA."""
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
    _git(dest, "tag", f"v{version}")  # upstream has the tag; a fetch by SHA does not get it
    return _git(dest, "rev-parse", "HEAD")


def _script(name: str, *args: str) -> list[str]:
    proc = subprocess.run(["sh", str(FILES / name), *args], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise ScriptFailed(name, proc)
    return (proc.stdout + proc.stderr).strip().splitlines()


def apply_series(tree: Path, patches: list[Path]) -> list[str]:
    """apply-patches.sh (the image's own script) on `tree`."""
    return _script("apply-patches.sh", str(tree), *map(str, patches)) if patches else []


def prepare(sdist_root: Path, workdir: Path, version: str, patches: list[Path],
            source_paths: list[str]) -> Checkout:
    """Origin from the sdist, then the recipe's fetch, patch series and path check."""
    sha = make_origin(sdist_root, workdir / "origin", version)
    dest = workdir / "src" / "vllm"
    if dest.exists():
        shutil.rmtree(dest)
    log = _script("fetch-vllm-source.sh", (workdir / "origin").as_uri(), sha, str(dest))
    log += apply_series(dest, patches)
    log += _script("check-source-tree.sh", str(dest), *source_paths)
    return Checkout(dest, _git(dest, "rev-parse", "HEAD"), sdist_commit(sdist_root), log)


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
