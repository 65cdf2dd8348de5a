"""An OCI distribution registry in memory, behind a requests.Session, for unit tests of
the code that reads and writes releases (gates, records, notes) through the real
RegistryClient: manifests by tag and digest, tags, blob uploads (monolithic, streamed,
mounted from another repository), deletes by digest, no referrers API (as distribution
2.8, the embedded registry). Every request is
recorded, so a test can assert that nothing was asked.

For the release-state tests it also has a clock of its own (`now`, sent as `Date`, as
distribution does), a crash switch (`crash_at`: the Nth request from now raises `Crash`
and so does every later one until `revive()`, like a run killed mid-command), a hook run
before each request (`before`: another client acting in the middle of a command), a tag
list cut short (`tag_limit`) or without latest and every tag on its manifest
(`hide_latest`: a lost page, the list disagreeing with a direct read of latest), a DELETE
whose answer was lost (`lost_delete`) and a slow registry or long work (`tick`: the clock
moves on this many seconds per request)."""

from __future__ import annotations

import email.utils
import hashlib
import json
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import requests

from imagebuild.registry.client import RegistryClient
from imagebuild.registry.credentials import Credentials


def _digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


class InMemoryClient(RegistryClient):
    """The real client on an in-memory session: each exchange runs in the caller's thread.
    Over sockets every exchange runs in a worker thread the client stops waiting for at
    the registry deadline (`_within_deadline`); a MemRegistry answers at once, and starting
    that thread per request was 60 % of the release-state property test's time. The
    deadline itself is still checked before every exchange (`_read_timeout`)."""

    def _within_deadline(self, exchange, what):  # type: ignore[no-untyped-def]
        return exchange()


def _before_request(reg, method: str, path: str) -> None:
    """The switches both registries share: a crash after `crash_at` more requests (and
    every request after it), then the per-request hook."""
    if reg.crash_at is not None:
        reg.crash_at -= 1
        if reg.crash_at < 0:
            reg.dead = True
    if reg.dead:
        raise Crash(f"killed before {method} {path}")
    if reg.before is not None:
        reg.before(method, path)


class Crash(BaseException):  # noqa: N818 - not an error a command may catch and go on
    """The run was killed here (BaseException: no `except Exception` survives it)."""


