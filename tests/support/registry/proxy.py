"""A fault-injecting HTTP proxy for registry tests, on 127.0.0.1.

It forwards to a real registry and can be told to:
- answer 500/429/... (optionally with Retry-After) for the next N matching requests,
- cut the connection halfway through the next N matching response bodies,
- stop forwarding altogether (the registry "dies": connections close unanswered),
- paginate tags/list the way OCI 1.1 registries do (distribution 2.8 ignores ?n=),
- front the registry with the bearer-token flow (a token realm served by the proxy),
  since distribution's own token auth needs a signing PKI.
Every request is recorded, so tests can count attempts.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import secrets
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
}


@dataclass
class Rule:
    action: str  # "fail" | "cut"
    method: str | None
    path: re.Pattern[str] | None
    times: int
    status: int = 500
    retry_after: str | None = None

    def matches(self, method: str, path: str) -> bool:
        return (
            self.times > 0
            and (self.method is None or self.method == method)
            and (self.path is None or bool(self.path.search(path)))
        )


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    outcome: str  # "forwarded 200", "fail 500", "cut", "dead", "challenge", "token 200"


@dataclass
class BearerRealm:
    """Token auth in front of a basic-auth registry: clients must present tokens."""

    user: str
    password: str = field(repr=False)
    upstream_user: str = ""
    upstream_password: str = field(default="", repr=False)
    service: str = "imagebuild-test"
    tokens: dict[str, set[str]] = field(default_factory=dict, repr=False)
    issued: list[str] = field(default_factory=list)  # scopes asked for, in order


class FaultProxy:
    def __init__(self, upstream_url: str, *, bearer: BearerRealm | None = None):
        parts = urlsplit(upstream_url)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.bearer = bearer
        self.paginate_tags = False
        self.dead = False
        self.seen: list[Seen] = []
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.host}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # -- control

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def fail(
        self,
        status: int = 500,
        *,
        times: int = 1,
        method: str | None = None,
        path: str | None = None,
        retry_after: float | str | None = None,
    ) -> None:
        """Answer `status` (not forwarding) to the next `times` matching requests."""
        ra = None if retry_after is None else str(retry_after)
        self._add(Rule("fail", method, _re(path), times, status, ra))

    def cut(self, *, times: int = 1, method: str | None = None, path: str | None = None) -> None:
        """Forward, then send headers and half the body of the next matching responses
        and close the connection."""
        self._add(Rule("cut", method, _re(path), times))

    def die(self) -> None:
        self.dead = True

    def revive(self) -> None:
        self.dead = False

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()
            self.seen.clear()

    def count(self, method: str | None = None, path: str | None = None) -> int:
        pat = _re(path)
        return sum(
            1
            for s in list(self.seen)
            if (method is None or s.method == method) and (pat is None or pat.search(s.path))
        )

    # -- internals

    def _add(self, rule: Rule) -> None:
        with self._lock:
            self._rules.append(rule)

    def _take(self, method: str, path: str) -> Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.matches(method, path):
                    rule.times -= 1
                    return rule
        return None

    def _record(self, method: str, path: str, outcome: str) -> None:
        with self._lock:
            self.seen.append(Seen(method, path, outcome))


def _re(path: str | None) -> re.Pattern[str] | None:
    return re.compile(path) if path else None


def _needed_scope(method: str, path: str) -> str | None:
    m = re.match(r"^/v2/(.+?)/(manifests|blobs|tags)/", path)
    if m:
        action = {"GET": "pull", "HEAD": "pull", "DELETE": "delete"}.get(method, "push")
        return f"repository:{m.group(1)}:{action}"
    if path.startswith("/v2/_catalog"):
        return "registry:catalog:*"
    return None


def _granted(scopes: set[str], needed: str | None) -> bool:
    if needed is None:
        return True
    kind, name, action = needed.rsplit(":", 2)
    for s in scopes:
        skind, _, rest = s.partition(":")
        sname, _, actions = rest.rpartition(":")
        if skind == kind and sname == name and (action in actions.split(",") or actions == "*"):
            return True
    return False


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # keep test output clean
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = b""
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        self.rfile.readline()
                        return out
                    out += self.rfile.read(size)
                    self.rfile.readline()
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        def _drop(self) -> None:
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def _send(
            self,
            status: int,
            headers: list[tuple[str, str]],
            body: bytes,
            length: int | None = None,
        ) -> None:
            self.send_response_only(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(
            self, status: int, obj: object, extra: list[tuple[str, str]] | None = None
        ) -> None:
            body = json.dumps(obj).encode()
            self._send(status, [("Content-Type", "application/json"), *(extra or [])], body)

        def _handle(self) -> None:
            method, path = self.command, self.path
            if proxy.dead:
                proxy._record(method, path, "dead")
                self._drop()
                return
            body = self._body()
            rule = proxy._take(method, path)
            if rule and rule.action == "fail":
                proxy._record(method, path, f"fail {rule.status}")
                extra = [("Retry-After", rule.retry_after)] if rule.retry_after else []
                code = "TOOMANYREQUESTS" if rule.status == 429 else "UNKNOWN"
                err = {"errors": [{"code": code, "message": "injected by FaultProxy"}]}
                self._json(rule.status, err, extra)
                return
            upstream_auth = self.headers.get("Authorization")
            if proxy.bearer is not None:
                if urlsplit(path).path == "/token":
                    self._token(path)
                    return
                upstream_auth = self._check_bearer(method, urlsplit(path).path)
                if upstream_auth is None:
                    return
            status, headers, payload, length = self._forward(method, path, body, upstream_auth)
            if (
                proxy.paginate_tags
                and method == "GET"
                and status == 200
                and re.search(r"/tags/list$", urlsplit(path).path)
            ):
                headers, payload = self._paginate(path, headers, payload)
                length = len(payload)
            if rule and rule.action == "cut" and payload:
                proxy._record(method, path, "cut")
                self.send_response_only(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload[: len(payload) // 2])
                self.wfile.flush()
                self._drop()
                return
            proxy._record(method, path, f"forwarded {status}")
            self._send(status, headers, payload, length)

        def _forward(self, method: str, path: str, body: bytes, auth: str | None):
            conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            headers.pop("Authorization", None)
            if auth:
                headers["Authorization"] = auth
            try:
                conn.request(method, path, body=body or None, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
                out = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP]
                # a HEAD's Content-Length describes the body a GET would return
                length = int(resp.getheader("Content-Length") or 0) if method == "HEAD" else None
                return resp.status, out, payload, length
            finally:
                conn.close()

        def _paginate(self, path: str, headers, payload: bytes):
            q = parse_qs(urlsplit(path).query)
            doc = json.loads(payload)
            tags = sorted(doc.get("tags") or [])
            if "last" in q:
                tags = [t for t in tags if t > q["last"][0]]
            if "n" in q:
                n = int(q["n"][0])
                rest, tags = tags[n:], tags[:n]
                if rest and tags:
                    nxt = urlsplit(path).path + "?" + urlencode({"n": n, "last": tags[-1]})
                    headers = [*headers, ("Link", f'<{nxt}>; rel="next"')]
            doc["tags"] = tags
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            return headers, json.dumps(doc).encode()

        def _token(self, path: str) -> None:
            realm = proxy.bearer
            assert realm is not None
            want = "Basic " + base64.b64encode(f"{realm.user}:{realm.password}".encode()).decode()
            if self.headers.get("Authorization") != want:
                proxy._record("GET", path, "token 401")
                self._json(401, {"details": "bad credentials"})
                return
            scopes = set(parse_qs(urlsplit(path).query).get("scope", []))
            realm.issued.extend(sorted(scopes))
            token = secrets.token_urlsafe(16)
            realm.tokens[token] = scopes
            proxy._record("GET", path, "token 200")
            self._json(200, {"token": token, "expires_in": 300})

        def _check_bearer(self, method: str, path: str) -> str | None:
            """The upstream Authorization for a valid token; else answer 401, return None."""
            realm = proxy.bearer
            assert realm is not None
            needed = _needed_scope(method, path)
            given = self.headers.get("Authorization", "")
            token = given[7:] if given.startswith("Bearer ") else None
            if token in realm.tokens and _granted(realm.tokens[token], needed):
                raw = f"{realm.upstream_user}:{realm.upstream_password}".encode()
                return "Basic " + base64.b64encode(raw).decode()
            proxy._record(method, path, "challenge")
            challenge = f'Bearer realm="{proxy.url}/token",service="{realm.service}"'
            if needed:
                challenge += f',scope="{needed}"'
            err = {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]}
            self._json(
                401,
                err,
                [
                    ("WWW-Authenticate", challenge),
                    ("Docker-Distribution-API-Version", "registry/2.0"),
                ],
            )
            return None

        do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _handle

    return Handler
