"""Several `build.py bench` runs side by side, one row per run and level: the README's
before/after table of the bench placement, regenerated from its raw data.

    .venv/bin/python benchmarks/bench_runs_table.py docs/data/placement-before-after.json
    .venv/bin/python benchmarks/bench_runs_table.py --collect OUT.json build/bench/*/*.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _ms(stats: dict | None, key: str = "median", digits: int = 1) -> str:
    v = (stats or {}).get(key)
    return "-" if v is None else f"{v:.{digits}f}"


def table(docs: list[dict]) -> str:
    out = ["| run | CPUs | c | tok/s | TTFT p50 ms | TTFT mean ms (vLLM's own) "
           "| ITL p50 ms | client waited for a CPU | figures |", "|" + "---|" * 9]
    for doc in docs:
        st = doc["settings"]
        client = ",".join(str(c) for c in st.get("client_cpus") or []) or "any"
        where = f"server {st.get('server_cpus') or 'any'}, client {client}"
        for lv in doc["levels"]:
            wait = (lv.get("client") or {}).get("wait_share")
            flags = ", ".join(f["code"] for f in lv.get("flags") or [])
            server = lv.get("server_ttft_mean_ms")
            out.append(
                f"| {doc['image'].get('label')} | {where} | {lv['concurrency']} "
                f"| {lv['output_tok_s']:,.1f} | {_ms(lv['ttft_ms'])} "
                f"| {_ms(lv['ttft_ms'], 'mean')} ({'-' if server is None else f'{server:.1f}'}) "
                f"| {_ms(lv['itl_ms'], digits=2)} "
                f"| {'-' if wait is None else f'{wait:.0%}'} "
                f"| {'**UNTRUSTED** (' + flags + ')' if flags else 'ok'} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--collect", type=Path, default=None, metavar="OUT",
                    help="write the given run documents, in order, into one data file")
    args = ap.parse_args()
    if args.collect:
        docs = [json.loads(f.read_text()) for f in args.files]
        args.collect.write_text(json.dumps({"runs": docs}, indent=1) + "\n")
    else:
        docs = [d for f in args.files for d in json.loads(f.read_text())["runs"]]
    print(table(docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
