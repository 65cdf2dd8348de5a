"""Where do a cpu bench's token bursts come from: the server, or the client reading late?

Starts a serve image (optionally pinned with --server-cpus, with extra --env settings),
then per concurrency level streams requests from this process (optionally pinned with
--client-cpus) while
- tcpdump on loopback records when each packet of every response left the server (kernel
  timestamps, independent of when the client got to read it), if tcpdump is installed;
- the client records when it parsed each streamed event (same clock);
- /proc gives every server process's and thread's CPU time and run-queue wait (time it was
  runnable but had no CPU), and the client's own.
A burst the server sends shows as packets close together; a client starved of CPU shows
as events parsed long after their packets arrived. Prints one JSON document per run
(--out keeps it).

    flock /tmp/imagebuild-heavy.lock .venv/bin/python benchmarks/diagnose_stream_timing.py \
        IMAGE_REF [--server-cpus 0] [--client-cpus 1] [--env K=V ...] [--levels 1,4]
    .venv/bin/python benchmarks/diagnose_stream_timing.py \
        --table-from docs/data/burst-diagnosis.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from imagebuild.bench import client, clientcpu, metrics, prompts  # noqa: E402
from imagebuild.docker import engine, inspect_image  # noqa: E402
from imagebuild.expectations import expectations_from_labels  # noqa: E402
from imagebuild.serving.container import serving  # noqa: E402
from imagebuild.serving.runspec import Limits  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")
_PKT = re.compile(r"^(\d+\.\d+) IP [\d.]+\.(\d+) > [\d.]+\.(\d+): .* length (\d+)")


def threads(pids: list[int]) -> dict[tuple[int, int], dict[str, Any]]:
    """CPU seconds and run-queue wait of every thread of `pids`, by (pid, tid)."""
    out = {}
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                sched = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            f = stat[stat.rindex(")") + 2:].split()
            out[(pid, int(tid))] = {"proc": cmd[:60], "comm": comm,
                                    "cpu_s": (int(f[11]) + int(f[12])) / HZ,
                                    "wait_s": int(sched[1]) / 1e9, "last_cpu": int(f[36])}
    return out


def usage(before: dict, after: dict, wall: float) -> list[dict[str, Any]]:
    """Per process: share of one CPU used and share of wall time spent waiting for one."""
    procs: dict[int, dict[str, Any]] = {}
    for key, a in after.items():
        b = before.get(key, {"cpu_s": 0.0, "wait_s": 0.0})
        p = procs.setdefault(key[0], {"pid": key[0], "proc": a["proc"], "cpu": 0.0,
                                      "wait": 0.0, "busiest_threads": []})
        cpu, wait = a["cpu_s"] - b["cpu_s"], a["wait_s"] - b["wait_s"]
        p["cpu"] += cpu / wall
        p["wait"] += wait / wall
        if cpu / wall > 0.05:
            p["busiest_threads"].append(f"{a['comm']}: {cpu / wall:.0%} CPU, "
                                        f"{wait / wall:.0%} waiting, last on CPU {a['last_cpu']}")
    return sorted(({**p, "cpu": round(p["cpu"], 3), "wait": round(p["wait"], 3)}
                   for p in procs.values()), key=lambda p: -p["cpu"])


async def timed_request(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    """One streamed request: its local port and the epoch time each event was parsed."""
    t0 = time.time()
    events: list[float] = []
    async with session.post(url, json=body) as resp:
        conn = resp.connection  # None once a short response was read whole
        port = (conn.transport.get_extra_info("sockname")[1]
                if conn is not None and conn.transport is not None else None)
        async for data in client._events(resp):
            if data != "[DONE]" and json.loads(data).get("choices"):
                events.append(time.time())
    return {"port": port, "start": t0, "events": events}


async def level(base: str, ps: list[prompts.Prompt], c: int, n: int, max_tokens: int,
                model: str) -> tuple[list[dict], clientcpu.ClientLoad, float, float | None]:
    load = client.Load(model=model, max_tokens=max_tokens, requests=n)
    url = base + "/v1/chat/completions"
    async with client.worker_session() as s:  # warm-up, as the bench does
        await client.one_request(s, url, client.payload(model, ps[0], load))
    before = await client._scrape(base)
    todo = iter(range(n))
    out: list[dict] = []

    async def worker() -> None:
        async with client.worker_session() as s:
            for i in todo:
                out.append(await timed_request(s, url, client.payload(model, ps[i % len(ps)],
                                                                      load)))
    t0 = time.perf_counter()
    async with clientcpu.watching() as held:
        await asyncio.gather(*(worker() for _ in range(c)))
    wall = time.perf_counter() - t0
    after = await client._scrape(base)
    srv = metrics.delta(before, after).server_ttft_mean_s if before and after else None
    return out, held, wall, srv


def packets(path: Path, server_port: int) -> dict[int, list[float]]:
    """Kernel timestamps of the server's data packets, by client port."""
    by_port: dict[int, list[float]] = {}
    for line in path.read_text().splitlines():
        m = _PKT.match(line)
        if m and int(m[2]) == server_port and int(m[4]) > 0:
            by_port.setdefault(int(m[3]), []).append(float(m[1]))
    return by_port


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    v = sorted(xs)
    return round(v[min(len(v) - 1, int(q * len(v)))], 3)


