"""What a source-built engine's lock entry adds to matrix.yaml's pin: the commit the vLLM
sdist (the tree every check and rehearsal tests) was built from, and every git source its
CMake fetches at build time, pinned by commit.

The sdist's `vllm/_version.py` names its commit (setuptools-scm's `commit_id`, "g<hex>");
a source pin that is not that commit would build a tree nobody tested, so `lock` refuses
it. The FetchContent sources are read from the sdist's CMake files with the series' CMake
patches applied (vllmsource/fetchcontent.py). A GIT_TAG that is a tag, not a commit, is
resolved with `git ls-remote` only when asked (`lock --update TARGET`, where GitHub is
reachable): until then the entry is unresolved and builds refuse it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from imagebuild.errors import OperationFailed, UserError
from imagebuild.spec.matrix import LoadedMatrix
from imagebuild.vllmsource.fetchcontent import is_commit, read_sources
from imagebuild.vllmsource.sdist import sdist_commit, sdist_tree

SdistTree = Callable[[str], Path]
ResolveRef = Callable[[str, str], str]


def check_pin(lm: LoadedMatrix, ename: str, tname: str, commit: str, built_from: str | None,
              version: str) -> None:
    """Exit 2 unless the source pin is the commit the sdist was built from."""
    if built_from and commit.startswith(built_from):
        return
    said = f"was built from commit {built_from}" if built_from else "names no commit"
    raise UserError(
        f"engine {ename} pins vLLM commit {commit[:12]} for {tname}, but the vLLM {version} "
        f"sdist (the tree every check and the GB10 rehearsal test) {said}: the image would "
        "be built from a tree nobody tested",
        fix=(f"pin the commit the sdist was built from: the full 40-hex SHA starting "
             f"{built_from} (e.g. the official image's VLLM_BUILD_COMMIT)" if built_from
             else "use a vLLM release whose sdist records its commit"),
        where=lm.located.where(("engines", ename, "realize", tname, "source", "commit")))


def resolve_ref(repository: str, ref: str) -> str:
    """The commit a tag (peeled: an annotated tag's object is not a commit) or branch names
    on `repository`, asked with `git ls-remote` (GIT_SSL_CAINFO and proxies from the
    environment, as git uses them)."""
    refs = [f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}"]
    try:
        proc = subprocess.run(["git", "ls-remote", repository, *refs],
                              capture_output=True, text=True, timeout=120, check=False,
                              env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OperationFailed(f"git ls-remote {repository} failed: {exc}",
                              fix="run it where git can reach the repository") from exc
    if proc.returncode != 0:
        raise OperationFailed(f"git ls-remote {repository} {ref} failed: "
                              f"{proc.stderr.strip()[-300:]}",
                              fix="run `python build.py lock --update TARGET` where git can "
                                  f"reach {repository} (e.g. a runner of the target)")
    found: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        sha, _, name = line.partition("\t")
        if name:
            found[name] = sha
    for name in refs:  # peeled tag first, then a lightweight tag, then a branch
        if name in found:
            return found[name]
    raise OperationFailed(f"{repository} has no tag or branch {ref!r}",
                          fix="check the GIT_TAG in vLLM's CMake files")


def source_pins(lm: LoadedMatrix, ename: str, tname: str, entry: dict[str, Any],
                previous: dict[str, Any] | None, *, resolve: bool,
                sdist: SdistTree | None = None, resolve_tag: ResolveRef = resolve_ref,
                log: Callable[[str], None] = print) -> dict[str, Any]:
    """`entry` (expected_engine's) with source.sdist_commit, dependencies and a status.

    Kept from `previous` while vLLM version, source and patches agree (a plain `lock`
    needs neither the sdist nor GitHub); read from the sdist otherwise; tags resolved only
    when `resolve`."""
    old = previous or {}
    same = (old.get("vllm_version") == entry["vllm_version"]
            and (old.get("source") or {}).get("commit") == entry["source"]["commit"]
            and (old.get("source") or {}).get("repository") == entry["source"]["repository"]
            and old.get("patches") == entry["patches"]
            and old.get("dependencies") is not None
            and (old.get("source") or {}).get("sdist_commit"))
    old_deps: dict[str, Any] = old.get("dependencies") or {}
    if same:
        built_from = old["source"]["sdist_commit"]
        deps = {n: {k: v for k, v in d.items() if k != "commit"} for n, d in old_deps.items()}
    else:
        if sdist is None:
            sdist = sdist_tree
        root = sdist(entry["vllm_version"])
        built_from = sdist_commit(root)
        check_pin(lm, ename, tname, entry["source"]["commit"], built_from,
                  entry["vllm_version"])
        patches = [lm.root / "patches" / p["file"] for p in entry["patches"]]
        deps = {d.name: d.as_lock() for d in read_sources(root, patches)}
    out_deps: dict[str, Any] = {}
    for name, dep in sorted(deps.items()):
        prev = old_deps.get(name) or {}
        if is_commit(dep["ref"]):
            commit: str | None = dep["ref"]
        elif (prev.get("repository"), prev.get("ref")) == (dep["repository"], dep["ref"]) \
                and prev.get("commit") and not resolve:
            commit = prev["commit"]
        elif resolve:
            commit = resolve_tag(dep["repository"], dep["ref"])
            log(f"  {ename}/{tname}: {name} {dep['ref']} is {commit}")
        else:
            commit = None
        out_deps[name] = {**dep, "commit": commit}
    result = {**entry, "source": {**entry["source"], "sdist_commit": built_from},
              "dependencies": out_deps, "status": "resolved"}
    unpinned = [f"{n} {d['ref']}" for n, d in out_deps.items() if d["commit"] is None]
    if unpinned:
        result["status"] = "unresolved"
        result["fix"] = (f"resolve {', '.join(unpinned)} to commits: `python build.py lock "
                         f"--update {tname}` where GitHub is reachable (a {tname} runner), "
                         "then commit the lock")
    return result
