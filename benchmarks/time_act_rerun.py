"""Time a re-run of release.yml for a tag the rehearsal already released (nothing changed:
every cell published, smoke-passed and benched), under act on this machine.

    make rehearse-release TAG=2026-06-18-dflashfix       # once: builds and releases it
    .venv/bin/python benchmarks/time_act_rerun.py --tag 2026-06-18-dflashfix [--runs 3]

The tag is set on HEAD (as the rehearsal does): run it on the commit that was released,
or one that changes no image. Prints the wall time of each re-run and each job's verdict,
and exits 1 if a re-run built, smoked, pushed or benched anything."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from imagebuild import REPO_ROOT  # noqa: E402
from tools.rehearse_release.act import Rehearsal  # noqa: E402

# the cell and engine steps a no-op re-run must skip (act logs "Success - Main NAME [time]")
REDONE = re.compile(r"Success - Main (Build the engine once[^\[]*|Build the serve layers[^\[]*|"
                    r"Smoke|Release gates[^\[]*|Push by digest[^\[]*|Bench, stored[^\[]*) \[")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tag", required=True)
    p.add_argument("--target", default="cpu")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workdir", type=Path, default=REPO_ROOT / "build" / "act-rehearsal")
    args = p.parse_args()
    reh = Rehearsal(args.workdir.resolve(),
                    registry=os.environ.get("IMAGEBUILD_REGISTRY", "127.0.0.1:5000"),
                    user=os.environ.get("IMAGEBUILD_REGISTRY_USER", "imagebuild"),
                    password=os.environ.get("IMAGEBUILD_REGISTRY_PASSWORD", "imagebuild-local"))
    out = subprocess.run([sys.executable, "build.py", "plan", "--tag", args.tag, "--target",
                          "all", "--format", "github"], cwd=REPO_ROOT, check=True,
                         capture_output=True, text=True).stdout
    runners = [c["runner"] for c in json.loads(out)["include"]]
    (reh.root / "home").mkdir(parents=True, exist_ok=True)
    reh.prepare()  # HEAD, as `make rehearse-release` does; the tag on it
    reh.tag(args.tag)
    ok = True
    for i in range(args.runs):
        start = time.monotonic()
        res = reh.run("release.yml", "workflow_dispatch", "refs/heads/main", run=args.tag,
                      inputs={"tag": args.tag, "target": args.target}, plan_runners=runners)
        wall = time.monotonic() - start
        jobs = re.findall(r"^\[release/([^\]]+?)\s*\] 🏁  Job (\w+)", res.log, re.M)
        redone = sorted(set(m.group(1) for m in REDONE.finditer(res.log)))
        print(f"re-run {i + 1}: {wall:.1f} s, act exit {res.returncode}, jobs "
              f"{', '.join(f'{j} {r}' for j, r in jobs)}; redone: {redone or 'nothing'}")
        ok = ok and res.returncode == 0 and not redone
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
