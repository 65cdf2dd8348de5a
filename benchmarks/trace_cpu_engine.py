#!/usr/bin/env python3
"""What a cpu serve image really loads: run it, exercise it the way smoke does, and record
every shared object and Python file its processes touch.

Recorded in every process of the container (API server, engine core, helpers):
- native libraries: the dynamic loader's own log (`LD_DEBUG=files`: each library as it is
  mapped, `dlopen`ed ones included) plus /proc/<pid>/maps of every live process after the
  exercise;
- Python: an audit hook (a `sitecustomize` on PYTHONPATH) logs every file opened (sources,
  bytecode, data files) and every `ctypes.dlopen`;
- optionally (`--bindings`) every symbol the loader binds into an NVIDIA or triton library,
  which tells whether any of their code can have been reached (lazy binding: a function is
  bound on its first call).

Exercised as smoke does: /health, /v1/models, chat, streamed chat, a forced tool call
(hermes), /v1/completions, ngram speculation on a repetitive prompt (draft and accepted
counters in /metrics must rise) and a burst of 8 concurrent chats. A failed check is
reported and makes the exit status 1.

Then every installed file of the image's site-packages is attributed to its distribution
(`importlib.metadata`), and the report lists, per distribution, installed bytes and bytes
touched, and the large files nothing touched.

Usage: python benchmarks/trace_cpu_engine.py IMAGE [--out DIR] [--bindings] [--keep-raw]
Heavy (boots vLLM): run it under `flock /tmp/imagebuild-heavy.lock`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from imagebuild.smoke.probes import (  # noqa: E402
    SPEC_ACCEPTED,
    SPEC_DRAFT,
    TOOL,
    message_text,
    metric_sum,
    sse_events,
    stream_text,
    tool_call_regex,
)

DOCKER = "/usr/bin/docker"
TRACE = "/trace"  # where the container writes its traces (a bind mount)
SITE = "/opt/vllm/lib/python3.11/site-packages"

# Installed in every Python process of the container: logs each file opened and each ctypes
# dlopen, once per process, with unbuffered writes (workers may die without atexit). Debian's
# own sitecustomize, which this one shadows, is run afterwards.
SITECUSTOMIZE = r'''
import os, sys
_fd = os.open(f"/trace/py.{os.getpid()}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
_seen = set()
def _hook(event, args):
    if event == "open" or event == "ctypes.dlopen":
        p = args[0]
        if isinstance(p, bytes):
            p = os.fsdecode(p)
        if isinstance(p, str) and p not in _seen:
            _seen.add(p)
            os.write(_fd, (event + "\t" + p + "\n").encode("utf-8", "replace"))
sys.addaudithook(_hook)
os.write(_fd, ("argv\t" + " ".join(sys.argv) + "\n").encode())
for _d in sys.path:
    _f = os.path.join(_d, "sitecustomize.py")
    if _d and not _d.startswith("/trace") and os.path.isfile(_f):
        exec(compile(open(_f).read(), _f, "exec"), {"__name__": "sitecustomize"})
        break
'''

# Run inside the image: every distribution's files with their sizes.
INVENTORY = r'''
import json, os, importlib.metadata as md
site = os.environ["SITE"]
out = {}
for d in md.distributions():
    files = []
    for f in d.files or []:
        p = os.path.normpath(os.path.join(site, str(f))) if not os.path.isabs(str(f)) else str(f)
        try:
            files.append([p, os.lstat(p).st_size])
        except OSError:
            pass
    out[d.metadata["Name"]] = files
print(json.dumps(out))
'''

LD_FILE = re.compile(r"^\s*\d+:\s+file=(\S+) \[\d+\];\s+generating link map")
LD_INIT = re.compile(r"^\s*\d+:\s+calling init: (\S+)")
LD_BIND = re.compile(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: \S+ symbol `([^']+)'")
HEAVY_BINDINGS = re.compile(r"/(nvidia|triton|cuda)/")


def docker(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def image_cmd(image: str, port: int) -> list[str]:
    cmd = json.loads(docker("image", "inspect", "--format", "{{json .Config.Cmd}}", image,
                            check=True).stdout)
    cmd[cmd.index("--port") + 1] = str(port)
    return list(cmd)


def start(image: str, name: str, port: int, trace: Path, bindings: bool) -> None:
    (trace / "py").mkdir(parents=True)
    (trace / "py" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    os.chmod(trace, 0o777)
    ld = "files,bindings" if bindings else "files"
    docker("run", "-d", "--name", name, "--network", "host", "--shm-size", "2g",
           "--memory", "8g", "-v", f"{trace}:{TRACE}", "-e", f"PYTHONPATH={TRACE}/py",
           "-e", f"LD_DEBUG={ld}", "-e", f"LD_DEBUG_OUTPUT={TRACE}/ld", image,
           *image_cmd(image, port), check=True)


def wait_healthy(name: str, base: str, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip() != "true":
            raise SystemExit("container exited:\n" + docker("logs", "--tail", "40", name).stderr)
        try:
            if requests.get(base + "/health", timeout=2).status_code == 200:
                return time.monotonic() - t0
        except requests.RequestException:
            pass
        time.sleep(1)
    raise SystemExit(f"not healthy after {timeout:.0f} s")


def exercise(base: str) -> dict[str, str]:
    """Smoke's requests; each check's outcome ('ok' or why not)."""
    results: dict[str, str] = {}

    def check(name: str, fn) -> None:
        try:
            fn()
            results[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none hidden
            results[name] = f"FAILED: {type(exc).__name__}: {exc}"[:300]

    def chat(content: str, **extra: Any) -> dict[str, Any]:
        body = {"model": "tiny", "max_tokens": 32, "temperature": 0,
                "messages": [{"role": "user", "content": content}],
                "chat_template_kwargs": {"enable_thinking": False}, **extra}
        r = requests.post(base + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text[:200]
        return dict(r.json())

    def models() -> None:
        ids = sorted(m["id"] for m in requests.get(base + "/v1/models", timeout=10)
                     .json()["data"])
        assert ids == ["tiny", "tiny-alias"], ids

    def plain() -> None:
        assert message_text(chat("Name three colours.", min_tokens=4)["choices"][0]
                            ["message"]).strip()

    def stream() -> None:
        body = {"model": "tiny-alias", "stream": True, "max_tokens": 16, "min_tokens": 4,
                "messages": [{"role": "user", "content": "Count to five."}]}
        with requests.post(base + "/v1/chat/completions", json=body, stream=True,
                           timeout=120) as r:
            events = sse_events(r.iter_lines(decode_unicode=True))
        assert events and events[-1] == "[DONE]" and stream_text(events).strip(), events[-2:]

    def tool() -> None:
        choice = chat("What is the weather in Paris?", tools=[TOOL], tool_choice="auto",
                      max_tokens=128,
                      structured_outputs={"regex": tool_call_regex("hermes")})["choices"][0]
        call = choice["message"]["tool_calls"][0]["function"]
        assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {
            "city": "Paris"} and choice["finish_reason"] == "tool_calls", choice

    def completion() -> None:
        r = requests.post(base + "/v1/completions", timeout=120, json={
            "model": "tiny", "prompt": "Once upon a time", "max_tokens": 16, "min_tokens": 4})
        assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text[:200]

    def speculation() -> None:
        text = requests.get(base + "/metrics", timeout=30).text
        d0, a0 = metric_sum(text, SPEC_DRAFT), metric_sum(text, SPEC_ACCEPTED)
        assert d0 is not None and a0 is not None, "no speculative counters in /metrics"
        for _ in range(4):
            chat("Repeat the list exactly, twice: " + "alpha beta gamma delta " * 12,
                 max_tokens=64, min_tokens=32)
        text = requests.get(base + "/metrics", timeout=30).text
        d1, a1 = metric_sum(text, SPEC_DRAFT), metric_sum(text, SPEC_ACCEPTED)
        assert d1 is not None and a1 is not None and d1 > d0 and a1 > a0, (d0, d1, a0, a1)

    def burst() -> None:
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(lambda i: chat(f"Request {i}: one sentence about the "
                                                   "sea.", min_tokens=4), range(16)))
        assert all(message_text(a["choices"][0]["message"]).strip() for a in answers)

    for name, fn in [("models", models), ("chat", plain), ("stream", stream),
                     ("tool_call", tool), ("completion", completion),
                     ("ngram_speculation", speculation), ("burst_c8", burst)]:
        check(name, fn)
    return results


def snapshot_maps(name: str) -> dict[str, dict[str, Any]]:
    """Mapped files of every live process in the container (read from the host's /proc)."""
    top = docker("top", name, "-eo", "pid,args", check=True).stdout.splitlines()[1:]
    procs: dict[str, dict[str, Any]] = {}
    for line in top:
        pid, _, args = line.strip().partition(" ")
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        files = sorted({f.split(None, 5)[5] for f in maps.splitlines()
                        if len(f.split(None, 5)) == 6 and f.split(None, 5)[5].startswith("/")})
        procs[pid] = {"args": args.strip()[:200], "files": files}
    return procs


def log_sizes(trace: Path) -> dict[str, int]:
    """How far each loader log has got: what is written after this was bound later."""
    return {f.name: f.stat().st_size for f in trace.glob("ld.*")}


def read_traces(trace: Path, healthy_at: dict[str, int]) -> dict[str, Any]:
    """Libraries the loader mapped, files Python opened, every symbol bound into an
    NVIDIA/triton/cuda library ({library: {binder: [symbols]}}), the subset bound after
    /health answered (with lazy binding, a function is bound at its first call: these are
    the calls serving made), and the argv of every traced Python process with the heavy
    packages it opened."""
    libs: set[str] = set()
    opened: set[str] = set()
    bound: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    serving: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    late = 0  # bindings of any library after /health: shows lazy binding is being seen
    for f in trace.glob("ld.*"):
        mark = healthy_at.get(f.name, 0)
        with f.open("rb") as fh:
            offset = 0
            for raw in fh:
                offset += len(raw)
                line = raw.decode(errors="replace")
                m = LD_INIT.match(line) or LD_FILE.match(line)
                if m and m.group(1).startswith("/"):
                    libs.add(os.path.normpath(m.group(1)))
                    continue
                if offset > mark and "binding file" in line:
                    late += 1
                if "binding file" in line and HEAVY_BINDINGS.search(line):
                    b = LD_BIND.search(line)
                    if b and HEAVY_BINDINGS.search(b.group(2)):
                        target = os.path.normpath(b.group(2))
                        binder = os.path.basename(b.group(1))
                        bound[target][binder].add(b.group(3))
                        if offset > mark:
                            serving[target][binder].add(b.group(3))
    processes = []
    for f in trace.glob("py.*"):
        argv, heavy = "", set()
        for line in f.read_text(errors="replace").splitlines():
            kind, _, path = line.partition("\t")
            if kind == "argv":
                argv = path
            elif kind == "ctypes.dlopen" and path.startswith("/"):
                libs.add(os.path.normpath(path))
            elif path.startswith("/"):
                opened.add(os.path.normpath(path))
            h = re.search(r"site-packages/(triton|cuda|nvidia)/", path)
            if h:
                heavy.add(h.group(1))
        processes.append({"argv": argv[:160], "opened_heavy": sorted(heavy)})

    def plain(d: dict[str, dict[str, set[str]]]) -> dict[str, dict[str, list[str]]]:
        return {t: {b: sorted(s) for b, s in v.items()} for t, v in sorted(d.items())}

    return {"libs": libs, "opened": opened, "bound": plain(bound),
            "bound_while_serving": plain(serving), "bindings_while_serving": late,
            "processes": processes}


def inventory(image: str) -> dict[str, list[tuple[str, int]]]:
    out = docker("run", "--rm", "--network", "none", "-e", f"SITE={SITE}", "--entrypoint",
                 "python", image, "-c", INVENTORY, check=True).stdout
    return {k: [(p, s) for p, s in v] for k, v in json.loads(out).items()}


def realpaths(image: str, paths: set[str]) -> dict[str, str]:
    """Symlinks resolved inside the image (the loader logs the name it opened)."""
    script = ("import json,os,sys; print(json.dumps({p: os.path.realpath(p) "
              "for p in json.load(sys.stdin)}))")
    proc = subprocess.run([DOCKER, "run", "--rm", "-i", "--network", "none", "--entrypoint",
                           "python", image, "-c", script], input=json.dumps(sorted(paths)),
                          capture_output=True, text=True, check=True)
    return dict(json.loads(proc.stdout))


def analyse(image: str, touched: set[str]) -> dict[str, Any]:
    inv = inventory(image)
    real = realpaths(image, touched)
    touched_all = touched | set(real.values())
    per_dist = []
    for dist, files in inv.items():
        size = sum(s for _, s in files)
        used = [(p, s) for p, s in files if p in touched_all]
        unused_big = sorted(((p, s) for p, s in files if p not in touched_all and s >= 2**20),
                            key=lambda x: -x[1])
        per_dist.append({"distribution": dist, "installed_bytes": size,
                         "touched_files": len(used), "touched_bytes": sum(s for _, s in used),
                         "untouched_large_files": [[p.removeprefix(SITE + "/"), s]
                                                   for p, s in unused_big[:40]]})
    per_dist.sort(key=lambda d: -d["installed_bytes"])
    return {"distributions": per_dist}


def mb(n: float) -> str:
    return f"{n / 1e6:8.1f} MB"


def report(result: dict[str, Any]) -> str:
    lines = [f"image: {result['image']}", f"boot to /health: {result['boot_s']:.1f} s",
             "checks: " + ", ".join(f"{k}={v}" for k, v in result["checks"].items()),
             f"processes traced: {len(result['processes'])} Python, "
             f"{len(result['maps'])} alive at the end", "",
             "distribution                     installed      touched  files"]
    for d in result["distributions"]:
        if d["installed_bytes"] < 1e6:
            continue
        lines.append(f"{d['distribution'][:30]:30} {mb(d['installed_bytes'])} "
                     f"{mb(d['touched_bytes'])} {d['touched_files']:6}")
    lines += ["", "native libraries loaded from nvidia/, triton/, cuda/ and torch/lib:"]
    lines += [f"  {p.removeprefix(SITE + '/')}" for p in result["libraries"]
              if re.search(r"/(nvidia|triton|cuda|torch/lib)/", p)]
    lines += ["", "Python processes (argv) and the heavy packages each opened:"]
    lines += [f"  {p['opened_heavy'] or '-'}  {p['argv'][:110]}" for p in result["processes"]]
    for key, title in (("bound_symbols", "symbols bound into NVIDIA / triton libraries"),
                       ("bound_while_serving", "of those, bound after /health answered "
                        "(functions first called while serving)")):
        if key not in result:
            continue
        lines += ["", f"{title}: library <- binder: count (a few names)"]
        if not result[key]:
            lines.append("  none")
        for lib, binders in result[key].items():
            for binder, syms in binders.items():
                lines.append(f"  {lib.removeprefix(SITE + '/')} <- {binder}: {len(syms)} ("
                             + ", ".join(syms[:4]) + ")")
    if "bindings_while_serving" in result:
        lines.append(f"(all symbol bindings after /health, any library: "
                     f"{result['bindings_while_serving']})")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("image")
    ap.add_argument("--out", type=Path, default=REPO / "build" / "trace")
    ap.add_argument("--bindings", action="store_true",
                    help="also log symbol bindings into NVIDIA/triton libraries (slow boot)")
    ap.add_argument("--keep-raw", action="store_true", help="keep the raw loader logs")
    ap.add_argument("--boot-timeout", type=float, default=900)
    args = ap.parse_args()

    port = free_port()
    name = f"imagebuild-trace-{port}"
    trace = Path(tempfile.mkdtemp(prefix="cpu-trace-"))
    base = f"http://127.0.0.1:{port}"
    start(args.image, name, port, trace, args.bindings)
    try:
        boot = wait_healthy(name, base, args.boot_timeout)
        healthy_at = log_sizes(trace)
        checks = exercise(base)
        maps = snapshot_maps(name)
        docker("stop", "-t", "20", name)  # a clean shutdown also logs what exit loads
        logs = docker("logs", name)
    finally:
        docker("rm", "-f", name)
    traced = read_traces(trace, healthy_at)
    mapped = {f for p in maps.values() for f in p["files"]}
    touched = traced["libs"] | traced["opened"] | mapped
    result = {"image": args.image, "boot_s": round(boot, 1), "checks": checks,
              "processes": traced["processes"], "maps": maps,
              "libraries": sorted(traced["libs"] | {f for f in mapped if ".so" in f}),
              **analyse(args.image, touched)}
    if args.bindings:
        result["bound_symbols"] = traced["bound"]
        result["bound_while_serving"] = traced["bound_while_serving"]
        result["bindings_while_serving"] = traced["bindings_while_serving"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "trace.json").write_text(json.dumps(result, indent=1))
    (args.out / "container.log").write_text(logs.stdout + logs.stderr)
    (args.out / "opened.txt").write_text("\n".join(sorted(touched)) + "\n")
    text = report(result)
    (args.out / "trace.md").write_text(text + "\n")
    print(text)
    if args.keep_raw:
        shutil.copytree(trace, args.out / "raw", dirs_exist_ok=True)
    shutil.rmtree(trace, ignore_errors=True)
    failed = [k for k, v in checks.items() if v != "ok"]
    if failed:
        print(f"FAILED checks: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
