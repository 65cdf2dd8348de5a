"""The gb10 arch gate on real shared objects compiled by nvcc (CUDA 13, no GPU needed).

Each case is a directory laid out like the installed `vllm/` package and checked the
way the engine Dockerfile does: `python3 check-cuda-arch.py --expect sm_121a DIR`.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
GATE = ROOT / "images" / "engine" / "files" / "check-cuda-arch.py"
FIXTURES = ROOT / "tests" / "data" / "cuda"
NVCC_DEFAULT = "/usr/local/cuda-13.0/bin/nvcc"


def _tool(env_var: str, name: str, extra: list[str]) -> str | None:
    for cand in [os.environ.get(env_var), shutil.which(name), *extra]:
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def _missing(what: str) -> None:
    # CI must have the toolchain; a developer machine without it just skips.
    if os.environ.get("CI"):
        pytest.fail(f"{what} not found and CI is set")
    pytest.skip(f"{what} not found")


@pytest.fixture(scope="session")
def nvcc() -> str:
    path = _tool("IMAGEBUILD_NVCC", "nvcc", [NVCC_DEFAULT])
    if path is None:
        _missing("nvcc (IMAGEBUILD_NVCC, PATH or /usr/local/cuda-13.0/bin)")
    assert path is not None
    return path


@pytest.fixture(scope="session")
def cuobjdump(nvcc: str) -> str:
    # The pip wheel nvidia-cuda-cuobjdump installs to <site>/nvidia/cu13/bin/cuobjdump.
    wheel = [c for p in sys.path for c in glob.glob(os.path.join(p, "nvidia/cu*/bin/cuobjdump"))]
    path = _tool("IMAGEBUILD_CUOBJDUMP", "cuobjdump", [str(Path(nvcc).parent / "cuobjdump")]
                 + wheel)
    if path is None:
        _missing("cuobjdump (IMAGEBUILD_CUOBJDUMP, PATH, next to nvcc, nvidia-cuda-cuobjdump)")
    assert path is not None
    return path


def _nvcc(nvcc: str, *args: str) -> None:
    subprocess.run([nvcc, "-Xcompiler", "-fPIC", *args], check=True, capture_output=True)


@pytest.fixture(scope="session")
def objects(nvcc: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Compiled once per session: nvcc takes ~2-3 s per object on 2 cores."""
    out = tmp_path_factory.mktemp("cuda")
    src = str(FIXTURES / "kernel.cu")
    gencodes = {
        "sm_121a": ["-gencode", "arch=compute_121a,code=sm_121a"],
        "sm_120": ["-gencode", "arch=compute_120,code=sm_120"],
        "ptx_121a": ["-gencode", "arch=compute_121a,code=compute_121a"],
        # vLLM's CUDA 13 "12.0f" family target: cuobjdump lists it as plain sm_120.
        "sm_120f": ["-gencode", "arch=compute_120f,code=sm_120f"],
    }
    built: dict[str, Path] = {}
    t0 = time.monotonic()
    for name, flags in gencodes.items():
        built[name] = out / f"{name}.so"
        _nvcc(nvcc, "-shared", *flags, "-o", str(built[name]), src)
    # Several translation units for several arches in one .so, like vLLM's _moe_C.
    (out / "k2.cu").write_text(
        (FIXTURES / "kernel.cu").read_text().replace("scale", "scale2"))
    _nvcc(nvcc, "-c", "-gencode", "arch=compute_121a,code=sm_121a", "-o", str(out / "a.o"), src)
    _nvcc(nvcc, "-c", "-gencode", "arch=compute_90a,code=[sm_90a,compute_90a]",
          "-o", str(out / "b.o"), str(out / "k2.cu"))
    built["mixed"] = out / "mixed.so"
    _nvcc(nvcc, "-shared", "-o", str(built["mixed"]), str(out / "a.o"), str(out / "b.o"))
    built["host_only"] = out / "host_only.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(built["host_only"]),
                    str(FIXTURES / "host_only.c")], check=True)
    print(f"\ncompiled {len(built)} shared objects in {time.monotonic() - t0:.1f} s")
    return built


def _package(tmp_path: Path, objects: dict[str, Path], files: dict[str, str]) -> Path:
    """A fake installed `vllm/` dir: {relative name: object key}."""
    pkg = tmp_path / "vllm"
    for rel, key in files.items():
        dest = pkg / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(objects[key], dest)
    pkg.mkdir(exist_ok=True)
    return pkg


