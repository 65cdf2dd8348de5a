"""The cpu serve image's container memory at boot and under the bench, against the memory
rule's prediction (imagebuild/preflight/memory.py, docs/memory.md).

For each VLLM_CPU_KVCACHE_SPACE given, the image is served the way the gates and the bench
serve it (serving/container.py: hardened, the cell's memory_limit) but without the
profile's --num-gpu-blocks-override (which caps the pool below the space), and with
--shipped once as it ships, and its memory cgroup is read: rss+shmem (what cannot be
reclaimed) after the boot and sampled 4 times a second under the bench levels, and the
kernel's high-water mark (v1 memory.max_usage_in_bytes, v2 memory.peak), which also
counts reclaimable page cache. A KV space the rule refuses is booted too when asked
(--refused), to see the kill it predicts.

    flock -o /tmp/imagebuild-heavy.lock .venv/bin/python benchmarks/memory_calibration.py \\
        [--image REF] [--kv 1,6] [--refused 7] [--shipped] \\
        [--out build/memory-calibration.json]

Prints one line per boot and writes the JSON; exits 1 if the rss+shmem peak under the
bench is off the prediction by more than the rule's stated error (memory.CPU_ERROR).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from imagebuild.bench import client, prompts  # noqa: E402
from imagebuild.docker import engine, inspect_image  # noqa: E402
from imagebuild.errors import OperationFailed  # noqa: E402
from imagebuild.lock.lockfile import read_lock  # noqa: E402
from imagebuild.preflight import checkpoint, memory  # noqa: E402
from imagebuild.preflight.flags import CellView  # noqa: E402
from imagebuild.preflight.run import kv_prediction  # noqa: E402
from imagebuild.serving.container import serving  # noqa: E402
from imagebuild.serving.runspec import Limits  # noqa: E402
from imagebuild.spec.matrix import expand, load  # noqa: E402
from imagebuild.spec.servecmd import serve_command  # noqa: E402

CELL = "cpu/cpu-tiny-ngram"
GIB = 2**30


def cgroup_dir(container_id: str) -> tuple[Path, str]:
    """The container's memory cgroup and the name of its peak file (v1 or v2)."""
    v1 = Path("/sys/fs/cgroup/memory/docker") / container_id
    if v1.is_dir():
        return v1, "memory.max_usage_in_bytes"
    for v2 in (Path("/sys/fs/cgroup/system.slice") / f"docker-{container_id}.scope",
               Path("/sys/fs/cgroup/docker") / container_id):
        if v2.is_dir():
            return v2, "memory.peak"
    raise SystemExit(f"no memory cgroup found for container {container_id}")


def anon(d: Path) -> int:
    """Non-reclaimable memory: rss + shmem (v1 total_*; v2 anon + shmem)."""
    s = {k: int(v) for k, v in (ln.split() for ln in (d / "memory.stat").read_text()
                                .splitlines())}
    if "total_rss" in s:
        return s["total_rss"] + s.get("total_shmem", 0)
    return s.get("anon", 0) + s.get("shmem", 0)


class Sampler(threading.Thread):
    def __init__(self, d: Path):
        super().__init__(daemon=True)
        self.d, self.stop, self.peak = d, threading.Event(), 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, anon(self.d))
            except (OSError, ValueError):
                pass
            self.stop.wait(0.25)


def predicted(kv_gib: int | None) -> tuple[int, str]:
    """The rule's prediction for the matrix's cpu cell at this KV space (None: as it ships,
    its pool from the predicted page layout), and its limit."""
    lm = load(REPO / "matrix.yaml")
    cell = next(c for c in expand(lm) if c.id == CELL)
    lock = read_lock(lm.root)
    model = checkpoint.MetadataStore(lm.root, lock).get("models", cell.model_name,
                                                        cell.model.repository)
    v = CellView(lm=lm, cell=cell, cmd=serve_command(cell),
                 family=checkpoint.model_family(model), label=cell.id)
    p = memory.predict(v, lock, model, None,
                       kv_prediction(v, model, None) if kv_gib is None else None)
    assert p.need is not None and p.kv is not None
    return (p.need if kv_gib is None else p.need - p.kv + kv_gib * GIB), \
        cell.target.memory_limit


