"""The image's arch gate (images/engine/files/check-cuda-arch.py) on compiled objects, run
as the engine Dockerfile runs it: a separate python3 process, exit code and lines."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from imagebuild import REPO_ROOT

GATE = REPO_ROOT / "images" / "engine" / "files" / "check-cuda-arch.py"


@dataclass(frozen=True)
class GateResult:
    returncode: int
    lines: list[str]

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run_gate(objects: list[Path], expect: str, cuobjdump: str) -> GateResult:
    proc = subprocess.run(
        [sys.executable, str(GATE), "--expect", expect, "--cuobjdump", cuobjdump,
         *map(str, objects)],
        capture_output=True, text=True, check=False, timeout=300,
    )
    return GateResult(proc.returncode, (proc.stdout + proc.stderr).strip().splitlines())
