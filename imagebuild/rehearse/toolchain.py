"""Where the rehearsal's tools are: nvcc 13 and its toolkit, cmake >= 3.26, a Python with
the torch 2.11 CUDA build, cuobjdump. Each can be named by an environment variable."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from imagebuild import REPO_ROOT


class ToolMissing(Exception):
    """A tool the rehearsal needs is not on this machine (the message says where it looked)."""


def _executable(path: str | os.PathLike | None) -> str | None:
    if path and os.path.isfile(path) and os.access(path, os.X_OK):
        return str(path)
    return None


def find_tool(env_var: str, name: str, extra: list[str] | None = None) -> str | None:
    for cand in [os.environ.get(env_var), shutil.which(name), *(extra or [])]:
        if found := _executable(cand):
            return found
    return None


def cuda_home(nvcc: str) -> str:
    """The toolkit nvcc belongs to (nvcc may be a wrapper script elsewhere on PATH)."""
    proc = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                          capture_output=True, text=True, check=False)
    match = re.search(r"^#\$ _HERE_=(.+)$", proc.stderr + proc.stdout, re.M)
    if not match:
        raise ToolMissing(f"cannot tell the CUDA toolkit of {nvcc} (nvcc --dryrun said no _HERE_)")
    return str(Path(match.group(1).strip()).resolve().parent)


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else "unknown"


def cmake_version(cmake: str) -> tuple[int, ...]:
    out = subprocess.run([cmake, "--version"], capture_output=True, text=True, check=False).stdout
    match = re.search(r"version (\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else (0,)


def _venv_bin(name: str) -> list[str]:
    return [str(Path(sys.executable).parent / name), str(REPO_ROOT / ".venv" / "bin" / name)]


@dataclass(frozen=True)
class Tools:
    nvcc: str
    cuda_home: str
    cmake: str
    torch_python: str
    cuobjdump: str

    def cublas_include(self) -> str | None:
        """Where cublas_v2.h is when the toolkit has none: this machine's toolkit is nvcc
        and the runtime only (the CUDA devel image ships cuBLAS headers); torch's
        nvidia-cublas wheel carries them."""
        if (Path(self.cuda_home) / "include" / "cublas_v2.h").is_file():
            return None
        env = Path(self.torch_python).parent.parent
        for hit in sorted(env.glob("lib/python3*/site-packages/nvidia/*/include/cublas_v2.h")):
            return str(hit.parent)
        return None

    def describe(self) -> list[str]:
        return [f"nvcc {nvcc_version(self.nvcc)} ({self.nvcc}, toolkit {self.cuda_home})",
                f"cmake {self.cmake}", f"torch python {self.torch_python}",
                f"cuobjdump {self.cuobjdump}"]


def torch_python_default() -> str:
    default = REPO_ROOT / ".venv-vllm" / "bin" / "python"
    return os.environ.get("IMAGEBUILD_VLLM_PYTHON", str(default))


def find_tools() -> Tools:
    """All tools, or ToolMissing naming the first one absent."""
    nvcc = find_tool("IMAGEBUILD_NVCC", "nvcc", ["/usr/local/cuda-13.0/bin/nvcc",
                                                  "/usr/local/cuda/bin/nvcc"])
    if not nvcc:
        raise ToolMissing("nvcc not found (IMAGEBUILD_NVCC, PATH, /usr/local/cuda*/bin)")
    home = cuda_home(nvcc)
    # vLLM needs CMake >= 3.26 (Python_add_library USE_SABI); the pip `cmake` in the venv
    # is the one its build requirements install too.
    cmake = find_tool("IMAGEBUILD_CMAKE", "__none__", _venv_bin("cmake")) or shutil.which("cmake")
    if not cmake:
        raise ToolMissing("cmake not found (IMAGEBUILD_CMAKE, the venv's pip cmake, PATH)")
    if cmake_version(cmake) < (3, 26):
        raise ToolMissing(f"{cmake} is older than 3.26, which vLLM needs "
                          "(pip install the cmake pinned in requirements-dev.txt)")
    torch_python = _executable(torch_python_default())
    if not torch_python:
        raise ToolMissing(f"no Python with torch at {torch_python_default()} "
                          "(IMAGEBUILD_VLLM_PYTHON; scripts/setup-tests.sh makes .venv-vllm)")
    wheel = [c for p in sys.path for c in glob.glob(os.path.join(p, "nvidia/cu*/bin/cuobjdump"))]
    cuobjdump = find_tool("IMAGEBUILD_CUOBJDUMP", "cuobjdump",
                          [os.path.join(home, "bin", "cuobjdump"), *wheel])
    if not cuobjdump:
        raise ToolMissing("cuobjdump not found (IMAGEBUILD_CUOBJDUMP, PATH, the toolkit, "
                          "the nvidia-cuda-cuobjdump wheel)")
    return Tools(nvcc, home, cmake, torch_python, cuobjdump)
