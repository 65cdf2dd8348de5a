"""The one module that talks to the Hugging Face Hub: pins -> commits, files, metadata.

Endpoint: `HubClient(endpoint=...)`, else `HF_ENDPOINT` read at call time, else the public
Hub. huggingface_hub reads HF_ENDPOINT once, at import, into `constants.ENDPOINT`; the
endpoint is therefore always passed explicitly to HfApi and hf_hub_download, so setting
the variable in-process (tests, lock) takes effect.

Telemetry is switched off (see below): a mirror endpoint means no other host is contacted.

Failures are sorted for the lock: a bad pin is a `UserError` (exit 2); a Hub that cannot
be reached is `HubUnreachable`, so the caller can mark the pin unresolved and never
invent a SHA (docs/domain.md: "the lock must say so rather than invent them").
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

import httpx2  # huggingface_hub 2.4.0's HTTP client: its transport errors mean "unreachable"
from huggingface_hub import HfApi, constants, hf_hub_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import ModelInfo

from imagebuild.errors import OperationFailed, UserError

# With telemetry on, huggingface_hub 2.4.0 builds its User-Agent by fetching
# `{import-time ENDPOINT}/api/agent-harnesses` (utils/_detect_agent.py): a call to the public
# Hub whatever endpoint is passed. Pins talk to the configured endpoint only.
constants.HF_HUB_DISABLE_TELEMETRY = True

FULL_SHA = re.compile(r"[0-9a-f]{40}")
SHORT_SHA = re.compile(r"[0-9a-f]{7,39}")  # people copy 12 characters from the Hub
# Answers that mean "the Hub is not answering now" rather than "this pin is wrong".
_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}

T = TypeVar("T")


class HubUnreachable(OperationFailed):
    """The Hub could not be reached (network, timeout, offline mode, Hub outage)."""


class HubFile(NamedTuple):
    path: str
    size: int
    lfs_sha256: str | None  # None for files stored in git itself
    blob_id: str  # git object id


@dataclass(frozen=True)
class ResolvedRevision:
    repo_id: str
    requested: str  # as written in matrix.yaml: full/short SHA, or a tracked branch
    sha: str  # the full 40-hex commit
    files: tuple[HubFile, ...]  # sorted by path
    from_branch: bool  # resolved from a `track:` branch: the SHA will move

    def file(self, path: str) -> HubFile | None:
        return next((f for f in self.files if f.path == path), None)

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)


def _token_fix(repo_id: str) -> str:
    return (
        f"set HF_TOKEN to a Hugging Face token whose account has been granted access to "
        f"{repo_id} (request access on the model page first)"
    )


def _translate(exc: BaseException, repo_id: str, revision: str) -> Exception:
    """Map a huggingface_hub / transport failure to the project's error types."""
    # hf_hub_download wraps connection failures: look at the whole cause chain
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    for e in chain:
        if isinstance(e, OfflineModeIsEnabled):
            return HubUnreachable(
                f"cannot reach the Hub for {repo_id}: offline mode is on",
                fix="unset HF_HUB_OFFLINE to resolve pins",
            )
        if isinstance(e, httpx2.TransportError):
            kind = "timed out" if isinstance(e, httpx2.TimeoutException) else "is unreachable"
            return HubUnreachable(
                f"the Hub {kind} while resolving {repo_id}@{revision}: {e}",
                fix="check the network (or HF_ENDPOINT) and re-run; the pin stays unresolved",
            )
    for e in chain:
        if isinstance(e, GatedRepoError):  # before RepositoryNotFoundError: it subclasses it
            status = e.response.status_code if e.response is not None else 401
            why = "needs a token" if status == 401 else "refused this token"
            return UserError(
                f"{repo_id} is gated and the Hub {why} ({status})", fix=_token_fix(repo_id)
            )
        if isinstance(e, RevisionNotFoundError):
            return UserError(
                f"revision {revision!r} does not exist in {repo_id}",
                fix="copy the commit SHA from the repo's history page on the Hub",
            )
        if isinstance(e, RepositoryNotFoundError):
            private = e.response is not None and e.response.status_code == 401
            hint = " (or it is private/gated and no token was sent)" if private else ""
            return UserError(
                f"model repo {repo_id} not found on the Hub{hint}",
                fix="check the repo id spelling"
                + ("; for a private or gated repo " + _token_fix(repo_id) if private else ""),
            )
        if isinstance(e, RemoteEntryNotFoundError):
            # only listed files are fetched: the listing and the files disagree
            return OperationFailed(f"{repo_id}@{revision}: a listed file is not served: {e}")
        if isinstance(e, HfHubHTTPError) and e.response is not None:
            status = e.response.status_code
            if status in (401, 403):
                return UserError(
                    f"the Hub refused access to {repo_id} ({status})", fix=_token_fix(repo_id)
                )
            if status in _TRANSIENT_STATUS:
                return HubUnreachable(
                    f"the Hub answered {status} for {repo_id}@{revision}",
                    fix="retry later; the pin stays unresolved",
                )
            return OperationFailed(f"the Hub answered {status} for {repo_id}@{revision}: {e}")
        if isinstance(e, HFValidationError):
            return UserError(
                f"{repo_id!r} is not a valid Hub repo id: {e}", fix="write it as owner/name"
            )
    return OperationFailed(f"Hub request for {repo_id}@{revision} failed: {exc}")


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubClient:
    def __init__(
        self, endpoint: str | None = None, token: str | None = None, timeout: float = 10.0
    ):
        self.endpoint = endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
        self.endpoint = self.endpoint.rstrip("/")
        self.token = token  # None: huggingface_hub's own lookup (HF_TOKEN, saved login)
        self.timeout = timeout
        self._api = HfApi(endpoint=self.endpoint, token=token, library_name="imagebuild")

    def _call(self, repo_id: str, revision: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (
            HfHubHTTPError,
            HFValidationError,
            OfflineModeIsEnabled,
            httpx2.TransportError,
            LocalEntryNotFoundError,
        ) as exc:
            raise _translate(exc, repo_id, revision) from exc

    def _info(self, repo_id: str, revision: str, files: bool) -> ModelInfo:
        return self._call(
            repo_id,
            revision,
            lambda: self._api.model_info(
                repo_id, revision=revision, files_metadata=files, timeout=self.timeout
            ),
        )

    def resolve(
        self, repo_id: str, revision: str, *, allow_branch: bool = False
    ) -> ResolvedRevision:
        """Resolve a pin to its full commit and file list.

        A full or short (>= 7 hex) SHA is a pin. Anything else is a branch or tag, only
        accepted with allow_branch=True (a `track:` entry whose SHA the lock records).
        """
        rev = revision.strip()
        is_sha = bool(SHORT_SHA.fullmatch(rev.lower()) or FULL_SHA.fullmatch(rev.lower()))
        if is_sha:
            rev = rev.lower()
        elif not allow_branch:
            raise UserError(
                f"{repo_id}: revision {revision!r} is a branch or tag, not a commit; "
                "a branch moves under the pin (the z-lab drafter's `main` was retrained "
                "and broke serving)",
                fix="pin a full commit SHA: `build.py lock --update NAME` resolves a "
                "`track:` branch",
            )
        info = self._info(repo_id, rev, files=True)
        sha = info.sha or ""
        if not FULL_SHA.fullmatch(sha):
            raise OperationFailed(
                f"{self.endpoint} answered for {repo_id}@{rev} without a commit SHA",
                fix="check that HF_ENDPOINT points to a Hugging Face Hub",
            )
        if is_sha and not sha.startswith(rev):
            # a branch or tag whose name looks like hex answered instead of a commit
            raise UserError(
                f"{repo_id}: {revision!r} resolved to commit {sha}, which does not start "
                "with it: it names a branch or tag, not a commit",
                fix=f"pin the commit itself: {sha}",
            )
        if info.siblings is None:
            raise OperationFailed(f"the Hub listed no files for {repo_id}@{sha}")
        files = []
        for s in info.siblings:
            if s.size is None or s.blob_id is None:
                raise OperationFailed(
                    f"the Hub gave no size/blob id for {repo_id}@{sha}:{s.rfilename}"
                )
            files.append(HubFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs else None, s.blob_id))
        return ResolvedRevision(
            repo_id=repo_id,
            requested=revision,
            sha=sha,
            files=tuple(sorted(files)),
            from_branch=not is_sha,
        )

    def head_sha(self, repo_id: str, branch: str = "main") -> str:
        """The commit a branch points at now (for the pin watcher)."""
        info = self._info(repo_id, branch, files=False)
        if not FULL_SHA.fullmatch(info.sha or ""):
            raise OperationFailed(f"{self.endpoint} gave no commit SHA for {repo_id}@{branch}")
        return info.sha  # type: ignore[return-value]

    def download_metadata(
        self, repo_id: str, sha: str, filenames: list[str], dest: Path
    ) -> list[Path]:
        """Copy those of `filenames` that exist at commit `sha` into dest, byte-exact.

        Files absent from the revision are skipped. Each copy is a plain file (no links
        into a cache, so dest can be committed) and is checked against the size and git
        blob id (or LFS sha256) the Hub lists for that commit.
        """
        if not FULL_SHA.fullmatch(sha):
            raise ValueError(f"download_metadata needs a full commit SHA, got {sha!r}")
        # One listing call first: it fails fast when the Hub is down (hf_hub_download
        # retries with backoff for ~20 s) and tells which files exist.
        listed = {f.path: f for f in self.resolve(repo_id, sha).files}
        dest = Path(dest)
        written: list[Path] = []
        with tempfile.TemporaryDirectory(prefix="imagebuild-hub-") as tmp:
            for name in filenames:
                entry = listed.get(name)
                if entry is None:
                    continue
                data = self._fetch(repo_id, sha, name, Path(tmp))
                _check(entry, data, repo_id, sha)
                target = dest / name
                target.parent.mkdir(parents=True, exist_ok=True)
                part = target.with_name(target.name + ".part")
                part.write_bytes(data)
                os.replace(part, target)
                written.append(target)
        return written

    def _fetch(self, repo_id: str, sha: str, name: str, tmp: Path) -> bytes:
        """One file's bytes via hf_hub_download, in a private throwaway cache."""

        def download() -> str:
            return hf_hub_download(
                repo_id,
                name,
                revision=sha,
                endpoint=self.endpoint,
                token=self.token,
                local_dir=tmp / "files",
                cache_dir=tmp / "cache",
                etag_timeout=self.timeout,
                library_name="imagebuild",
            )

        return Path(self._call(repo_id, sha, download)).read_bytes()


def _check(entry: HubFile, data: bytes, repo_id: str, sha: str) -> None:
    """The bytes must be the ones the commit lists (docs/domain.md: stale copies fail silently)."""
    if entry.lfs_sha256 is not None:
        ok, want = hashlib.sha256(data).hexdigest() == entry.lfs_sha256, entry.lfs_sha256
    else:
        ok, want = _git_blob_id(data) == entry.blob_id, entry.blob_id
    if len(data) != entry.size or not ok:
        raise OperationFailed(
            f"{repo_id}@{sha}:{entry.path}: served bytes ({len(data)} B) do not match the "
            f"commit's listing ({entry.size} B, {want[:12]})",
            fix="re-run; if it persists, the endpoint serves a different revision",
        )