def analyse(reqs: list[dict], pkts: dict[int, list[float]] | None) -> dict[str, Any]:
    """Client gaps vs packet gaps; how long after its packet each event was parsed."""
    client_gaps, wire_gaps, read_delay = [], [], []
    for r in reqs:
        ev = r["events"]
        client_gaps += [1000 * (b - a) for a, b in zip(ev, ev[1:], strict=False)]
        if pkts is None or not ev:
            continue
        mine = [t for t in pkts.get(r["port"], []) if r["start"] <= t <= ev[-1] + 1e-3]
        # the first packet holds the response headers; events start after it
        wire = mine[1:]
        wire_gaps += [1000 * (b - a) for a, b in zip(wire, wire[1:], strict=False)]
        for t in ev:
            arrived = [k for k in wire if k <= t + 1e-4]
            if arrived:
                read_delay.append(1000 * (t - arrived[-1]))
    out: dict[str, Any] = {
        "client_gap_ms_p50": pct(client_gaps, 0.5),
        "client_gaps_under_0.2ms": round(sum(g < 0.2 for g in client_gaps)
                                         / max(1, len(client_gaps)), 3)}
    if pkts is not None:
        out.update({
            "wire_gap_ms_p50": pct(wire_gaps, 0.5),
            "wire_gaps_under_0.2ms": round(sum(g < 0.2 for g in wire_gaps)
                                           / max(1, len(wire_gaps)), 3),
            "client_read_delay_ms_p50": pct(read_delay, 0.5),
            "client_read_delay_ms_p90": pct(read_delay, 0.9),
            "client_read_delay_ms_max": pct(read_delay, 1.0)})
    return out


PLACEMENTS = {  # how each run placed server and client, in words
    (None, None): "none (the whole job before the fix)",
    (None, "1"): "client on CPU 1 only",
    (None, "0"): "client on CPU 0 only",
    ("0", "1"): "server on CPU 0, client on CPU 1 (the fix)",
}


