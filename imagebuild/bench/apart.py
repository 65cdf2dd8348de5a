"""Each bench level's load generator runs in a Python process of its own.

The client times every streamed chunk, so anything that delays its event loop shows up
as latency the server never had. In the calling process that is more than CPU
contention: any other thread there (a log follower, a progress watcher, a test runner's
helpers) holds the interpreter lock for up to its 5 ms switch interval, and a long-lived
process's large heap makes garbage collections long. A CI run showed exactly that: the
client pinned to its own CPU, waiting for it 1% of the time, yet its 5 ms timer fired a
full switch interval late (p90 5.0 ms) and the level was flagged `client-starved`. A
child with one thread and a small heap measures only what the server did. It inherits
the caller's CPU affinity, so the placement (placement.py) still holds.

Protocol: the request as one JSON document on stdin; on stdout one `tick` line per
finished request (the caller's progress) and a final `level <json>` line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from imagebuild.bench import client, clientcpu, metrics
from imagebuild.bench.prompts import Prompt
from imagebuild.errors import OperationFailed

# the directory holding the `imagebuild` package: the child imports the same code the
# caller runs, from a checkout or an installed package alike
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


def run_level(base_url: str, prompts: list[Prompt], concurrency: int, load: client.Load,
              tick: Callable[[], None] = lambda: None) -> client.Level:
    """client.run_level, in a child process; the caller's `tick` runs per request."""
    request = {"base_url": base_url, "prompts": [asdict(p) for p in prompts],
               "concurrency": concurrency, "load": asdict(load)}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "imagebuild.bench.apart"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env)
    found: dict[str, Any] | None = None
    try:
        assert proc.stdin is not None and proc.stdout is not None
        with contextlib.suppress(BrokenPipeError):  # a child that died at once: below
            proc.stdin.write(json.dumps(request))
            proc.stdin.close()
        for line in proc.stdout:
            if line == "tick\n":
                tick()
            elif line.startswith("level "):
                found = json.loads(line[len("level "):])
        code = proc.wait()
    finally:  # an interrupt or a failing tick: the child never outlives the level
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if code != 0 or found is None:
        raise OperationFailed(
            f"the load generator for c={concurrency} against {base_url} exited with "
            f"code {code} before reporting its level (its error is printed above)",
            fix="check that the server still answers (curl URL/health) and run the bench "
                "again")
    return level_from_dict(found)


def level_to_dict(level: client.Level) -> dict[str, Any]:
    return asdict(level)


def level_from_dict(d: dict[str, Any]) -> client.Level:
    return client.Level(
        concurrency=int(d["concurrency"]),
        results=[client.RequestResult(**r) for r in d["results"]],
        wall_s=float(d["wall_s"]), client_cpu_s=float(d["client_cpu_s"]),
        server=None if d["server"] is None else metrics.LevelMetrics(**d["server"]),
        client=None if d["client"] is None else clientcpu.ClientLoad(**d["client"]))


def _main() -> int:
    req = json.loads(sys.stdin.read())

    def tick() -> None:
        sys.stdout.write("tick\n")
        sys.stdout.flush()

    level = asyncio.run(client.run_level(
        req["base_url"], [Prompt(**p) for p in req["prompts"]], int(req["concurrency"]),
        client.Load(**req["load"]), tick=tick))
    sys.stdout.write("level " + json.dumps(level_to_dict(level)) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_main())
