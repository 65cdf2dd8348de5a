"""matrix.lock.json: reading it, and checking it agrees with matrix.yaml.

The lock is written by `build.py lock` (lock.py); everything that builds reads pins from
here only. An entry may be `unresolved` (this machine could not reach the Hub): the fields
it could not learn are null, never invented, and building a cell that needs them refuses.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagebuild.errors import UserError
from imagebuild.lock.jsonpos import json_marks
from imagebuild.lock.lockschema import check_lock
from imagebuild.spec.config import HubPin
from imagebuild.spec.yamlpos import shorten

LOCK_NAME = "matrix.lock.json"
LOCK_VERSION = 1
MAX_LOCK_BYTES = 32 << 20  # file lists of large Hub repositories; the real lock is ~7 KB


@dataclass(frozen=True)
class Lock:
    data: dict[str, Any]
    path: Path

    def entry(self, kind: str, name: str) -> dict[str, Any] | None:
        return self.data.get(kind, {}).get(name)

    def hub_sha(self, kind: str, name: str) -> str | None:
        entry = self.entry(kind, name)
        return entry.get("sha") if entry else None


def read_lock(root: Path) -> Lock | None:
    """The lock beside matrix.yaml, checked value by value (a hand edit is refused at its
    file:line:column, like matrix.yaml); None when there is none."""
    path = root / LOCK_NAME
    if not path.exists() and not path.is_symlink():
        return None
    where = f"{LOCK_NAME}:1:1"
    fix = "regenerate it with `python build.py lock` (and commit it)"
    try:
        if path.is_dir() or not path.is_file():
            raise UserError(f"{LOCK_NAME} is not a regular file", fix=fix, where=where)
        with path.open("rb") as fh:
            raw = fh.read(MAX_LOCK_BYTES + 1)
    except OSError as exc:
        raise UserError(f"cannot read {LOCK_NAME}: {exc.strerror or exc}", fix=fix,
                        where=where) from None
    if len(raw) > MAX_LOCK_BYTES:
        raise UserError(f"{LOCK_NAME} is larger than {MAX_LOCK_BYTES} bytes", fix=fix,
                        where=where)
    try:
        text = raw.decode("utf-8")
        data = json.loads(text)
    except UnicodeDecodeError as exc:
        raise UserError(f"{LOCK_NAME} is not UTF-8 (byte {exc.start})", fix=fix,
                        where=where) from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{LOCK_NAME} is not valid JSON: {exc.msg}", fix=fix,
                        where=f"{LOCK_NAME}:{exc.lineno}:{exc.colno}") from None
    except RecursionError:
        raise UserError(f"{LOCK_NAME} is nested too deep", fix=fix, where=where) from None
    if not isinstance(data, dict):
        raise UserError(f"{LOCK_NAME} must be a JSON object, not a {type(data).__name__}",
                        fix=fix, where=where)
    if data.get("version") != LOCK_VERSION:
        raise UserError(f"{LOCK_NAME} has version {shorten(data.get('version'))}, expected "
                        f"{LOCK_VERSION}", fix=fix, where=where)
    check_lock(data, lambda: json_marks(text))
    return Lock(data=data, path=path)


def served_files(files: list[dict[str, Any]], exclude: list[str] | tuple[str, ...]
                 ) -> list[dict[str, Any]]:
    """The locked files an image carries: all of the pinned revision's, minus those a
    pattern of the pin's `exclude` matches."""
    return [f for f in files if not any(fnmatch.fnmatchcase(f["path"], p) for p in exclude)]


def hub_disagreement(pin: HubPin, entry: dict[str, Any] | None) -> str | None:
    """Why the lock entry does not match the matrix pin, or None when it does."""
    if entry is None:
        return "has no lock entry"
    if entry.get("repository") != pin.repository:
        return f"is locked for repository {entry.get('repository')!r}, not {pin.repository!r}"
    if pin.revision:
        sha = entry.get("sha") or ""
        if entry.get("revision") != pin.revision or not sha.startswith(pin.revision):
            return f"is locked at {sha or entry.get('revision')!r}, not revision {pin.revision!r}"
    elif entry.get("track") != pin.track:
        return f"is locked from track {entry.get('track')!r}, not {pin.track!r}"
    return None
