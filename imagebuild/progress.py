"""Progress a person can follow: one line per stage and cell, with the elapsed time and
what the stage is waiting for (a build step, a boot phase, pushed bytes, a bench level).

    [progress  1:02] smoke cpu/cpu-tiny-ngram  21.4s  boot: loading the model
    [progress  4:31] publish cpu/cpu-tiny-ngram  12.0s  push: 1,204 of 6,495 MB

Stages open with `stage(name, cell)`; code deep inside a stage reports with
`wait(what, detail)` and needs no handle (a context variable knows the stage). A new
`what` always prints a line. A new `detail` of the same `what` (a byte counter) redraws
the line in place on a terminal, and elsewhere (a GitHub Actions log, a file) prints at
most one line per HEARTBEAT_S: no carriage returns where they would pile up. Lines go to
stderr, next to the stages' own output; while a line waits to be redrawn, whatever else
the stage prints to the terminal (stdout or stderr) first ends it, so a result never runs
on into a counter (`_EndsRedraw`).
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TextIO

HEARTBEAT_S = 15.0
POLL_S = 1.0
Poll = Callable[[], "tuple[str, str] | None"]  # (what, detail) a stage waits for now
_T0 = time.monotonic()  # the run's start: every line shows the time since it


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


@dataclass
class Stage:
    name: str
    cell: str
    out: TextIO
    tty: bool
    started: float = field(default_factory=lambda: time.monotonic())
    what: str | None = None
    detail: str = ""
    printed_at: float = 0.0
    redrawing: bool = False  # a terminal line waits for its newline
    lock: threading.Lock = field(default_factory=threading.Lock)

    def line(self, text: str) -> str:
        now = time.monotonic()
        return (f"[progress {_clock(now - _T0):>5}] {self.name} {self.cell}  "
                f"{now - self.started:5.1f}s  {text}")

    def _emit(self, text: str, *, redraw: bool = False) -> None:
        global _redrawing
        if self.redrawing and not redraw:
            self.out.write("\n")
        if redraw:
            self.out.write("\r\x1b[2K" + text)
        else:
            self.out.write(text + "\n")
        self.redrawing = redraw
        _redrawing = self if redraw else None
        self.out.flush()
        self.printed_at = time.monotonic()

    def end_redraw(self) -> None:
        """End a line waiting to be redrawn: someone else writes to the terminal."""
        global _redrawing
        with self.lock:
            if self.redrawing:
                self.out.write("\n")
                self.out.flush()
                self.redrawing = False
            _redrawing = None

    def wait(self, what: str, detail: str = "") -> None:
        with self.lock:
            self._wait(what, detail)

    def _wait(self, what: str, detail: str) -> None:
        if what == self.what and detail == self.detail:
            return
        new = what != self.what
        self.what, self.detail = what, detail
        text = self.line(f"{what}: {detail}" if detail else what)
        if new:
            self._emit(text)
        elif self.tty:
            self._emit(text, redraw=True)
        elif time.monotonic() - self.printed_at >= HEARTBEAT_S:
            self._emit(text)

    def finish(self, outcome: str) -> None:
        with self.lock:
            self._emit(self.line(outcome))


_redrawing: Stage | None = None  # the stage whose terminal line has no newline yet


class _EndsRedraw:
    """A terminal stream (stdout or stderr) that ends a pending progress line before it
    writes; anything else is the stream's own."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, text: str) -> int:
        st = _redrawing
        if st is not None and text:
            st.end_redraw()
        return self._stream.write(text)

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


def _unwrapped(stream: TextIO) -> TextIO:
    return stream._stream if isinstance(stream, _EndsRedraw) else stream


@contextlib.contextmanager
def _terminal_writes_end_redraws(tty: bool) -> Iterator[None]:
    """While a stage redraws on a terminal, sys.stdout and sys.stderr end its line first."""
    if not tty or isinstance(sys.stdout, _EndsRedraw) or isinstance(sys.stderr, _EndsRedraw):
        yield  # a log gets no redraws; an outer stage has wrapped them already
        return
    before = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _EndsRedraw(before[0]), _EndsRedraw(before[1])  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = before


_current: contextvars.ContextVar[Stage | None] = contextvars.ContextVar("stage", default=None)


@contextlib.contextmanager
def stage(name: str, cell: str, out: TextIO | None = None,
          poll: Poll | None = None) -> Iterator[Stage]:
    """A stage of one cell: a line when it starts, when it waits for something new, and
    when it ends (with how it ended). `poll`, asked every POLL_S from a thread, tells
    what the stage waits for when its code cannot say (it runs in another process)."""
    out = _unwrapped(out or sys.stderr)
    st = Stage(name, cell, out, tty=out.isatty())
    st._emit(st.line("started"))
    token = _current.set(st)
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(POLL_S):
            try:
                found = poll() if poll else None
            except Exception:  # noqa: BLE001 - progress must never break a stage
                found = None
            if found:
                st.wait(*found)

    watcher = threading.Thread(target=watch, daemon=True, name=f"progress-{name}")
    if poll:
        watcher.start()
    try:
        with _terminal_writes_end_redraws(st.tty):
            yield st
    except BaseException as exc:
        st.finish(f"stopped: {type(exc).__name__}")
        raise
    else:
        st.finish(f"done in {time.monotonic() - st.started:.1f}s")
    finally:
        stop.set()
        if poll:
            watcher.join(timeout=5)
        _current.reset(token)


def wait(what: str, detail: str = "") -> None:
    """Report what the current stage waits for (nothing happens outside a stage)."""
    st = _current.get()
    if st is not None:
        st.wait(what, detail)
