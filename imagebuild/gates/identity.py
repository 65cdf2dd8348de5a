"""Did the server stay the same server for the whole run? A result measured across a
restart compares tokens of two different processes (and hides the crash that caused
it), so it cannot be trusted: its gate says `untrusted`, never `pass`.

Seen three ways: the container's start time or main process id changed (a restart
policy, a supervisor), Docker counted a restart, or the log gained a boot line (an
engine brought up again inside the same container)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from imagebuild.docker import engine

BOOT_LINE = re.compile(rb"Application startup complete")


@dataclass(frozen=True)
class Identity:
    running: bool
    started_at: str
    pid: int
    restarts: int
    boot_lines: int

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def identity(container: str) -> Identity:
    state = engine().container_state(container) or {}
    log = b"".join(engine().logs(container, follow=False))
    return Identity(running=bool(state.get("Running")),
                    started_at=str(state.get("StartedAt") or ""),
                    pid=int(state.get("Pid") or 0),
                    restarts=int(state.get("RestartCount") or 0),
                    boot_lines=len(BOOT_LINE.findall(log)))


def changed(before: Identity, after: Identity) -> str | None:
    """Why `after` is not the server `before` was, or None."""
    if not after.running:
        return "the server was no longer running after the requests"
    if (after.started_at, after.pid) != (before.started_at, before.pid):
        return (f"the container restarted during the run (started {before.started_at}, "
                f"pid {before.pid}; then started {after.started_at}, pid {after.pid})")
    if after.restarts != before.restarts:
        return f"Docker restarted the container {after.restarts - before.restarts} time(s)"
    if after.boot_lines != before.boot_lines:
        return ("the server booted again inside the container during the run "
                f"({before.boot_lines} boot line(s) before the requests, "
                f"{after.boot_lines} after)")
    return None
