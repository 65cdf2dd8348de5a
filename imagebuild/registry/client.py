"""The one module that talks to OCI registries: the distribution HTTP API over requests.

Promote and rollback only move manifests: a tag is retargeted by GETting the manifest
bytes and PUTting the same bytes under another tag, so no layer crosses the wire. Every
request's body bytes are counted (ByteCounter) so callers can prove that.

Requests retry on 429/5xx/connection errors when idempotent (never on 401/403). Auth
(auth.py) answers the registry's challenge with credentials from credentials.py; secrets
never appear in messages, logs or repr.

A registry's answer is untrusted input: every body is read streamed under a size cap and
the command's registry deadline (deadline.py), parsed by documents.py, and anything it
says reaches messages only through safetext.safe. Credentials go to the registry's own
origin and the token realm its first challenge named, nowhere else: not to a `Link: next`
page, an upload `Location` or a redirect on another origin.
"""

from __future__ import annotations

import copy
import email.utils
import functools
import hashlib
import ipaddress
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlencode, urljoin, urlsplit

import requests

from imagebuild.errors import OperationFailed, UserError
from imagebuild.registry import documents
from imagebuild.registry.auth import Auth, Challenge, parse_challenges
from imagebuild.registry.credentials import (
    CRED_FIX,
    PASSWORD_ENV,
    USER_ENV,
    Credentials,
    docker_config_credentials,
    resolve_credentials,
)
from imagebuild.registry.deadline import DEADLINE_ENV, Deadline, deadline_seconds
from imagebuild.registry.errors import (
    AuthError,
    MissingBlob,
    NotFound,
    RegistryFault,
    Unreachable,
    Unsupported,
)
from imagebuild.safetext import safe

__all__ = ["AuthError", "Challenge", "Credentials", "MissingBlob", "NotFound",
           "RegistryClient", "RegistryFault", "Unsupported", "docker_config_credentials",
           "parse_challenges", "resolve_credentials"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")


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

RETRY_AFTER_CAP = 30.0  # never let a server park us longer than this per attempt
MAX_PAGES = 1000  # a `Link: next` chain longer than this is a registry fault
MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)
# the most a body of each kind of endpoint may hold on a success (documents.py caps)
_BODY_CAPS = {"manifest": documents.MAX_MANIFEST, "referrers": documents.MAX_MANIFEST,
              "tags": documents.MAX_TAG_PAGE, "catalog": documents.MAX_TAG_PAGE,
              "blob": documents.MAX_BLOB}
_CHUNK = 65536
_UNKNOWN_BLOB = ("MANIFEST_BLOB_UNKNOWN", "BLOB_UNKNOWN")
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
_TRANSIENT_ERRORS = (
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,
    requests.exceptions.ContentDecodingError,
)
# what requests refuses to send: a header value with CR/LF or leading space (a token the
# registry gave us), a URL it cannot parse or no adapter for its scheme (an upload
# `Location`, a `Link: next`, a redirect the registry sent). Our own values are checked at
# the edge, so at this point the registry wrote it: a fault of the registry, not a crash
_UNSENDABLE = (
    requests.exceptions.InvalidHeader,
    requests.exceptions.InvalidURL,
    requests.exceptions.InvalidSchema,
    requests.exceptions.MissingSchema,
)


# ---------------------------------------------------------------------------- helpers


@dataclass
class ByteCounter:
    """Body bytes moved (request + response), in total and per kind of endpoint; added
    to from several threads at once (a push's layers)."""

    sent: int = 0
    received: int = 0
    requests: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def total(self) -> int:
        return self.sent + self.received

    def add(self, kind: str, sent: int, received: int) -> None:
        with self._lock:
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


def followed_url(base_url: str, ref: str, host: str, what: str) -> str:
    """A URL the registry gave us (a redirect, an upload `Location`, a `Link: next`) made
    absolute, or a RegistryFault when it is none we could send a request to: not http(s),
    no host, a port out of range, whitespace or a control character in it."""
    try:
        url = urljoin(base_url, ref)
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError as exc:
        raise RegistryFault(host, f"a URL that is not one ({safe(ref, 120)}: {exc})",
                            what) from None
    if (parts.scheme not in ("http", "https") or not parts.hostname
            or re.search(r"[\x00-\x20\x7f]", url)):
        raise RegistryFault(host, f"a URL that HTTP cannot follow: {safe(ref, 120)}", what)
    return url


