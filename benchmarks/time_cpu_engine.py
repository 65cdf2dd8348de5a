#!/usr/bin/env python3
"""The cpu engine layer by layer, before and after a change of it: each build step's
seconds, each layer's bytes, where the bytes of its Python environment are, and
(--release) what smoke, the release gates and the bench report on the image built from it.

For each checkout given (default: this one; another is a clone or an export of another
commit, run by this interpreter), in a namespace of its own (IMAGEBUILD_NAMESPACE=
time-engine-PID-N: no shared serve tag moves, no release of an earlier run is in the way):
  1. `build.py build --no-cache --tag T --target cpu --out OUT/N`: base, engine and serve
     image built from nothing but BuildKit's pip cache mount (the downloads come from
     it); the engine's BuildKit log gives each step's seconds (stages run side by side:
     the engine's wall time is its build record's, not the sum of its steps);
  2. the engine image: its size (`docker image inspect .Size`), each layer's bytes and
     step, and its venv by what holds the bytes;
  3. with --release, the README's main command for the tag (`build.py --tag T --target
     cpu --out OUT/N`, which reuses the images of 1) and what it leaves: each smoke
     check's result, the gates' verdicts, the token ids of the speculative run the gates
     compare, and the bench's output tok/s per concurrency.
  4. with --bench-rounds N, `build.py bench` of each checkout's serve image, taking turns N
     times (a shared machine's load moves: turns spread it over both).
Then the checkouts side by side, the token ids compared between them.

    python benchmarks/time_cpu_engine.py [--checkout DIR ...] [--tag T] [--release]
        [--bench-rounds N] [--out DIR] [--json FILE]

Heavy (the engine built from nothing, vLLM booted three times per checkout): run it under
`flock /tmp/imagebuild-heavy.lock`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DOCKER = "/usr/bin/docker"
STEP = re.compile(r"^#(\d+) \[([^\]]+)\] (.*)$")
DONE = re.compile(r"^#(\d+) DONE ([\d.]+)s$")
CHECK_ROW = re.compile(r"^\| (\S+) \| (.+?) \| [\d.]* \|$")
# where the bytes of the engine's venv are, read inside the image by its own python
WHERE = r"""
import json, os, sys
out = {}
for base, dirs, files in os.walk(sys.argv[1]):
    for name in files:
        path = os.path.join(base, name)
        if os.path.islink(path):
            continue
        rel = os.path.relpath(path, sys.argv[1])
        site = rel.split("site-packages/", 1)[-1] if "site-packages/" in rel else ""
        kind = ("__pycache__" if "/__pycache__/" in rel else
                "torch/lib" if site.startswith("torch/lib/") else
                "vllm extensions (_C*.so)" if site.startswith("vllm/_C") else
                "nvidia/" if site.startswith("nvidia/") else
                "other native (.so)" if ".so" in name else "other")
        out[kind] = out.get(kind, 0) + os.stat(path).st_size
