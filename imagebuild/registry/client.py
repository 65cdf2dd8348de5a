"""The one module that talks to OCI registries: the distribution HTTP API over requests.

Promote and rollback only move manifests: a tag is retargeted by GETting the manifest
bytes and PUTting the same bytes under another tag, so no layer crosses the wire. Every
request's body bytes are counted (ByteCounter) so callers can prove that.

Requests retry on 429/5xx/connection errors when idempotent (never on 401/403). Auth
(auth.py) answers the registry's challenge with credentials from credentials.py; secrets
never appear in messages, logs or repr.
"""

from __future__ import annotations

import email.utils
import hashlib
import ipaddress
import json
import logging
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn
from urllib.parse import urlencode, urljoin, urlsplit

import requests

from imagebuild.errors import OperationFailed, UserError
from imagebuild.registry.auth import Auth, Challenge, parse_challenges
from imagebuild.registry.credentials import (
    CRED_FIX,
    PASSWORD_ENV,
    USER_ENV,
    Credentials,
    docker_config_credentials,
    resolve_credentials,
)
from imagebuild.registry.errors import AuthError, NotFound, Unsupported

__all__ = ["AuthError", "Challenge", "Credentials", "NotFound", "RegistryClient",
           "Unsupported", "docker_config_credentials", "parse_challenges",
           "resolve_credentials"]

log = logging.getLogger(__name__)


DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
IMAGE_MANIFESTS = (DOCKER_MANIFEST, OCI_MANIFEST)
INDEXES = (DOCKER_LIST, OCI_INDEX)
MANIFEST_TYPES = IMAGE_MANIFESTS + INDEXES

# distribution's reference grammar (reference/regexp.go), simplified to what we accept
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPO_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST_RE = re.compile(r"^(sha256:[a-f0-9]{64}|sha512:[a-f0-9]{128})$")

_RETRY_AFTER_CAP = 60.0  # never let a server park us longer than this per attempt
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
_TRANSIENT_ERRORS = (
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,
    requests.exceptions.ContentDecodingError,
)


# ---------------------------------------------------------------------------- helpers


@dataclass
class ByteCounter:
    """Body bytes moved (request + response), in total and per kind of endpoint."""

    sent: int = 0
    received: int = 0
    requests: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.sent + self.received

    def add(self, kind: str, sent: int, received: int) -> None:
        self.sent += sent
        self.received += received
        self.requests += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + sent + received

    def reset(self) -> None:
        self.sent = self.received = self.requests = 0
        self.by_kind.clear()

    def summary(self) -> str:
        """E.g. '1,204 bytes in 3 requests (manifest 1,052, ping 2)'."""
        parts = ", ".join(f"{k} {v:,}" for k, v in sorted(self.by_kind.items()) if v)
        return f"{self.total:,} bytes in {self.requests} requests" + (
            f" ({parts})" if parts else ""
        )


def parse_link_next(header: str | None, base_url: str) -> str | None:
    """The absolute URL of the rel="next" entry of a Link header, if any."""
    if not header:
        return None
    for m in re.finditer(r"<([^>]*)>\s*((?:;\s*[^;,]+)*)", header):
        rels = re.findall(r';\s*rel\s*=\s*"?([^";,]+)"?', m.group(2))
        if any("next" in r.split() for r in rels):
            return urljoin(base_url, m.group(1))
    return None


def sha256_digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _digest_of(body: bytes, algo_like: str) -> str:
    """The digest of body in the algorithm of algo_like ('sha512:...'); sha256 otherwise."""
    algo = algo_like.split(":", 1)[0]
    algo = algo if algo in ("sha256", "sha512") else "sha256"
    return f"{algo}:{hashlib.new(algo, body).hexdigest()}"


def is_digest(ref: str) -> bool:
    return bool(_DIGEST_RE.match(ref))


def _check_repo(repo: str) -> None:
    if not _REPO_RE.match(repo) or len(repo) > 255:
        raise UserError(
            f"invalid repository name {repo!r}",
            fix="use lower-case path components like 'imagebuild/vllm-gb10'",
        )


