"""What the build and smoke stages wait for, read from what they already write: the
builder's log lines and its BuildKit log file, the smoke suite's container log and boot
record. Polled by a stage's progress line (progress.stage(..., poll=...)), so neither
stage needs to know about progress.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from imagebuild import progress
from imagebuild.serving.logwatch import phase_after

_BUILDING = re.compile(r"^\[(\w+)\] building (\S+) .*; log: (.+)$")
_UP_TO_DATE = re.compile(r"^\[(\w+)\] (\S+): up to date")
_STEP = re.compile(r"^#\d+ \[([^\]]+)\] (?!FROM )(.*)")


def _tail(path: Path, size: int = 16384) -> list[str]:
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - size))
            return fh.read().decode(errors="replace").splitlines()
    except OSError:
        return []


class BuildWatch:
    """The builder's `log`: prints each line and notes which image is being built and
    where BuildKit writes; `poll` names the step running now."""

    def __init__(self) -> None:
        self.kind = ""
        self.log_path: Path | None = None

    def log(self, line: str) -> None:
        print(line, flush=True)
        if m := _BUILDING.match(line):
            self.kind, self.log_path = m[1], Path(m[3].strip())
            progress.wait(f"{self.kind} image", "BuildKit starts")
        elif m := _UP_TO_DATE.match(line):
            self.log_path = None
            progress.wait(f"{m[1]} image", "up to date, not rebuilt")

    def poll(self) -> tuple[str, str] | None:
        if self.log_path is None:
            return None
        steps = [m for line in _tail(self.log_path) if (m := _STEP.match(line))]
        if not steps:
            return None
        # each step is news (a line of its own), not a counter
        return f"{self.kind} image: [{steps[-1][1]}] {steps[-1][2][:90]}", ""


class SmokeWatch:
    """The smoke suite of one cell writing into `out`: the boot phase its container log
    shows, then the checks once the boot record is written."""

    def __init__(self, out: Path) -> None:
        self.out, self.since = out, time.time()
        self.phase, self.seen = "starting", 0

    def _fresh(self, name: str) -> Path | None:
        path = self.out / name
        try:
            return path if path.stat().st_mtime >= self.since else None
        except OSError:
            return None

    def poll(self) -> tuple[str, str] | None:
        if self._fresh("boot.json"):
            return "checks: the smoke suite runs against the server", ""
        log = self._fresh("container.log")
        if log is None:
            return "boot: starting the container", ""
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            return None
        for line in lines[self.seen:]:
            self.phase = phase_after(self.phase, line)
        self.seen = len(lines)
        return f"boot: {self.phase}", ""  # each phase is news, not a counter
