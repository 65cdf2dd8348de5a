"""The GPU-code table on real objects: nvcc-compiled shared objects laid out like an
installed site-packages (gb10's arches), the rehearsal's gate result, and a real cpu engine
image (the table as `build` records it, run inside the image)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from imagebuild.builder.archtable import markdown, problems, scan, table_for_image
from imagebuild.rehearse.gate import run_gate
from tests.e2e.test_arch_gate import FIXTURES, _nvcc, cuobjdump, nvcc, objects  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _site(tmp_path: Path, built: dict[str, Path], extra: Path) -> Path:
    layout = {"vllm/_C.abi3.so": built["sm_121a"],
              "vllm/_moe_C.abi3.so": built["sm_120f"],
              "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": built["ptx_121a"],
              "flashinfer_jit_cache/jit/fused_moe_120.so": built["sm_120"],
              "flashinfer_cubin/cubins/moe_sm90.so": extra,
              "vllm/cumem_allocator.abi3.so": built["host_only"]}
    root = tmp_path / "site-packages"
    for rel, src in layout.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, root / rel)
    return root


@pytest.fixture(scope="module")
def sm90(nvcc: str, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("sm90") / "sm90.so"
    _nvcc(nvcc, "-shared", "-gencode", "arch=compute_90a,code=sm_90a", "-o", str(out),
          str(FIXTURES / "kernel.cu"))
    return out


def test_table_per_library_on_nvcc_objects(tmp_path, objects, cuobjdump, sm90):  # noqa: F811
    root = _site(tmp_path, objects, sm90)
    rows = {r.library: r for r in scan([root], "sm_121a", cuobjdump)}
    assert set(rows) == {"vllm", "vllm/vllm_flash_attn", "flashinfer_jit_cache",
                         "flashinfer_cubin"}  # host-only code is not a row
    assert (rows["vllm"].verdict, rows["vllm"].worst, rows["vllm"].files) == (
        "sm_121a", "sm_120 family", 2)  # _moe_C is 12.0f family code
    assert rows["vllm/vllm_flash_attn"].verdict == "PTX-only"
    assert rows["flashinfer_jit_cache"].verdict == "sm_120 family"
    assert rows["flashinfer_cubin"].verdict == "none"
    text = markdown(list(rows.values()), "sm_121a")
    assert "| flashinfer_cubin | none | none | 1 | sm_90a | - |" in text
    # FlashInfer's MoE on sm_121a with only the JIT cache's sm_120 family code is the
    # flashinfer#3294 trap; FlashInfer attention takes the family code
    (bad,) = problems(list(rows.values()), {"moe": "FLASHINFER_CUTLASS"}, gpu=True,
                      expect="sm_121a")
    assert "flashinfer_jit_cache: sm_120 family" in bad and "flashinfer#3294" in bad
    assert problems(list(rows.values()), {"attention": "FLASHINFER"}, gpu=True,
                    expect="sm_121a") == []
    (root / "flashinfer_jit_cache/jit/fused_moe_120.so").unlink()
    rows2 = scan([root], "sm_121a", cuobjdump)
    (bad,) = problems(rows2, {"attention": "FLASHINFER"}, gpu=True, expect="sm_121a")
    assert "flashinfer_cubin: none (sm_90a)" in bad


def test_the_rehearsal_gate_reports_the_table(objects, cuobjdump):  # noqa: F811
    gate = run_gate([objects["sm_121a"], objects["sm_120f"]], "sm_121a", cuobjdump)
    assert not gate.ok  # the sm_120f object fails check-cuda-arch.py, as before
    assert [r.verdict for r in gate.table] == ["sm_121a"]
    assert "GPU code per library (build/archtable.py):" in gate.lines


def _cpu_engine_image() -> str | None:
    proc = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}",
                           "imagebuild/engine-cpu-*"], capture_output=True, text=True,
                          check=False)
    found = [line for line in proc.stdout.split() if ":<none>" not in line]
    return found[0] if found else None


def test_table_of_a_real_cpu_engine_image(cuobjdump, cpu_serve_image):  # noqa: F811
    image = _cpu_engine_image()  # the session's cpu build made (or reused) it
    assert image is not None, "the cpu build left no imagebuild/engine-cpu-* image"
    t0 = time.monotonic()
    rows = table_for_image(image, "sm_121a", cuobjdump)
    print(f"\narch table of {image}: {time.monotonic() - t0:.1f} s\n"
          + markdown(rows, "sm_121a"))
    assert "vllm" not in {r.library for r in rows}  # the CPU build has no vLLM GPU kernels
    assert problems(rows, {"attention": "CPU_ATTN"}, gpu=False) == []