class MemRegistry(requests.Session):
    def __init__(self) -> None:
        super().__init__()
        self.manifests: dict[str, dict[str, tuple[bytes, str]]] = {}  # repo -> digest -> ..
        self.tags: dict[str, dict[str, str]] = {}  # repo -> tag -> digest
        self.blobs: dict[str, dict[str, bytes]] = {}
        self.calls: list[tuple[str, str]] = []
        self.now: float | None = None  # the registry's clock (None: this machine's)
        self.crash_at: int | None = None  # requests from now until the crash
        self.dead = False
        self.before: Callable[[str, str], None] | None = None
        self.tag_limit: int | None = None
        self.hide_latest = False
        self.lost_delete: set[str] = set()  # digests whose DELETE answer gets lost
        self.tick = 0.0  # seconds `now` moves on per request
        self.uploads: dict[str, bytearray] = {}  # open blob uploads by id
        self.phantom: dict[str, int] = {}  # digest -> size a HEAD claims though it is absent
        self.check_blobs = False  # refuse an image manifest naming a blob it lacks

    def client(self) -> RegistryClient:
        return InMemoryClient("127.0.0.1:5999", session=self, retries=0,
                              credentials=Credentials("u", "p"))

    def revive(self) -> None:
        self.dead, self.crash_at = False, None

    def writes(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] not in ("GET", "HEAD")]

    # -- the HTTP side

    def request(self, method, url, headers=None, data=None, **kw):  # type: ignore[override]
        parts = urlsplit(url)
        _before_request(self, method, parts.path)
        if self.now is not None:
            self.now += self.tick
        self.calls.append((method, parts.path))
        path = parts.path
        if path == "/v2/":
            return self._answer(200, b"{}")
        repo, kind, ref = self._split(path)
        if kind == "manifests":
            return self._manifest(method, repo, ref, headers or {}, data)
        if kind == "tags":
            if repo not in self.tags:
                return self._error(404, "NAME_UNKNOWN")
            shown = self.tags[repo]
            hidden = shown.get("latest") if self.hide_latest else None
            tags = sorted(t for t, d in shown.items() if d != hidden)[:self.tag_limit]
            return self._answer(200, json.dumps({"name": repo, "tags": tags}).encode())
        if kind == "referrers":
            return self._error(404, "NOT_FOUND")
        if kind == "blobs":
            blob = self.blobs.get(repo, {}).get(ref)
            if blob is None and ref in self.phantom and method == "HEAD":
                return self._answer(200, b"", {"Docker-Content-Digest": ref,
                                               "Content-Length": str(self.phantom[ref])})
            if blob is None:
                return self._error(404, "BLOB_UNKNOWN")
            return self._answer(200, b"" if method == "HEAD" else blob,
                                {"Docker-Content-Digest": ref, "Content-Length": str(len(blob))})
        if kind == "uploads":
            return self._upload(method, repo, ref, parse_qs(parts.query), data)
        return self._error(404, "NOT_FOUND")

    def _upload(self, method, repo, ref, query, data):
        """POST opens an upload (or mounts `mount` from `from`), PATCH appends a body
        (streamed: an iterator), PUT closes it under `digest`, checked."""
        if method == "POST":
            source = self.blobs.get((query.get("from") or [""])[0], {})
            mount = (query.get("mount") or [""])[0]
            if mount in source:
                self.blobs.setdefault(repo, {})[mount] = source[mount]
                return self._answer(201, b"", {"Docker-Content-Digest": mount,
                                               "Location": f"/v2/{repo}/blobs/{mount}"})
            uid = uuid.uuid4().hex
            self.uploads[uid] = bytearray()
            return self._answer(202, b"", {"Location": f"/v2/{repo}/blobs/uploads/{uid}"})
        if ref not in self.uploads:
            return self._error(404, "BLOB_UPLOAD_UNKNOWN")
        body = data if isinstance(data, bytes | type(None)) else b"".join(data)
        self.uploads[ref] += body or b""
        if method == "PATCH":
            return self._answer(202, b"", {"Location": f"/v2/{repo}/blobs/uploads/{ref}"})
        digest = query["digest"][0]
        if _digest(bytes(self.uploads[ref])) != digest:
            return self._error(400, "DIGEST_INVALID")
        self.blobs.setdefault(repo, {})[digest] = bytes(self.uploads.pop(ref))
        return self._answer(201, b"", {"Docker-Content-Digest": digest})

    @staticmethod
    def _split(path: str) -> tuple[str, str, str]:
        rest = path.removeprefix("/v2/")
        for kind, marker in (("uploads", "/blobs/uploads/"), ("manifests", "/manifests/"),
                             ("blobs", "/blobs/"), ("tags", "/tags/list"),
                             ("referrers", "/referrers/")):
            if marker in rest:
                repo, _, ref = rest.partition(marker)
                return repo, kind, ref
        return rest, "", ""

    def _manifest(self, method, repo, ref, headers, data):
        store = self.manifests.setdefault(repo, {})
        tags = self.tags.setdefault(repo, {}) if method == "PUT" else self.tags.get(repo, {})
        if method == "PUT":
            body = bytes(data or b"")
            digest = _digest(body)
            if self.check_blobs and self._lacks_blob(repo, body):
                return self._error(400, "MANIFEST_BLOB_UNKNOWN")
            store[digest] = (body, headers.get("Content-Type", ""))
            if not ref.startswith("sha256:"):
                tags[ref] = digest
            return self._answer(201, b"", {"Docker-Content-Digest": digest})
        if method == "DELETE":
            if not ref.startswith("sha256:"):
                return self._error(400, "UNSUPPORTED")
            if ref not in store:
                return self._error(404, "MANIFEST_UNKNOWN")
            del store[ref]
            for tag in [t for t, d in tags.items() if d == ref]:
                del tags[tag]
            if ref in self.lost_delete:  # done, but the answer was lost: the retry sees 404
                self.lost_delete.discard(ref)
                return self._error(404, "MANIFEST_UNKNOWN")
            return self._answer(202, b"")
        digest = ref if ref.startswith("sha256:") else tags.get(ref)
        if digest is None or digest not in store:
            return self._error(404, "MANIFEST_UNKNOWN")
        body, media = store[digest]
        return self._answer(200, b"" if method == "HEAD" else body,
                            {"Docker-Content-Digest": digest, "Content-Type": media,
                             "Content-Length": str(len(body))})

    def _lacks_blob(self, repo: str, body: bytes) -> bool:
        """An image manifest naming a blob this repository does not hold (distribution
        checks every one on a PUT)."""
        doc = json.loads(body)
        named = [doc.get("config") or {}, *(doc.get("layers") or [])]
        return any(d.get("digest") not in self.blobs.get(repo, {}) for d in named if d)

    @staticmethod
    def _plain(status: int, body: bytes, headers: dict | None = None) -> requests.Response:
        r = requests.Response()
        r.status_code = status
        r._content = body  # noqa: SLF001 - an answer made here
        r.headers.update({"Docker-Distribution-API-Version": "registry/2.0",
                          "Content-Type": "application/json", **(headers or {})})
        return r

    def _answer(self, status: int, body: bytes,
                headers: dict | None = None) -> requests.Response:
        r = MemRegistry._plain(status, body, headers)
        r.headers["Date"] = email.utils.formatdate(
            self.now if self.now is not None else time.time(), usegmt=True)
        return r

    def _error(self, status: int, code: str) -> requests.Response:
        return self._answer(status, json.dumps({"errors": [{"code": code,
                                                            "message": code}]}).encode())

    # -- what tests put in

    def add_release(self, repo: str, tag: str, **kw: Any) -> str:
        return add_release(self.client(), repo, tag, **kw)

    def point_latest(self, repo: str, tag: str) -> None:
        self.tags[repo]["latest"] = self.tags[repo][tag]


