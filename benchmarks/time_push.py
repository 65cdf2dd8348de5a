#!/usr/bin/env python3
"""Push of the cpu serve image to a fresh local registry, the way publish pushes it
(imagebuild/registry/push.py, then its read-back): the median of --runs pushes, each to a
new registry (scripts/start-registry.sh on a free 127.0.0.1 port, its own storage) with an
empty push cache, so every layer travels. Also this process's and the registry's CPU
seconds, the bytes sent and stored, and the load average before each run (the figures
move with it on a shared machine).

--encoding gzip / --source export time the other ways (a registry elsewhere; an engine
whose store this user may not read); --dockerd also times `docker push` of the same image
to a fresh registry (benchmarks/time_cpu_image.py's), the way before. --gzip-levels 1,6
pushes nothing: it times zlib on one core, 4 MiB members, over the first 256 MB of the
image's largest layer, per level (why streams.GZIP_LEVEL is what it is).

Usage: flock -o /tmp/imagebuild-heavy.lock .venv/bin/python benchmarks/time_push.py
         [IMAGE] [--runs 3] [--encoding none|gzip] [--gzip-level N] [--source store|export]
         [--dockerd] [--gzip-levels 1,6] [--json FILE]
IMAGE defaults to the newest local image of the cpu-tiny-ngram cell.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from time_cpu_image import docker, free_port, timed_push  # noqa: E402

from imagebuild import dockerstore  # noqa: E402
from imagebuild.registry import push, streams  # noqa: E402
from imagebuild.registry.client import RegistryClient  # noqa: E402

CELL = "io.imagebuild.cell=cpu/cpu-tiny-ngram"


def newest_cell_image() -> str:
    ids = docker("images", "--filter", f"label={CELL}", "--format", "{{.ID}}").stdout.split()
    if not ids:
        raise SystemExit(f"no local image labelled {CELL}: build the cpu cell first "
                         "(`build.py build --tag 2026-06-18-dflashfix`)")
    return ids[0]  # docker lists the newest first


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def fresh_registry() -> Iterator[tuple[RegistryClient, Path, int]]:
    """(client, storage, registry pid) of a new registry; stopped and deleted after."""
    root = Path(tempfile.mkdtemp(prefix="time-push-"))
    user, password = "bench", secrets.token_hex(12)
    env = {**os.environ, "IMAGEBUILD_REGISTRY_USER": user,
           "IMAGEBUILD_REGISTRY_PASSWORD": password}
    start = [str(REPO / "scripts/start-registry.sh"), "--port", str(free_port()), "--dir",
             str(root / "registry")]
    url = subprocess.run(start, check=True, capture_output=True, text=True,
                         env=env).stdout.strip().splitlines()[-1]
    try:
        pid = int((root / "registry" / "registry.pid").read_text())
        yield RegistryClient(url, username=user, password=password), root, pid
    finally:
        subprocess.run([*start, "--stop"], capture_output=True, env=env)
        shutil.rmtree(root, ignore_errors=True)


def one_push(image_id: str) -> dict[str, Any]:
    with fresh_registry() as (client, root, pid), tempfile.TemporaryDirectory() as cache:
        os.environ["IMAGEBUILD_CACHE_DIR"] = cache  # no records: nothing is mounted
        load = os.getloadavg()[0]
        ours, theirs, t0 = resource.getrusage(resource.RUSAGE_SELF), cpu_seconds(pid), \
            time.monotonic()
        digest = push.push_with_retries(client, "bench/cpu", "bench", image_id,
                                        attempts=1, log=lambda _: None)
        push.verify_pushed(client, "bench/cpu", "bench", image_id, digest)
        took = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_SELF)
        stored = sum(f.stat().st_size for f in (root / "registry" / "data").rglob("data")
                     if f.is_file())
        return {"push_s": round(took, 1), "sent_bytes": client.bytes.sent,
                "stored_bytes": stored, "load_before": round(load, 1),
                "our_cpu_s": round(after.ru_utime + after.ru_stime - ours.ru_utime
                                   - ours.ru_stime, 1),
                "registry_cpu_s": round(cpu_seconds(pid) - theirs, 1)}


def gzip_levels(image_id: str, levels: list[int], sample: int = 256 << 20
                ) -> list[dict[str, Any]]:
    """zlib's speed on one core and the size it gives, per level, over the first
    `sample` bytes of the largest layer, cut into streams.PIECE members as a push does."""
    image = dockerstore.local_image(image_id)
    sizes = {d: 0 for d in image.diff_ids}
    for layer in image.layers(set(image.diff_ids)):  # sizes from the store's own bytes
        sizes[layer.diff_id or ""] = sum(len(c) for c in layer.chunks)
    largest = max(sizes, key=sizes.__getitem__)
    data = bytearray()
    for layer in image.layers({largest}):
        for chunk in layer.chunks:
            data += chunk
            if len(data) >= sample:
                break
    out = []
    for level in levels:
        t0 = time.process_time()
        packed = sum(len(m) for m in streams.gzip_members(iter([bytes(data)]), level=level,
                                                           workers=1))
        secs = time.process_time() - t0
        out.append({"level": level, "sample_bytes": len(data),
                    "mb_per_core_s": round(len(data) / secs / 1e6),
                    "ratio": round(packed / len(data), 3)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("image", nargs="?")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--encoding", choices=streams.ENCODINGS, default="none",
                    help="none: what a loopback registry gets (the default); gzip: any other")
    ap.add_argument("--source", choices=("store", "export"), default="store",
                    help="store: dockerd's files (when readable); export: `docker save`")
    ap.add_argument("--gzip-level", type=int, default=streams.GZIP_LEVEL)
    ap.add_argument("--dockerd", action="store_true", help="also time `docker push`")
    ap.add_argument("--gzip-levels", help="e.g. 1,6: time zlib per level, push nothing")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    image = args.image or newest_cell_image()
    image_id = docker("image", "inspect", "--format", "{{.Id}}", image).stdout.strip()
    if args.gzip_levels:
        levels = gzip_levels(image_id, [int(x) for x in args.gzip_levels.split(",")])
        print(json.dumps({"image": image, "levels": levels}, indent=1))
        return 0
    os.environ[streams.ENCODING_ENV] = args.encoding
    streams.GZIP_LEVEL = args.gzip_level
    if args.source == "export":
        push.local_image = lambda i: dockerstore.from_export(  # type: ignore[assignment]
            i, tuple(json.loads(docker("image", "inspect", "--format",
                                       "{{json .RootFS.Layers}}", i).stdout)))
    runs = []
    for n in range(args.runs):
        runs.append(one_push(image_id))
        print(f"run {n + 1}: {runs[-1]}", file=sys.stderr, flush=True)
    result: dict[str, Any] = {
        "image": image, "image_id": image_id, "image_bytes": int(docker(
            "image", "inspect", "--format", "{{.Size}}", image).stdout),
        "encoding": args.encoding, "source": args.source, "runs": runs,
        "gzip_level": args.gzip_level if args.encoding == "gzip" else None,
        "median_push_s": statistics.median(r["push_s"] for r in runs)}
    if args.dockerd:
        dockerd = [timed_push(image) for _ in range(args.runs)]
        result["dockerd_runs"] = dockerd
        result["dockerd_median_push_s"] = statistics.median(r["push_s"] for r in dockerd)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
