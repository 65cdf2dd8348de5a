"""One build time for every image: SOURCE_DATE_EPOCH (docs/reproducibility.md).

The reproducible-builds convention: the variable when the runner sets it, else the commit
time of this checkout. Build contexts get their files' times clamped to it (BuildKit's
COPY keeps a context file's mtime, which a checkout or a generated model sets to "now";
COPY's cache key ignores mtimes, so this costs no cache hit). Each image carries it as a
label, so a rebuild can use the same value; BuildKit 0.11+ (Docker Engine 23+) also
stamps it into the image config's `created` times, which older engines set to the
build's own time whatever they are given.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from imagebuild.errors import UserError

ENV = "SOURCE_DATE_EPOCH"
LABEL = "io.imagebuild.source-date-epoch"
# the first Docker Engine whose BuildKit (0.11) reads the SOURCE_DATE_EPOCH build arg
CONFIG_EPOCH_ENGINE = 23


def source_date_epoch(root: Path, environ: Mapping[str, str] | None = None) -> int | None:
    """SOURCE_DATE_EPOCH from the environment, else the commit time of `root`'s HEAD, else
    None (not a git checkout: an installed copy)."""
    env = os.environ if environ is None else environ
    value = env.get(ENV, "").strip()
    if value:
        if not value.isdigit():
            raise UserError(f"environment variable {ENV}={value[:40]!r} is not a number of "
                            "seconds since 1970-01-01 UTC",
                            fix=f"set {ENV} to an integer (e.g. `git log -1 --format=%ct`), "
                                "or unset it")
        return int(value)
    try:
        proc = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%ct"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = proc.stdout.strip()
    return int(out) if proc.returncode == 0 and out.isdigit() else None


def clamp_tree(root: Path, epoch: int) -> int:
    """Set every file, link and directory under `root` (and root) that is newer than
    `epoch` to it; how many were changed."""
    changed = 0
    paths = [root, *root.rglob("*")]
    for path in sorted(paths, key=lambda p: len(p.parts), reverse=True):  # dirs last
        if path.lstat().st_mtime > epoch:
            os.utime(path, (epoch, epoch), follow_symlinks=False)
            changed += 1
    return changed


def supports_config_epoch(server_version: str) -> bool:
    """Whether this Docker Engine's BuildKit stamps the SOURCE_DATE_EPOCH build arg into
    the image config (BuildKit 0.11, Docker Engine 23)."""
    try:
        return int(server_version.split(".")[0]) >= CONFIG_EPOCH_ENGINE
    except ValueError:
        return False