def _check_ref(ref: str) -> None:
    if not (_TAG_RE.match(ref) or is_digest(ref)):
        raise UserError(
            f"invalid tag or digest {ref!r}",
            fix="a tag is [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}; a digest is sha256:<64 hex>",
        )


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _is_loopback(host: str) -> bool:
    name = urlsplit("//" + host).hostname or ""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def normalize_base_url(base_url: str) -> str:
    """Add a scheme (http for loopback, as dockerd does; https elsewhere), drop '/v2/'."""
    url = base_url.strip().rstrip("/")
    if "://" not in url:
        url = ("http://" if _is_loopback(url.split("/")[0]) else "https://") + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UserError(f"invalid registry URL {base_url!r}", fix="use e.g. 127.0.0.1:5000")
    path = parts.path[:-3] if parts.path.endswith("/v2") else parts.path
    return f"{parts.scheme}://{parts.netloc}{path}"


def _error_codes(resp: requests.Response) -> list[tuple[str, str]]:
    """(code, message) pairs of a distribution error body; empty if it is not one."""
    try:
        errors = resp.json().get("errors") or []
    except (ValueError, AttributeError):
        return []
    return [
        (str(e.get("code", "")), str(e.get("message", ""))) for e in errors if isinstance(e, dict)
    ]


def _kind_of(path: str) -> str:
    for marker, kind in (
        ("/manifests/", "manifest"),
        ("/blobs/", "blob"),
        ("/tags/list", "tags"),
        ("/_catalog", "catalog"),
    ):
        if marker in path:
            return kind
    return "ping" if path.rstrip("/").endswith("/v2") else "other"


def _scope_for(method: str, path: str) -> str | None:
    """The token scope a request needs (distribution's token auth spec)."""
    m = re.match(r"^/v2/(.+?)/(?:manifests|blobs|tags)/", path)
    if m:
        action = {"GET": "pull", "HEAD": "pull", "DELETE": "delete"}.get(method, "pull,push")
        return f"repository:{m.group(1)}:{action}"
    if path.startswith("/v2/_catalog"):
        return "registry:catalog:*"
    return None


# ----------------------------------------------------------------------------- client


