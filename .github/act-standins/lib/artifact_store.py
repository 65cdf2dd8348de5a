"""GitHub's artifact store of one workflow run, as files: <store>/<name>/ holds the files,
<store>/.meta/<name>.json its id and size. Its rules are the service's as
@actions/artifact v4 (upload-artifact v5, download-artifact v6) meet them:

- a name is unique within the run, across its attempts: a second upload of a name fails
  with the service's 409 unless the step deletes the old one first (`overwrite: true`);
  artifacts of earlier attempts stay visible to later ones (a re-run job downloads what a
  job of attempt 1 uploaded);
- a name may not hold `" : < > | * ? \\r \\n \\ /` (validateArtifactName);
- ids grow, so "latest" of a name is the highest id."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

FORBIDDEN = ['"', ":", "<", ">", "|", "*", "?", "\r", "\n", "\\", "/"]


class ArtifactError(Exception):
    pass


def store() -> Path:
    return Path(os.environ["IMAGEBUILD_REHEARSAL_ARTIFACTS"])


def validate_name(name: str) -> None:
    bad = [c for c in FORBIDDEN if c in name]
    if bad:
        raise ArtifactError(f"The artifact name is not valid: {name}. Contains the following "
                            f"character: {bad[0]!r}")


def listed() -> list[dict[str, Any]]:
    meta = store() / ".meta"
    return sorted((json.loads(p.read_text()) for p in meta.glob("*.json")),
                  key=lambda m: m["id"]) if meta.is_dir() else []


def delete(name: str) -> bool:
    meta = store() / ".meta" / f"{name}.json"
    if not meta.exists():
        return False
    meta.unlink()
    shutil.rmtree(store() / name, ignore_errors=True)
    return True


def create(name: str, files: list[tuple[Path, str]]) -> dict[str, Any]:
    """files: (source, path inside the artifact)."""
    validate_name(name)
    meta = store() / ".meta" / f"{name}.json"
    if meta.exists():
        raise ArtifactError("Failed to CreateArtifact: Received non-retryable error: Failed "
                            "request: (409) Conflict: an artifact with this name already "
                            "exists on the workflow run")
    dest = store() / name
    for src, rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    counter = store() / ".meta" / ".last-id"  # ids only grow, deleted ones too
    counter.parent.mkdir(parents=True, exist_ok=True)
    ident = 1 + (int(counter.read_text()) if counter.exists() else 0)
    counter.write_text(str(ident))
    rec = {"id": ident, "name": name, "size": sum(s.stat().st_size for s, _ in files),
           "attempt": os.environ.get("GITHUB_RUN_ATTEMPT", "1")}
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(json.dumps(rec))
    return rec
