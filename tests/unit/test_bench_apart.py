"""The load generator in its own process (bench/apart.py): same figures, and no delay
from whatever else the calling process runs."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from imagebuild.bench import apart, client, prompts
from imagebuild.errors import OperationFailed
from tests.unit.test_bench_client import TOKENS, _serve


@contextmanager
def _server_thread() -> Iterator[str]:
    """The timed SSE server of test_bench_client, on a loop in a thread of its own."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, object] = {}

    async def main() -> None:
        box["stop"] = stop = asyncio.Event()
        server = await asyncio.start_server(_serve, "127.0.0.1", 0)
        box["url"] = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        started.set()
        async with server:
            await stop.wait()

    t = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    t.start()
    started.wait(10)
    try:
        yield str(box["url"])
    finally:
        loop.call_soon_threadsafe(box["stop"].set)  # type: ignore[attr-defined]
        t.join(5)
        loop.close()


@contextmanager
def _gil_hog() -> Iterator[None]:
    """A thread of this process that never waits: it holds the interpreter lock for a
    full switch interval whenever it gets it."""
    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def test_a_level_run_apart_is_the_level_run_here_and_ticks_per_request() -> None:
    load = client.Load("tiny", requests=6)
    ticks = []
    with _server_thread() as url:
        level = apart.run_level(url, prompts.BUILTIN["structured"], 3, load,
                                tick=lambda: ticks.append(1))
    assert level.concurrency == 3 and len(level.results) == 6 == len(ticks)
    assert all(r.ok and r.output_tokens == TOKENS for r in level.results)
    assert all(len(r.itl_s) == TOKENS - 1 for r in level.results)
    assert level.client is not None and level.client.lag_ms and level.wall_s > 0
    assert apart.level_from_dict(apart.level_to_dict(level)) == level


@pytest.mark.alone  # compares delays: a test of the other lane beside it adds its own
def test_a_busy_thread_here_delays_a_client_here_but_not_one_apart() -> None:
    """The CI failure this module exists for: the same level, the caller holding the
    interpreter lock from another thread. In-process the client's 5 ms timer fires a
    switch interval late; the child's does not."""
    load = client.Load("tiny", requests=8)
    ps = prompts.BUILTIN["structured"]
    with _server_thread() as url, _gil_hog():
        here = asyncio.run(client.run_level(url, ps, 4, load))
        away = apart.run_level(url, ps, 4, load)
    assert here.client is not None and away.client is not None
    assert here.client.lag_p90_ms() >= 3.0, here.client.lag_ms
    assert away.client.lag_p90_ms() < 2.0, away.client.lag_ms


def test_a_child_that_dies_is_an_error_naming_the_level(monkeypatch) -> None:
    # an interpreter that exits at once, reporting nothing
    monkeypatch.setattr(apart.sys, "executable", "/bin/false")
    with pytest.raises(OperationFailed, match="c=2 .* exited with code 1"):
        apart.run_level("http://127.0.0.1:9", prompts.BUILTIN["structured"], 2,
                        client.Load("tiny", requests=2))


def test_an_interrupted_level_leaves_no_child_behind() -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt

    before = _children()
    with _server_thread() as url, pytest.raises(KeyboardInterrupt):
        apart.run_level(url, prompts.BUILTIN["structured"], 2,
                        client.Load("tiny", requests=50), tick=interrupted)
    assert _children() == before


def _children() -> set[int]:
    """Live child processes of this one (from /proc: no process library here)."""
    me = str(os.getpid())
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            out.add(int(stat.parent.name))
    return out
