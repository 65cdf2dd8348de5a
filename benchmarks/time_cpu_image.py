#!/usr/bin/env python3
"""Size, push time and boot time of cpu serve images (before/after an engine change).

For each image given:
  - size as Docker reports it, and every layer (bytes, the step that made it);
  - push time: `docker push` to a fresh, empty registry (Debian's docker-registry with
    htpasswd auth, started on a free 127.0.0.1 port by scripts/start-registry.sh), so every
    layer really travels; the credentials go to a throw-away DOCKER_CONFIG, never the
    machine's; the bytes the registry stored (compressed layers) are reported too;
  - boot to /health: the image's own serve command in `docker run --network host` on a
    free port, timed from `docker run` to the first HTTP 200 (best of --boots runs).

Usage: python benchmarks/time_cpu_image.py IMAGE [IMAGE ...] [--boots N] [--json FILE]
Heavy (pushes gigabytes, boots vLLM): run it under `flock /tmp/imagebuild-heavy.lock`.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parent.parent
DOCKER = "/usr/bin/docker"


def docker(*args: str, env: dict[str, str] | None = None, check: bool = True
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, check=check,
                          env={**os.environ, **(env or {})})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def layers(image: str) -> list[dict[str, Any]]:
    """Non-empty layers, bottom-up, with the step that made each."""
    rows = docker("history", "--no-trunc", "--human=false", "--format",
                  "{{.Size}}\t{{.CreatedBy}}", image).stdout.splitlines()[::-1]
    out = []
    for row in rows:
        size, _, step = row.partition("\t")
        if int(size) > 0:
            out.append({"bytes": int(size), "step": " ".join(step.split())[:110]})
    return out


def timed_push(image: str) -> dict[str, Any]:
    """Push IMAGE to a fresh registry; seconds and bytes stored."""
    port = free_port()
    root = Path(tempfile.mkdtemp(prefix="time-cpu-image-"))
    user, password = "bench", secrets.token_hex(12)
    env = {"IMAGEBUILD_REGISTRY_USER": user, "IMAGEBUILD_REGISTRY_PASSWORD": password}
    start = [str(REPO / "scripts/start-registry.sh"), "--port", str(port), "--dir",
             str(root / "registry")]
    subprocess.run(start, check=True, capture_output=True, env={**os.environ, **env})
    config = root / "docker-config"
    config.mkdir()
    denv = {"DOCKER_CONFIG": str(config)}
    ref = f"127.0.0.1:{port}/bench/{image.rsplit('/', 1)[-1].split(':')[0]}:bench"
    try:
        subprocess.run([DOCKER, "login", "--username", user, "--password-stdin",
                        f"127.0.0.1:{port}"], input=password, text=True, check=True,
                       capture_output=True, env={**os.environ, **denv})
        docker("tag", image, ref)
        t0 = time.monotonic()
        docker("push", ref, env=denv)
        took = time.monotonic() - t0
        stored = sum(f.stat().st_size for f in (root / "registry" / "data").rglob("data")
                     if f.is_file())
        return {"push_s": round(took, 1), "pushed_bytes": stored}
    finally:
        docker("rmi", ref, check=False)
        subprocess.run([*start, "--stop"], capture_output=True, env={**os.environ, **env})
        shutil.rmtree(root, ignore_errors=True)


def boot_to_health(image: str, timeout: float = 600) -> float:
    cmd = json.loads(docker("image", "inspect", "--format", "{{json .Config.Cmd}}",
                            image).stdout)
    port = free_port()
    cmd[cmd.index("--port") + 1] = str(port)
    name = f"time-cpu-image-{port}"
    t0 = time.monotonic()
    docker("run", "-d", "--name", name, "--network", "host", "--shm-size", "2g",
           "--memory", "8g", image, *cmd)
    try:
        while time.monotonic() - t0 < timeout:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    return round(time.monotonic() - t0, 1)
            except requests.RequestException:
                pass
            state = docker("inspect", "-f", "{{.State.Running}}", name, check=False)
            if state.stdout.strip() != "true":
                logs = docker("logs", "--tail", "30", name, check=False)
                raise SystemExit(f"{image} exited while booting:\n{logs.stderr[-3000:]}")
            time.sleep(0.5)
        raise SystemExit(f"{image}: no /health 200 within {timeout:.0f} s")
    finally:
        docker("rm", "-f", name, check=False)


def measure(image: str, boots: int) -> dict[str, Any]:
    size = int(docker("image", "inspect", "--format", "{{.Size}}", image).stdout)
    result: dict[str, Any] = {"image": image, "bytes": size, "layers": layers(image)}
    result.update(timed_push(image))
    result["boot_s"] = min(boot_to_health(image) for _ in range(boots)) if boots else None
    return result


def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| image | size | pushed (compressed) | push s | boot to /health s |",
             "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['image']} | {gb(r['bytes'])} | {gb(r['pushed_bytes'])} | "
                     f"{r['push_s']} | {r['boot_s']} |")
    for r in results:
        lines += ["", f"layers of {r['image']} (bottom-up, non-empty):"]
        lines += [f"  {layer['bytes'] / 1e6:10.1f} MB  {layer['step']}" for layer in r["layers"]]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("images", nargs="+")
    ap.add_argument("--boots", type=int, default=1, help="boots per image (best is kept)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    results = []
    for image in args.images:
        print(f"measuring {image} ...", file=sys.stderr, flush=True)
        results.append(measure(image, args.boots))
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
