"""How much the load generator itself was held back during a level.

A client that cannot run when a chunk arrives timestamps it late: tokens that left the
server milliseconds apart are read together and look like a burst (issue 15: every token
of a request "arrived" at the end). Three views of the client's own process, taken around
each level:
- CPU time (`time.process_time`): the client's cost, per request in every table;
- run-queue wait of the event-loop thread (Linux schedstat): time it was runnable but
  another task held the CPU, i.e. starved by the server or a neighbour;
- event-loop lag: how late a 5 ms timer fires, the delay any chunk read suffers on top.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

LAG_TICK_S = 0.005
SCHEDSTAT = Path("/proc/thread-self/schedstat")


def run_queue_wait_s() -> float | None:
    """Seconds this thread has spent runnable but waiting for a CPU (None off Linux)."""
    try:
        return int(SCHEDSTAT.read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class ClientLoad:
    """What the client's process went through during one level."""

    cpu_s: float = 0.0  # CPU time of this process
    wait_s: float | None = None  # run-queue wait of the event-loop thread
    lag_ms: list[float] = field(default_factory=list)  # timer lateness samples

    def lag_p90_ms(self) -> float | None:
        if not self.lag_ms:
            return None
        v = sorted(self.lag_ms)
        return v[min(len(v) - 1, int(0.9 * len(v)))]


@contextlib.asynccontextmanager
async def watching() -> AsyncIterator[ClientLoad]:
    """Measure the client's own load while the body runs (call from the event loop)."""
    load = ClientLoad()
    cpu0, wait0 = time.process_time(), run_queue_wait_s()

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(LAG_TICK_S)
            load.lag_ms.append(max(0.0, (loop.time() - t - LAG_TICK_S) * 1000))

    task = asyncio.create_task(ticker())
    try:
        yield load
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        load.cpu_s = time.process_time() - cpu0
        wait1 = run_queue_wait_s()
        load.wait_s = wait1 - wait0 if wait0 is not None and wait1 is not None else None
