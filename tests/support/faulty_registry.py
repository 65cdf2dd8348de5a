"""A registry that misbehaves in one way per case, over real HTTP on 127.0.0.1.

The healthy answers come from MemRegistry (tests/support/memregistry.py: manifests, tags,
blobs, no referrers API, like distribution 2.8); a `fault` sees each request and the
healthy answer and returns what this registry sends instead: another answer, `Hang()`
(accept, never answer), or `Drip(answer)` (headers at once, then a byte per interval).
Every request is recorded with its headers, so a test can prove which credentials went
where. A second instance with its own MemRegistry plays "another host".
"""

from __future__ import annotations

import base64
import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support.memregistry import MemRegistry


@dataclass
class Request:
    method: str
    path: str  # with the query
    headers: dict[str, str]
    body: bytes = b""

    @property
    def bare_path(self) -> str:
        return self.path.split("?", 1)[0]


@dataclass
class Answer:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def rebody(self, body: bytes) -> Answer:
        """The same answer with another body, its digest and length made to match (so the
        client's digest check passes and the body itself is what is tested)."""
        headers = dict(self.headers)
        headers["Content-Length"] = str(len(body))
        if "Docker-Content-Digest" in headers:
            headers["Docker-Content-Digest"] = "sha256:" + hashlib.sha256(body).hexdigest()
        return Answer(self.status, headers, body)


@dataclass
class Hang:
    """Read the request, never answer."""


@dataclass
class Drip:
    answer: Answer
    interval: float = 1.0
    headers_too: bool = False  # drip the status line and headers as well


Fault = Callable[[Request, Answer], "Answer | Hang | Drip"]


class FaultyRegistry:
    def __init__(self, mem: MemRegistry | None = None, fault: Fault | None = None, *,
                 basic_auth: tuple[str, str] | None = None):
        self.mem = mem or MemRegistry()
        self.fault = fault
        self.basic_auth = basic_auth
        self.requests: list[Request] = []
        self.hung_up: list[float] = []  # when a client closed a connection mid-answer
        self.stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.host = f"127.0.0.1:{self._server.server_address[1]}"
        self.url = f"http://{self.host}"

    # -- what the client sees

    def healthy(self, req: Request) -> Answer:
        if self.basic_auth:
            user, password = self.basic_auth
            want = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
            if req.headers.get("Authorization") != want:
                return Answer(401, {"WWW-Authenticate": 'Basic realm="faulty"',
                                    "Docker-Distribution-API-Version": "registry/2.0",
                                    "Content-Type": "application/json"},
                              b'{"errors":[{"code":"UNAUTHORIZED","message":"auth"}]}')
        resp = self.mem.request(req.method, self.url + req.path, headers=req.headers,
                                data=req.body or None)
        return Answer(resp.status_code, dict(resp.headers), resp.content or b"")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = bytearray()  # a streamed upload: chunk size lines, then data
                    while size := int(self.rfile.readline().split(b";")[0], 16):
                        out += self.rfile.read(size)
                        self.rfile.readline()
                    self.rfile.readline()
                    return bytes(out)
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _serve(self) -> None:
                req = Request(self.command, self.path, dict(self.headers.items()),
                              self._body())
                registry.requests.append(req)
                answer: Answer | Hang | Drip = registry.healthy(req)
                if registry.fault is not None:
                    answer = registry.fault(req, answer)
                if isinstance(answer, Hang):
                    registry.stopping.wait(120)
                    return
                drip = answer.interval if isinstance(answer, Drip) else None
                ans = answer.answer if isinstance(answer, Drip) else answer
                if isinstance(answer, Drip) and answer.headers_too:
                    head = (f"HTTP/1.1 {ans.status} OK\r\n" + "".join(
                        f"{k}: {v}\r\n" for k, v in ans.headers.items()) + "\r\n").encode()
                    self._drip(head + ans.body, answer.interval)
                    return
                self.send_response(ans.status)
                headers = {k: v for k, v in ans.headers.items()
                           if k.lower() not in ("content-length", "connection")}
                length = ans.headers.get("Content-Length", str(len(ans.body)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", length)
                self.send_header("Connection", "close")
                self.end_headers()
                if self.command == "HEAD":
                    return
                if drip is None:
                    self.wfile.write(ans.body)
                    return
                self._drip(ans.body, drip)

            def _drip(self, data: bytes, interval: float) -> None:
                for i in range(len(data)):
                    if registry.stopping.wait(interval):
                        return
                    try:
                        self.wfile.write(data[i:i + 1])
                        self.wfile.flush()
                    except OSError:
                        registry.hung_up.append(time.monotonic())
                        return

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = _serve

        return Handler

    # -- lifetime

    def __enter__(self) -> FaultyRegistry:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def authorizations(self) -> list[str]:
        """Every Authorization header this server received."""
        return [r.headers["Authorization"] for r in self.requests
                if "Authorization" in r.headers]


@contextmanager
def serving(mem: MemRegistry | None = None, fault: Fault | None = None,
            **kw: object) -> Iterator[FaultyRegistry]:
    with FaultyRegistry(mem, fault, **kw) as reg:  # type: ignore[arg-type]
        yield reg
