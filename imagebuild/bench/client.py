"""The load generator: streaming chat requests at a fixed concurrency, timed per chunk.

Figures follow vLLM's own benchmark (vllm/benchmarks/serve.py) so the two agree:
TTFT is the first streamed chunk that carries a choice, ITL the gaps between later chunks,
TPOT (E2E - TTFT) / (output tokens - 1), output tokens from the stream's usage record.
`ignore_eos` keeps output lengths fixed, so releases are compared on the same work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from imagebuild.bench import http, metrics
from imagebuild.bench.prompts import Prompt


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


async def one_request(url: str, body: dict[str, Any],
                      conn: http.Connection | None = None) -> RequestResult:
    r = RequestResult(ok=False, start=time.perf_counter())
    last = end = r.start  # last chunk with a choice; last chunk of any kind
    try:
        # read to the end of the body (it closes right after [DONE]), so the keep-alive
        # connection can carry the next request
        async with contextlib.aclosing(http.post_sse(url, body, conn)) as stream:
            async for data in stream:
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
    except (OSError, http.HTTPError, ValueError, asyncio.IncompleteReadError) as exc:
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
    await one_request(url, payload(load.model, prompts[0], load))
    before = await _scrape(base_url)
    results: list[RequestResult] = []
    counter = iter(range(1 << 30))
    cpu0, t0 = time.process_time(), time.perf_counter()
    deadline = t0 + load.duration_s if load.duration_s else None

    def next_index() -> int | None:
        i = next(counter)
        if load.requests is not None and i >= load.requests:
            return None
        if deadline is not None and time.perf_counter() >= deadline:
            return None
        return i

    async def worker() -> None:
        conn = http.Connection()
        try:
            while (i := next_index()) is not None:
                results.append(await one_request(
                    url, payload(load.model, prompts[i % len(prompts)], load), conn))
                tick()
        finally:
            conn.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    after = await _scrape(base_url)
    server = metrics.delta(before, after) if before is not None and after is not None else None
    return Level(concurrency, results, wall, cpu, server)


async def _scrape(base_url: str) -> dict[str, float] | None:
    try:
        return metrics.parse(await http.get_text(base_url + "/metrics"))
    except (TimeoutError, OSError, http.HTTPError):
        return None


async def served_model(base_url: str) -> str:
    """The first name /v1/models lists (the server's primary --served-model-name)."""
    data = json.loads(await http.get_text(base_url + "/v1/models"))
    return str(data["data"][0]["id"])
