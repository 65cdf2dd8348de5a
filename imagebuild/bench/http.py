"""A minimal HTTP/1.1 client on asyncio streams, for loopback vLLM servers only.

Why not a library: the project pins `requests` (blocking) only, and a streaming load
generator needs per-chunk arrival times with as little in between as possible. One
connection per request (`Connection: close`), chunked or sized bodies, nothing else.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit


class HTTPError(Exception):
    pass


def _split(url: str) -> tuple[str, int, str]:
    u = urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise HTTPError(f"only plain http URLs are supported, not {url!r}")
    return u.hostname, u.port or 80, (u.path or "/") + (f"?{u.query}" if u.query else "")


async def _open(url: str, method: str, body: bytes | None) -> tuple[
        asyncio.StreamReader, asyncio.StreamWriter, int, dict[str, str]]:
    host, port, path = _split(url)
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close",
            "Accept: */*"]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + (body or b""))
    await writer.drain()
    status_line = await reader.readline()
    parts = status_line.decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        writer.close()
        raise HTTPError(f"bad status line {status_line[:80]!r}")
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return reader, writer, int(parts[1]), headers


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


async def post_sse(url: str, payload: dict[str, Any]) -> AsyncIterator[str]:
    """POST JSON; yield each server-sent event's data as it arrives ('[DONE]' included)."""
    reader, writer, status, headers = await _open(url, "POST", json.dumps(payload).encode())
    try:
        if status != 200:
            body = b"".join([c async for c in _body_chunks(reader, headers)])
            raise HTTPError(f"HTTP {status}: {body[:300].decode(errors='replace')}")
        buf = b""
        async for chunk in _body_chunks(reader, headers):
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if line.startswith(b"data:"):
                        yield line[5:].strip().decode()
    finally:
        writer.close()
