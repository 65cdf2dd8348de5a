"""Run compile commands from a compile_commands.json, at most `jobs` at a time, each timed.

A launcher (sccache) is put in front of the compiler the way CMake's
CMAKE_<LANG>_COMPILER_LAUNCHER does it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Unit:
    """One translation unit: its source (relative to the vLLM tree) and CMake's entry."""

    source: str
    directory: Path
    argv: tuple[str, ...]
    output: Path

    @classmethod
    def from_entry(cls, source: str, entry: dict) -> Unit:
        directory = Path(entry["directory"])
        argv = tuple(entry.get("arguments") or shlex.split(entry["command"]))
        return cls(source, directory, argv, directory / entry["output"])

    @property
    def is_cuda(self) -> bool:
        return self.source.endswith(".cu")


@dataclass(frozen=True)
class Compiled:
    unit: Unit
    seconds: float
    returncode: int
    log: str  # the compiler's output (warnings, or the error)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.unit.output.is_file()

    def error_tail(self, lines: int = 6) -> str:
        return "\n".join(self.log.strip().splitlines()[-lines:])


def _run(unit: Unit, launcher: list[str], env: dict[str, str] | None) -> Compiled:
    unit.output.unlink(missing_ok=True)  # a stale object must not pass for a new one
    unit.output.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    proc = subprocess.run([*launcher, *unit.argv], cwd=unit.directory, capture_output=True,
                          text=True, env=env, check=False)
    return Compiled(unit, time.monotonic() - start, proc.returncode, proc.stdout + proc.stderr)


def compile_units(units: list[Unit], *, jobs: int = 2, launcher: list[str] | None = None,
                  env: dict[str, str] | None = None) -> list[Compiled]:
    """Compile every unit (in the given order of results); jobs is capped at the cores."""
    workers = max(1, min(jobs, os.cpu_count() or 1, len(units) or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda u: _run(u, launcher or [], env), units))
