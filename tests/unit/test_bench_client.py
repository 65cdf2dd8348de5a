"""The streaming client against a loopback SSE server whose timing we control."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from imagebuild.bench import client, prompts
from imagebuild.bench.prompts import Prompt

FIRST_DELAY, GAP, TOKENS = 0.15, 0.02, 5


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    line = await reader.readline()
    length = 0
    while (h := await reader.readline()) not in (b"\r\n", b""):
        if h.lower().startswith(b"content-length:"):
            length = int(h.split(b":")[1])
    body = json.loads(await reader.readexactly(length)) if length else {}
    if line.startswith(b"GET /v1/models"):
        data = json.dumps({"data": [{"id": "tiny"}, {"id": "tiny-alias"}]}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    elif body.get("model") != "tiny":
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno")
    else:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                     b"Content-Type: text/event-stream\r\n\r\n")

        def chunk(obj: object) -> bytes:
            data = f"data: {json.dumps(obj) if not isinstance(obj, str) else obj}\n\n".encode()
            return b"%x\r\n%s\r\n" % (len(data), data)

        await asyncio.sleep(FIRST_DELAY)
        for i in range(TOKENS):
            if i:
                await asyncio.sleep(GAP)
            writer.write(chunk({"choices": [{"delta": {"content": "x"}}]}))
            await writer.drain()
        writer.write(chunk({"choices": [], "usage": {"completion_tokens": TOKENS}}))
        writer.write(chunk("[DONE]") + b"0\r\n\r\n")
    await writer.drain()
    writer.close()


async def _with_server(fn):
    server = await asyncio.start_server(_serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        return await fn(f"http://127.0.0.1:{port}")
    finally:
        server.close()


def test_one_request_times_first_chunk_and_gaps() -> None:
    async def go(base: str) -> client.RequestResult:
        body = client.payload("tiny", Prompt("t", "t", "hi"), client.Load("tiny"))
        async with client.worker_session() as session:
            return await client.one_request(session, base + "/v1/chat/completions", body)

    r = asyncio.run(_with_server(go))
    assert r.ok and r.output_tokens == TOKENS
    assert r.ttft_s == pytest.approx(FIRST_DELAY, abs=0.05)
    assert len(r.itl_s) == TOKENS - 1
    assert all(g == pytest.approx(GAP, abs=0.03) for g in r.itl_s)
    assert r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / (TOKENS - 1))


def test_http_error_is_a_counted_error_not_an_exception() -> None:
    async def go(base: str) -> client.RequestResult:
        body = client.payload("other", Prompt("t", "t", "hi"), client.Load("other"))
        async with client.worker_session() as session:
            return await client.one_request(session, base + "/v1/chat/completions", body)

    r = asyncio.run(_with_server(go))
    assert not r.ok and "HTTP 404" in r.error


def test_level_keeps_concurrency_in_flight() -> None:
    load = client.Load("tiny", requests=8)

    async def go(base: str) -> client.Level:
        assert await client.served_model(base) == "tiny"
        return await client.run_level(base, prompts.BUILTIN["structured"], 4, load)

    t0 = time.perf_counter()
    level = asyncio.run(_with_server(go))
    wall = time.perf_counter() - t0
    one = FIRST_DELAY + GAP * (TOKENS - 1)
    assert len(level.results) == 8 and all(r.ok for r in level.results)
    assert wall < 3.5 * one  # 8 requests at c=4: two rounds, not eight
    assert level.server is None  # this server has no /metrics


def test_builtin_prompts_are_fixed_and_jsonl_is_checked(tmp_path) -> None:
    a = prompts.select("structured,prose")
    assert a == prompts.select("structured,prose")
    assert {p.kind for p in a} == {"code", "math", "extraction", "prose"}
    f = tmp_path / "mine.jsonl"
    f.write_text('{"prompt": "one"}\n\n{"prompt": "two", "kind": "qa"}\n')
    assert [p.text for p in prompts.select(f"prose,{f}")][-2:] == ["one", "two"]
    f.write_text('{"text": "no prompt key"}\n')
    with pytest.raises(prompts.UserError, match=":1: needs"):
        prompts.select(str(f))
    with pytest.raises(prompts.UserError, match="unknown prompt set"):
        prompts.select("poetry")


def test_workers_keep_their_connection_alive_and_survive_a_server_close() -> None:
    """One connection per worker across requests (as aiohttp in vLLM's benchmark); a
    server that closes an idle connection costs a reconnect, not an error."""
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        served = 0
        while (line := await reader.readline()):
            length = 0
            while (h := await reader.readline()) not in (b"\r\n", b""):
                if h.lower().startswith(b"content-length:"):
                    length = int(h.split(b":")[1])
            await reader.readexactly(length)
            if not line.startswith(b"POST"):
                data = json.dumps({"data": [{"id": "tiny"}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(data)
                             + data)
                break
            events = b"".join(
                f"data: {e}\n\n".encode() for e in (
                    json.dumps({"choices": [{"delta": {"content": "x"}}]}),
                    json.dumps({"choices": [], "usage": {"completion_tokens": 2}}), "[DONE]"))
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + b"%x\r\n%s\r\n0\r\n\r\n" % (len(events), events))
            await writer.drain()
            served += 1
            if served == 3:  # as a keep-alive timeout would
                break
        writer.close()

    async def go() -> client.Level:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            return await client.run_level(base, prompts.BUILTIN["structured"], 2,
                                          client.Load("tiny", requests=8))
        finally:
            server.close()

    level = asyncio.run(go())
    assert len(level.results) == 8 and all(r.ok for r in level.results), level.results
    # warm-up and the two /metrics scrapes (3, one each) + 8 requests over 2 workers whose
    # connections the server drops after 3 requests (at most 4); one per request is 11
    assert connections <= 7
