"""Running the CLI on bad input the way the bad-input tests judge it: the limits every
answer must meet, the CLI run in this process with its time and peak memory measured,
and a folder's contents as a value (to show that nothing was written)."""

from __future__ import annotations

import hashlib
import time
import tracemalloc
from pathlib import Path

import pytest

from imagebuild.cli import main

LIMIT_S = 2.0  # every bad input is answered within this
LIMIT_BYTES = 256 << 20  # ... and this much memory


def run_cli_measured(argv: list[str], case_id: str, capsys: pytest.CaptureFixture[str]
                     ) -> tuple[int, str, float, int]:
    """`build.py ARGV` in this process: (exit code, output, seconds, peak bytes allocated).
    Anything escaping the CLI (a traceback, SystemExit included) fails the test."""
    tracemalloc.start()
    start = time.monotonic()
    try:
        code = main(argv)
    except BaseException as exc:  # noqa: BLE001 - any escape is what these tests are against
        pytest.fail(f"{case_id}: {type(exc).__name__} escaped the CLI: {exc}")
    finally:
        elapsed = time.monotonic() - start
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
