"""A re-run of a released tag: the README's main command (`build.py --tag T`) run twice in
a row against the configured registry (matrix.yaml's, 127.0.0.1:5000, or
IMAGEBUILD_REGISTRY); the first run builds, tests and releases what is missing, the second
finds it all in the registry. Prints each run's wall seconds, the stages the second run
skipped (its `<stage> skipped` lines) and whether it booted anything.

  flock -o /tmp/imagebuild-heavy.lock .venv/bin/python benchmarks/time_rerun.py \\
      [--tag 2026-06-18-dflashfix] [--runs 2] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_once(tag: str) -> dict[str, object]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "build.py", "--tag", tag], cwd=ROOT,
                          capture_output=True, text=True, env=os.environ.copy())
    seconds = time.monotonic() - start
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        sys.exit(f"build.py --tag {tag} exited {proc.returncode}:\n{out[-4000:]}")
    return {"seconds": round(seconds, 2),
            "skipped": re.findall(r"^(\w+) skipped  ", out, re.M),
            "booted": "booting " in out,
            "pushed": re.search(r": pushed sha256:", out) is not None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tag", default="2026-06-18-dflashfix")
    ap.add_argument("--runs", type=int, default=2, help="runs in a row (>= 2)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    runs = []
    for i in range(max(2, args.runs)):
        r = run_once(args.tag)
        runs.append(r)
        print(f"run {i + 1}: {r['seconds']:.1f} s  skipped: {', '.join(r['skipped']) or '-'}"
              f"  booted: {r['booted']}  pushed: {r['pushed']}", flush=True)
    rerun = runs[1:]
    print(f"re-run of a released tag: {min(r['seconds'] for r in rerun):.1f} s "
          f"(best of {len(rerun)}), load {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps({"tag": args.tag, "runs": runs,
                                         "load1": os.getloadavg()[0]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
