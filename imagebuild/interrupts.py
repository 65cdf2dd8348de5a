"""Interrupts (Ctrl-C, SIGTERM) end a run cleanly: SIGTERM takes Ctrl-C's path, and a
container operation that must not be cut in half holds them until it is done."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def held_interrupts() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is done, then stop the run as
    KeyboardInterrupt: around creating a container (an interrupt between the engine
    creating it and us learning its id would leave it behind) and removing one.

    The handlers only note the signal. Python runs signal handlers in the main thread
    whichever thread the kernel delivered the signal to, so this holds for every thread
    (blocking with pthread_sigmask would not: a process-directed signal goes to any
    thread that has it unblocked). Outside the main thread nothing can be held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: seen.append(signum))
                for s in INTERRUPTS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if seen:
            raise KeyboardInterrupt(f"signal {seen[0]} during a container operation")


@contextlib.contextmanager
def interrupts_as_keyboard_interrupt() -> Iterator[None]:
    """SIGTERM (a CI cancel, `kill`) takes the same clean-up path as Ctrl-C."""
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
