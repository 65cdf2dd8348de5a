"""The disk a command takes at its peak: free bytes sampled while it runs.

    .venv/bin/python benchmarks/disk_peak.py [--path P ...] [--every S] [--json F] -- CMD ...

Samples the free bytes of the file system of each --path (default: Docker's root,
/var/lib/docker, and this checkout) every S seconds (default 0.5) while CMD runs, and
prints per file system: free at the start, the lowest free seen (start minus it is the
command's peak need: what a disk check before it must ask for), and free at the end
(what it leaves behind). Other writers on the same disk count too: run it alone.
Exit code: CMD's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

GB = 1e9


def _device(path: str) -> int:
    return os.stat(path).st_dev


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", action="append", default=None)
    ap.add_argument("--every", type=float, default=0.5)
    ap.add_argument("--json", type=Path)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command after --")
    paths = args.path or ["/var/lib/docker", str(Path(__file__).resolve().parent.parent)]
    # one sample per file system, named by the first path on it
    by_dev: dict[int, str] = {}
    for p in paths:
        by_dev.setdefault(_device(p), p)
    start = {p: shutil.disk_usage(p).free for p in by_dev.values()}
    low = dict(start)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(args.every):
            for p in low:
                low[p] = min(low[p], shutil.disk_usage(p).free)

    sampler = threading.Thread(target=sample, daemon=True)
    t0 = time.monotonic()
    sampler.start()
    rc = subprocess.call(cmd)
    done.set()
    sampler.join()
    seconds = time.monotonic() - t0
    rows = []
    for p in low:
        end = shutil.disk_usage(p).free
        low[p] = min(low[p], end)
        rows.append({"path": p, "free_start": start[p], "free_low": low[p], "free_end": end,
                     "peak_need": start[p] - low[p], "left_behind": start[p] - end})
        print(f"[disk] {p}: free {start[p] / GB:.1f} GB at start, lowest {low[p] / GB:.1f} GB "
              f"(peak need {(start[p] - low[p]) / GB:.2f} GB), {end / GB:.1f} GB at the end "
              f"(left behind {(start[p] - end) / GB:.2f} GB); {seconds:.0f} s, exit {rc}",
              file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"cmd": cmd, "seconds": round(seconds, 1),
                                         "exit": rc, "filesystems": rows}, indent=2) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
