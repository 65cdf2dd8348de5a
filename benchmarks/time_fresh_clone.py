"""Time the README's main command from a fresh clone: set-up, then the whole job to `latest`.

Usage:
    flock /tmp/imagebuild-heavy.lock .venv/bin/python benchmarks/time_fresh_clone.py \\
        [--source PATH_OR_URL] [--branch NAME] [--namespace NS] [--json FILE] [--keep]
        [--workdir DIR]

Clones --source (default: this checkout, its current branch) into a new temporary folder,
reads the main command from the clone's README (the first line of its first ```sh block:
`bash scripts/setup.sh && .venv/bin/python build.py --tag T`) and runs it there as
written, with every output line time-stamped. The set-up part ends at `[setup] ready`;
the job ends when build.py exits (0: `latest` moved, the last step of the whole job).

It publishes under a registry namespace of its own (IMAGEBUILD_NAMESPACE, default
`fresh-<UTC time>`), so the release is a first release there, as on a fresh machine whose
registry is empty, and nobody else's `latest` moves. What stays warm, and is said in the
result: the machine's Docker engine (its image store and BuildKit cache: an image whose
inputs digest exists is not rebuilt), the pip cache of the host, and the apt packages
already installed. Prints one table and writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETUP_DONE = "[setup] ready"
STAGE = re.compile(r"^\[progress\s+[\d:]+\] (\w+) (\S+)\s+[\d.]+s\s+(started|done in .*)$")


def main_command(readme: Path) -> str:
    """The README's main command: the first command line of its first ```sh block."""
    block = readme.read_text().split("```sh\n", 1)[1].split("```", 1)[0]
    return next(ln for ln in block.splitlines() if ln.strip() and not ln.startswith("#"))


def run(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--source", default=str(ROOT), help="what to clone (default: this checkout)")
    ap.add_argument("--branch", default=None, help="branch to clone (default: the checked-out one)")
    ap.add_argument("--namespace", default=None, help="registry namespace (default fresh-<time>)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    ap.add_argument("--keep", action="store_true", help="keep the clone (default: removed)")
    ap.add_argument("--cold", action="store_true",
                    help="say the machine was made cold (benchmarks/cold_machine.sh)")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="an empty folder for the clone and the log (default: a new temporary one)")
    args = ap.parse_args(argv)
    branch = args.branch or subprocess.run(
        ["git", "-C", args.source, "rev-parse", "--abbrev-ref", "HEAD"], capture_output=True,
        text=True).stdout.strip() or "main"
    namespace = args.namespace or "fresh-" + datetime.now(UTC).strftime("%Y%m%d%H%M%S")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="imagebuild-fresh-"))
    dest = work / "fresh"
    subprocess.run(["git", "clone", "-q", "-b", branch, args.source, str(dest)], check=True)
    command = main_command(dest / "README.md")
    env = {**os.environ, "IMAGEBUILD_NAMESPACE": namespace, "PYTHONUNBUFFERED": "1"}
    env.pop("VIRTUAL_ENV", None)
    start = time.monotonic()
    setup_s: float | None = None
    stages: list[tuple[float, str]] = []
    log_path = work / "run.log"
    with log_path.open("w") as log, subprocess.Popen(
            ["bash", "-c", command], cwd=dest, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.monotonic() - start
            log.write(f"{now:8.1f} {line}")
            sys.stdout.write(f"{now:7.1f}s {line}")
            if setup_s is None and line.startswith(SETUP_DONE):
                setup_s = now
            if m := STAGE.match(line.strip()):
                stages.append((now, f"{m.group(1)} {m.group(2)} {m.group(3)}"))
        code = proc.wait()
    total = time.monotonic() - start
    result = {
        "command": command, "clone": str(dest), "branch": branch, "namespace": namespace,
        "exit_code": code, "setup_s": round(setup_s, 1) if setup_s is not None else None,
        "job_s": round(total - setup_s, 1) if setup_s is not None else None,
        "total_s": round(total, 1), "stages": [(round(t, 1), s) for t, s in stages],
        "warm": ("apt lists and Python only (benchmarks/cold_machine.sh)" if args.cold else
                 "Docker engine image store and BuildKit cache, host pip cache, apt packages"),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "log": str(log_path),
    }
    if not args.keep:
        shutil.rmtree(dest, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


def table(r: dict) -> str:
    def mmss(s: float | None) -> str:
        return "-" if s is None else f"{int(s // 60)} min {s % 60:04.1f} s"
    return "\n".join([
        "| part | time |", "|---|---|",
        f"| set-up (`bash scripts/setup.sh`) | {mmss(r['setup_s'])} |",
        f"| whole job to `latest` | {mmss(r['job_s'])} |",
        f"| total (exit {r['exit_code']}) | {mmss(r['total_s'])} |"])


if __name__ == "__main__":
    res = run(sys.argv[1:])
    print(table(res))
    print(json.dumps({k: v for k, v in res.items() if k != "stages"}, indent=2))
    sys.exit(0 if res["exit_code"] == 0 else 1)
