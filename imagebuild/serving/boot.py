"""Wait for a container to serve, ending early on anything that means it never will.

Two waits on the one /health probe (`healthy`): smoke's `wait_ready`, which also reads
the log (fatal lines, the boot phase, the silent spawn hang), and `wait_healthy`, the
plain wait of the servers the release gates and the bench start (one container or a
multi-node cell's head)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import requests

from imagebuild import progress
from imagebuild.docker import engine
from imagebuild.errors import OperationFailed
from imagebuild.serving.logwatch import LogState, LogWatcher, exceptions, excerpt
from imagebuild.spec.servecmd import HOST

FATAL_GRACE_S = 1.5  # after a fatal line, keep reading this long for the rest of the trace
IDLE_CPU_PERCENT = 10.0  # docker stats scale: 100 = one core busy
POLL_S = 0.25
# /health is asked every HEALTH_EVERY_S while the log says the engine is still coming up,
# and at every POLL_S once it printed its ready line (the port answers within moments of
# it: a 1 s step there cost half a second per boot on average)
HEALTH_EVERY_S = 1.0


@dataclass(frozen=True)
class Container:
    """The running serve container: its name and the loopback port it serves on."""

    name: str
    port: int

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def running(self) -> bool:
        state = engine().container_state(self.name)
        return bool(state and state.get("Running"))

    def exit_code(self) -> int | None:
        state = engine().container_state(self.name)
        return int(state["ExitCode"]) if state and "ExitCode" in state else None

    def cpu_percent(self) -> float | None:
        return engine().cpu_percent(self.name)


@dataclass
class BootOutcome:
    kind: str  # ready | fatal | exited | timeout | stalled
    message: str
    phase: str
    seconds: float
    excerpt: str = ""
    fatal_line_s: float | None = None  # when the fatal line arrived, since launch
    exit_code: int | None = None

    @property
    def ready(self) -> bool:
        return self.kind == "ready"


def healthy(c: Container) -> bool:
    """The one /health probe: 200 within 2 s."""
    try:
        return requests.get(f"{c.base_url}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def wait_healthy(c: Container, *, timeout_s: float, waiting: Callable[[float], str],
                 exited: Callable[[], OperationFailed], timed_out: Callable[[], OperationFailed],
                 check: Callable[[], None] = lambda: None, poll_s: float = POLL_S) -> float:
    """Poll until /health answers; the seconds it took. On each round the progress line
    says `waiting(elapsed)`, then `check()` may end the wait (a multi-node cell's lost
    worker), then: healthy, or the container stopped (`exited()` is raised), or past
    `timeout_s` (`timed_out()`). Each caller words its own errors."""
    t0 = time.monotonic()
    while True:
        elapsed = time.monotonic() - t0
        progress.wait("boot", waiting(elapsed))
        check()
        if healthy(c):
            return time.monotonic() - t0
        if not c.running():
            raise exited()
        if time.monotonic() - t0 > timeout_s:
            raise timed_out()
        # smoke's poll step: a 1 s step cost half a second per boot on average
        time.sleep(poll_s)


def is_spawn_hang(state: LogState, now: float, stall_s: float, cpu: Callable[[], float | None]
                  ) -> bool:
    """The silent spawn hang of docs/domain.md: log frozen before weights load, CPU idle."""
    if state.silent_for(now) < stall_s or not state.could_be_spawn_hang():
        return False
    used = cpu()
    return used is not None and used < IDLE_CPU_PERCENT


def wait_ready(c: Container, watcher: LogWatcher, *, timeout_s: float, stall_s: float,
               tick: Callable[[float, str], None] = lambda elapsed, phase: None) -> BootOutcome:
    t0 = time.monotonic()
    next_health = t0
    while True:
        watcher.changed.wait(POLL_S)
        watcher.changed.clear()
        now = time.monotonic()
        s = watcher.snapshot()
        elapsed = now - t0
        tick(elapsed, s.phase)
        if s.fatal:
            deadline = now + FATAL_GRACE_S
            while time.monotonic() < deadline and watcher.snapshot().ended_at is None:
                time.sleep(0.1)
            s = watcher.snapshot()
            assert s.fatal_at is not None and s.fatal_index is not None
            cause = exceptions(s.lines)
            return BootOutcome("fatal", f"engine failed at boot: {s.fatal} (log line "
                               f"{s.fatal_index + 1})" + (f": {cause[0]}" if cause else ""),
                               s.phase, time.monotonic() - t0,
                               excerpt(s.lines, s.fatal_index, after=len(s.lines)),
                               fatal_line_s=s.fatal_at - t0)
        if s.ended_at is not None:
            code = c.exit_code()
            cause = exceptions(s.lines)
            return BootOutcome("exited", f"the container exited (code {code}) during boot, "
                               f"in phase {s.phase}" + (f": {cause[0]}" if cause else ""),
                               s.phase, elapsed,
                               excerpt(s.lines), exit_code=code,
                               fatal_line_s=(s.ended_at - t0))
        if now >= next_health or s.phase == "ready":
            if healthy(c):
                return BootOutcome("ready", f"/health 200 after {elapsed:.1f}s", "ready",
                                   time.monotonic() - t0)
            next_health = now + HEALTH_EVERY_S
        if elapsed >= timeout_s:
            return BootOutcome("timeout", f"not healthy after {timeout_s:.0f}s (boot timeout); "
                               f"last phase from the logs: {s.phase}", s.phase, elapsed,
                               excerpt(s.lines, before=25, after=0))
        if is_spawn_hang(s, now, stall_s, c.cpu_percent):
            return BootOutcome("stalled", f"log silent for {s.silent_for(now):.0f}s in phase "
                               f"{s.phase} with the engine idle: the silent spawn hang",
                               s.phase, elapsed, excerpt(s.lines, before=15, after=0))
