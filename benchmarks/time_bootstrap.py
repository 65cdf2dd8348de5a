"""Time the cpu base's rootfs made by mmdebstrap and by debootstrap, same package set.

Each run bootstraps into a fresh folder with the exact command the product runs
(imagebuild/builder/bootstrap.bootstrap_argv), alternating the tools so a change in the
mirror's or the machine's speed hits both; reports seconds per run and the packages each
installed (they must agree). Needs root, both tools and the Debian mirror; no Docker.

    .venv/bin/python benchmarks/time_bootstrap.py [--runs 2] [--suite bookworm] [--json F]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from imagebuild.builder import bootstrap  # noqa: E402
from imagebuild.builder.aptsources import debian_mirror  # noqa: E402

TOOLS = ("mmdebstrap", "debootstrap")


def installed(root: Path) -> list[str]:
    out = subprocess.run(["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W",
                          "-f", "${db:Status-Status} ${Package}\n"],
                         capture_output=True, text=True, check=True).stdout
    return sorted(line.split()[1] for line in out.splitlines()
                  if line.startswith("installed "))


def one(tool: str, suite: str, mirror: str, workdir: Path) -> tuple[float, list[str]]:
    root = Path(tempfile.mkdtemp(prefix=f"{tool}-", dir=workdir))
    try:
        argv = bootstrap.bootstrap_argv(tool, root, suite, mirror)
        t0 = time.monotonic()
        res = subprocess.run(argv, capture_output=True, text=True, check=False)
        took = time.monotonic() - t0
        if res.returncode:
            sys.exit(f"{tool} failed:\n{res.stderr[-2000:]}")
        return took, installed(root)
    finally:
        bootstrap._remove_tree(root)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--suite", default="bookworm")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        sys.exit(f"not installed: {', '.join(missing)} (apt-get install {' '.join(missing)})")
    mirror = debian_mirror(args.suite, None)
    times: dict[str, list[float]] = {t: [] for t in TOOLS}
    packages: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="time-bootstrap-", dir="/var/tmp") as tmp:
        for i in range(args.runs):
            for tool in (TOOLS if i % 2 == 0 else TOOLS[::-1]):
                took, pkgs = one(tool, args.suite, mirror, Path(tmp))
                times[tool].append(round(took, 1))
                packages[tool] = pkgs
                print(f"run {i + 1}: {tool} {took:.1f} s, {len(pkgs)} packages", flush=True)
    same = packages["mmdebstrap"] == packages["debootstrap"]
    print(f"same packages installed: {same}")
    if not same:
        a, b = set(packages["mmdebstrap"]), set(packages["debootstrap"])
        print(f"  only mmdebstrap: {sorted(a - b)}\n  only debootstrap: {sorted(b - a)}")
    for tool in TOOLS:
        print(f"{tool}: {', '.join(f'{t:.1f}' for t in times[tool])} s")
    if args.json:
        # the mirror is not written down: the repository names no package-registry host
        args.json.write_text(json.dumps({"suite": args.suite, "seconds": times,
                                         "same_packages": same}, indent=2) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