def parse_link_next(header: str | None, base_url: str, host: str = "",
                    what: str = "a Link header") -> str | None:
    """The absolute URL of the rel="next" entry of a Link header, if any."""
    if not header:
        return None
    for m in re.finditer(r"<([^>]*)>\s*((?:;\s*[^;,]+)*)", header):
        rels = re.findall(r';\s*rel\s*=\s*"?([^";,]+)"?', m.group(2))
        if any("next" in r.split() for r in rels):
            return followed_url(base_url, m.group(1), host or urlsplit(base_url).netloc, what)
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


def is_repository(name: str) -> bool:
    return bool(_REPO_RE.match(name)) and len(name) <= 255


def _check_repo(repo: str) -> None:
    if not is_repository(repo):
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


def _connection_failure(exc: Exception) -> str:
    """What went wrong with a connection, in words (not urllib3's repr of its pool)."""
    text = str(exc)
    if isinstance(exc, requests.Timeout):
        return "no answer in time"
    if isinstance(exc, requests.exceptions.ChunkedEncodingError):
        return "the answer was cut off"
    if isinstance(exc, requests.exceptions.ContentDecodingError):
        return "the answer could not be decoded"
    for needle, said in (("Connection refused", "connection refused (nothing listens there)"),
                         ("Name or service not known", "the host name does not resolve"),
                         ("Temporary failure in name resolution",
                          "the host name does not resolve"),
                         ("No route to host", "no route to the host"),
                         ("Connection reset", "the connection was reset"),
                         ("RemoteDisconnected", "the server closed the connection")):
        if needle in text:
            return said
    return type(exc).__name__


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


def is_loopback(host: str) -> bool:
    """A registry on this machine (127.0.0.0/8, ::1, localhost): plain HTTP, no proxy."""
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
        url = ("http://" if is_loopback(url.split("/")[0]) else "https://") + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UserError(f"invalid registry URL {base_url!r}", fix="use e.g. 127.0.0.1:5000")
    path = parts.path[:-3] if parts.path.endswith("/v2") else parts.path
    return f"{parts.scheme}://{parts.netloc}{path}"


def _error_codes(resp: requests.Response) -> list[tuple[str, str]]:
    """(code, message) pairs of a distribution error body; empty if it is not one."""
    return documents.error_codes(resp.content or b"")


