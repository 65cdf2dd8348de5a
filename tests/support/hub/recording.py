"""Recorded Hub answers, loaded from tests/data/hub/<owner>/<name>/.

Each repo folder holds `repo.json` (refs, revisions, file entries, access rules) and, per
revision, `<sha>/<path>` for the files whose bytes were recorded. A recorded file's size
and git blob id are computed from its bytes, so the listing can never drift from the
content; a file recorded without bytes (weights, large tokenizer files) carries its size,
blob id and LFS sha256 in repo.json.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

FULL_SHA = re.compile(r"[0-9a-f]{40}")
SHORT_SHA = re.compile(r"[0-9a-f]{7,39}")


def git_blob_id(data: bytes) -> str:
    """The git object id of a blob: what the Hub reports as `blobId` and ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class RecordedFile:
    path: str
    size: int
    blob_id: str
    lfs_sha256: str | None = None
    lfs_pointer_size: int | None = None
    content: Path | None = None  # None: listed, but its bytes were not recorded

    def sibling(self, blobs: bool) -> dict:
        """The entry of `siblings` in the model API answer."""
        if not blobs:
            return {"rfilename": self.path}
        entry: dict = {"rfilename": self.path, "blobId": self.blob_id, "size": self.size}
        if self.lfs_sha256 is not None:
            entry["lfs"] = {
                "sha256": self.lfs_sha256,
                "size": self.size,
                "pointerSize": self.lfs_pointer_size,
            }
        return entry


@dataclass(frozen=True)
class RecordedRevision:
    sha: str
    last_modified: str
    files: dict[str, RecordedFile]


@dataclass(frozen=True)
class RecordedRepo:
    repo_id: str
    private: bool
    gated: str | bool
    authorized_tokens: frozenset[str]
    info: dict  # extra model API fields (library_name, tags, ...)
    refs: dict[str, str]
    revisions: dict[str, RecordedRevision] = field(repr=False)

    def resolve(self, rev: str) -> str | None:
        """Ref name, full SHA or unique SHA prefix -> full SHA, as the Hub resolves them."""
        rev = rev.removeprefix("refs/heads/")
        if rev in self.refs:
            return self.refs[rev]
        if FULL_SHA.fullmatch(rev):
            return rev if rev in self.revisions else None
        if SHORT_SHA.fullmatch(rev):
            hits = [sha for sha in self.revisions if sha.startswith(rev)]
            return hits[0] if len(hits) == 1 else None
        return None


def _load_file(entry: dict, rev_dir: Path) -> RecordedFile:
    path = entry["path"]
    content = rev_dir / path
    lfs = entry.get("lfs")
    if content.is_file():
        data = content.read_bytes()
        return RecordedFile(path=path, size=len(data), blob_id=git_blob_id(data), content=content)
    return RecordedFile(
        path=path,
        size=int(entry["size"]),
        blob_id=entry["blobId"],
        lfs_sha256=lfs["sha256"] if lfs else None,
        lfs_pointer_size=lfs["pointerSize"] if lfs else None,
    )


def load_repo(repo_dir: Path) -> RecordedRepo:
    spec = json.loads((repo_dir / "repo.json").read_text())
    revisions = {}
    for sha, rev in spec["revisions"].items():
        files = [_load_file(e, repo_dir / sha) for e in rev["files"]]
        revisions[sha] = RecordedRevision(
            sha=sha, last_modified=rev["lastModified"], files={f.path: f for f in files}
        )
    return RecordedRepo(
        repo_id=spec["id"],
        private=bool(spec.get("private", False)),
        gated=spec.get("gated", False),
        authorized_tokens=frozenset(spec.get("authorized_tokens", [])),
        info=spec.get("info", {}),
        refs=dict(spec["refs"]),
        revisions=revisions,
    )


def load_recordings(fixture_dir: Path) -> dict[str, RecordedRepo]:
    """Every <owner>/<name>/repo.json under fixture_dir, keyed by repo id."""
    repos = [load_repo(p.parent) for p in sorted(Path(fixture_dir).glob("*/*/repo.json"))]
    return {r.repo_id: r for r in repos}
