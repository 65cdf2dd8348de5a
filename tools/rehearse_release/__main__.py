"""`make rehearse-release`: the release workflow run by act on this machine before a tag
is pushed: release.yml (a dispatch naming the tag, restricted to --target), then the
GitHub release it made is listed. Exit 0 when every job act ran succeeded."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from imagebuild import REPO_ROOT
from tools.rehearse_release.act import Rehearsal


def plan(tag: str, target: str | None) -> list[dict]:
    where = ["--target", target] if target else []  # none: the target fitting this host
    out = subprocess.run([sys.executable, "build.py", "plan", "--tag", tag, *where,
                          "--format", "github"], cwd=REPO_ROOT, check=True,
                         capture_output=True, text=True).stdout
    return list(json.loads(out)["include"])


def skipped(tag: str, target: str) -> list[str]:
    """Cells the plan of the whole matrix has that this rehearsal does not run, and why."""
    ran = {c["cell"] for c in plan(tag, target)}
    return [f"{c['cell']}: runs-on {', '.join(c['runner'])} (target {c['target']}); this "
            f"rehearsal dispatches release.yml with target={target}"
            for c in plan(tag, "all") if c["cell"] not in ran]


# act's own complaints about what it does not emulate, answered in words (not failures)
ACT_LIMITS = {
    "Failed to parse 'max-parallel'": "act reads max-parallel only as a literal number, so "
    "the cap (vars.IMAGEBUILD_MAX_PARALLEL) was not applied here: legs ran one at a time; "
    "GitHub applies it (docs/release-workflow.md)",
}
# what the rehearsal changes in the copy of the workflow act runs, said every time
ADAPTED = ("act 0.2.89's schema has no `concurrency.queue` and no `artifact-metadata` "
           "permission: the copy act runs drops those lines (act runs one job at a time and "
           "grants no token scopes; the stand-ins read the job's permissions from the real "
           "file); GitHub keeps every waiting run")


def act_limits(log: str) -> list[str]:
    """Notes for the act errors in `log` that are act's limits, not the workflow's faults."""
    return [note for said, note in ACT_LIMITS.items() if said in log]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.rehearse_release",
                                description=__doc__)
    p.add_argument("--tag", required=True, help="release tag DATE-NAME, made on HEAD")
    p.add_argument("--target", default=None, help="the workflow's own `target` input "
                                                  "(default: the target fitting this host)")
    p.add_argument("--registry", default=os.environ.get("IMAGEBUILD_REGISTRY",
                                                         "127.0.0.1:5000"))
    p.add_argument("--workdir", type=Path, default=REPO_ROOT / "build" / "act-rehearsal")
    args = p.parse_args(argv)
    if args.target is None:
        here = plan(args.tag, None)
        if not here:  # bad input: nothing is written
            print("error: the plan has no cell for this host (no target of matrix.yaml "
                  "runs here), so --target has no default\n  fix: pass --target TARGET "
                  "(`build.py plan --tag TAG --target all` lists them)", file=sys.stderr)
            return 2
        args.target = here[0]["target"]
    reh = Rehearsal(args.workdir.resolve(), registry=args.registry,
                    user=os.environ.get("IMAGEBUILD_REGISTRY_USER", "imagebuild"),
                    password=os.environ.get("IMAGEBUILD_REGISTRY_PASSWORD", "imagebuild-local"))
    sha = reh.prepare()
    reh.tag(args.tag)
    runners = [c["runner"] for c in plan(args.tag, "all")]
    print(f"rehearsal: release.yml for {args.tag} ({sha[:12]}), target={args.target}, "
          f"registry {args.registry}, in {reh.root}")
    for line in skipped(args.tag, args.target):
        print(f"  skipped {line}")
    res = reh.run("release.yml", "workflow_dispatch", "refs/heads/main",
                  inputs={"tag": args.tag, "target": args.target}, plan_runners=runners,
                  echo=True)
    for note in act_limits(res.log):
        print(f"note: {note}")
    print(f"note: {ADAPTED}")
    rel = reh.gh / "releases" / args.tag
    print(f"\nrehearsal: act exited {res.returncode} after {res.seconds:.0f} s; GitHub release "
          f"files: {rel if rel.exists() else 'none'}")
    return 0 if res.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
