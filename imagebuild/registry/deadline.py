"""A bound on the time one command may spend waiting for a registry.

Per-read timeouts alone do not bound a command: a server that drips a byte a second, a
429 with `Retry-After: 86400`, or a `Link: next` chain without end each stay inside every
per-read limit. The client therefore charges every request, every streamed read and every
retry wait to one budget and stops when it is spent.

The budget counts time spent on the registry, not wall time since the command started:
`release` builds for an hour between two registry calls, and that hour is not the
registry's. Default 600 s; IMAGEBUILD_REGISTRY_DEADLINE sets another (seconds).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping

from imagebuild.errors import UserError

DEADLINE_ENV = "IMAGEBUILD_REGISTRY_DEADLINE"
DEFAULT_DEADLINE = 600.0
CLEANUP_GRACE = 30.0  # what clean-up may still spend once the budget is gone


def deadline_seconds(env: Mapping[str, str] | None = None) -> float:
    env = os.environ if env is None else env
    raw = env.get(DEADLINE_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_DEADLINE
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"{DEADLINE_ENV}={raw!r} is not a number of seconds above 0",
                        fix=f"e.g. {DEADLINE_ENV}=600, or unset it for the default "
                        f"({DEFAULT_DEADLINE:.0f} s)")
    return value


class Deadline:
    """The registry time left to one command. `running()` charges the time spent inside
    it (re-entrant: a token fetch inside a request is charged once)."""

    def __init__(self, seconds: float, clock=time.monotonic):
        self.seconds = seconds
        self.spent = 0.0
        self._clock = clock
        self._since: float | None = None
        self._depth = 0
        self._grace = 0.0
        self._lock = threading.Lock()

    def remaining(self) -> float:
        running = self._clock() - self._since if self._since is not None else 0.0
        return self.seconds + self._grace - self.spent - running

    @contextlib.contextmanager
    def grace(self, seconds: float = CLEANUP_GRACE) -> Iterator[Deadline]:
        """At least `seconds` more inside, whatever is left: clean-up after the budget
        ran out (putting a half-moved set back, releasing a lease) must still be sent,
        or the failure that spent the budget leaves a half move behind. Bounded all the
        same; what was spent inside still counts."""
        extra = max(0.0, seconds - self.remaining())
        self._grace += extra
        try:
            yield self
        finally:
            self._grace -= extra

    def expired(self) -> bool:
        return self.remaining() <= 0

    @contextlib.contextmanager
    def running(self) -> Iterator[Deadline]:
        """Charge the time inside; requests of several threads at once (a push's layers)
        are charged once, from the first one's start to the last one's end."""
        with self._lock:
            if self._depth == 0:
                self._since = self._clock()
            self._depth += 1
        try:
            yield self
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0 and self._since is not None:
                    self.spent += self._clock() - self._since
                    self._since = None