def table(runs: list[dict]) -> str:
    """The README table: one row per run, each cell `c=1 / c=4` (the levels run)."""
    def cells(run: dict, fn) -> str:
        return " / ".join(fn(lv) for lv in run["levels"])

    def engine_core(lv: dict) -> str:
        cpu = next((p["cpu"] for p in lv["server_processes"]
                    if "EngineCor" in " ".join(p["busiest_threads"])), None)
        return "-" if cpu is None else f"{cpu:.0%}"

    levels = " / ".join(f"c={lv['concurrency']}" for lv in runs[0]["levels"])
    out = [f"| placement | run | client TTFT p50 ms ({levels}) | vLLM's own TTFT mean ms "
           "| gaps under 0.2 ms, client | ... on the wire | client waited for a CPU "
           "| EngineCore CPU | events/s |", "|" + "---|" * 9]
    for run in runs:
        out.append(" | ".join([
            f"| {PLACEMENTS.get((run['server_cpus'], run['client_cpus']), '?')}",
            run["label"],
            cells(run, lambda lv: f"{lv['client_ttft_ms_p50']:.1f}"),
            cells(run, lambda lv: f"{lv['server_ttft_ms_mean']:.1f}"),
            cells(run, lambda lv: f"{lv['client_gaps_under_0.2ms']:.0%}"),
            cells(run, lambda lv: f"{lv['wire_gaps_under_0.2ms']:.0%}"),
            cells(run, lambda lv: f"{lv['client_loop_wait']:.0%}"),
            cells(run, engine_core),
            cells(run, lambda lv: f"{lv['events_per_s']:.0f}")]) + " |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("image", nargs="?")
    ap.add_argument("--table-from", type=Path, default=None, metavar="JSON",
                    help="print the table of saved runs (a list of --out documents)")
    ap.add_argument("--server-cpus", default=None)
    ap.add_argument("--client-cpus", default=None)
    ap.add_argument("--env", action="append", default=[], metavar="K=V")
    ap.add_argument("--levels", default="1,4")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.table_from:
        print(table(json.loads(args.table_from.read_text())["runs"]))
        return 0
    if not args.image:
        ap.error("IMAGE_REF is needed to measure")
    if args.client_cpus:
        os.sched_setaffinity(0, {int(x) for x in args.client_cpus.split(",")})
    env = dict(e.split("=", 1) for e in args.env)
    ps = prompts.select("structured")
    info = inspect_image(args.image)
    doc: dict[str, Any] = {"label": args.label, "image": args.image, "id": info["Id"],
                           "server_cpus": args.server_cpus, "client_cpus": args.client_cpus,
                           "env": env, "loadavg_before": os.getloadavg(), "levels": []}
    with serving(args.image, info, Limits.of(expectations_from_labels(args.image, info=info)),
                 cpuset=args.server_cpus, environment=env or None) as c:
        logs = b"".join(engine().logs(c.name, follow=False)).decode(errors="replace")
        doc["omp_binding"] = [ln.split("]", 1)[-1].strip() for ln in logs.splitlines()
                              if "ompmultiprocessing" in ln][-4:]
        top = engine().api.top(c.name)
        pids = [int(p[top["Titles"].index("PID")]) for p in top["Processes"]]
        model = asyncio.run(client.served_model(c.base_url))
        for lv in [int(x) for x in args.levels.split(",")]:
            dump = None
            with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
                if shutil.which("tcpdump"):
                    dump = Path(tmp) / "pkts.txt"
                    fh = stack.enter_context(open(dump, "w"))
                    tcpd = subprocess.Popen(
                        ["tcpdump", "-i", "lo", "-n", "-tt", "-l", "-B", "8192",
                         f"tcp src port {c.port}"], stdout=fh, stderr=subprocess.DEVNULL)
                    time.sleep(1)
                t_before, me_before = threads(pids), threads([os.getpid()])
                t_outer = time.perf_counter()
                reqs, held, wall, srv_ttft = asyncio.run(
                    level(c.base_url, ps, lv, args.requests, args.max_tokens, model))
                outer = time.perf_counter() - t_outer  # warm-up and scrapes included
                t_after, me_after = threads(pids), threads([os.getpid()])
                if dump is not None:
                    time.sleep(0.5)
                    tcpd.send_signal(signal.SIGINT)
                    tcpd.wait(10)
                pk = packets(dump, c.port) if dump is not None else None
            ttfts = [1000 * (r["events"][0] - r["start"]) for r in reqs if r["events"]]
            tokens = sum(1 for r in reqs for _ in r["events"])
            row = {"concurrency": lv, "requests": len(reqs), "wall_s": round(wall, 3),
                   "events_per_s": round(tokens / wall, 1),
                   "client_ttft_ms_p50": pct(ttfts, 0.5),
                   "client_ttft_ms_mean": round(statistics.fmean(ttfts), 2) if ttfts else None,
                   "server_ttft_ms_mean": None if srv_ttft is None else round(1000 * srv_ttft,
                                                                               2),
                   **analyse(reqs, pk),
                   "client_cpu": round(held.cpu_s / wall, 3),
                   "client_loop_wait": (None if held.wait_s is None
                                        else round(held.wait_s / wall, 3)),
                   "client_loop_lag_ms_p90": held.lag_p90_ms(),
                   "client_threads": usage(me_before, me_after, outer),
                   "server_processes": usage(t_before, t_after, outer)}
            doc["levels"].append(row)
            print(json.dumps({k: v for k, v in row.items()
                              if k not in ("server_processes", "client_threads")}), flush=True)
            for p in row["server_processes"]:
                print(f"   {p['proc'][:40]:40} cpu {p['cpu']:.2f} wait {p['wait']:.2f}  "
                      + "; ".join(p["busiest_threads"][:3]), flush=True)
    doc["loadavg_after"] = os.getloadavg()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
