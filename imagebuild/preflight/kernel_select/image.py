"""What a built engine image answers to vLLM's hardware and extension probes (the names of
vllm_probes.py), from the target's build: its compute capability, the CUDA arch list it
compiles for and the CUDA version of its base image.

Read from the pinned vLLM 0.23.0 source (the sdist the engine builds from):
- cutlass_fp4: csrc/libtorch_stable/quantization/fp4/nvfp4_scaled_mm_entry.cu 71-86 answers
  true for capability 100-119 only with the SM100 kernels and for 120-129 only with the
  SM120 kernels compiled; CMakeLists.txt 926-989 compiles the SM120 ones for a 12.x arch
  and the SM100 ones for a 10.x/11.x arch (CUDA 13: the 12.0f / 10.0f;11.0f families;
  the gb10 engines' cuda13-keep-sm121a.patch keeps 12.1a in the list);
- cutlass_fp8 / cutlass_block_fp8 / cutlass_group_gemm: csrc/libtorch_stable/quantization/
  w8a8/cutlass/scaled_mm_entry.cu 144-189, by capability and CUDA version only;
- flashinfer, cutedsl: requirements/cuda.txt pins flashinfer-python 0.6.12 (with
  flashinfer-cubin, and the runtime stage adds the matching flashinfer-jit-cache) and
  nvidia-cutlass-dsl 4.5.2, installed by the engine's runtime stage;
- fa2 / fa3 / fa4: vllm-flash-attn builds its FA2 module for every CUDA build and its FA3
  module only for 9.0a (cmake/external_projects/vllm_flash_attn.cmake); FA4 is the CuTe
  DSL sources the wheel carries (vllm_flash_attn/flash_attn_interface.py FA4_AVAILABLE);
- fbgemm: not a vLLM CUDA requirement; deep_gemm: vendored in the vLLM wheel
  (utils/import_utils.py has_deep_gemm).
"""

from __future__ import annotations

import re

ARCH = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")


def arch_majors(arch_list: str) -> set[int]:
    """Majors of a TORCH_CUDA_ARCH_LIST ("12.1a", "9.0a;10.0f 12.0+PTX")."""
    out = set()
    for item in re.split(r"[;\s]+", arch_list.strip()):
        m = ARCH.match(item)
        if m:
            out.add(int(m.group(1)))
    return out


def probes(cc: str, arch_list: str, cuda_version: tuple[int, int] = (13, 0)) -> dict[str, bool]:
    major, minor = (int(x) for x in cc.split("."))
    cc_int = major * 10 + minor
    built = arch_majors(arch_list)
    cuda = cuda_version[0] * 100 + cuda_version[1] * 10
    sm100 = bool(built & {10, 11})
    sm120 = 12 in built
    return {
        "flashinfer": True,
        "cutedsl": True,
        "cutlass_fp4": cuda >= 1280 and ((100 <= cc_int < 120 and sm100)
                                         or (120 <= cc_int < 130 and sm120)),
        "cutlass_fp8": (cc_int >= 90 and cuda >= 1200) or (cc_int >= 89 and cuda >= 1240),
        "cutlass_block_fp8": (cc_int >= 100 and cuda >= 1280) or (90 <= cc_int and cuda >= 1200),
        "cutlass_group_gemm": (cc_int >= 100 and cuda >= 1280) or (90 <= cc_int < 100
                                                                   and cuda >= 1230),
        "fa2": True,
        "fa3": 9 in built,
        "fa4": True,
        "fbgemm": False,
        "deep_gemm": True,
    }


def cuda_of(base_image: str | None) -> tuple[int, int]:
    """The CUDA version a CUDA base image tag names (nvcr.io/nvidia/cuda:13.0.1-devel...)."""
    m = re.search(r"cuda:(\d+)\.(\d+)", base_image or "")
    return (int(m.group(1)), int(m.group(2))) if m else (13, 0)
