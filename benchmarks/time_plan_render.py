#!/usr/bin/env python3
"""Benchmark: `plan` + `render` of a generated 1,000-cell matrix (target: < 2 s together)
and `plan` of the real matrix (target: < 0.5 s), each timed as the whole command a user
runs (`python build.py ...`, interpreter start-up included).

Usage: python benchmarks/time_plan_render.py [--runs 5] [--cells 1000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TAG = "2026-06-18-dflashfix"


def generated_matrix(dest: Path, side: int) -> Path:
    """The real matrix plus one cpu family of side^3 cells (models x drafters x profiles)."""
    for rel in ("patches", "images/engine/cpu", "scripts/make_tiny_model.py", "locked"):
        src = REPO / rel
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dest / rel)
    text = (REPO / "matrix.yaml").read_text()
    models = "".join(
        f"  gen-m{i}:\n    description: generated model {i}\n    generate:\n"
        f"      script: scripts/make_tiny_model.py\n      seed: {i}\n"
        f"    served_names: [gen-{i}, gen-{i}-alias]\n    targets: [cpu]\n"
        for i in range(side))
    drafters = "".join(
        f"  gen-d{i}:\n    description: generated ngram {i}\n    method: ngram\n"
        f"    num_speculative_tokens: {1 + i % 8}\n    options: {{prompt_lookup_max: {2 + i}}}\n"
        f"    targets: [cpu]\n" for i in range(side))
    profiles = "".join(
        f"  gen-p{i}:\n    description: generated profile {i}\n    target: cpu\n"
        f"    methods: [ngram]\n    args:\n      host: 127.0.0.1\n      port: {8000 + i}\n"
        f"      max-model-len: 512\n      max-num-seqs: {1 + i}\n    acceptance_floor: 0.3\n"
        for i in range(side))
    family = (
        "  gen:\n    description: generated family\n    target: cpu\n"
        '    name: "{family}-{model}-{drafter}-{profile}"\n    matrix:\n'
        "      engine: [dflashfix]\n"
        f"      model: [{', '.join(f'gen-m{i}' for i in range(side))}]\n"
        f"      drafter: [{', '.join(f'gen-d{i}' for i in range(side))}]\n"
        f"      profile: [{', '.join(f'gen-p{i}' for i in range(side))}]\n")
    text = (text.replace("\nmodels:\n", "\nmodels:\n" + models)
                .replace("\ndrafters:\n", "\ndrafters:\n" + drafters)
                .replace("\nprofiles:\n", "\nprofiles:\n" + profiles)
                .replace("\nimages:\n", "\nimages:\n" + family))
    (dest / "matrix.yaml").write_text(text)
    # lock it (offline: the generated cells need no Hub), as a user would before planning
    proc = subprocess.run([sys.executable, "build.py", "lock", "--matrix",
                           str(dest / "matrix.yaml")], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        sys.exit(f"lock of the generated matrix failed:\n{proc.stderr}")
    return dest / "matrix.yaml"


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return elapsed


def report(name: str, samples: list[float], target: float) -> bool:
    ok = statistics.median(samples) < target
    print(f"{name:44} min {min(samples):.3f}s  median {statistics.median(samples):.3f}s  "
          f"max {max(samples):.3f}s  (target < {target}s: {'PASS' if ok else 'FAIL'})")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cells", type=int, default=1000)
    args = ap.parse_args()
    side = round(args.cells ** (1 / 3))
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        gen = generated_matrix(Path(tmp) / "m", side)
        out = Path(tmp) / "rendered"
        real_plan, big_plan, big_render, big_both = [], [], [], []
        for _ in range(args.runs):
            real_plan.append(timed([py, "build.py", "plan", "--tag", TAG, "--target", "cpu"]))
            p = timed([py, "build.py", "plan", "--matrix", str(gen), "--tag", TAG,
                       "--target", "cpu", "--format", "json"])
            r = timed([py, "build.py", "render", "--matrix", str(gen), "--tag", TAG,
                       "--target", "cpu", "--out", str(out)])
            big_plan.append(p)
            big_render.append(r)
            big_both.append(p + r)
        n = len(list(out.rglob("*.Dockerfile")))
    print(f"generated matrix: {side ** 3} generated cells (+ the real ones), "
          f"{n} Dockerfiles rendered")
    ok = report("plan, real matrix", real_plan, 0.5)
    report(f"plan, {side ** 3}-cell matrix", big_plan, 2.0)
    report(f"render, {side ** 3}-cell matrix", big_render, 2.0)
    ok &= report(f"plan + render, {side ** 3}-cell matrix", big_both, 2.0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
