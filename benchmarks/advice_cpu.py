"""The cpu cell against its plain twin, benched back to back N times (docs/advice.md):
how far apart the two are per level from run to run, which sets cpu's `bench.tie_margin`.

    flock -o /tmp/imagebuild-heavy.lock .venv/bin/python benchmarks/advice_cpu.py --runs 3
    .venv/bin/python benchmarks/advice_cpu.py --from docs/data/advice-cpu.json

Each run is `build.py bench --tag T --target cpu` (the image as it ships, then its twin);
`--from` prints the table and draws docs/advice-cpu.png from recorded runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from imagebuild.bench.plot import plot  # noqa: E402
from imagebuild.bench.results import plain_levels  # noqa: E402


def table(runs: list[dict]) -> str:
    out = ["| run | c | ngram tok/s | plain twin tok/s | ngram vs plain | acceptance / mean "
           "length | figures |", "|" + "---|" * 7]
    for r in runs:
        doc = r["doc"]
        twin = plain_levels(doc)
        for lv in doc["levels"]:
            p = twin[lv["concurrency"]]
            sd = lv.get("spec_decode") or {}
            flags = [f["code"] for f in (lv.get("flags") or []) + (p.get("flags") or [])]
            out.append(f"| {r['run']} | {lv['concurrency']} | {lv['output_tok_s']:,.1f} | "
                       f"{p['output_tok_s']:,.1f} | "
                       f"{lv['output_tok_s'] / p['output_tok_s'] - 1:+.1%} | "
                       f"{sd.get('acceptance', 0):.2f} / {sd.get('mean_accepted_length', 0):.2f}"
                       f" | {'UNTRUSTED (' + ', '.join(flags) + ')' if flags else 'ok'} |")
    return "\n".join(out)


def run(tag: str, n: int) -> list[dict]:
    runs = []
    for i in range(1, n + 1):
        with tempfile.TemporaryDirectory() as out:
            subprocess.run([sys.executable, "build.py", "bench", "--tag", tag, "--target",
                            "cpu", "--plain-baseline", "--out", out], cwd=ROOT, check=True)
            (path,) = Path(out).glob("*.json")
            doc = json.loads(path.read_text())
        doc["image"].pop("labels", None)
        runs.append({"run": f"rep{i}", "doc": doc})
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tag", default="2026-06-18-dflashfix")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--from", dest="source", type=Path, help="recorded runs (JSON) instead")
    ap.add_argument("--json", type=Path, help="write the runs here")
    ap.add_argument("--png", type=Path, default=ROOT / "docs" / "advice-cpu.png")
    args = ap.parse_args()
    runs = (json.loads(args.source.read_text())["runs"] if args.source
            else run(args.tag, args.runs))
    if args.json:
        args.json.write_text(json.dumps({"runs": runs}, indent=1, sort_keys=True))
    print(table(runs))
    docs = [{**r["doc"], "image": {**r["doc"]["image"], "label": r["run"].split(" ")[0]}}
            for r in runs]
    plot(docs, args.png, title="cpu-tiny-ngram (solid) and its plain twin (dashed), "
                               "benched back to back on 2 shared cores")
    print(f"png: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
