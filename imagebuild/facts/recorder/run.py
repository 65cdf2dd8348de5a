"""Run one part of the recorder inside the interpreter of the vLLM it describes.

    PYTHON imagebuild/facts/recorder/run.py PART --out FILE [--module NAME=FILE ...]
    PYTHON imagebuild/facts/recorder/run.py --identify

imagebuild/facts/record.py starts it once per part (`build.py facts record`). --identify
prints the installed vLLM's version and distribution as JSON (on the last line).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Context, distribution, part_sha256, version_of, vllm_root  # noqa: E402,I001

PARTS = ("serve_args", "modalities", "kv", "envs", "logs", "metrics", "kernel_select")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", nargs="?", choices=PARTS)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--identify", action="store_true")
    ap.add_argument("--module", action="append", default=[], metavar="NAME=FILE",
                    help="load this (patched) file as vLLM module NAME where a part runs it")
    args = ap.parse_args(argv)
    if args.identify:
        dist = distribution()
        print(json.dumps({"vllm_version": version_of(dist), "distribution": dist,
                          "python": sys.version.split()[0], "root": str(vllm_root()),
                          "recorders": {p: part_sha256(p) for p in PARTS}}))
        return 0
    if not args.part or not args.out:
        ap.error("give PART and --out (or --identify)")
    ctx = Context(options={"modules": dict(m.split("=", 1) for m in args.module)})
    started = time.monotonic()
    module = importlib.import_module(args.part)
    doc = module.record(ctx)
    if ctx.findings:
        doc["findings"] = ctx.findings
    dumps = getattr(module, "dumps", None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dumps(doc) if dumps else json.dumps(doc, indent=1, sort_keys=True)
                        + "\n")
    print(json.dumps({"part": args.part, "out": str(args.out), "findings": ctx.findings,
                      "seconds": round(time.monotonic() - started, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