print(json.dumps(out))
"""


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def steps(log: Path) -> list[dict[str, Any]]:
    """Each BuildKit step of LOG that ran: its stage and command, its seconds."""
    names: dict[str, str] = {}
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if m := STEP.match(line):
            names.setdefault(m.group(1), f"[{m.group(2)}] {' '.join(m.group(3).split())}")
        elif (m := DONE.match(line)) and m.group(1) in names:
            out.append({"step": names[m.group(1)], "seconds": float(m.group(2))})
    return out


def layers(image: str) -> list[dict[str, Any]]:
    rows = run([DOCKER, "history", "--no-trunc", "--human=false", "--format",
                "{{.Size}}\t{{.CreatedBy}}", image], check=True).stdout.splitlines()[::-1]
    return [{"bytes": int(size), "step": " ".join(step.split())}
            for size, _, step in (r.partition("\t") for r in rows) if int(size) > 0]


def where(image: str) -> dict[str, int]:
    got = run([DOCKER, "run", "--rm", "--network", "none", "--user", "0", "--entrypoint",
               "python", image, "-c", WHERE, "/opt/vllm"], check=True)
    return json.loads(got.stdout)


def build(checkout: Path, out: Path, namespace: str, tag: str, release: bool
          ) -> dict[str, Any]:
    env = {**os.environ, "IMAGEBUILD_NAMESPACE": namespace}
    cmd = [sys.executable, "build.py", "build", "--no-cache", "--tag", tag, "--target", "cpu",
           "--out", str(out)]
    t0 = time.monotonic()
    done = run(cmd, cwd=checkout, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: {' '.join(cmd[1:])} failed:\n{done.stderr[-3000:]}")
    wall = time.monotonic() - t0
    engine = json.loads(next((out / "records/cpu").glob("*/engine.json")).read_text())
    serve = json.loads(next((out / "records/cpu").glob("*/cpu-tiny-ngram.json")).read_text())
    result: dict[str, Any] = {
        "checkout": str(checkout), "build_s": round(wall, 1), "engine": engine["ref"],
        "serve": serve["ref"],
        "engine_build_s": engine["wall_s"], "bytes": engine["size_bytes"],
        "layers": layers(engine["ref"]), "steps": steps(Path(engine["log"])),
        "venv": where(engine["ref"])}
    if release:
        t0 = time.monotonic()
        job = run([sys.executable, "build.py", "--tag", tag, "--target", "cpu", "--out",
                   str(out)], cwd=checkout, env=env)
        if job.returncode != 0:
            raise SystemExit(f"{checkout}: the main job failed:\n{job.stderr[-3000:]}")
        result["release_s"] = round(time.monotonic() - t0, 1)
        result["reports"] = reports(out, tag.split("-", 3)[-1])
    return result


def bench_rounds(results: list[dict[str, Any]], out: Path, rounds: int) -> None:
    """`build.py bench SERVE_REF` of each checkout's serve image, taking turns ROUNDS times
    (the machine's load moves between runs: turns spread it over both): output tok/s per
    concurrency, each run's, into each result's `bench_rounds`."""
    for n in range(rounds):
        for i, r in enumerate(results):
            folder = out / str(i) / f"bench-round-{n}"
            done = run([sys.executable, "build.py", "bench", r["serve"], "--out", str(folder)],
                       cwd=r["checkout"])
            if done.returncode != 0:
                raise SystemExit(f"bench of {r['serve']} failed:\n{done.stderr[-3000:]}")
            levels = json.loads(sorted(folder.glob("*.json"))[-1].read_text())["levels"]
            for lv in levels:
                r.setdefault("bench_rounds", {}).setdefault(str(lv["concurrency"]), []).append(
                    round(lv["output_tok_s"], 1))


def reports(out: Path, engine: str) -> dict[str, Any]:
    """What smoke, the gates and the bench of the main job left in OUT."""
    cell = next((out / "smoke/cpu" / engine).glob("*/summary.md")).parent
    checks = {m.group(1): m.group(2) for line in (cell / "summary.md").read_text().splitlines()
              if (m := CHECK_ROW.match(line))}
    gates = json.loads((cell / "gates.json").read_text())
    spoken = json.loads((cell / "gates-speculative.json").read_text())
    bench = json.loads(sorted((out / "bench").glob("*.json"))[-1].read_text())
    return {
        "smoke": checks,
        "gates": {k: f"{gates[k]['status']}: {gates[k]['reason']}"
                  for k in ("lossless", "long_generation")},
        "token_ids": {g["name"]: g["token_ids"] for g in spoken["generations"]},
        "bench": {str(lv["concurrency"]): {"output_tok_s": round(lv["output_tok_s"], 1),
                                           "errors": lv["errors"],
                                           "acceptance": round((lv.get("spec_decode") or {})
                                                               .get("acceptance", 0), 3)}
                  for lv in bench["levels"]}}


def mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB"


def table(results: list[dict[str, Any]]) -> str:
    names = [f"#{i}" for i in range(len(results))]
    lines = [f"{n}: {r['checkout']} ({r['engine']})" for n, r in zip(names, results,
                                                                        strict=True)]
    lines += ["", "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|",
              "| engine image | " + " | ".join(mb(r["bytes"]) for r in results) + " |",
              "| engine build (wall) | " + " | ".join(f"{r['engine_build_s']} s"
                                                     for r in results) + " |"]
    kinds = sorted({k for r in results for k in r["venv"]})
    lines += [f"| venv: {k} | " + " | ".join(mb(r["venv"].get(k, 0)) for r in results) + " |"
              for k in kinds]
    for n, r in zip(names, results, strict=True):
        lines += ["", f"{n} layers (bottom-up, non-empty):"]
        lines += [f"  {x['bytes'] / 1e6:9.1f} MB  {x['step'][:100]}" for x in r["layers"]]
        lines += ["", f"{n} engine build steps that ran (seconds):"]
        lines += [f"  {x['seconds']:7.1f}  {x['step'][:100]}" for x in r["steps"]
                  if x["seconds"] >= 0.5]
    with_reports = [r for r in results if "reports" in r]
    if with_reports:
        rep = [r["reports"] for r in with_reports]
        lines += ["", "| release | " + " | ".join(names[:len(rep)]) + " |",
                  "|---" * (len(rep) + 1) + "|"]
        for part in ("smoke", "gates"):
            for key in sorted({k for x in rep for k in x[part]}):
                lines.append(f"| {part}: {key} | " + " | ".join(x[part].get(key, "-")
                                                              for x in rep) + " |")
        for level in sorted({k for x in rep for k in x["bench"]}, key=int):
            lines.append(f"| bench c={level}: output tok/s, errors, acceptance | " + " | ".join(
                "{output_tok_s} / {errors} / {acceptance}".format(**x["bench"][level])
                if level in x["bench"] else "-" for x in rep) + " |")
        first = rep[0]["token_ids"]
        lines.append("")
        for x, n in zip(rep[1:], names[1:], strict=False):
            same = [k for k in first if x["token_ids"].get(k) == first[k]]
            lines.append(f"token ids of the gates' speculative run, {n} vs #0: "
                         f"{len(same)} of {len(first)} requests identical "
                         f"({sum(len(first[k]) for k in same)} tokens)")
    if any("bench_rounds" in r for r in results):
        lines += ["", "| bench taking turns: output tok/s per run | "
                  + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for level in sorted({k for r in results for k in r.get("bench_rounds", {})}, key=int):
            lines.append(f"| c={level} | " + " | ".join(
                ", ".join(map(str, r.get("bench_rounds", {}).get(level, []))) or "-"
                for r in results) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkout", type=Path, action="append",
                    help="a checkout to build (repeat; default: this one)")
    ap.add_argument("--tag", default="2026-06-18-dflashfix")
    ap.add_argument("--release", action="store_true",
                    help="also run the main job and compare smoke, gates and bench")
    ap.add_argument("--bench-rounds", type=int, default=0, metavar="N",
                    help="then bench each checkout's serve image N times, taking turns")
    ap.add_argument("--out", type=Path, help="build folders (default: a temporary one)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="time-cpu-engine-"))
    results = []
    for i, checkout in enumerate(args.checkout or [REPO]):
        print(f"building the cpu engine of {checkout} ...", file=sys.stderr, flush=True)
        results.append(build(checkout.resolve(), out / str(i),
                             f"time-engine-{os.getpid()}-{i}", args.tag, args.release))
    bench_rounds(results, out, args.bench_rounds)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
