"""Follow a container's log from its first line: boot phase, fatal lines, stalls.

Following a container's log replays it from the start, so following right after the
container starts misses nothing. The stream ends when the container exits, which is
itself a verdict. Patterns are vLLM 0.23's own messages (v1/engine/core.py,
v1/engine/utils.py, ...) and the failures seen on DGX Spark deployments (docs/domain.md).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from imagebuild.docker import DockerEngine, engine

# (name, pattern): the first match ends the boot wait at once.
FATAL = (
    ("KV page-size assert (unify_kv_cache_spec_page_size)",
     re.compile(r"unify_kv_cache_spec_page_size")),
    ("engine init failed",
     re.compile(r"Engine core initialization failed|EngineCore failed to start|"
                r"WorkerProc initialization failed|WorkerProc failed to start")),
    ("CUDA out of memory", re.compile(r"CUDA out of memory|torch\.OutOfMemoryError")),
)
TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
# Boot phases in the order a healthy boot passes them; a later match moves the phase on.
PHASES = (
    ("engine starting", re.compile(r"vLLM API server version|Initializing a V1 LLM engine|"
                                   r"EngineCore|non-default args")),
    ("loading weights", re.compile(r"Starting to load model|Loading weights|"
                                   r"Loading safetensors checkpoint")),
    ("compiling", re.compile(r"torch\.compile|Compiling a graph|Dynamo bytecode|"
                             r"Warming up model")),
    ("capturing graphs", re.compile(r"Capturing CUDA graph|Graph capturing")),
    ("ready", re.compile(r"Application startup complete|Uvicorn running on")),
)
PHASE_ORDER = ("starting",) + tuple(name for name, _ in PHASES)
# Before this phase a silent log is the spawn hang (docs/domain.md: no EngineCore start line,
# weights never loaded); after it, quiet means work (compiling) or an idle healthy server.
STALL_BEFORE = "loading weights"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def fatal_of(line: str) -> str | None:
    for name, pattern in FATAL:
        if pattern.search(line):
            return name
    return None


def phase_after(phase: str, line: str) -> str:
    """The boot phase once `line` is seen; phases never move backwards."""
    best = PHASE_ORDER.index(phase)
    for name, pattern in PHASES:
        if pattern.search(line):
            best = max(best, PHASE_ORDER.index(name))
    return PHASE_ORDER[best]


# vLLM's line prefix: "(EngineCore pid=28) ERROR 11-30 01:25:53 [core.py:1195] "
PREFIX = re.compile(r"^(\(\w+ pid=\d+\)\s*)?([A-Z]+ \d\d-\d\d [\d:.]+ \[[^\]]+\]\s?)?")
EXCEPTION = re.compile(r"^([\w.]+(Error|Exception|Exit)|AssertionError)\b(:|$)")


def exceptions(lines: list[str], limit: int = 8) -> list[str]:
    """The exception lines of every traceback (their root causes), first seen first."""
    found: list[str] = []
    for line in lines:
        payload = PREFIX.sub("", line).strip()
        if EXCEPTION.match(payload) and payload not in found:
            found.append(payload)
    return found[:limit]


def excerpt(lines: list[str], at: int | None = None, *, before: int = 40, after: int = 5,
            limit: int = 80) -> str:
    """The exceptions raised, then the lines around `at` (default: the end) starting at
    the traceback that leads to it."""
    if not lines:
        return "(the container printed nothing)"
    at = len(lines) - 1 if at is None else at
    start = max(0, at - before)
    for i in range(at, start - 1, -1):
        if TRACEBACK.search(lines[i]):
            start = i
            break
    chunk = lines[start:min(len(lines), at + after + 1)]
    if len(chunk) > limit:
        chunk = chunk[:15] + ["  [...]"] + chunk[-(limit - 16):]
    raised = exceptions(lines[:at + after + 1])
    head = (["exceptions raised:"] + [f"  {e}" for e in raised] + ["--- log ---"]
            if raised else [])
    return "\n".join(head + chunk)


@dataclass
class LogState:
    lines: list[str] = field(default_factory=list)
    phase: str = "starting"
    fatal: str | None = None
    fatal_index: int | None = None
    fatal_at: float | None = None  # monotonic time the fatal line arrived
    last_line_at: float = field(default_factory=time.monotonic)
    started_at: float = field(default_factory=time.monotonic)
    ended_at: float | None = None  # the log stream closed: the container stopped

    def feed(self, line: str, now: float) -> None:
        self.lines.append(line)
        self.last_line_at = now
        self.phase = phase_after(self.phase, line)
        if self.fatal is None:
            kind = fatal_of(line)
            if kind:
                self.fatal, self.fatal_index, self.fatal_at = kind, len(self.lines) - 1, now

    def silent_for(self, now: float) -> float:
        return now - self.last_line_at

    def could_be_spawn_hang(self) -> bool:
        return PHASE_ORDER.index(self.phase) < PHASE_ORDER.index(STALL_BEFORE)


class LogWatcher:
    """A thread copying the container's log (followed through the Docker seam) into a file
    and a LogState. The stream ends when the container stops or is removed."""

    def __init__(self, container: str, log_path: Path, eng: DockerEngine | None = None):
        self.container = container
        self.eng = eng  # None: the process-wide engine (another: a partner node's)
        self.log_path = log_path
        self.state = LogState()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"logs-{container}",
                                        daemon=True)
        self.changed = threading.Event()  # set on every line and at the end

    def start(self) -> LogWatcher:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def _line(self, out, raw: bytes) -> None:  # noqa: ANN001
        line = ANSI.sub("", raw.decode("utf-8", "replace").rstrip("\r\n"))
        out.write(line + "\n")
        out.flush()  # the check suite reads this file while we write it
        with self._lock:
            self.state.feed(line, time.monotonic())
        self.changed.set()

    def _run(self) -> None:
        pending = b""
        with self.log_path.open("w", encoding="utf-8") as out:
            for chunk in (self.eng or engine()).logs(self.container, follow=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    self._line(out, raw)
            if pending:
                self._line(out, pending)
        with self._lock:
            self.state.ended_at = time.monotonic()
        self.changed.set()

    def snapshot(self) -> LogState:
        with self._lock:
            s = self.state
            return LogState(lines=list(s.lines), phase=s.phase, fatal=s.fatal,
                            fatal_index=s.fatal_index, fatal_at=s.fatal_at,
                            last_line_at=s.last_line_at, started_at=s.started_at,
                            ended_at=s.ended_at)

    def stop(self, timeout: float = 5) -> None:
        """Wait for the stream to end (it does once the container is gone)."""
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)
