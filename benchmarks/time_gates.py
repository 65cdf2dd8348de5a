"""Seconds the release gates add to the whole job on the cpu target: the gates' requests
smoke sends to the image it has up (the check release_gate_requests_answered, from
smoke's verdict) plus the gates stage, which is `build.py gates --tag T` (the whole job
calls the same function between smoke and publish). Both are timed here after a real
`build.py smoke --tag T` of the built cells, as the whole job runs them.

    .venv/bin/python build.py build --tag 2026-06-18-dflashfix --target cpu   # once
    .venv/bin/python benchmarks/time_gates.py --tag 2026-06-18-dflashfix [--runs 2]

Run it under the machine's heavy-work lock where several people share it. Prints, per
run, the command's wall time and, from each cell's gates.json, the boot and request
seconds of the speculative and the plain server; exits 1 if a gate did not pass."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def one_run(tag: str, target: str, out: Path) -> tuple[float, int, list[dict]]:
    smoke = subprocess.run([sys.executable, "build.py", "smoke", "--tag", tag, "--target",
                            target, "--out", str(out)], cwd=REPO, capture_output=True,
                           text=True)
    if smoke.returncode != 0:
        sys.stderr.write(smoke.stdout[-2000:] + smoke.stderr[-2000:])
        raise SystemExit("smoke failed: the gates follow a passed smoke")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "build.py", "gates", "--tag", tag, "--target",
                           target, "--out", str(out)], cwd=REPO, capture_output=True,
                          text=True)
    wall = time.monotonic() - t0
    if proc.returncode not in (0, 1):
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-2000:])
    docs = []
    for p in sorted(out.rglob("gates.json")):
        doc = json.loads(p.read_text())
        verdict = json.loads(p.with_name("verdict.json").read_text())
        check = verdict["checks"].get("release_gate_requests_answered") or {}
        doc["capture_s"] = float(check.get("seconds") or 0.0)
        docs.append(doc)
    return wall, proc.returncode, docs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tag", default="2026-06-18-dflashfix")
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    worst = 0
    for i in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory(prefix="time-gates-") as d:
            wall, code, docs = one_run(args.tag, args.target, Path(d))
        worst = max(worst, code)
        capture = sum(doc["capture_s"] for doc in docs)
        print(f"run {i}: build.py gates wall {wall:.1f} s, exit {code}; the gates' requests "
              f"inside smoke {capture:.1f} s; added to the whole job {wall + capture:.1f} s")
        for doc in docs:
            s = doc["summary"]
            print(f"  {doc['cell']}: lossless {s['lossless']['status']} "
                  f"({s['lossless']['compared_tokens']} tokens compared, "
                  f"{s['lossless']['ties']} ties), long generation "
                  f"{s['long_generation']['status']} ({s['long_generation']['tokens']} "
                  f"tokens); gates {doc['seconds']:.1f} s")
            conds = s["lossless"].get("conditions") or {}
            print("    conditions: " + ", ".join(f"{k} {v['status']}" for k, v in conds.items()))
            for r in doc["runs"]:
                toks = sum(q["tokens"] for q in r["requests"])
                phases = r.get("phase_seconds") or {}
                fresh = phases.get("fresh", 0.0)
                print(f"    {r['what']:<11} ({r.get('source', '')}) boot {r['boot_s']:5.1f} s, "
                      f"requests {sum(phases.values()):5.1f} s ({toks} tokens): fresh "
                      f"{fresh:.1f} s, conditions {sum(phases.values()) - fresh:.1f} s ("
                      + ", ".join(f"{k} {v:.1f}" for k, v in phases.items() if k != "fresh")
                      + f"); server total {r['seconds']:5.1f} s")
    return worst


if __name__ == "__main__":
    raise SystemExit(main())
