"""The gb10 compile's git sources: read from the pinned sdist's CMake, pinned in the lock,
fetched by commit (fetch-git-commit.sh against local repositories standing in for GitHub,
which this machine cannot reach), handed to CMake, and the pinned commit is the tested one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from imagebuild.lock.sourcepins import resolve_ref
from imagebuild.spec import matrix as mx
from imagebuild.vllmsource import fetchcontent
from imagebuild.vllmsource.fetchcontent import read_sources
from imagebuild.vllmsource.sdist import sdist_commit, sdist_tree

FETCH = REPO_ROOT / "images" / "engine" / "files" / "fetch-git-commit.sh"
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent",
           # local repositories stand in for GitHub; git refuses file:// submodules unless told
           "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "protocol.file.allow",
           "GIT_CONFIG_VALUE_0": "always"}


@pytest.fixture(scope="module")
def sdist() -> Path:
    return sdist_tree("0.23.0")


def _source_engines() -> list[tuple[str, str, dict]]:
    lm = mx.load(REPO_ROOT / "matrix.yaml")
    lock = json.loads((REPO_ROOT / "matrix.lock.json").read_text())
    return [(e, t, lock["engines"][e][t]) for e, eng in lm.matrix.engines.items()
            for t, real in eng.realize.items() if real.source]


def test_pinned_commit_is_the_commit_the_tested_sdist_was_built_from(sdist: Path) -> None:
    built_from = sdist_commit(sdist)
    assert built_from == "91df0fad4"
    for ename, tname, entry in _source_engines():
        assert entry["source"]["commit"].startswith(built_from), (ename, tname)
        assert entry["source"]["sdist_commit"] == built_from


def test_every_fetchcontent_of_the_pinned_cmake_is_in_the_lock(sdist: Path) -> None:
    """A pin bump that adds (or changes) a FetchContent fails here until it is locked."""
    lm = mx.load(REPO_ROOT / "matrix.yaml")
    for ename, tname, entry in _source_engines():
        patches = [lm.root / "patches" / p for p in lm.matrix.engines[ename].realize[tname].patches]
        found = {d.name: d.as_lock() for d in read_sources(sdist, patches)}
        locked = {n: {k: v for k, v in d.items() if k != "commit"}
                  for n, d in entry["dependencies"].items()}
        assert locked == found, (ename, tname)
    assert set(found) == {"cutlass", "deepgemm", "flashmla", "qutlass", "triton_kernels",
                          "vllm-flash-attn"}


def test_a_new_fetchcontent_in_the_cmake_is_found(sdist: Path, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(sdist / "cmake", tree / "cmake")
    shutil.copy2(sdist / "CMakeLists.txt", tree / "CMakeLists.txt")
    before = {d.name for d in fetchcontent.dependencies(tree)}
    extra = tree / "cmake" / "external_projects" / "newdep.cmake"
    extra.write_text('set(NEWDEP_TAG "v1.2")\n# FetchContent_Declare(commented GIT_REPOSITORY x)\n'
                     "FetchContent_Declare(\n  newdep # why\n  GIT_REPOSITORY "
                     '"https://github.com/example/newdep.git"\n  GIT_TAG ${NEWDEP_TAG}\n'
                     '  GIT_SUBMODULES ""\n)\n')
    deps = {d.name: d for d in fetchcontent.dependencies(tree)}
    assert set(deps) - before == {"newdep"}
    assert deps["newdep"].repository == "https://github.com/example/newdep.git"
    assert deps["newdep"].ref == "v1.2" and deps["newdep"].commit is None
    assert deps["newdep"].submodules == ()
    assert deps["newdep"].source_dir_var == "FETCHCONTENT_SOURCE_DIR_NEWDEP"


def test_the_cpu_only_cmake_is_the_only_file_left_out(sdist: Path) -> None:
    """cpu_extension.cmake (oneDNN, ACL) is included only for VLLM_TARGET_DEVICE=cpu."""
    text = (sdist / "CMakeLists.txt").read_text()
    cpu = text.index('include(${CMAKE_CURRENT_LIST_DIR}/cmake/cpu_extension.cmake)')
    assert 'VLLM_TARGET_DEVICE STREQUAL "cpu"' in text[max(0, cpu - 400):cpu]
    assert fetchcontent.NOT_CUDA == {"cmake/cpu_extension.cmake"}


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV}, check=True,
                          capture_output=True, text=True).stdout.strip()


def _repo(path: Path, files: dict[str, str]) -> str:
    path.mkdir(parents=True)
    _git(path, "init", "-q", "-b", "main")
    for name, text in files.items():
        (path / name).write_text(text)
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "one")
    return _git(path, "rev-parse", "HEAD")


@pytest.fixture
def remote(tmp_path: Path) -> dict[str, str]:
    """A repository with two submodules (one with its own), and an annotated tag."""
    inner = _repo(tmp_path / "inner", {"inner.h": "//\n"})
    fmt = _repo(tmp_path / "fmt", {"fmt.h": "//\n"})
    cutlass = tmp_path / "cutlass"
    _repo(cutlass, {"cutlass.h": "//\n"})
    _git(cutlass, "submodule", "add", "-q", (tmp_path / "inner").as_uri(), "third-party/inner")
    _git(cutlass, "commit", "-q", "-m", "inner")
    top = tmp_path / "dep"
    _repo(top, {"README": "dep\n"})
    _git(top, "submodule", "add", "-q", cutlass.as_uri(), "third-party/cutlass")
    _git(top, "submodule", "add", "-q", (tmp_path / "fmt").as_uri(), "third-party/fmt")
    _git(top, "commit", "-q", "-m", "submodules")
    _git(top, "tag", "-a", "v1.0", "-m", "release")
    # the server side of a fetch by SHA (GitHub allows it)
    _git(top, "config", "uploadpack.allowReachableSHA1InWant", "true")
    return {"url": top.as_uri(), "commit": _git(top, "rev-parse", "HEAD"),
            "tag_object": _git(top, "rev-parse", "v1.0"), "inner": inner, "fmt": fmt,
            "path": str(top)}


def _fetch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(FETCH), *args], capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}, timeout=120)


def test_fetch_by_commit_with_every_submodule_at_its_recorded_commit(remote, tmp_path) -> None:
    dest = tmp_path / "src" / "dep"
    proc = _fetch(remote["url"], remote["commit"], str(dest), "all")
    assert proc.returncode == 0, proc.stderr
    assert _git(dest, "rev-parse", "HEAD") == remote["commit"]
    assert (dest / "third-party/cutlass/third-party/inner/inner.h").is_file()  # recursive
    assert re.search(rf"submodule third-party/fmt at {remote['fmt']}", proc.stdout)


def test_fetch_of_listed_submodules_only(remote, tmp_path) -> None:
    dest = tmp_path / "out" / "dep"
    proc = _fetch(remote["url"], remote["commit"], str(dest), "third-party/fmt")
    assert proc.returncode == 0, proc.stderr
    assert (dest / "third-party/fmt/fmt.h").is_file()
    assert not (dest / "third-party/cutlass/cutlass.h").exists()


def test_fetch_all_of_a_tree_whose_gitmodules_lists_nothing(tmp_path) -> None:
    # a .gitmodules with no submodule in it: `git submodule status` prints nothing
    path = tmp_path / "bare-modules"
    commit = _repo(path, {".gitmodules": "", "README": "x\n"})
    _git(path, "config", "uploadpack.allowReachableSHA1InWant", "true")
    proc = _fetch(path.as_uri(), commit, str(tmp_path / "out" / "d"), "all")
    assert proc.returncode == 0, proc.stderr
    assert _git(tmp_path / "out" / "d", "rev-parse", "HEAD") == commit


def test_fetch_refuses_what_is_not_the_locked_commit(remote, tmp_path) -> None:
    # an annotated tag's object id is not a commit: fetching it checks out another id
    proc = _fetch(remote["url"], remote["tag_object"], str(tmp_path / "out" / "a"))
    assert proc.returncode == 1 and f"gave {remote['commit']}" in proc.stderr
    proc = _fetch(remote["url"], "v1.0", str(tmp_path / "out" / "b"))
    assert proc.returncode == 2 and "full 40-hex" in proc.stderr
    proc = _fetch(remote["url"], "0" * 40, str(tmp_path / "out" / "c"))
    assert proc.returncode == 1


def test_ls_remote_resolves_an_annotated_tag_to_its_commit(remote) -> None:
    assert remote["tag_object"] != remote["commit"]
    assert resolve_ref(remote["url"], "v1.0") == remote["commit"]
    assert resolve_ref(remote["url"], "main") == remote["commit"]


def test_cmake_takes_every_locked_source_from_src_deps_without_a_download(tmp_path) -> None:
    """The rendered compile's CMAKE_ARGS, given to CMake (>= 3.26, as vLLM's build pins)
    with each dependency declared as the sdist declares it: configure uses the local
    directories and downloads nothing (GitHub is unreachable here, so a fetch would fail)."""
    import shlex

    from imagebuild.lock.lockfile import read_lock
    from imagebuild.rehearse.toolchain import find_tools
    from imagebuild.render import render_engine

    lm = mx.load(REPO_ROOT / "matrix.yaml")
    text = render_engine(lm, "gb10", "dflashfix", read_lock(lm.root)).text
    args = shlex.split(re.search(r"CMAKE_ARGS=('[^']*')", text).group(1))[0].split()
    deps = read_lock(lm.root).entry("engines", "dflashfix")["gb10"]["dependencies"]
    deps_dir = tmp_path / "src" / "deps"
    lines = ["cmake_minimum_required(VERSION 3.26)", "project(probe NONE)",
             "include(FetchContent)"]
    for name, dep in deps.items():
        (deps_dir / name).mkdir(parents=True)
        (deps_dir / name / "MARKER").write_text(name)
        subs = ("" if dep["submodules"] == "all" else
                " GIT_SUBMODULES " + " ".join(f'"{s}"' for s in dep["submodules"]))
        lines += [f"FetchContent_Declare({name} GIT_REPOSITORY {dep['repository']} "
                  f"GIT_TAG {dep['ref']}{subs} GIT_PROGRESS TRUE)",
                  f"FetchContent_MakeAvailable({name})",
                  f'file(READ "${{{name}_SOURCE_DIR}}/MARKER" got)',
                  f'message(STATUS "source {name}: ${{got}}")']
    (tmp_path / "CMakeLists.txt").write_text("\n".join(lines) + "\n")
    local = [a.replace("=/src/deps/", f"={deps_dir}/") for a in args]
    proc = subprocess.run([find_tools().cmake, "-S", str(tmp_path), "-B",
                           str(tmp_path / "build"), *local], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in deps:
        assert f"source {name}: {name}" in proc.stdout
    # the same project without the source directories would have to download: it fails
    proc = subprocess.run([find_tools().cmake, "-S", str(tmp_path), "-B",
                           str(tmp_path / "build2"), "-DFETCHCONTENT_FULLY_DISCONNECTED=ON"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
