"""A minimal HTTP/1.1 client on asyncio streams, for loopback vLLM servers only.

Why not a library: the project pins `requests` (blocking) only, and a streaming load
generator needs per-chunk arrival times with as little in between as possible. Chunked or
sized bodies, nothing else. The load generator keeps one connection per worker alive
across requests (`Connection`), as aiohttp in vLLM's own benchmark and the OpenAI SDK do,
so the server does not pay an accept and a new connection per request that real clients
do not make it pay.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any
from urllib.parse import urlsplit


class HTTPError(Exception):
    pass


def _split(url: str) -> tuple[str, int, str]:
    u = urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise HTTPError(f"only plain http URLs are supported, not {url!r}")
    return u.hostname, u.port or 80, (u.path or "/") + (f"?{u.query}" if u.query else "")


async def _send(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, url: str,
                method: str, body: bytes | None, keep_alive: bool
                ) -> tuple[int, dict[str, str]]:
    host, port, path = _split(url)
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}",
            f"Connection: {'keep-alive' if keep_alive else 'close'}", "Accept: */*"]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + (body or b""))
    await writer.drain()
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionResetError("connection closed before a response")
    parts = status_line.decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        writer.close()
        raise HTTPError(f"bad status line {status_line[:80]!r}")
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers


async def _open(url: str, method: str, body: bytes | None) -> tuple[
        asyncio.StreamReader, asyncio.StreamWriter, int, dict[str, str]]:
    host, port, _ = _split(url)
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
    try:
        status, headers = await _send(reader, writer, url, method, body, keep_alive=False)
    except BaseException:
        writer.close()
        raise
    return reader, writer, status, headers


class Connection:
    """One keep-alive connection to one server, used by one worker at a time."""

    def __init__(self) -> None:
        self._rw: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def request(self, url: str, body: bytes) -> tuple[
            asyncio.StreamReader, asyncio.StreamWriter, int, dict[str, str]]:
        for attempt in (0, 1):
            fresh = self._rw is None
            if self._rw is None:
                host, port, _ = _split(url)
                self._rw = await asyncio.open_connection(host, port, limit=1 << 20)
            reader, writer = self._rw
            try:
                status, headers = await _send(reader, writer, url, "POST", body, True)
                return reader, writer, status, headers
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                if fresh or attempt:  # a reused connection may have idled out: once more
                    raise
        raise AssertionError("unreachable")

    def release(self, reusable: bool) -> None:
        """After a response: keep the connection only if its body was read to the end."""
        if not reusable:
            self.close()

    def close(self) -> None:
        if self._rw is not None:
            self._rw[1].close()
            self._rw = None


def _reusable(headers: dict[str, str]) -> bool:
    """Whether the server keeps the connection after a body it delimited."""
    return (headers.get("connection", "").lower() != "close" and
            ("chunked" in headers.get("transfer-encoding", "").lower()
             or "content-length" in headers))


async def _body_chunks(reader: asyncio.StreamReader,
                       headers: dict[str, str]) -> AsyncIterator[bytes]:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            if not size_line:
                return
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return
            data = await reader.readexactly(size)
            await reader.readline()  # CRLF after each chunk
            yield data
    elif "content-length" in headers:
        left = int(headers["content-length"])
        while left > 0:
            data = await reader.read(min(left, 1 << 16))
            if not data:
                return
            left -= len(data)
            yield data
    else:
        while data := await reader.read(1 << 16):
            yield data


async def get_text(url: str, timeout: float = 30) -> str:
    async def go() -> str:
        reader, writer, status, headers = await _open(url, "GET", None)
        try:
            body = b"".join([c async for c in _body_chunks(reader, headers)])
        finally:
            writer.close()
        if status != 200:
            raise HTTPError(f"GET {url}: HTTP {status}")
        return body.decode()
    return await asyncio.wait_for(go(), timeout)


async def post_sse(url: str, payload: dict[str, Any],
                   conn: Connection | None = None) -> AsyncGenerator[str, None]:
    """POST JSON; yield each server-sent event's data as it arrives ('[DONE]' included).
    With `conn` the request goes over that keep-alive connection, which stays open when
    the caller reads the stream to its end."""
    body = json.dumps(payload).encode()
    if conn is None:
        reader, writer, status, headers = await _open(url, "POST", body)
    else:
        reader, writer, status, headers = await conn.request(url, body)
    finished = False
    try:
        if status != 200:
            data = b"".join([c async for c in _body_chunks(reader, headers)])
            finished = True
            raise HTTPError(f"HTTP {status}: {data[:300].decode(errors='replace')}")
        buf = b""
        async for chunk in _body_chunks(reader, headers):
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if line.startswith(b"data:"):
                        yield line[5:].strip().decode()
        finished = True
    finally:
        if conn is None:
            writer.close()
        else:
            conn.release(finished and _reusable(headers))
