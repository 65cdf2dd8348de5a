"""The image's arch gate (images/engine/files/check-cuda-arch.py) on compiled objects, run
as the engine Dockerfile runs it: a separate python3 process, exit code and lines; then
the GPU-code table (build/archtable.py) of the same objects, as `build` records it for an
image: which code each library carries for the target."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from imagebuild import REPO_ROOT
from imagebuild.builder.archtable import Row, markdown, scan

GATE = REPO_ROOT / "images" / "engine" / "files" / "check-cuda-arch.py"


@dataclass(frozen=True)
class GateResult:
    returncode: int
    lines: list[str]
    table: tuple[Row, ...] = ()

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run_gate(objects: list[Path], expect: str, cuobjdump: str) -> GateResult:
    proc = subprocess.run(
        [sys.executable, str(GATE), "--expect", expect, "--cuobjdump", cuobjdump,
         *map(str, objects)],
        capture_output=True, text=True, check=False, timeout=300,
    )
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    # the rehearsed units are vLLM's own kernels: one library
    rows = scan(objects, expect, cuobjdump, library="vllm")
    lines += ["GPU code per library (build/archtable.py):", *markdown(rows, expect).splitlines()]
    return GateResult(proc.returncode, lines, tuple(rows))
