"""A folder's contents as a comparable value, for tests asserting that nothing was written."""

from __future__ import annotations

import hashlib
from pathlib import Path


def tree_snapshot(root: Path) -> dict[str, str]:
    """Every path below `root`: a file's sha256, a link's target, or `dir`."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = f"-> {p.readlink()}"
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out