def _gate(cuobjdump: str, *paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GATE), "--expect", "sm_121a", "--cuobjdump", cuobjdump,
         *map(str, paths)],
        capture_output=True, text=True, check=False, timeout=120,
    )


def test_sm121a_passes(tmp_path, objects, cuobjdump):
    pkg = _package(tmp_path, objects, {"_C.abi3.so": "sm_121a", "_moe_C.abi3.so": "mixed"})
    r = _gate(cuobjdump, pkg)
    assert r.returncode == 0, r.stderr
    assert f"{pkg}/_C.abi3.so: ok" in r.stdout
    # mixed: other arches alongside sm_121a are fine, and are reported
    assert "_moe_C.abi3.so: ok" in r.stdout and "sm_90a" in r.stdout


def test_sm120_fails_naming_found_arch(tmp_path, objects, cuobjdump):
    pkg = _package(tmp_path, objects, {"_C.abi3.so": "sm_120"})
    r = _gate(cuobjdump, pkg)
    assert r.returncode == 1
    line = r.stderr.strip()
    assert line.startswith(f"{pkg}/_C.abi3.so: no sm_121a cubin (found: sm_120);")
    assert "TORCH_CUDA_ARCH_LIST=12.1a" in line


def test_family_sm120f_is_not_sm121a(tmp_path, objects, cuobjdump):
    # What stock vLLM 0.23 + CUDA 13 emits for its NVFP4 kernels ("12.0f").
    pkg = _package(tmp_path, objects, {"_C.abi3.so": "sm_120f"})
    r = _gate(cuobjdump, pkg)
    assert r.returncode == 1
    assert "no sm_121a cubin (found: sm_120)" in r.stderr


def test_ptx_only_fails(tmp_path, objects, cuobjdump):
    pkg = _package(tmp_path, objects, {"_C.abi3.so": "ptx_121a"})
    r = _gate(cuobjdump, pkg)
    assert r.returncode == 1
    assert "_C.abi3.so: no sm_121a cubin (found: PTX sm_121a)" in r.stderr
    assert "not the native NVFP4 path" in r.stderr


def test_one_bad_file_fails_the_lot(tmp_path, objects, cuobjdump):
    pkg = _package(tmp_path, objects, {"_C.abi3.so": "sm_121a", "_moe_C.abi3.so": "sm_120"})
    r = _gate(cuobjdump, pkg)
    assert r.returncode == 1
    assert "_C.abi3.so: ok" in r.stderr
    assert "_moe_C.abi3.so: no sm_121a cubin (found: sm_120)" in r.stderr


def test_no_device_code_fails(tmp_path, objects, cuobjdump):
    pkg = _package(tmp_path, objects, {"_C.abi3.so": "host_only"})
    r = _gate(cuobjdump, pkg)
    assert r.returncode == 1
    assert "_C.abi3.so: no device code" in r.stderr


def test_no_extension_found_fails(tmp_path, objects, cuobjdump):
    # Only non-matching names: cumem_allocator is not gated, subdirs are not searched.
    pkg = _package(tmp_path, objects, {"cumem_allocator.abi3.so": "sm_120",
                                       "vllm_flash_attn/_vllm_fa2_C.abi3.so": "sm_120"})
    r = _gate(cuobjdump, pkg)
    assert r.returncode == 1
    assert f"no _*C*.so found in {pkg}" in r.stderr


def test_explicit_file_is_checked(tmp_path, objects, cuobjdump):
    pkg = _package(tmp_path, objects, {"_C.abi3.so": "sm_121a",
                                       "vllm_flash_attn/_vllm_fa2_C.abi3.so": "sm_120"})
    r = _gate(cuobjdump, pkg, pkg / "vllm_flash_attn" / "_vllm_fa2_C.abi3.so")
    assert r.returncode == 1
    assert "_vllm_fa2_C.abi3.so: no sm_121a cubin (found: sm_120)" in r.stderr


def test_missing_cuobjdump_is_a_usage_error(tmp_path, objects):
    pkg = _package(tmp_path, objects, {"_C.abi3.so": "sm_121a"})
    r = _gate(str(tmp_path / "nope"), pkg)
    assert r.returncode == 2
    assert "--cuobjdump" in r.stderr
