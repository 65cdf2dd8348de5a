"""The one fake Hub of the tests: recorded answers (tests/data/hub), two faces."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from imagebuild.lock.hub import HubFile, HubUnreachable, ResolvedRevision
from tests.support.hub.recording import (
    RecordedFile,
    RecordedRepo,
    RecordedRevision,
    git_blob_id,
    load_recordings,
)
from tests.support.hub.server import ReplayServer, serve_repos
from tests.support.paths import HUB_DATA


class FakeHub:
    """The recorded Hub (tests/data/hub), editable per test (`add_revision`, `offline`).

    Two faces over the same repositories: in process it answers `resolve` and
    `download_metadata` the way imagebuild.lock.hub.HubClient does (fast, for tests of the
    code that uses the client); `serve()` puts it on 127.0.0.1 for the real
    huggingface_hub client (tests of HubClient itself). Repos or revisions absent from the
    recordings are unreachable, like the Hub from a machine without it.
    """

    def __init__(self, fixture_dir: Path = HUB_DATA, *, offline: tuple[str, ...] = ()):
        self.repos = load_recordings(fixture_dir)
        self.offline = set(offline)  # repositories to treat as unreachable

    @contextmanager
    def serve(self) -> Iterator[ReplayServer]:
        """This hub over HTTP on 127.0.0.1 (see server.py for the endpoints)."""
        with serve_repos(self.repos) as replay:
            yield replay

    def add_revision(self, repo_id: str, files: dict[str, dict], store: Path) -> str:
        """Record a new commit of repo_id (its `main` moves there) holding these JSON files;
        returns the commit SHA (derived from the content, so tests are deterministic)."""
        blobs = {name: json.dumps(data, indent=2).encode() for name, data in files.items()}
        sha = hashlib.sha1(repr(sorted(blobs.items())).encode()).hexdigest()
        recorded = {}
        for name, data in blobs.items():
            path = store / repo_id / sha / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            recorded[name] = RecordedFile(path=name, size=len(data), blob_id=git_blob_id(data),
                                          content=path)
        old = self.repos.get(repo_id)
        revisions = {**(old.revisions if old else {}),
                     sha: RecordedRevision(sha=sha, last_modified="2026-06-01T00:00:00.000Z",
                                           files=recorded)}
        self.repos[repo_id] = RecordedRepo(
            repo_id=repo_id, private=False, gated=False, authorized_tokens=frozenset(),
            info={}, refs={**(old.refs if old else {}), "main": sha}, revisions=revisions)
        return sha

    def config(self, repo_id: str, revision: str = "main") -> dict:
        """A recorded config.json, to derive edited fixtures from."""
        repo = self.repos[repo_id]
        sha = repo.resolve(revision)
        assert sha, f"{repo_id}@{revision} not recorded"
        content = repo.revisions[sha].files["config.json"].content
        assert content is not None
        return json.loads(content.read_text())

    def resolve(self, repo_id: str, revision: str, *, allow_branch: bool = False
                ) -> ResolvedRevision:
        repo = self.repos.get(repo_id)
        sha = repo.resolve(revision) if repo and repo_id not in self.offline else None
        if repo is None or sha is None or repo_id in self.offline:
            raise HubUnreachable(f"{repo_id}@{revision} is not in the recordings")
        files = tuple(sorted(HubFile(f.path, f.size, f.lfs_sha256, f.blob_id)
                             for f in repo.revisions[sha].files.values()))
        return ResolvedRevision(repo_id=repo_id, requested=revision, sha=sha, files=files,
                                from_branch=sha != revision and not sha.startswith(revision))

    def download_metadata(self, repo_id: str, sha: str, filenames: list[str], dest: Path
                          ) -> list[Path]:
        rev = self.repos[repo_id].revisions[sha]
        written = []
        for name in filenames:
            f = rev.files.get(name)
            if f is None or f.content is None:
                continue
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f.content, dest / name)
            written.append(dest / name)
        return written