def latest_and_candidate(repo: str, old: str, new: str) -> MemRegistry:
    """Two passed releases of `repo` (their own configs, so their own image ids): `old`
    is latest, `new` the candidate a promote would compare with it."""
    reg = MemRegistry()
    reg.add_release(repo, old, config=b'{"old":1}')
    reg.add_release(repo, new, config=b'{"new":1}')
    reg.point_latest(repo, old)
    return reg


def add_release(client: RegistryClient, repo: str, tag: str, *, smoke: str = "passed",
                config: bytes = b'{"config":{}}', created: float | None = None,
                benched: bool = False, gates: dict[str, Any] | None = None) -> str:
    """A release as publish records it: config and layer blobs, the annotated manifest
    under the release tag (and bench results stored with it when `benched`). Returns its
    manifest digest."""
    from imagebuild.registry.records import annotated_manifest, release_record
    from imagebuild.spec.tags import parse_release_tag

    config_digest = client.put_blob(repo, config)
    layer = client.put_blob(repo, tag.encode())
    pushed = {"mediaType": "application/vnd.docker.distribution.manifest.v2+json",
              "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                         "digest": config_digest, "size": len(config)},
              "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                          "digest": layer, "size": len(tag)}]}
    rtag = parse_release_tag(tag)
    assert rtag is not None, tag
    record = release_record(rtag, config_digest, {"passed": smoke == "passed"},
                            pins={}, cell=None, inputs=None, pushed_digest="sha256:" + "0" * 64,
                            gates=gates)
    if created is not None:
        record["org.opencontainers.image.created"] = time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime(created))
    digest = client.put_manifest(repo, tag, annotated_manifest(pushed, record),
                                 "application/vnd.oci.image.manifest.v1+json")
    if benched:
        from imagebuild.bench import store

        store.put_results(client, repo, tag, {"image": {"id": config_digest}, "levels": []})
    return digest


class FaultSession(requests.Session):
    """A real registry behind the same switches as MemRegistry (crash_at, before, calls),
    for the slice of the release-state properties run against distribution itself."""

    def __init__(self, url: str, user: str, password: str) -> None:
        super().__init__()
        self.url, self.user, self.password = url, user, password
        self.calls: list[tuple[str, str]] = []
        self.now: float | None = None  # the registry keeps its own clock
        self.crash_at: int | None = None
        self.dead = False
        self.before: Callable[[str, str], None] | None = None

    def request(self, method, url, *args, **kw):  # type: ignore[override]
        path = urlsplit(url).path
        _before_request(self, method, path)
        self.calls.append((method, path))
        return super().request(method, url, *args, **kw)

    def client(self) -> RegistryClient:
        return RegistryClient(self.url, session=self, retries=0,
                              credentials=Credentials(self.user, self.password))

    def _clean(self) -> RegistryClient:
        return RegistryClient(self.url, retries=2,
                              credentials=Credentials(self.user, self.password))

    def revive(self) -> None:
        self.dead, self.crash_at = False, None

    def writes(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] not in ("GET", "HEAD")]

    @property
    def tags(self) -> dict[str, dict[str, str]]:
        """repo -> {tag: ""} as the registry lists them now (read without faults)."""
        clean = self._clean()

        class View(dict):
            def __missing__(self, repo: str) -> dict[str, str]:
                try:
                    return dict.fromkeys(clean.tags(repo), "")
                except Exception:  # noqa: BLE001 - an unknown repository has no tags
                    return {}

            def get(self, repo, default=None):  # type: ignore[override]
                return self[repo]

        return View()

    def add_release(self, repo: str, tag: str, **kw: Any) -> str:
        return add_release(self._clean(), repo, tag, **kw)

    def point_latest(self, repo: str, tag: str) -> None:
        self._clean().copy_tag(repo, tag, "latest")
