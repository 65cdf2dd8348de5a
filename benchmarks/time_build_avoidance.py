#!/usr/bin/env python3
"""Benchmark build avoidance on the cpu cell (issue: real images).

Measures, each as the whole `python build.py build` command:
  1. cold build of the cpu cell (with --cold: its images and BuildKit's cache removed first;
     without it, whatever state the machine is in, reported as such);
  2. re-run with unchanged inputs (target: zero build steps run, under 10 s);
  3. only the drafter/speculative settings changed (num_speculative_tokens 3 -> 4);
  4. only the model changed (generator seed 0 -> 1);
for 3 and 4: engine layers all cached, seconds, and bytes of new layers vs the whole image.

Usage: python benchmarks/time_build_avoidance.py [--cold]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TAG = "2026-06-18-dflashfix"
DOCKER = "/usr/bin/docker"
FILES = ("matrix.yaml", "matrix.lock.json", "patches", "images/engine/cpu",
         "scripts/make_tiny_model.py")


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, **kw)


def build(matrix: Path, out: Path) -> tuple[float, list[dict]]:
    start = time.perf_counter()
    proc = run([sys.executable, "build.py", "build", "--matrix", str(matrix), "--tag", TAG,
                "--target", "cpu", "--out", str(out)])
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"build failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    records = [json.loads(p.read_text()) for p in sorted((out / "records").rglob("*.json"))]
    return wall, records


def layers(image: str) -> list[tuple[str, int]]:
    """(layer diff id, size) bottom-up, from the image config and `docker history` (whose
    non-empty rows are the layers; a real layer of exactly 0 bytes would shift this)."""
    diff_ids = json.loads(run([DOCKER, "image", "inspect", "--format",
                               "{{json .RootFS.Layers}}", image]).stdout)
    sizes = [int(s) for s in run([DOCKER, "history", "--no-trunc", "--human=false",
                                  "--format", "{{.Size}}", image]).stdout.split()][::-1]
    nonempty = [s for s in sizes if s > 0]
    return list(zip(diff_ids, nonempty + [0] * (len(diff_ids) - len(nonempty)), strict=False))


def variant(root: Path, edit) -> Path:
    """A copy of the matrix (and what it references) with one edit, locked offline."""
    for rel in FILES:
        src, dst = REPO / rel, root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
    matrix = root / "matrix.yaml"
    matrix.write_text(edit(matrix.read_text()))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = run([sys.executable, "build.py", "lock", "--matrix", str(matrix)], env=env)
    if proc.returncode != 0:
        sys.exit(f"lock failed: {proc.stderr}")
    return matrix


def summarize(name: str, wall: float, records: list[dict], base_layers=None) -> None:
    run_steps = sum(r["steps_run"] for r in records)
    cached = sum(r["steps_cached"] for r in records)
    by_kind = {r["kind"]: r for r in records}
    engine = by_kind.get("engine", {})
    state = ("reused" if engine.get("avoided") else
             "all steps cached" if engine.get("steps_run") == 0 else "REBUILT")
    line = (f"{name:34} {wall:7.1f}s  steps run {run_steps:3d}, cached {cached:3d}; "
            f"engine {state}")
    if base_layers is not None and "serve" in by_kind:
        now = layers(by_kind["serve"]["ref"])
        old = {d for d, _ in base_layers}
        new_bytes = sum(s for d, s in now if d not in old)
        total = sum(s for _, s in now)
        line += f"; new layers {new_bytes / 1e6:.2f} MB of {total / 1e9:.2f} GB image"
    print(line)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cold", action="store_true",
                    help="remove the cpu images and BuildKit's cache first (slow)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        if args.cold:
            refs = run([DOCKER, "image", "ls", "-q", "--filter",
                        "label=io.imagebuild.engine"]).stdout.split()
            refs += run([DOCKER, "image", "ls", "-q", "imagebuild/*"]).stdout.split()
            if refs:
                run([DOCKER, "image", "rm", "-f", *sorted(set(refs))])
            run([DOCKER, "builder", "prune", "-af"])
        wall, recs = build(REPO / "matrix.yaml", tmp_path / "b1")
        summarize("cold build" if args.cold else "first build (machine state)", wall, recs)
        serve_ref = next(r["ref"] for r in recs if r["kind"] == "serve")
        base_layers = layers(serve_ref)
        wall, recs = build(REPO / "matrix.yaml", tmp_path / "b2")
        summarize("re-run, unchanged inputs", wall, recs)
        ok = wall < 10 and all(r["steps_run"] == 0 for r in recs)
        m = variant(tmp_path / "drafter", lambda t: t.replace(
            "    num_speculative_tokens: 3", "    num_speculative_tokens: 4"))
        wall, recs = build(m, tmp_path / "b3")
        summarize("only speculative settings changed", wall, recs, base_layers)
        m = variant(tmp_path / "model", lambda t: t.replace(
            "      script: scripts/make_tiny_model.py\n      seed: 0",
            "      script: scripts/make_tiny_model.py\n      seed: 1"))
        wall, recs = build(m, tmp_path / "b4")
        summarize("only the model changed", wall, recs, base_layers)
        build(REPO / "matrix.yaml", tmp_path / "b5")  # point the local tags back
    print("unchanged re-run target (0 steps, < 10 s):", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