def default_image() -> str:
    """The newest local image of the cpu cell (the one the whole job last built)."""
    images = engine().client.images.list(filters={"label": f"io.imagebuild.cell={CELL}"})
    tagged = sorted((i for i in images if i.tags), key=lambda i: i.attrs["Created"])
    if not tagged:
        raise SystemExit(f"no local image of {CELL}: build one (`build.py build --target "
                         "cpu`) or pass --image")
    return str(tagged[-1].tags[0])


def boot(image: str, kv: int | None, limit: str, levels: list[int], requests: int) -> dict:
    """kv None: as the image ships; else that KV space, the block override dropped."""
    info = inspect_image(image)
    limits = Limits(memory=limit, gpu=False, boot_timeout_s=300)
    out: dict = {"kv_gib": kv}
    env = None if kv is None else {memory.CPU_KV_ENV: str(kv)}
    drop = () if kv is None else (f"--{memory.BLOCKS_FLAG}",)
    t0 = time.monotonic()
    try:
        with serving(image, info, limits, environment=env, drop_flags=drop,
                     log=lambda _m: None) as c:
            out["boot_s"] = round(time.monotonic() - t0, 1)
            d, peak_file = cgroup_dir(engine().client.containers.get(c.name).id)
            out["boot_peak"] = int((d / peak_file).read_text())
            out["boot_anon"] = anon(d)
            sampler = Sampler(d)
            sampler.start()
            ps = prompts.select("structured,prose")
            model = asyncio.run(client.served_model(c.base_url))
            for level in levels:
                load_ = client.Load(model=model, max_tokens=64, requests=requests)
                asyncio.run(client.run_level(c.base_url, ps, level, load_))
            out["bench_peak"] = int((d / peak_file).read_text())
            sampler.stop.set()
            sampler.join(2)
            out["bench_anon_peak"] = sampler.peak
    except OperationFailed as exc:
        out["failed"] = exc.message.splitlines()[0]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", help=f"default: the newest local image of {CELL}")
    ap.add_argument("--kv", default="1,6", help="KV spaces (GiB) to boot")
    ap.add_argument("--refused", default="", help="KV spaces the rule refuses, booted to "
                                                  "see the predicted kill")
    ap.add_argument("--shipped", action="store_true", help="also boot the image as it ships")
    ap.add_argument("--levels", default="1,4,8")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--out", type=Path, default=REPO / "build" / "memory-calibration.json")
    a = ap.parse_args()
    image = a.image or default_image()
    levels = [int(x) for x in a.levels.split(",")]
    runs, worst = [], 0.0
    spaces: list[int | None] = [int(x) for x in a.kv.split(",") if x]
    spaces += [int(x) for x in a.refused.split(",") if x] + ([None] if a.shipped else [])
    for kv in spaces:
        need, limit = predicted(kv)
        r = boot(image, kv, limit, levels, a.requests) | {"predicted": need, "limit": limit}
        runs.append(r)
        what = "as shipped" if kv is None else f"KV {kv} GiB"
        if "failed" in r:
            print(f"{what}: predicted {need / GIB:.3f} GiB vs limit {limit}: "
                  f"boot failed ({r['failed'][:120]})")
            continue
        # the error is on rss+shmem, what the kernel cannot reclaim before an OOM kill;
        # the high-water mark also counts the page cache of the image's libraries, charged
        # to whichever container first read them (docs/memory.md)
        errs = [(r[k] - need) / r[k] for k in ("boot_anon", "bench_anon_peak")]
        worst = max(worst, abs(errs[1]))  # the peak is predicted; the boot sits below it
        print(f"{what}: predicted {need / GIB:.3f} GiB; rss+shmem at boot "
              f"{r['boot_anon'] / GIB:.3f} ({errs[0]:+.1%}), peak under the bench "
              f"{r['bench_anon_peak'] / GIB:.3f} ({errs[1]:+.1%}); cgroup high-water mark "
              f"at boot {r['boot_peak'] / GIB:.3f}, after the bench "
              f"{r['bench_peak'] / GIB:.3f}; boot {r['boot_s']} s")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"image": image, "levels": levels, "requests": a.requests,
                                 "runs": runs, "worst_error": worst}, indent=1))
    print(f"worst error {worst:.1%} (stated: {memory.CPU_ERROR:.0%}); {a.out}")
    return 0 if worst <= memory.CPU_ERROR else 1


if __name__ == "__main__":
    sys.exit(main())
