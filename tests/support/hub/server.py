"""A loopback HTTP server that answers like the Hugging Face Hub, from recorded answers.

It speaks the part of the Hub protocol that huggingface_hub 2.4.0 uses for model_info and
hf_hub_download (read from the client's source: hf_api.model_info,
file_download.get_hf_file_metadata, utils/_http.hf_raise_for_status):

- `GET /api/models/{repo}[/revision/{rev}]`, `?blobs=true` adds sizes, blob ids and LFS
  info to `siblings`; `?expand=...` keeps only the named properties.
- `HEAD|GET /{repo}/resolve/{rev}/{path}`: a git-stored file is redirected (307, same
  origin) to `/api/resolve-cache/models/{repo}/{sha}/{path}`, which serves the bytes with
  `ETag` (git blob id), `X-Repo-Commit`, `Content-Length`; an LFS file answers 302 to a
  CDN on another origin, carrying `X-Linked-Etag` (sha256) and `X-Linked-Size`, which is
  where the client reads its metadata from. The CDN has no bytes: LFS weights are listed,
  never recorded.
- Errors carry the `X-Error-Code` the client maps to its typed exceptions: `RepoNotFound`
  (401 without a token, 404 with one, as the Hub hides private repos),
  `RevisionNotFound`, `EntryNotFound`, `GatedRepo` (401 without a token, 403 with a token
  that is not on the recorded authorized list).

Every request is logged so tests can assert what the client asked. Binds 127.0.0.1 only.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

from .recording import RecordedFile, RecordedRepo, load_recordings


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str  # unquoted, without the query string
    query: dict[str, list[str]]
    authorization: str | None
    server: str  # "hub" or "cdn"


class ReplayServer:
    """Handle on a running replay: its endpoint URL and the log of what was asked."""

    def __init__(self, repos: dict[str, RecordedRepo]):
        self.repos = repos
        self.endpoint = ""
        self.cdn_endpoint = ""
        self._log: list[RecordedRequest] = []
        self._lock = threading.Lock()

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._log)

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    def record(self, req: RecordedRequest) -> None:
        with self._lock:
            self._log.append(req)


def _model_config(files: dict[str, RecordedFile]) -> dict:
    """The `config` summary the Hub derives from config.json."""
    f = files.get("config.json")
    if f is None or f.content is None:
        return {}
    cfg = json.loads(f.content.read_bytes())
    out = {k: cfg[k] for k in ("architectures", "model_type") if k in cfg}
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict) and "quant_method" in quant:
        out["quantization_config"] = {"quant_method": quant["quant_method"]}
    return out


class _HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects
    timeout = 10  # an idle kept-alive connection frees its thread after this
    replay: ReplayServer  # set on the subclass made per server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # the request log replaces stderr chatter

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch()

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch()

    # -- plumbing ---------------------------------------------------------------------
    def _token(self) -> str | None:
        auth = self.headers.get("Authorization")
        return auth.split(" ", 1)[1] if auth and " " in auth else None

    def _send(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if "Content-Length" not in headers:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, data: dict) -> None:
        self._send(200, {"Content-Type": "application/json"}, json.dumps(data).encode())

    def _error(self, status: int, code: str | None, message: str, **extra: str) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Message": message, **extra}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, headers, json.dumps({"error": message}).encode())

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        self.replay.record(
            RecordedRequest(
                method=self.command,
                path=unquote(url.path),
                query=parse_qs(url.query),
                authorization=self.headers.get("Authorization"),
                server="hub",
            )
        )
        parts = url.path.strip("/").split("/")
        try:
            if parts[:2] == ["api", "models"] and len(parts) in (4, 6):
                if len(parts) == 6 and parts[4] != "revision":
                    return self._error(404, None, "Not found")
                rev = unquote(parts[5]) if len(parts) == 6 else "main"
                return self._model_info("/".join(parts[2:4]), rev, parse_qs(url.query))
            if parts[:3] == ["api", "resolve-cache", "models"] and len(parts) >= 7:
                repo_id, sha = "/".join(parts[3:5]), parts[5]
                return self._serve_file(repo_id, sha, unquote("/".join(parts[6:])), cached=True)
            if len(parts) >= 5 and parts[2] == "resolve":
                repo_id, rev = "/".join(parts[:2]), unquote(parts[3])
                return self._serve_file(repo_id, rev, unquote("/".join(parts[4:])), cached=False)
            self._error(404, None, "Not found")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away: nothing to answer

    # -- access rules -----------------------------------------------------------------
    def _visible_repo(self, repo_id: str) -> RecordedRepo | None:
        repo = self.replay.repos.get(repo_id)
        token = self._token()
        if repo is None or (repo.private and token not in repo.authorized_tokens):
            # The Hub answers a missing and a private repo alike; 401 until authenticated.
            self._error(401 if token is None else 404, "RepoNotFound", "Repository not found")
            return None
        return repo

    def _gate_blocks(self, repo: RecordedRepo) -> bool:
        token = self._token()
        if not repo.gated or token in repo.authorized_tokens:
            return False
        if token is None:
            self._error(
                401,
                "GatedRepo",
                f"Access to model {repo.repo_id} is restricted. You must have access to it "
                "and be authenticated to access it. Please log in.",
            )
        else:
            self._error(
                403,
                "GatedRepo",
                f"Access to model {repo.repo_id} is restricted and you are not in the "
                f"authorized list. Visit {self.replay.endpoint}/{repo.repo_id} to ask for access.",
            )
        return True

    # -- endpoints --------------------------------------------------------------------
    def _model_info(self, repo_id: str, rev: str, query: dict[str, list[str]]) -> None:
        repo = self._visible_repo(repo_id)
        if repo is None:
            return
        sha = repo.resolve(rev)
        if sha is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        revision = repo.revisions[sha]
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        owner = repo_id.split("/")[0]
        info = {
            "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": owner,
            "sha": sha,
            "lastModified": revision.last_modified,
            "private": repo.private,
            "gated": repo.gated,
            "disabled": False,
            **repo.info,
            "config": _model_config(revision.files),
            "siblings": [f.sibling(blobs) for f in revision.files.values()],
            "spaces": [],
            "usedStorage": sum(f.size for f in revision.files.values()),
        }
        expand = query.get("expand")
        if expand:
            info = {k: v for k, v in info.items() if k in ("_id", "id", *expand)}
        self._json(info)

    def _serve_file(self, repo_id: str, rev: str, path: str, cached: bool) -> None:
        repo = self._visible_repo(repo_id)
        if repo is None or self._gate_blocks(repo):
            return
        sha = repo.resolve(rev)
        if sha is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        f = repo.revisions[sha].files.get(path)
        if f is None:
            return self._error(404, "EntryNotFound", "Entry not found", **{"X-Repo-Commit": sha})
        if f.lfs_sha256 is not None:
            location = f"{self.replay.cdn_endpoint}/repos/{f.lfs_sha256}"
            return self._send(
                302,
                {
                    "Location": location,
                    "X-Repo-Commit": sha,
                    "X-Linked-Etag": f'"{f.lfs_sha256}"',
                    "X-Linked-Size": str(f.size),
                    "ETag": f'"{f.lfs_sha256}"',
                },
            )
        if not cached:
            target = f"/api/resolve-cache/models/{repo_id}/{sha}/{quote(path)}"
            return self._send(307, {"Location": target, "X-Repo-Commit": sha})
        if f.content is None:
            return self._error(501, None, f"{path}@{sha}: bytes not recorded in the fixture")
        self._send_bytes(f, sha)

    def _send_bytes(self, f: RecordedFile, sha: str) -> None:
        assert f.content is not None
        data = f.content.read_bytes()
        ctype = "application/json" if f.path.endswith(".json") else "text/plain; charset=utf-8"
        headers = {
            "Content-Type": ctype,
            "ETag": f'"{f.blob_id}"',
            "X-Repo-Commit": sha,
            "Accept-Ranges": "bytes",
        }
        rng = self.headers.get("Range", "")
        if rng.startswith("bytes=") and rng[6:].split("-")[0].isdigit():
            start = int(rng[6:].split("-")[0])  # the client only resumes: "bytes=N-"
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            return self._send(206, headers, data[start:])
        self._send(200, headers, data)


class _CdnHandler(_HubHandler):
    """The LFS CDN: logs what was asked; the weights themselves were never recorded."""

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        self.replay.record(
            RecordedRequest(
                self.command, unquote(url.path), parse_qs(url.query), None, server="cdn"
            )
        )
        self._send(404, {"Content-Type": "text/plain"}, b"LFS bytes are not recorded\n")


def _start(handler: type[_HubHandler], replay: ReplayServer) -> ThreadingHTTPServer:
    bound = type(handler.__name__, (handler,), {"replay": replay})
    server = ThreadingHTTPServer(("127.0.0.1", 0), bound)
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="hub-replay", daemon=True
    ).start()
    return server


@contextmanager
def hub_replay_server(fixture_dir: Path) -> Iterator[ReplayServer]:
    """Serve the recordings under fixture_dir on 127.0.0.1; yields the running replay."""
    with serve_repos(load_recordings(fixture_dir)) as replay:
        yield replay


@contextmanager
def serve_repos(repos: dict[str, RecordedRepo]) -> Iterator[ReplayServer]:
    """Serve these repositories on 127.0.0.1 (FakeHub.serve); yields the running replay.

    Use `replay.endpoint` as HfApi(endpoint=...) / HubClient(endpoint=...): huggingface_hub
    reads HF_ENDPOINT only once, at import, so setting the variable in-process is too late.
    """
    replay = ReplayServer(repos)
    hub = _start(_HubHandler, replay)
    cdn = _start(_CdnHandler, replay)
    replay.endpoint = f"http://127.0.0.1:{hub.server_address[1]}"
    replay.cdn_endpoint = f"http://127.0.0.1:{cdn.server_address[1]}"
    try:
        yield replay
    finally:
        for server in (hub, cdn):
            server.shutdown()
            server.server_close()
