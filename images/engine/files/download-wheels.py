"""`pip download --no-deps` of a pinned requirements file, several pips at once.

One pip fetches one file at a time: for the cpu engine's ~170 pins that is ~170 index
lookups and downloads in a row, each waiting on the round trip to the package index
(through the build's proxy), ~45 s of an empty-cache engine build. The pins are dealt
round-robin to --jobs pips (the big wheels land in different ones) that share the pip
cache; the build fails if any of them fails, with that pip's own output.

    python3 download-wheels.py REQUIREMENTS DEST [--jobs 4] [PIP_OPTION ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def requirement_lines(text: str) -> list[str]:
    """The requirement lines of a requirements file; an option line (`--index-url`, ...)
    would apply to one pip only, so it is refused rather than silently dropped."""
    out = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise SystemExit(f"download-wheels: option line {line!r} in the requirements: "
                             f"pass pip options after DEST instead")
        out.append(line)
    return out


def deal(lines: list[str], jobs: int) -> list[list[str]]:
    """Round-robin, so neighbours in the sorted pins (torch, torchaudio, torchvision) go
    to different pips."""
    return [chunk for chunk in (lines[i::jobs] for i in range(jobs)) if chunk]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("requirements", type=Path)
    ap.add_argument("dest", type=Path)
    ap.add_argument("--jobs", type=int, default=4)
    args, pip_options = ap.parse_known_args(argv)
    chunks = deal(requirement_lines(args.requirements.read_text()), max(1, args.jobs))
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for n, chunk in enumerate(chunks):
            req = Path(tmp) / f"requirements-{n}.txt"
            req.write_text("\n".join(chunk) + "\n")
            log = open(Path(tmp) / f"pip-{n}.log", "w+")  # noqa: SIM115 - read after wait
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar",
                   "off", "-d", str(args.dest), "-r", str(req), *pip_options]
            procs.append((chunk, log, subprocess.Popen(cmd, stdout=log,
                                                       stderr=subprocess.STDOUT)))
        failed = 0
        for chunk, log, proc in procs:
            code = proc.wait()
            log.seek(0)
            if code:
                failed += 1
                print(f"download-wheels: pip failed (exit {code}) for "
                      f"{', '.join(chunk)}:\n{log.read()}", file=sys.stderr)
            log.close()
    if failed:
        return 1
    total = sum(len(c) for c in chunks)
    print(f"download-wheels: {total} pins by {len(chunks)} pips in "
          f"{time.monotonic() - start:.1f} s into {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
