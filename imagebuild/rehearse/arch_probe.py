"""vLLM's own CUDA arch selection, run by CMake on a probe project.

The probe is the pinned CMakeLists.txt cut down to the code that turns
TORCH_CUDA_ARCH_LIST into per-source `-gencode` flags: vLLM's cmake/utils.cmake, torch's
own CMake config (find_package(Torch) reads TORCH_CUDA_ARCH_LIST), the CUDA 13 supported
arch list, the CUDA_ARCHS intersection, the NVFP4 (SM12x) arch block and the
_C_stable_libtorch target definition, all verbatim (cmake_blocks.py). Configuring it
with the same arguments setup.py passes yields vLLM's arch lists and, through
compile_commands.json, the exact nvcc command line of each rehearsed translation unit.
What the probe leaves out (FetchContent of CUTLASS and friends, the other kernel
families, linking) is named in LEFT_OUT.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from imagebuild.rehearse.cmake_blocks import AnchorError, Piece, extract
from imagebuild.rehearse.toolchain import Tools

# In file order. The "until" piece is the section that sets VLLM_GPU_LANG, CUDA_ARCHS
# and VLLM_GPU_FLAGS (torch's nvcc flags, --threads, --compress-mode).
SETUP_PIECES = [
    Piece("C++/CUDA standard, target device",
          r"^set\(CMAKE_CXX_STANDARD ", "until", until=r'^message\(STATUS "Build type'),
    Piece("Python versions", r"^set\(PYTHON_SUPPORTED_VERSIONS"),
    Piece("torch version", r"^set\(TORCH_SUPPORTED_VERSION_CUDA"),
    Piece("vLLM CMake helpers", r"^include\(\$\{CMAKE_CURRENT_LIST_DIR\}/cmake/utils\.cmake\)"),
    Piece("Python from VLLM_PYTHON_EXECUTABLE", r"^if \(VLLM_PYTHON_EXECUTABLE\)", "block"),
    Piece("torch's CMake prefix", r'^append_cmake_prefix_path\("torch"'),
    Piece("torch (reads TORCH_CUDA_ARCH_LIST)", r"^find_package\(Torch REQUIRED\)"),
    Piece("CUDA_SUPPORTED_ARCHS", r"^if\(DEFINED CMAKE_CUDA_COMPILER_VERSION AND\s*\n"
          r"\s*CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 13\.0\)", "block"),
    Piece("GPU language, CUDA_ARCHS, nvcc flags",
          r"^if \(NOT HIP_FOUND AND NOT PYTORCH_FOUND_HIP AND CUDA_FOUND\)", "until",
          until=r"^include\(FetchContent\)"),
]
GENERIC_PIECES = [
    Piece("_C_stable_libtorch sources: CUDA_ARCHS",
          r'^[ \t]*set_gencode_flags_for_srcs\(\s*\n\s*SRCS "\$\{VLLM_STABLE_EXT_SRC\}"\s*\n'
          r'\s*CUDA_ARCHS "\$\{CUDA_ARCHS\}"\)'),
]
FP4_PIECES = [
    Piece("NVFP4 kernels for SM12x: FP4_ARCHS",
          r'cuda_archs_loose_intersection\(FP4_ARCHS "12\.0f"', "block+next"),
]
TARGET_PIECES = [
    Piece("_C_stable_libtorch target",
          r"^[ \t]*define_extension_target\(\s*\n\s*_C_stable_libtorch\b"),
    Piece("_C_stable_libtorch definitions", r"TORCH_TARGET_VERSION=0x020B", "block"),
]

LEFT_OUT = (
    "the rest of vLLM's CMakeLists.txt: FetchContent of CUTLASS, FlashMLA, vllm-flash-attn, "
    "QuTLASS, DeepGEMM and Triton kernels (GitHub is unreachable), every kernel family but "
    "the rehearsed units, and linking the extensions"
)

RESULT = "rehearse-result.txt"
# Variables the probe reports, one `NAME=value` line each.
_REPORTED = ("CMAKE_CUDA_COMPILER_VERSION", "TORCH_CUDA_ARCH_LIST_USED", "CUDA_SUPPORTED_ARCHS",
             "CUDA_ARCHS", "FP4_ARCHS", "VLLM_GPU_FLAGS")


@dataclass
class ArchResult:
    """What vLLM's CMake chose, and the nvcc command of each rehearsed source."""

    values: dict[str, str]
    commands: dict[str, dict] = field(default_factory=dict)  # source -> compile_commands entry
    log: str = ""

    def archs(self, name: str) -> list[str]:
        return [a for a in self.values.get(name, "").split(";") if a]

    def gencodes(self, source: str) -> list[str]:
        """`-gencode` values vLLM gives `source`, e.g. ["arch=compute_121a,code=sm_121a"]."""
        entry = self.commands.get(source)
        if not entry:
            return []
        args = entry.get("arguments") or shlex.split(entry["command"])
        return [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-gencode"]


def _probe_text(pieces_text: dict[str, str], generic: list[str], fp4: list[str]) -> str:
    srcs = " ".join(f'"{s}"' for s in generic + fp4)
    generic_srcs = " ".join(f'"{s}"' for s in generic)
    report = " ".join(f'"{name}=${{{name}}}\\n"' for name in _REPORTED)
    return f"""\
# Written by imagebuild's GB10 rehearsal (imagebuild/rehearse/arch_probe.py). The pieces
# between "---" headers are vLLM's CMakeLists.txt, verbatim; the lines outside them glue
# the pieces to a probe target holding only the rehearsed translation units.
cmake_minimum_required(VERSION 3.26)
project(vllm_arch_rehearsal LANGUAGES CXX)
set(CMAKE_EXPORT_COMPILE_COMMANDS ON)

{pieces_text["setup"]}
# rehearsal: vLLM's _C target receives a definition in the NVFP4 block below
add_library(_C STATIC EXCLUDE_FROM_ALL rehearse-placeholder.cpp)
set(VLLM_STABLE_EXT_SRC {generic_srcs})
{pieces_text["generic"]}
{pieces_text["fp4"]}
# rehearsal: only the rehearsed units go into the target; nothing is linked, and a
# machine without a GPU driver has no libcuda for CUDA::cuda_driver to name
set(VLLM_STABLE_EXT_SRC {srcs})
if(NOT TARGET CUDA::cuda_driver)
  add_library(CUDA::cuda_driver INTERFACE IMPORTED)
endif()
{pieces_text["target"]}
set(TORCH_CUDA_ARCH_LIST_USED "$ENV{{TORCH_CUDA_ARCH_LIST}}")
file(WRITE "${{CMAKE_BINARY_DIR}}/{RESULT}" {report})
"""


def write_probe(tree: Path, probe: Path, generic: list[str], fp4: list[str]) -> Path:
    """Lay out the probe in `probe`: the generated CMakeLists.txt beside links to the
    tree's cmake/ and csrc/ (vLLM's code uses paths relative to its source dir)."""
    text = (tree / "CMakeLists.txt").read_text()
    where = str(tree / "CMakeLists.txt")
    pieces = {
        "setup": extract(text, SETUP_PIECES, where),
        "generic": extract(text, GENERIC_PIECES, where),
        "fp4": extract(text, FP4_PIECES, where),
        "target": extract(text, TARGET_PIECES, where),
    }
    probe.mkdir(parents=True, exist_ok=True)
    for name in ("cmake", "csrc"):
        link = probe / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(tree / name, target_is_directory=True)
    (probe / "rehearse-placeholder.cpp").write_text("// rehearsal placeholder for _C\n")
    (probe / "CMakeLists.txt").write_text(_probe_text(pieces, generic, fp4))
    return probe


def configure(probe: Path, tools: Tools, arch_list: str, nvcc_threads: int | None,
              build_type: str = "RelWithDebInfo") -> ArchResult:
    """Configure the probe as setup.py configures vLLM; raise ProbeFailed with the log."""
    build = probe / "build"
    if build.exists():
        shutil.rmtree(build)
    cuda_home = tools.cuda_home
    args = [tools.cmake, "-S", str(probe), "-B", str(build),
            f"-DCMAKE_BUILD_TYPE={build_type}", "-DVLLM_TARGET_DEVICE=cuda",
            f"-DVLLM_PYTHON_EXECUTABLE={tools.torch_python}",
            f"-DCMAKE_CUDA_COMPILER={cuda_home}/bin/nvcc",
            f"-DCUDA_TOOLKIT_ROOT_DIR={cuda_home}"]
    if nvcc_threads:
        args.append(f"-DNVCC_THREADS={nvcc_threads}")
    env = {**os.environ, "TORCH_CUDA_ARCH_LIST": arch_list, "CUDA_HOME": cuda_home}
    if extra := tools.cublas_include():
        # CMake starts CMAKE_CUDA_FLAGS / CMAKE_CXX_FLAGS from these
        for var in ("CUDAFLAGS", "CXXFLAGS"):
            env[var] = f"{os.environ.get(var, '')} -isystem {extra}".strip()
    proc = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    log = proc.stdout + proc.stderr
    (probe / "configure.log").write_text(log)
    result_file = build / RESULT
    if proc.returncode != 0 or not result_file.is_file():
        raise ProbeFailed(f"cmake configure of the arch probe exited {proc.returncode}", log)
    values = dict(line.split("=", 1) for line in result_file.read_text().splitlines()
                  if "=" in line)
    commands: dict[str, dict] = {}
    for entry in json.loads((build / "compile_commands.json").read_text()):
        rel = os.path.relpath(entry["file"], probe)
        if rel.startswith("csrc/"):
            commands[rel] = entry
    return ArchResult(values, commands, log)


def messages(log: str) -> list[str]:
    """vLLM's own status lines about arches, e.g. "Building NVFP4 for archs: 12.1a"."""
    keep = re.compile(r"^-- (CUDA .*architectures.*|Building NVFP4.*|Not building NVFP4.*|"
                      r"Added CUDA NVCC flags.*)$")
    return [m.group(1) for line in log.splitlines() if (m := keep.match(line))]


class ProbeFailed(Exception):
    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


__all__ = ["AnchorError", "ArchResult", "LEFT_OUT", "ProbeFailed",
           "configure", "messages", "write_probe"]