def origin(url: str) -> tuple[str, str]:
    """(scheme, host:port) with the default port made explicit: what credentials bind to."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, f"{(parts.hostname or '').lower()}:{port}"


def _kind_of(path: str) -> str:
    for marker, kind in (
        ("/manifests/", "manifest"),
        ("/blobs/", "blob"),
        ("/tags/list", "tags"),
        ("/referrers/", "referrers"),
        ("/_catalog", "catalog"),
    ):
        if marker in path:
            return kind
    return "ping" if path.rstrip("/").endswith("/v2") else "other"


def _scope_for(method: str, path: str) -> str | None:
    """The token scope a request needs (distribution's token auth spec)."""
    m = re.match(r"^/v2/(.+?)/(?:manifests|blobs|tags|referrers)/", path)
    if m:
        action = {"GET": "pull", "HEAD": "pull", "DELETE": "delete"}.get(method, "pull,push")
        return f"repository:{m.group(1)}:{action}"
    if path.startswith("/v2/_catalog"):
        return "registry:catalog:*"
    return None


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


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
        deadline: Deadline | None = None,
        max_pages: int = MAX_PAGES,
    ):
        self.base_url = normalize_base_url(base_url)
        self.host = urlsplit(self.base_url).netloc
        self.origin = origin(self.base_url)
        self.timeout = timeout
        self.retries = max(0, retries)
        self.backoff = backoff
        self.max_pages = max_pages
        # one budget for the whole command (every request, read and retry wait)
        self.deadline = deadline if deadline is not None else Deadline(deadline_seconds())
        self.bytes = bytes_counter if bytes_counter is not None else ByteCounter()
        self._session = session or requests.Session()
        self._session.headers.setdefault("User-Agent", "imagebuild-registry/0.1")
        # a proxy has no business between us and a loopback registry
        self._proxies: Any = {"http": None, "https": None} if is_loopback(self.host) else None
        self.auth = Auth(self.host,
                         credentials or resolve_credentials(self.host, username, password),
                         token, self._transport)
        self._sleep = time.sleep
        self.say = _to_stderr  # what the user must hear at once (a long Retry-After wait)

    def __repr__(self) -> str:
        return f"RegistryClient({self.base_url!r}, credentials={self.auth.creds!r})"

    def with_credentials(self, creds: Credentials) -> RegistryClient:
        """This client (its session, deadline and byte counter) with other credentials."""
        other = copy.copy(self)
        other.auth = Auth(self.host, creds, None, other._transport)
        return other

    def _mask(self, text: str) -> str:
        return self.auth.mask(text)

    def own_origin(self, url: str) -> bool:
        return origin(url) == self.origin

    # -- transport

    def _out_of_time(self, what: str, why: str) -> NoReturn:
        raise RegistryFault(
            self.host, why, what,
            fix=f"the registry is too slow or stuck; retry later (re-runs resume), or give "
            f"it more time with {DEADLINE_ENV} (now {self.deadline.seconds:g} s)")

    def _read_timeout(self, what: str) -> float:
        left = self.deadline.remaining()
        if left <= 0:
            self._out_of_time(what, f"no complete answer within the {self.deadline.seconds:g} "
                              "s registry deadline")
        return min(self.timeout, left)

    def _read_body(self, resp: requests.Response, method: str, kind: str, what: str) -> int:
        """Read the body streamed: the deadline is checked between reads (a server that
        drips a byte a second ends by it) and a success's body is capped per kind."""
        ok = resp.status_code < 300
        cap = _BODY_CAPS.get(kind, documents.MAX_SMALL) if ok else documents.MAX_SMALL
        if resp.raw is None:  # a canned response (tests): already in memory
            body = resp.content or b""
        else:
            declared = resp.headers.get("Content-Length", "")
            # (a HEAD's length is the size of what it describes, not of a body to read)
            if ok and method != "HEAD" and declared.isdigit() and int(declared) > cap:
                resp.close()
                raise RegistryFault(self.host, f"a body of {int(declared):,} bytes (the cap "
                                    f"for a {kind} is {cap:,})", what)
            chunks: list[bytes] = []
            size = 0
            try:
                while True:
                    if self.deadline.expired():
                        resp.close()
                        self._out_of_time(what, f"a body still incomplete after {size:,} "
                                          f"bytes when the {self.deadline.seconds:g} s "
                                          "registry deadline ran out")
                    chunk = resp.raw.read1(_CHUNK, decode_content=True)
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > cap:
                        resp.close()
                        if not ok:  # an error body only decorates a message
                            break
                        raise RegistryFault(self.host, f"a body of more than {cap:,} bytes "
                                            f"(the cap for a {kind})", what)
                    chunks.append(chunk)
                else:
                    resp.raw.release_conn()
            except Exception as exc:  # urllib3's own errors, as requests would map them
                if isinstance(exc, RegistryFault):
                    raise
                raise requests.ConnectionError(str(exc)) from None
            body = b"".join(chunks)
        resp._content = body  # noqa: SLF001 - what resp.content returns from now on
        resp._content_consumed = True  # type: ignore[attr-defined]  # noqa: SLF001
        return len(body)

    def _exchange(self, method: str, url: str, headers: dict[str, str], data: bytes | None,
                  wait: float, kind: str, what: str) -> tuple[requests.Response, int]:
        resp = self._session.request(method, url, headers=headers, data=data,
                                     timeout=(wait, wait), proxies=self._proxies,
                                     allow_redirects=False, stream=True)
        return resp, self._read_body(resp, method, kind, what)

    def _within_deadline(self, exchange: Callable[[], _T], what: str) -> _T:
        """Run one exchange in a worker and stop waiting for it at the deadline. Socket
        timeouts bound each read, not their sum: a server that sends its headers a byte at
        a time never trips one, so the bound on the whole exchange is kept here."""
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["value"] = exchange()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                box["error"] = exc

        worker = threading.Thread(target=work, name="registry-request", daemon=True)
        worker.start()
        worker.join(max(self.deadline.remaining(), 0) + 0.05)
        if worker.is_alive():  # left behind: its socket timeout or the exit ends it
            self._out_of_time(what, f"no complete answer within the "
                              f"{self.deadline.seconds:g} s registry deadline")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _send(self, method: str, url: str, headers: Mapping[str, str], data: bytes | None,
              kind: str, what: str) -> requests.Response:
        """One attempt, redirects followed here (not by requests): every hop is charged to
        the deadline, and a hop to another origin goes without our Authorization."""
        hdrs = dict(headers)
        for _ in range(MAX_REDIRECTS + 1):
            wait = self._read_timeout(what)
            try:
                resp, received = self._within_deadline(
                    functools.partial(self._exchange, method, url, hdrs, data, wait, kind,
                                      what), what)
            except _UNSENDABLE as exc:
                raise RegistryFault(
                    self.host, "a value that HTTP cannot carry in the next request "
                    f"({type(exc).__name__}: {safe(self._mask(str(exc)), 160)})",
                    what) from None
            resp.url = url
            location = resp.headers.get("Location")
            if resp.status_code not in _REDIRECTS or not location:
                self.bytes.add(kind, len(data or b""), received)
                return resp
            self.bytes.add(kind, len(data or b""), received)
            url = followed_url(url, location, self.host, what)
            if not self.own_origin(url):
                hdrs.pop("Authorization", None)
            if resp.status_code == 303:
                method, data = "GET", None
        raise RegistryFault(self.host, f"more than {MAX_REDIRECTS} redirects", what)

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
        """One logical request: retries on 429/5xx/connection errors when idempotent,
        all of it inside the command's registry deadline."""
        what = f"{method} {self._where(url)}"
        attempt = 0
        with self.deadline.running():
            while True:
                try:
                    resp = self._send(method, url, dict(headers or {}), data, kind, what)
                except requests.exceptions.SSLError as exc:
                    raise OperationFailed(
                        f"TLS to {self.host} failed: {safe(self._mask(str(exc)))}",
                        fix="trust the registry's CA (REQUESTS_CA_BUNDLE) or fix its certificate",
                    ) from None
                except _TRANSIENT_ERRORS as exc:
                    self.bytes.add(kind, len(data or b""), 0)
                    if self.deadline.expired():
                        self._out_of_time(what, f"no complete answer within the "
                                          f"{self.deadline.seconds:g} s registry deadline "
                                          f"({type(exc).__name__})")
                    if not idempotent or attempt >= self.retries:
                        raise self._connection_fault(exc, what, attempt + 1) from None
                    delay = self.backoff * 2**attempt
                    log.info("registry %s: %s; retry %d of %d in %.1f s", safe(self.host, 100),
                             _connection_failure(exc), attempt + 1, self.retries, delay)
                else:
                    status = resp.status_code
                    if not (status == 429 or status >= 500) or not idempotent:
                        return resp
                    if attempt >= self.retries:
                        return resp  # the caller turns it into a message
                    delay = self._retry_delay(resp, attempt, what)
                    log.info("registry %s: HTTP %d for %s; retry %d of %d in %.1f s",
                             safe(self.host, 100), status, safe(self._mask(what), 200),
                             attempt + 1, self.retries, delay)
                if delay >= self.deadline.remaining():
                    self._out_of_time(what, f"errors until the {self.deadline.seconds:g} s "
                                      "registry deadline left no time for another attempt")
                attempt += 1
                self._sleep(delay)

    def _connection_fault(self, exc: Exception, what: str, attempts: int) -> OperationFailed:
        """What a connection that failed for good means, in one line."""
        said = f"{_connection_failure(exc)} ({safe(self._mask(what), 200)}, {attempts} attempt(s))"
        if isinstance(exc, requests.ConnectionError):
            return Unreachable(
                f"cannot reach the registry at {self.base_url}: {said}",
                fix=f"start the registry at {self.host} (scripts/start-registry.sh starts "
                "the local one), or point IMAGEBUILD_REGISTRY (or matrix.yaml "
                "publish.registry) at one that runs")
        return OperationFailed(
            f"the registry at {self.base_url} failed mid-answer: {said}",
            fix=f"check that the registry at {self.base_url} is up and healthy "
            "(scripts/start-registry.sh starts the local one)")

    def _retry_delay(self, resp: requests.Response, attempt: int, what: str) -> float:
        """Retry-After honoured up to RETRY_AFTER_CAP and the deadline, and said."""
        raw = resp.headers.get("Retry-After")
        hinted = _retry_after(raw)
        if hinted is None:
            return self.backoff * 2**attempt
        left = self.deadline.remaining()
        if hinted > left and hinted > RETRY_AFTER_CAP:
            self._out_of_time(what, f"HTTP {resp.status_code} with Retry-After "
                              f"{safe(raw, 40)} (more than the {max(left, 0):.0f} s left "
                              f"of the registry deadline)")
        delay = min(hinted, RETRY_AFTER_CAP)
        if hinted >= 1:
            capped = f", capped at {RETRY_AFTER_CAP:.0f} s" if hinted > RETRY_AFTER_CAP else ""
            self.say(f"registry {self.host} answered HTTP {resp.status_code} to {what} and "
                     f"asked to wait {hinted:.0f} s (Retry-After); retrying in {delay:.0f} s"
                     f"{capped}")
        return delay

    def _where(self, url: str) -> str:
        parts = urlsplit(url)
        return safe(f"{parts.netloc}{parts.path}", 200)

    def _request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
        url: str | None = None,
        scope: str | None = None,
    ) -> requests.Response:
        """A registry request with the auth dance: at most one re-try per 401. A URL on
        another origin (a `Link: next` page, an upload `Location`) gets no credentials.
        `scope`: the token scope when the path alone does not say it (a mount)."""
        url = url or self.base_url + path
        path = urlsplit(url).path
        scope = scope or _scope_for(method, path)
        kind = _kind_of(path)
        ours = self.own_origin(url)
        for _ in range(2):
            hdrs = dict(headers or {})
            auth = self.auth.header_for(scope) if ours else None
            if auth:
                hdrs["Authorization"] = auth
            resp = self._transport(
                method, url, headers=hdrs, data=data, kind=kind, idempotent=method in _IDEMPOTENT
            )
            # a challenge from another origin (after a redirect) is not the registry's
            if (resp.status_code != 401 or not ours or not self.own_origin(resp.url or url)
                    or not self.auth.answer_challenge(resp, scope)):
                return resp
        return resp

    def _fail(self, resp: requests.Response, what: str, scope: str | None = None) -> NoReturn:
        """Raise the clearest error for a response that is not a success."""
        status = resp.status_code
        codes = _error_codes(resp)
        detail = "; ".join(f"{c}: {m}" for c, m in codes) or resp.reason or ""
        detail = safe(self._mask(str(detail)))
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
        parse = documents.tag_list if key == "tags" else documents.catalog
        while url:
            if url in seen:  # a server looping its Link header would spin forever
                raise RegistryFault(self.host, f"a Link header that repeats the page "
                                    f"{self._where(url)}", what)
            if len(seen) >= self.max_pages:
                raise RegistryFault(self.host, f"a Link: next chain longer than "
                                    f"{self.max_pages} pages", what)
            seen.add(url)
            resp = self._request("GET", "", url=url)
            if resp.status_code != 200:
                self._fail(resp, what)
            items.extend(parse(resp.content, self.host, what))
            url = parse_link_next(resp.headers.get("Link"), url, self.host, what)
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
        if digest and not is_digest(digest):
            raise RegistryFault(self.host, f"a Docker-Content-Digest {safe(digest, 80)!r} "
                                "that is not a digest", f"HEAD {repo}:{ref}")
        if not digest:  # not every registry sends it on HEAD; fall back to a GET
            _, media, digest = self.get_manifest(repo, ref)
        length = resp.headers.get("Content-Length") or "0"
        size = int(length) if length.isdigit() else 0
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
        what = f"manifest {repo}:{ref}"
        media = resp.headers.get("Content-Type", "").split(";")[0].strip()
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise RegistryFault(self.host, "a body that is not a JSON object", what)
        declared = doc.get("mediaType")
        media = declared if isinstance(declared, str) and declared else media
        if media not in MANIFEST_TYPES:  # the body is authoritative when it says
            raise OperationFailed(
                f"manifest {repo}:{ref} has unsupported media type {safe(media, 100)!r}",
                fix="push it as a Docker v2 / OCI image manifest or index",
            )
        if media in IMAGE_MANIFESTS:
            documents.image_manifest(body, self.host, what)
        else:
            documents.index(body, self.host, what)
        header = resp.headers.get("Docker-Content-Digest")
        if header and not is_digest(header):
            raise RegistryFault(self.host, f"a Docker-Content-Digest {safe(header, 80)!r} "
                                "that is not a digest", what)
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
        unknown = [c for c, _ in _error_codes(resp) if c in _UNKNOWN_BLOB]
        if resp.status_code == 400 and unknown:  # it said it held them, or took them
            raise MissingBlob(self.host, f"HTTP 400 ({', '.join(unknown)})",
                              f"PUT manifest {repo}:{ref}",
                              fix="the registry lacks a blob it said it held or had just "
                              "taken: check its storage, then re-run")
        if resp.status_code not in (200, 201):
            self._fail(resp, f"PUT manifest {repo}:{ref}", f"repository:{repo}:pull,push")
        returned = resp.headers.get("Docker-Content-Digest")
        if returned and returned != digest:
            raise OperationFailed(
                f"PUT manifest {repo}:{ref}: registry stored {returned}, expected {digest}",
                fix="the registry rewrote the manifest; this registry cannot retag by bytes",
            )
        return digest

    def put_referrer(self, repo: str, body: bytes, media_type: str) -> tuple[str, bool]:
        """PUT a manifest that has a `subject`, by digest: (digest, whether the registry
        indexed the subject itself). OCI 1.1 registries answer with an `OCI-Subject`
        header; without it the pusher maintains the referrers tag (`sha256-<hex>`)."""
        digest = sha256_digest(body)
        resp = self._request("PUT", f"/v2/{repo}/manifests/{digest}", data=body,
                             headers={"Content-Type": media_type})
        if resp.status_code not in (200, 201):
            self._fail(resp, f"PUT manifest {repo}@{digest}", f"repository:{repo}:pull,push")
        return digest, bool(resp.headers.get("OCI-Subject"))

    def referrers(self, repo: str, digest: str,
                  artifact_type: str | None = None) -> list[dict[str, Any]] | None:
        """Descriptors of the manifests whose `subject` is repo@digest, through the OCI
        referrers API; None when the registry has no such API (404: use the tag schema)."""
        _check_repo(repo)
        if not is_digest(digest):
            raise UserError(f"referrers needs a digest, got {digest!r}")
        query = f"?{urlencode({'artifactType': artifact_type})}" if artifact_type else ""
        resp = self._request("GET", f"/v2/{repo}/referrers/{digest}{query}",
                             headers={"Accept": OCI_INDEX})
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            self._fail(resp, f"referrers of {repo}@{digest}", f"repository:{repo}:pull")
        what = f"referrers of {repo}@{digest}"
        documents.referrers_index(resp.content, self.host, what)
        manifests = list(json.loads(resp.content).get("manifests") or [])
        if artifact_type:  # the filter is optional for registries (OCI-Filters-Applied)
            manifests = [m for m in manifests if m.get("artifactType") == artifact_type]
        return manifests

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
        if resp.status_code == 404:  # named by a stored manifest: the registry lost it
            codes = " ".join(c for c, _ in _error_codes(resp)) or "not found"
            raise MissingBlob(self.host, f"HTTP 404 ({safe(codes, 80)})", f"blob {repo}@{digest}",
                              fix="a manifest in the registry names a blob it no longer has "
                              "(storage lost, or garbage-collected while in use): re-publish "
                              "the release or restore the registry's storage")
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
        digest = sha256_digest(data)
        if self.head_blob(repo, digest) is not None:
            return digest
        url = self.start_upload(repo)
        assert url is not None  # no mount asked for
        return self._finish_upload(repo, url, digest, data)

    def head_blob(self, repo: str, digest: str) -> int | None:
        """The size of the blob repo holds under `digest`, or None when it holds none."""
        _check_repo(repo)
        what = f"HEAD blob {repo}@{digest}"
        resp = self._request("HEAD", f"/v2/{repo}/blobs/{digest}")
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            self._fail(resp, what, f"repository:{repo}:pull")
        said = resp.headers.get("Docker-Content-Digest")
        if said and said != digest:
            raise RegistryFault(self.host, f"the digest {safe(said, 80)}", what)
        length = resp.headers.get("Content-Length", "")
        if not length.isdigit():
            raise RegistryFault(self.host, "no size (Content-Length)", what)
        return int(length)

    def start_upload(self, repo: str, *, mount: str | None = None,
                     source: str | None = None) -> str | None:
        """Open a blob upload to repo and return its URL; with `mount` (a digest) and
        `source` (a repository of this registry) ask for a cross-repository mount first:
        None when the registry mounted it (201), else the upload it opened instead."""
        _check_repo(repo)
        what = f"blob upload to {repo}"
        query, scope = "", f"repository:{repo}:pull,push"
        if mount and source:
            _check_repo(source)
            query = "?" + urlencode({"mount": mount, "from": source})
            scope += f" repository:{source}:pull"  # the token must let us read the source
        resp = self._request("POST", f"/v2/{repo}/blobs/uploads/{query}", scope=scope)
        if query and resp.status_code == 201:
            said = resp.headers.get("Docker-Content-Digest")
            if said and said != mount:
                raise RegistryFault(self.host, f"the digest {safe(said, 80)} for a mount of "
                                    f"{mount}", what)
            return None
        if resp.status_code != 202 or not resp.headers.get("Location"):
            self._fail(resp, what, scope)
        return followed_url(self.base_url + "/", resp.headers["Location"], self.host, what)

    def send_blob(self, repo: str, url: str, body: Iterator[bytes],
                  digest: Callable[[], str]) -> str:
        """Stream `body` into the upload at `url` (one chunked PATCH), then close the
        upload under `digest()`, known once the body is sent; returns that digest."""
        what = f"blob upload to {repo}"
        resp = self._stream("PATCH", url, body, what)
        if resp.status_code != 202:
            self._fail(resp, what, f"repository:{repo}:pull,push")
        if resp.headers.get("Location"):
            url = followed_url(url, resp.headers["Location"], self.host, what)
        return self._finish_upload(repo, url, digest(), None)

    def _finish_upload(self, repo: str, url: str, digest: str, data: bytes | None) -> str:
        what = f"blob upload to {repo}"
        url += ("&" if "?" in url else "?") + urlencode({"digest": digest})
        resp = self._request("PUT", "", url=url, data=data,
                             headers={"Content-Type": "application/octet-stream"})
        if resp.status_code != 201:
            self._fail(resp, what, f"repository:{repo}:pull,push")
        said = resp.headers.get("Docker-Content-Digest")
        if said and said != digest:
            raise RegistryFault(self.host, f"the digest {safe(said, 80)} for a blob sent as "
                                f"{digest}", what)
        return digest

    def _stream(self, method: str, url: str, body: Iterator[bytes],
                what: str) -> requests.Response:
        """One request whose body is a stream, sent once: no retry, no redirect, no second
        try after a 401 (the body is gone; the push retries whole). Bounded by progress,
        not by the command's deadline, which bounds waiting on the registry, not sending
        it gigabytes: each chunk within the socket timeout, the answer within it too."""
        self._read_timeout(what)  # a spent deadline starts no stream
        scope = _scope_for(method, urlsplit(url).path)
        headers = {"Content-Type": "application/octet-stream"}
        auth = self.auth.header_for(scope) if self.own_origin(url) else None
        if auth:
            headers["Authorization"] = auth
        sent = 0

        def counted() -> Iterator[bytes]:
            nonlocal sent
            for chunk in body:
                sent += len(chunk)
                yield chunk

        try:
            resp = self._session.request(method, url, headers=headers, data=counted(),
                                         timeout=(self.timeout, self.timeout),
                                         proxies=self._proxies, allow_redirects=False,
                                         stream=True)
            with self.deadline.running():
                received = self._read_body(resp, method, "blob", what)
        except _UNSENDABLE as exc:
            raise RegistryFault(self.host, "a value that HTTP cannot carry in the next "
                                f"request ({type(exc).__name__})", what) from None
        except _TRANSIENT_ERRORS as exc:
            raise self._connection_fault(exc, f"{method} {self._where(url)}", 1) from None
        self.bytes.add("blob", sent, received)
        if resp.status_code in _REDIRECTS:
            raise RegistryFault(self.host, f"a redirect (HTTP {resp.status_code}) for a "
                                "streamed upload", what)
        return resp

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
        return documents.json_object(self.get_blob(repo, config), self.host, "image config",
                                     f"config of {repo}:{ref}")

    def image_labels(self, repo: str, ref: str, *, platform: str | None = None) -> dict:
        """The image's labels (they live in the config blob, not in the manifest)."""
        config = self.image_config(repo, ref, platform=platform)
        return dict((config.get("config") or {}).get("Labels") or {})

    def get_bench_results(self, repo: str, digest: str) -> dict[str, Any]:
        """A bench results document (a blob), checked against its schema."""
        return documents.bench_results(self.get_blob(repo, digest), self.host,
                                       f"bench results {repo}@{digest}")

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