class RegistryClient:
    """A client for one registry. Methods raise UserError/OperationFailed, never HTTPError."""

    def __init__(
        self,
        base_url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        timeout: float = 10,
        retries: int = 4,
        backoff: float = 0.2,
        session: requests.Session | None = None,
        bytes_counter: ByteCounter | None = None,
        credentials: Credentials | None = None,
    ):
        self.base_url = normalize_base_url(base_url)
        self.host = urlsplit(self.base_url).netloc
        self.timeout = timeout
        self.retries = max(0, retries)
        self.backoff = backoff
        self.bytes = bytes_counter if bytes_counter is not None else ByteCounter()
        self._session = session or requests.Session()
        self._session.headers.setdefault("User-Agent", "imagebuild-registry/0.1")
        # a proxy has no business between us and a loopback registry
        self._proxies: Any = {"http": None, "https": None} if _is_loopback(self.host) else None
        self.auth = Auth(self.host,
                         credentials or resolve_credentials(self.host, username, password),
                         token, self._transport)
        self._sleep = time.sleep

    def __repr__(self) -> str:
        return f"RegistryClient({self.base_url!r}, credentials={self.auth.creds!r})"

    def _mask(self, text: str) -> str:
        return self.auth.mask(text)


    # -- transport

    def _transport(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
        kind: str,
        idempotent: bool,
    ) -> requests.Response:
        """One logical request: retries on 429/5xx/connection errors when idempotent."""
        attempt = 0
        while True:
            try:
                resp = self._session.request(
                    method,
                    url,
                    headers=dict(headers or {}),
                    data=data,
                    timeout=self.timeout,
                    proxies=self._proxies,
                    allow_redirects=True,
                )
                received = len(resp.content)  # reads the body: a cut body raises here
            except requests.exceptions.SSLError as exc:
                raise OperationFailed(
                    f"TLS to {self.host} failed: {self._mask(str(exc))[:300]}",
                    fix="trust the registry's CA (REQUESTS_CA_BUNDLE) or fix its certificate",
                ) from None
            except _TRANSIENT_ERRORS as exc:
                self.bytes.add(kind, len(data or b""), 0)
                if not idempotent or attempt >= self.retries:
                    raise OperationFailed(
                        f"{method} {self._where(url)} failed after {attempt + 1} attempt(s): "
                        f"{type(exc).__name__}: {self._mask(str(exc))[:300]}",
                        fix=f"check that the registry at {self.base_url} is up "
                        "(scripts/start-registry.sh starts the local one)",
                    ) from None
                delay = self.backoff * 2**attempt
                log.info(
                    "retrying %s %s after %s in %.2fs",
                    method,
                    self._where(url),
                    type(exc).__name__,
                    delay,
                )
            else:
                self.bytes.add(kind, len(data or b""), received)
                status = resp.status_code
                if not (status == 429 or status >= 500) or not idempotent:
                    return resp
                if attempt >= self.retries:
                    return resp  # the caller turns it into a message
                hinted = _retry_after(resp.headers.get("Retry-After"))
                delay = (
                    min(hinted, _RETRY_AFTER_CAP)
                    if hinted is not None
                    else (self.backoff * 2**attempt)
                )
                log.info(
                    "retrying %s %s after HTTP %d in %.2fs", method, self._where(url), status, delay
                )
            attempt += 1
            self._sleep(delay)

    def _where(self, url: str) -> str:
        parts = urlsplit(url)
        return f"{parts.netloc}{parts.path}"

    def _request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
        url: str | None = None,
    ) -> requests.Response:
        """A registry request with the auth dance: at most one re-try per 401."""
        url = url or self.base_url + path
        path = urlsplit(url).path
        scope = _scope_for(method, path)
        kind = _kind_of(path)
        for _ in range(2):
            hdrs = dict(headers or {})
            auth = self.auth.header_for(scope)
            if auth:
                hdrs["Authorization"] = auth
            resp = self._transport(
                method, url, headers=hdrs, data=data, kind=kind, idempotent=method in _IDEMPOTENT
            )
            if resp.status_code != 401 or not self.auth.answer_challenge(resp, scope):
                return resp
        return resp

    def _fail(self, resp: requests.Response, what: str, scope: str | None = None) -> NoReturn:
        """Raise the clearest error for a response that is not a success."""
        status = resp.status_code
        codes = _error_codes(resp)
        detail = "; ".join(f"{c}: {m}" for c, m in codes) or resp.reason or ""
        detail = self._mask(detail)[:300]
        if status == 401:
            creds = self.auth.creds
            if not creds or not (creds.password or creds.identity_token):
                raise AuthError(f"registry {self.host} needs credentials for {what}", fix=CRED_FIX)
            raise AuthError(
                f"registry {self.host} rejected the credentials {self.auth.who()} for {what}",
                fix=CRED_FIX,
            )
        if status == 403:
            raise AuthError(
                f"registry {self.host} denied {what} {self.auth.who()}: no permission for "
                f"{scope or 'this scope'} ({detail})",
                fix="grant this user pull/push/delete on the repository, or use other "
                f"credentials ({USER_ENV}/{PASSWORD_ENV})",
            )
        if status == 404:
            raise NotFound(
                f"{what}: not found on {self.host} ({detail})",
                fix="check the repository and tag names (`build.py releases`)",
            )
        if status == 405 or any(c == "UNSUPPORTED" for c, _ in codes):
            raise Unsupported(
                f"registry {self.host} does not allow {what} (HTTP {status}: {detail})",
                fix="enable it in the registry (distribution: storage.delete.enabled: true)",
            )
        if status == 429 or status >= 500:
            raise OperationFailed(
                f"{what}: registry {self.host} answered HTTP {status} after "
                f"{self.retries + 1} attempts ({detail})",
                fix="the registry is overloaded or failing; retry later (re-runs resume)",
            )
        raise OperationFailed(f"{what}: registry {self.host} answered HTTP {status} ({detail})")

    # -- API

    def ping(self) -> None:
        """GET /v2/: check that this is a v2 registry and that the credentials work."""
        resp = self._request("GET", "/v2/")
        api = resp.headers.get("Docker-Distribution-API-Version", "")
        ctype = resp.headers.get("Content-Type", "")
        if resp.status_code == 200 and (api.startswith("registry/2") or "json" in ctype):
            return
        if resp.status_code in (401, 403) and (
            api.startswith("registry/2") or resp.headers.get("WWW-Authenticate")
        ):
            self._fail(resp, "GET /v2/")
        if resp.status_code == 429 or resp.status_code >= 500:
            self._fail(resp, "GET /v2/")
        raise UserError(
            f"{self.base_url} is not an OCI/Docker v2 registry: GET /v2/ answered HTTP "
            f"{resp.status_code} ({ctype or 'no content type'}, "
            f"no Docker-Distribution-API-Version header)",
            fix="point at the registry's host:port (e.g. 127.0.0.1:5000), not a web page",
        )

    def _paginate(self, path: str, key: str, page_size: int | None, what: str) -> list[str]:
        url: str | None = self.base_url + path + (f"?n={page_size}" if page_size else "")
        seen: set[str] = set()
        items: list[str] = []
        while url:
            if url in seen:  # a server looping its Link header would spin forever
                raise OperationFailed(f"{what}: registry {self.host} repeats page {url}")
            seen.add(url)
            resp = self._request("GET", "", url=url)
            if resp.status_code != 200:
                self._fail(resp, what)
            try:
                items.extend(resp.json().get(key) or [])
            except (ValueError, AttributeError):
                raise OperationFailed(f"{what}: registry {self.host} sent no JSON") from None
            url = parse_link_next(resp.headers.get("Link"), url)
        return items

    def tags(self, repo: str, *, page_size: int | None = None) -> list[str]:
        """All tags of `repo`, following Link pagination; [] for an empty repo."""
        _check_repo(repo)
        return self._paginate(f"/v2/{repo}/tags/list", "tags", page_size, f"tags of {repo}")

    def catalog(self, *, page_size: int | None = None) -> list[str]:
        return self._paginate("/v2/_catalog", "repositories", page_size, "catalog")

    def head_manifest(self, repo: str, ref: str) -> tuple[str, str, int] | None:
        """(digest, media type, size) of repo:ref, or None if it does not exist."""
        _check_repo(repo)
        _check_ref(ref)
        resp = self._request(
            "HEAD", f"/v2/{repo}/manifests/{ref}", headers={"Accept": ", ".join(MANIFEST_TYPES)}
        )
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            self._fail(resp, f"HEAD {repo}:{ref}", f"repository:{repo}:pull")
        digest = resp.headers.get("Docker-Content-Digest")
        media = resp.headers.get("Content-Type", "").split(";")[0].strip()
        if not digest:  # not every registry sends it on HEAD; fall back to a GET
            _, media, digest = self.get_manifest(repo, ref)
        size = int(resp.headers.get("Content-Length") or 0)
        return digest, media, size

    def digest(self, repo: str, ref: str) -> str:
        """The manifest digest repo:ref points at; NotFound if it does not exist."""
        found = self.head_manifest(repo, ref)
        if found is None:
            raise NotFound(
                f"{repo}:{ref}: not found on {self.host}",
                fix="check the repository and tag names (`build.py releases`)",
            )
        return found[0]

    def get_manifest(self, repo: str, ref: str) -> tuple[bytes, str, str]:
        """(raw bytes, media type, digest); the digest is checked against the bytes."""
        _check_repo(repo)
        _check_ref(ref)
        resp = self._request(
            "GET", f"/v2/{repo}/manifests/{ref}", headers={"Accept": ", ".join(MANIFEST_TYPES)}
        )
        if resp.status_code != 200:
            self._fail(resp, f"manifest {repo}:{ref}", f"repository:{repo}:pull")
        body = resp.content
        media = resp.headers.get("Content-Type", "").split(";")[0].strip()
        try:
            declared = json.loads(body).get("mediaType")
        except (ValueError, AttributeError):
            declared = None
        media = declared or media  # the body is authoritative when it says
        if media not in MANIFEST_TYPES:
            raise OperationFailed(
                f"manifest {repo}:{ref} has unsupported media type {media!r}",
                fix="push it as a Docker v2 / OCI image manifest or index",
            )
        header = resp.headers.get("Docker-Content-Digest")
        expect = ref if is_digest(ref) else header
        digest = _digest_of(body, expect or "sha256")
        if expect and digest != expect:
            raise OperationFailed(
                f"manifest {repo}:{ref}: body hashes to {digest}, registry said {expect}",
                fix="the registry or a proxy altered the manifest; retry, then investigate",
            )
        return body, media, digest

    def put_manifest(self, repo: str, ref: str, body: bytes, media_type: str) -> str:
        """PUT raw manifest bytes under a tag or digest; returns the verified digest."""
        _check_repo(repo)
        _check_ref(ref)
        digest = sha256_digest(body)
        if is_digest(ref) and ref != _digest_of(body, ref):
            raise UserError(
                f"manifest bytes do not hash to {ref}",
                fix="PUT by digest only the exact bytes of that manifest",
            )
        resp = self._request(
            "PUT", f"/v2/{repo}/manifests/{ref}", data=body, headers={"Content-Type": media_type}
        )
        if resp.status_code not in (200, 201):
            self._fail(resp, f"PUT manifest {repo}:{ref}", f"repository:{repo}:pull,push")
        returned = resp.headers.get("Docker-Content-Digest")
        if returned and returned != digest:
            raise OperationFailed(
                f"PUT manifest {repo}:{ref}: registry stored {returned}, expected {digest}",
                fix="the registry rewrote the manifest; this registry cannot retag by bytes",
            )
        return digest

    def copy_tag(self, repo: str, src_ref: str, dst_tag: str) -> str:
        """Point dst_tag at src_ref's manifest server-side: manifest bytes only, no blobs.

        A no-op (one HEAD) when dst_tag already points there, so re-runs resume.
        """
        _check_ref(dst_tag)
        if is_digest(dst_tag):
            raise UserError(f"copy_tag destination must be a tag, not {dst_tag}")
        body, media, digest = self.get_manifest(repo, src_ref)
        current = self.head_manifest(repo, dst_tag)
        if current and current[0] == digest:
            return digest
        return self.put_manifest(repo, dst_tag, body, media)

    def delete_manifest(self, repo: str, digest: str) -> None:
        """Delete a manifest by digest (and with it every tag that points at it)."""
        _check_repo(repo)
        if not is_digest(digest):
            raise UserError(
                f"delete_manifest needs a digest, got {digest!r}",
                fix="resolve the tag first (RegistryClient.digest)",
            )
        resp = self._request("DELETE", f"/v2/{repo}/manifests/{digest}")
        if resp.status_code not in (200, 202):
            self._fail(resp, f"delete of {repo}@{digest}", f"repository:{repo}:delete")

    def delete_tag(self, repo: str, tag: str) -> str:
        """Remove one tag; returns the digest it pointed at.

        Registries that implement tag deletion (OCI 1.1, distribution 3) do it directly.
        distribution 2.x can only delete the manifest, which drops every tag pointing at
        it, so there we refuse when another tag shares the digest.
        """
        if is_digest(tag):
            raise UserError(f"delete_tag needs a tag, got {tag}", fix="use delete_manifest")
        digest = self.digest(repo, tag)
        resp = self._request("DELETE", f"/v2/{repo}/manifests/{tag}")
        if resp.status_code in (200, 202):
            return digest
        codes = [c for c, _ in _error_codes(resp)]
        if resp.status_code not in (400, 405) or not (
            "DIGEST_INVALID" in codes or "UNSUPPORTED" in codes or resp.status_code == 405
        ):
            self._fail(resp, f"delete of tag {repo}:{tag}", f"repository:{repo}:delete")
        others = [t for t in self.tags(repo) if t != tag and self._points_at(repo, t, digest)]
        if others:
            raise Unsupported(
                f"registry {self.host} cannot delete only the tag {repo}:{tag}: it deletes "
                f"manifests, and {digest} is also tagged {', '.join(sorted(others))}",
                fix="move or delete those tags first, or keep this tag",
            )
        self.delete_manifest(repo, digest)
        return digest

    def _points_at(self, repo: str, tag: str, digest: str) -> bool:
        found = self.head_manifest(repo, tag)
        return bool(found and found[0] == digest)

    def get_blob(self, repo: str, digest: str) -> bytes:
        """A blob's bytes, checked against its digest. Meant for config blobs."""
        _check_repo(repo)
        if not is_digest(digest):
            raise UserError(f"get_blob needs a digest, got {digest!r}")
        resp = self._request("GET", f"/v2/{repo}/blobs/{digest}")
        if resp.status_code != 200:
            self._fail(resp, f"blob {repo}@{digest}", f"repository:{repo}:pull")
        if _digest_of(resp.content, digest) != digest:
            raise OperationFailed(
                f"blob {repo}@{digest}: body does not match its digest",
                fix="retry; if it persists the registry storage is corrupt",
            )
        return resp.content

    def put_blob(self, repo: str, data: bytes) -> str:
        """Upload a small blob in one request (monolithic upload); a no-op if it exists."""
        _check_repo(repo)
        digest = sha256_digest(data)
        resp = self._request("HEAD", f"/v2/{repo}/blobs/{digest}")
        if resp.status_code == 200:
            return digest
        resp = self._request("POST", f"/v2/{repo}/blobs/uploads/")
        if resp.status_code != 202 or not resp.headers.get("Location"):
            self._fail(resp, f"blob upload to {repo}", f"repository:{repo}:pull,push")
        url = urljoin(self.base_url + "/", resp.headers["Location"])
        url += ("&" if "?" in url else "?") + urlencode({"digest": digest})
        resp = self._request("PUT", "", url=url, data=data,
                             headers={"Content-Type": "application/octet-stream"})
        if resp.status_code != 201:
            self._fail(resp, f"blob upload to {repo}", f"repository:{repo}:pull,push")
        return digest

    def image_manifest(
        self, repo: str, ref: str, *, platform: str | None = None
    ) -> tuple[dict[str, Any], str]:
        """(image manifest JSON, its digest), resolving an index to one platform."""
        body, media, digest = self.get_manifest(repo, ref)
        if media in IMAGE_MANIFESTS:
            return json.loads(body), digest
        entries = [
            m
            for m in json.loads(body).get("manifests") or []
            if m.get("mediaType") in IMAGE_MANIFESTS
            and (m.get("platform") or {}).get("os") not in (None, "unknown")
        ]
        if platform:
            want = platform.split("/")
            entries = [e for e in entries if _platform_matches(e.get("platform") or {}, want)]
        if len(entries) != 1:
            have = sorted(_platform_str(e.get("platform") or {}) for e in entries)
            raise UserError(
                f"{repo}:{ref} is an index with {len(entries)} matching images "
                f"({', '.join(have) or 'none'})",
                fix="pass platform='os/arch' (e.g. linux/arm64 for gb10, linux/amd64 for cpu)",
            )
        return self.image_manifest(repo, entries[0]["digest"])

    def image_config(self, repo: str, ref: str, *, platform: str | None = None) -> dict:
        manifest, _ = self.image_manifest(repo, ref, platform=platform)
        config = (manifest.get("config") or {}).get("digest")
        if not config:
            raise OperationFailed(f"{repo}:{ref}: manifest has no config blob")
        return json.loads(self.get_blob(repo, config))

    def image_labels(self, repo: str, ref: str, *, platform: str | None = None) -> dict:
        """The image's labels (they live in the config blob, not in the manifest)."""
        config = self.image_config(repo, ref, platform=platform)
        return dict((config.get("config") or {}).get("Labels") or {})

    def iter_tag_digests(self, repo: str) -> Iterator[tuple[str, str]]:
        """(tag, digest) for every tag of repo: one HEAD per tag, no bodies."""
        for tag in self.tags(repo):
            found = self.head_manifest(repo, tag)
            if found:
                yield tag, found[0]


def _platform_matches(plat: dict, want: list[str]) -> bool:
    keys = ("os", "architecture", "variant")
    return all(plat.get(k) == w for k, w in zip(keys, want, strict=False))


def _platform_str(plat: dict) -> str:
    parts = [plat.get("os", "?"), plat.get("architecture", "?")]
    return "/".join(parts + ([plat["variant"]] if plat.get("variant") else []))
