"""The load generator: streaming chat requests at a fixed concurrency, timed per chunk.

Figures follow vLLM's own benchmark (vllm/benchmarks/serve.py) so the two agree:
TTFT is the first streamed chunk that carries a choice, ITL the gaps between later chunks,
TPOT (E2E - TTFT) / (output tokens - 1), output tokens from the stream's usage record.
`ignore_eos` keeps output lengths fixed, so releases are compared on the same work.

HTTP is aiohttp, as in vLLM's benchmark. Each worker owns one session holding one
keep-alive connection, so the server pays no accept and handshake per request (real
clients do not make it pay them either) and workers never wait on each other's pool.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from imagebuild.bench import clientcpu, metrics
from imagebuild.bench.prompts import Prompt

# a level of long generations on a slow host may take minutes; a hung server must not
# hang the bench forever (vLLM's benchmark allows 6 h)
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=3600, sock_connect=30)
SMALL_TIMEOUT = aiohttp.ClientTimeout(total=30)


@dataclass
class RequestResult:
    ok: bool
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    output_tokens: int = 0
    itl_s: list[float] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0
    error: str = ""

    @property
    def tpot_s(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass
class Level:
    concurrency: int
    results: list[RequestResult]
    wall_s: float
    client_cpu_s: float  # this process's CPU time during the level
    server: metrics.LevelMetrics | None
    client: clientcpu.ClientLoad | None = None  # how held back the client itself was


@dataclass(frozen=True)
class Load:
    model: str
    max_tokens: int = 128
    requests: int | None = 32  # per level; or
    duration_s: float | None = None  # per level, new requests stop after it
    temperature: float = 0.0


def payload(model: str, prompt: Prompt, load: Load) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt.text}],
            "max_tokens": load.max_tokens, "temperature": load.temperature,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


def worker_session() -> aiohttp.ClientSession:
    """One keep-alive connection, no proxy from the environment (loopback servers)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1),
                                 timeout=REQUEST_TIMEOUT, trust_env=False)


async def _events(resp: aiohttp.ClientResponse):
    """Server-sent events' data fields as they arrive ('[DONE]' included)."""
    buf = b""
    async for chunk in resp.content.iter_any():
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    yield line[5:].strip().decode()


async def one_request(session: aiohttp.ClientSession, url: str,
                      body: dict[str, Any]) -> RequestResult:
    r = RequestResult(ok=False, start=time.perf_counter())
    last = end = r.start  # last chunk with a choice; last chunk of any kind
    try:
        for attempt in (0, 1):
            try:
                resp = await session.post(url, json=body)
                break
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                # before any response: a kept-alive connection the server had closed while
                # idle. Once more, on a fresh connection
                if attempt:
                    raise
                r.start = last = end = time.perf_counter()
        async with resp:
            if resp.status != 200:
                text = (await resp.read())[:300].decode(errors="replace")
                raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status,
                                                  message=f"HTTP {resp.status}: {text}")
            async for data in _events(resp):
                now = time.perf_counter()
                if data == "[DONE]":
                    continue
                chunk = json.loads(data)
                if chunk.get("choices"):
                    if not r.ttft_s:
                        r.ttft_s = now - r.start
                    else:
                        r.itl_s.append(now - last)
                    last = now
                if chunk.get("usage"):
                    r.output_tokens = int(chunk["usage"].get("completion_tokens") or 0)
                end = now
        r.ok = r.ttft_s > 0 and r.output_tokens > 0
        r.error = "" if r.ok else "stream ended without tokens"
    except aiohttp.ClientResponseError as exc:
        r.error = exc.message[:300]
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
        r.error = f"{type(exc).__name__}: {exc}"[:300]
    r.end = time.perf_counter()
    r.e2e_s = end - r.start
    return r


async def run_level(base_url: str, prompts: list[Prompt], concurrency: int, load: Load,
                    tick: Callable[[], None] = lambda: None) -> Level:
    """Keep `concurrency` requests in flight; prompts are taken in order, round-robin."""
    url = base_url + "/v1/chat/completions"
    # one uncounted request first, as vLLM's benchmark does: the first request after boot
    # pays one-off warm-up costs that are no property of the release
    async with worker_session() as s:
        await one_request(s, url, payload(load.model, prompts[0], load))
    before = await _scrape(base_url)
    results: list[RequestResult] = []
    counter = iter(range(1 << 30))
    t0 = time.perf_counter()
    deadline = t0 + load.duration_s if load.duration_s else None

    def next_index() -> int | None:
        i = next(counter)
        if load.requests is not None and i >= load.requests:
            return None
        if deadline is not None and time.perf_counter() >= deadline:
            return None
        return i

    async def worker() -> None:
        async with worker_session() as session:
            while (i := next_index()) is not None:
                results.append(await one_request(
                    session, url, payload(load.model, prompts[i % len(prompts)], load)))
                tick()

    async with clientcpu.watching() as held:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    after = await _scrape(base_url)
    server = metrics.delta(before, after) if before is not None and after is not None else None
    return Level(concurrency, results, wall, held.cpu_s, server, held)


async def get_text(url: str) -> str:
    async with aiohttp.ClientSession(timeout=SMALL_TIMEOUT, trust_env=False) as s, \
            s.get(url) as resp:
        if resp.status != 200:
            raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status,
                                              message=f"GET {url}: HTTP {resp.status}")
        return await resp.text()


async def _scrape(base_url: str) -> dict[str, float] | None:
    try:
        return metrics.parse(await get_text(base_url + "/metrics"))
    except (TimeoutError, aiohttp.ClientError, OSError):
        return None


async def served_model(base_url: str) -> str:
    """The first name /v1/models lists (the server's primary --served-model-name)."""
    data = json.loads(await get_text(base_url + "/v1/models"))
    return str(data["data"][0]["id"])
