"""What this machine pushed where: per registry and layer (its diff id and the encoding
sent), the blob it became (digest, size, media type) and the repositories it went to, so
that a push to another repository of that registry mounts the blob instead of sending it
again, and a gzipped layer is known without compressing it again (dockerd keeps the same
for its own pushes: v2metadata-by-diffid).

A hint, never trusted: the registry is asked (HEAD, mount) before anything rests on a
record, and a wrong or unreadable record costs an upload, never a wrong image.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from imagebuild import cache_dir
from imagebuild.registry.client import is_digest, is_repository

KEEP_REPOS = 4  # the repositories remembered per blob, newest first


@dataclass(frozen=True)
class Blob:
    digest: str
    size: int | None  # None: not known until the registry says it
    media_type: str


def _path(host: str, diff_id: str, encoding: str) -> Path:
    safe_host = re.sub(r"[^A-Za-z0-9.-]", "_", host)
    return cache_dir("pushed-blobs") / safe_host / f"{diff_id.split(':')[-1]}.{encoding}.json"


def recall(host: str, diff_id: str, encoding: str) -> tuple[Blob, tuple[str, ...]] | None:
    """The blob this machine last pushed to `host` for the layer, and where to."""
    try:
        doc = json.loads(_path(host, diff_id, encoding).read_text())
        digest, size = str(doc["digest"]), int(doc["size"])
        repos = tuple(str(r) for r in doc["repos"] if is_repository(str(r)))
        blob = Blob(digest, size, str(doc["media_type"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (blob, repos) if is_digest(digest) and size >= 0 else None


def remember(host: str, diff_id: str, encoding: str, blob: Blob, repo: str) -> None:
    """Record that `repo` on `host` holds `blob` for the layer (best effort: a cache)."""
    if blob.size is None:
        return
    known = recall(host, diff_id, encoding)
    repos = [repo, *(r for r in (known[1] if known and known[0] == blob else ()) if r != repo)]
    doc = {"digest": blob.digest, "size": blob.size, "media_type": blob.media_type,
           "repos": repos[:KEEP_REPOS]}
    path = _path(host, diff_id, encoding)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(doc, fh)
            os.replace(tmp, path)  # whole or not at all: another push may read it now
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
