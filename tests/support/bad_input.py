"""Running the CLI on bad input the way the bad-input tests judge it: the limits every
answer must meet, the CLI run in this process with its time and peak memory measured,
and a folder's contents as a value (to show that nothing was written)."""

from __future__ import annotations

import hashlib
import resource
import time
import tracemalloc
from pathlib import Path

import pytest

from imagebuild.cli import main

# every bad input is answered within LIMIT_S seconds of CPU: CPU, not wall time, which on
# a machine shared with the suite's other lane depends on that lane's load; a run past
# WALL_LIMIT_S of wall time is stopped (a hang uses no CPU)
LIMIT_S = 2.0
WALL_LIMIT_S = 4 * LIMIT_S
LIMIT_BYTES = 256 << 20  # ... and this much memory


def children_cpu_s() -> float:
    """CPU seconds of every child this process has waited for."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def run_cli_measured(argv: list[str], case_id: str, capsys: pytest.CaptureFixture[str]
                     ) -> tuple[int, str, float, int]:
    """`build.py ARGV` in this process: (exit code, output, CPU seconds, peak bytes
    allocated). Anything escaping the CLI (a traceback, SystemExit included) fails the
    test."""
    tracemalloc.start()
    start = time.process_time()
    try:
        code = main(argv)
    except BaseException as exc:  # noqa: BLE001 - any escape is what these tests are against
        pytest.fail(f"{case_id}: {type(exc).__name__} escaped the CLI: {exc}")
    finally:
        elapsed = time.process_time() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    out = capsys.readouterr()
    return code, out.out + out.err, elapsed, peak


def tree_snapshot(root: Path) -> dict[str, str]:
    """Every path below `root`: a file's sha256, a link's target, or `dir`."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = f"-> {p.readlink()}"
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out
