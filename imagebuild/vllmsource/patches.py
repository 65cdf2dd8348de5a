"""Engine patch files: their hashes for the lock, and a check that a series applies.

`check_series` mirrors images/engine/files/apply-patches.sh (patches in order, -p1) on a
scratch copy of only the files the series touches, so a vLLM source tree (or a
site-packages dir holding vllm/) is never modified and a 100 MB tree is not copied.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from imagebuild.errors import OperationFailed, UserError

# "--- a/x" / "+++ b/x" headers (optionally followed by a tab and a timestamp).
_HEADER = re.compile(r"^(?:---|\+\+\+) (?:[ab]/)?(?P<path>[^\t\n]+)")
_DIFF_GIT = re.compile(r"^diff --git a/(?P<a>\S+) b/(?P<b>\S+)")
# The most telling lines of git apply's complaints.
_GIT_FAIL = re.compile(
    r"^error: (?:patch failed: (?P<at>\S+)|(?P<file>\S+): (?P<why>.+))$", re.M
)


def patch_sha256(path: Path) -> str:
    """sha256 of the patch file's bytes, as recorded in the lock."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def touched_files(patch: Path) -> list[str]:
    """Paths (after -p1) the patch reads or writes, in order, without /dev/null."""
    found: list[str] = []
    for line in Path(patch).read_text(encoding="utf-8", errors="replace").splitlines():
        git = _DIFF_GIT.match(line)
        names = [git["a"], git["b"]] if git else []
        header = _HEADER.match(line)
        if header and header["path"] != "/dev/null":
            names.append(header["path"].strip())
        for name in names:
            if name not in found:
                found.append(name)
    return found


def _git_env(ceiling: Path) -> dict[str, str]:
    # Keep git apply from discovering an enclosing repository: inside one it skips paths
    # outside the current directory and still exits 0.
    return {**os.environ, "GIT_CEILING_DIRECTORIES": str(ceiling)}


def _failure(patch: Path, stderr: str) -> OperationFailed:
    match = _GIT_FAIL.search(stderr)
    if match and match["at"]:
        file, _, line = match["at"].rpartition(":")
        where = f"{file} (hunk at line {line})"
    elif match:
        where = f"{match['file']} ({match['why']})"
    else:
        where = stderr.strip().splitlines()[0] if stderr.strip() else "unknown file"
    return OperationFailed(
        f"patch {patch.name} does not apply: {where}",
        fix=f"rebase {patch} onto this vLLM source, or drop it from the patch set",
        where=str(patch),
    )


@dataclass(frozen=True)
class Outcome:
    """What one patch of a series does to the pinned source."""

    patch: Path
    status: str  # applies | upstream (the source already has it) | fails | untried
    detail: str = ""  # for fails: the file (and hunk) git apply named


def _git_apply(work: Path, patch: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "apply", "-p1", *flags, str(patch)], cwd=work,
                          env=_git_env(work.parent), capture_output=True, text=True,
                          check=False)


def try_series(tree: Path, patches: list[Path]) -> list[Outcome]:
    """Each patch of the series against `tree`, in order, as apply-patches.sh applies them
    (cumulatively, on a scratch copy of the files they touch): it applies; it is already
    in the source (it applies in reverse: upstream has it, and applying it again fails the
    build); or it fails, naming the file, and the patches after it are untried."""
    tree = Path(tree)
    if not tree.is_dir():
        raise UserError(f"{tree} is not a directory", fix="pass the vLLM source root")
    if shutil.which("git") is None:
        raise OperationFailed("git is needed to check patches", fix="install git")
    out: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="imagebuild-patches.") as scratch:
        work = Path(scratch) / "tree"
        work.mkdir()
        for patch in patches:
            patch = Path(patch).resolve()
            if not patch.is_file():
                raise UserError(f"patch {patch} not found", fix="check the patch set's files")
            if out and out[-1].status in ("fails", "untried"):
                out.append(Outcome(patch, "untried"))
                continue
            for rel in touched_files(patch):
                src, dst = tree / rel, work / rel
                if src.is_file() and not dst.exists():
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, dst)
            proc = _git_apply(work, patch)
            if proc.returncode == 0:
                out.append(Outcome(patch, "applies"))
            elif _git_apply(work, patch, "--check", "--reverse").returncode == 0:
                out.append(Outcome(patch, "upstream"))
            else:
                out.append(Outcome(patch, "fails", _failure(patch, proc.stderr).message))
    return out


def check_series(tree: Path, patches: list[Path]) -> None:
    """Raise OperationFailed naming the first patch (and file) that does not apply (one
    the source already has does not apply a second time either)."""
    for o in try_series(tree, patches):
        if o.status == "fails":
            raise OperationFailed(o.detail, fix=f"rebase {o.patch} onto this vLLM source, or "
                                                "drop it from the patch set", where=str(o.patch))
        if o.status == "upstream":
            raise OperationFailed(f"patch {o.patch.name} is already in this vLLM source (it "
                                  "applies in reverse)", fix="drop it from the patch set",
                                  where=str(o.patch))
