#!/usr/bin/env python3
"""Self-check of a vLLM CUDA runtime: can it compile what vLLM compiles at run time?

vLLM on GB10 compiles while it serves: Triton builds a C launcher per kernel signature
(a C compiler and Python.h) and assembles its PTX with ptxas; FlashInfer JIT-compiles
CUDA sources with nvcc (host compiler, CUDA headers) or NVRTC. A runtime image missing
any of these builds fine and then fails its first request. These checks take seconds and
need no GPU, so the engine build runs them before the long compile finishes.

Usage:
    runtime-selfcheck.py --arch sm_121a [--phase toolchain|installed|all]
                         [--require-triton-env] [--only NAME[,NAME...]]
                         [--may-skip NAME[,NAME...]]

Run it with the Python that will run vLLM (its Python.h and site-packages are checked).
Phases and checks (NAME):
  toolchain (before vLLM is installed):
    python-headers  Python.h of this interpreter exists (Triton's include dir choice)
    c-compiler      $CC, else gcc, else clang (Triton's order) builds a C extension with
                    Python.h the way Triton builds its launcher, and it imports
    ptxas           the CUDA toolkit's ptxas ($CUDA_HOME/bin, else PATH) assembles PTX for
                    --arch at the PTX ISA version of its own release
    triton-ptxas-env  TRITON_PTXAS_PATH / TRITON_PTXAS_BLACKWELL_PATH, where set, name a
                    ptxas that accepts --arch (--require-triton-env: both must be set)
    nvcc            nvcc compiles a unit including the CUDA headers FlashInfer's JIT
                    sources use, for -gencode arch=compute_X,code=sm_X with the host C++
                    compiler
    nvrtc           libnvrtc loads and compiles a kernel for --arch (FlashInfer's and
                    DeepGEMM's NVRTC path)
  installed (after vLLM and its requirements are installed):
    ninja           `ninja` is on PATH (FlashInfer's JIT builds with it)
    flashinfer-jit-cache  flashinfer-jit-cache is installed at flashinfer-python's version,
                    built for this image's CUDA: the whole version, its local part too
                    (0.6.12+cu130 on CUDA 13.0; a +cu128/+cu129 wheel from another index
                    carries kernels and JIT state for another toolkit)
    triton-ptxas    the ptxas Triton itself picks for --arch (triton.backends.nvidia
                    .compiler.get_ptxas) accepts PTX at the ISA version Triton emits

A check whose component is absent altogether (flashinfer-jit-cache without
flashinfer-python) fails unless --may-skip names it: only a caller that knows nothing it
serves selects that component may skip it, and a skip is printed as `skip NAME: why`,
never as ok. A component that is present but broken (flashinfer-python without its
jit-cache) always fails.

Exit 0: every selected check passed or was allowed to skip. Exit 1: a check failed (each
failure is printed with its fix). Exit 2: bad usage. Standard library only.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import glob
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path

ARCH = re.compile(r"^sm_(\d+)([a-z]?)$")
TOOLCHAIN = ("python-headers", "c-compiler", "ptxas", "triton-ptxas-env", "nvcc", "nvrtc")
INSTALLED = ("ninja", "flashinfer-jit-cache", "triton-ptxas")
# The headers FlashInfer's JIT sources include from the toolkit (cuda_fp4.h: NVFP4).
CUDA_HEADERS = ("cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "cuda_fp4.h")


class Failed(Exception):
    def __init__(self, detail: str, fix: str):
        super().__init__(detail)
        self.detail, self.fix = detail, fix


class Absent(Failed):
    """The checked component is not in the image at all (skippable with --may-skip)."""


def run(cmd: list[str], cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)


def last_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    return lines[-1] if lines else f"exit {proc.returncode}"


def cuda_home() -> Path | None:
    for cand in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if cand and Path(cand, "bin").is_dir():
            return Path(cand)
    nvcc = shutil.which("nvcc")
    return Path(nvcc).resolve().parent.parent if nvcc else None


def toolkit_tool(name: str) -> str | None:
    home = cuda_home()
    if home and os.access(home / "bin" / name, os.X_OK):
        return str(home / "bin" / name)
    return shutil.which(name)


def release_of(tool: str) -> str:
    """'13.0' from `tool --version` ("Cuda compilation tools, release 13.0, V13.0.88")."""
    m = re.search(r"release (\d+\.\d+)", run([tool, "--version"]).stdout)
    if not m:
        raise Failed(f"{tool} --version names no release", "use a CUDA toolkit ptxas/nvcc")
    return m.group(1)


def ptx_isa_for(release: str) -> str:
    """The PTX ISA a CUDA release assembles at most (Triton's ptx_get_version mapping)."""
    major, minor = map(int, release.split("."))
    if major >= 13:
        isa = 90 + (major - 13) * 10 + minor
    elif major == 12:
        isa = 80 + minor - (1 if minor >= 6 else 0)
    else:
        isa = 70 + minor
    return f"{isa // 10}.{isa % 10}"


def assemble(ptxas: str, arch: str, isa: str, tmp: str) -> subprocess.CompletedProcess[str]:
    ptx = Path(tmp, f"probe-{isa}.ptx")
    ptx.write_text(f".version {isa}\n.target {arch}\n.address_size 64\n"
                   ".visible .entry imagebuild_probe() { ret; }\n")
    return run([ptxas, f"--gpu-name={arch}", str(ptx), "-o", str(ptx.with_suffix(".cubin"))])


# ------------------------------------------------------------------------- the checks

def python_include() -> Path:
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":  # Debian's scheme; Triton maps it the same way
        scheme = "posix_prefix"
    return Path(sysconfig.get_paths(scheme=scheme)["include"])


def check_python_headers(arch: str, tmp: str) -> str:
    header = python_include() / "Python.h"
    if not header.is_file():
        raise Failed(f"no {header} for {sys.executable}",
                     "install the interpreter's dev package (python3-dev) in the runtime stage")
    return str(header)


def check_c_compiler(arch: str, tmp: str) -> str:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise Failed("no C compiler ($CC, gcc or clang)",
                     "install gcc in the runtime stage: Triton builds its launcher at run time")
    src = Path(tmp, "imagebuild_probe.c")
    src.write_text('#include <Python.h>\n'
                   'static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "imagebuild_probe"};\n'
                   'PyMODINIT_FUNC PyInit_imagebuild_probe(void) { return PyModule_Create(&m); }\n')
    so = Path(tmp, "imagebuild_probe" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    proc = run([cc, str(src), "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o", str(so),
                f"-I{python_include()}"])
    if proc.returncode != 0:
        raise Failed(f"{cc} cannot build a Python extension: {last_line(proc)}",
                     "install gcc and python3-dev in the runtime stage")
    spec = importlib.util.spec_from_file_location("imagebuild_probe", so)
    assert spec and spec.loader
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    return f"{cc} built and imported a Python extension"


def check_ptxas(arch: str, tmp: str) -> str:
    ptxas = toolkit_tool("ptxas")
    if not ptxas:
        raise Failed("no ptxas in $CUDA_HOME/bin or on PATH",
                     "install the toolkit's nvcc package (cuda-nvcc-<major>-<minor>)")
    release = release_of(ptxas)
    proc = assemble(ptxas, arch, ptx_isa_for(release), tmp)
    if proc.returncode != 0:
        raise Failed(f"{ptxas} (CUDA {release}) rejects {arch}: {last_line(proc)}",
                     f"use a CUDA toolkit that knows {arch} (13.0 does)")
    return f"{ptxas} (CUDA {release}) assembles {arch} at PTX {ptx_isa_for(release)}"


def check_triton_ptxas_env(arch: str, tmp: str, require: bool = False) -> str:
    seen = []
    for var in ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH"):
        path = os.environ.get(var)
        if not path:
            if require:
                raise Failed(f"{var} is not set",
                             f"set {var} to the toolkit's ptxas (ENV in the runtime stage)")
            continue
        if not os.access(path, os.X_OK):
            raise Failed(f"{var}={path} is not an executable", f"point {var} at a ptxas")
        release = release_of(path)
        proc = assemble(path, arch, ptx_isa_for(release), tmp)
        if proc.returncode != 0:
            raise Failed(f"{var}={path} (CUDA {release}) rejects {arch}: {last_line(proc)}",
                         f"point {var} at the CUDA toolkit's ptxas")
        seen.append(f"{var}={path} (CUDA {release})")
    return "; ".join(seen) + f" accept {arch}" if seen else "neither variable is set"


def check_nvcc(arch: str, tmp: str) -> str:
    nvcc = toolkit_tool("nvcc")
    if not nvcc:
        raise Failed("no nvcc in $CUDA_HOME/bin or on PATH",
                     "install cuda-nvcc-<major>-<minor> in the runtime stage (FlashInfer JIT)")
    home = cuda_home()
    include = home / "include" if home else None
    headers = [h for h in CUDA_HEADERS if include and (include / h).is_file()]
    missing = [h for h in CUDA_HEADERS[:4] if h not in headers]  # fp4 only where it exists
    if missing:
        raise Failed(f"{', '.join(missing)} missing from {include}",
                     "install cuda-cudart-dev-<major>-<minor> in the runtime stage")
    src = Path(tmp, "probe.cu")
    src.write_text("".join(f"#include <{h}>\n" for h in headers)
                   + "__global__ void imagebuild_probe(__nv_bfloat16 *x) "
                     "{ x[threadIdx.x] = __float2bfloat16(1.0f); }\n"
                     "int main() { return 0; }\n")
    num = arch.removeprefix("sm_")
    proc = run([nvcc, "-gencode", f"arch=compute_{num},code=sm_{num}", "-c", str(src),
                "-o", str(src.with_suffix(".o"))])
    if proc.returncode != 0:
        raise Failed(f"{nvcc} cannot compile for {arch}: {last_line(proc)}",
                     "install g++ (nvcc's host compiler) and the toolkit's dev headers")
    return f"{nvcc} (CUDA {release_of(nvcc)}) compiles {', '.join(headers)} for {arch}"


def _nvrtc_candidates() -> list[str]:
    found = []
    if name := ctypes.util.find_library("nvrtc"):
        found.append(name)
    home = cuda_home()
    if home:
        found += sorted(glob.glob(str(home / "lib64" / "libnvrtc.so*")))
    for site in sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]:
        found += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libnvrtc.so*")))
    return [f for f in dict.fromkeys(found) if "builtins" not in f and ".alt." not in f]


def check_nvrtc(arch: str, tmp: str) -> str:
    lib, errors = None, []
    for cand in _nvrtc_candidates():
        try:
            # NVRTC dlopens its builtins library by name: load the one beside it first
            # (the pip wheels' directory is not on the loader's path, /usr/local/cuda is)
            for builtins in sorted(glob.glob(os.path.join(os.path.dirname(cand),
                                                          "libnvrtc-builtins.so.*"))):
                if ".alt." not in builtins:
                    ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            lib = ctypes.CDLL(cand)
            break
        except OSError as exc:
            errors.append(str(exc))
    if lib is None:
        raise Failed("no loadable libnvrtc" + (f" ({errors[-1]})" if errors else ""),
                     "install cuda-nvrtc-<major>-<minor> in the runtime stage")
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    prog = ctypes.c_void_p()
    code = b'extern "C" __global__ void imagebuild_probe(float *x) { x[threadIdx.x] = 1.0f; }'
    if lib.nvrtcCreateProgram(ctypes.byref(prog), code, b"probe.cu", 0, None, None) != 0:
        raise Failed("nvrtcCreateProgram failed", "reinstall cuda-nvrtc")
    opts = (ctypes.c_char_p * 1)(f"--gpu-architecture={arch}".encode())
    rc = lib.nvrtcCompileProgram(prog, 1, opts)
    size, log = ctypes.c_size_t(), b""
    if rc == 0:
        rc = lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    else:
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value + 1)
        lib.nvrtcGetProgramLog(prog, buf)
        log, size = buf.value, ctypes.c_size_t()
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    if rc != 0 or size.value == 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        why = (lib.nvrtcGetErrorString(rc) or b"").decode()
        tail = log.decode(errors="replace").strip().splitlines()[-1:] if log else []
        raise Failed(f"NVRTC {major.value}.{minor.value} cannot compile for {arch}: {why}"
                     + (f" ({tail[0]})" if tail else ""),
                     f"use an NVRTC that knows {arch} (13.0 does) with its builtins library")
    return f"NVRTC {major.value}.{minor.value} compiles a {size.value}-byte {arch} cubin"


def check_ninja(arch: str, tmp: str) -> str:
    ninja = shutil.which("ninja")
    if not ninja:
        raise Failed("no ninja on PATH", "install vLLM's requirements (they pin ninja) "
                     "into the venv that is first on PATH")
    return f"{ninja} {run([ninja, '--version']).stdout.strip()}"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cuda_tag() -> str | None:
    """`cuXY0` of this image's CUDA: $CUDA_VERSION (NVIDIA's CUDA images set it), else the
    toolkit's nvcc --version; FlashInfer's per-CUDA wheels carry it as their local version."""
    text = os.environ.get("CUDA_VERSION", "")
    m = re.match(r"^(\d+)\.(\d+)", text)
    if not m:
        home = cuda_home()
        nvcc = shutil.which("nvcc") or (str(home / "bin" / "nvcc") if home else None)
        proc = run([nvcc, "--version"]) if nvcc and Path(nvcc).exists() else None
        m = re.search(r"release (\d+)\.(\d+)", proc.stdout if proc else "")
    return f"cu{m.group(1)}{m.group(2)}" if m else None


def check_flashinfer_jit_cache(arch: str, tmp: str) -> str:
    want = _version("flashinfer-python")
    if not want:
        raise Absent("flashinfer-python is not installed", "install vLLM's requirements/cuda.txt")
    got = _version("flashinfer-jit-cache")
    tag = cuda_tag()
    if tag is None:
        raise Failed("cannot tell this image's CUDA version (no CUDA_VERSION, no nvcc)",
                     "run it in the CUDA image, or set CUDA_VERSION")
    if got != f"{want}+{tag}":
        raise Failed(f"flashinfer-jit-cache is {got or 'not installed'}, flashinfer-python is "
                     f"{want} and this image's CUDA is {tag}: it must be {want}+{tag}",
                     f"install flashinfer-jit-cache=={want}+{tag} (vLLM's own runtime stage "
                     "does, from FlashInfer's per-CUDA wheel index: give the build that "
                     "CUDA's index through the runner's pip configuration)")
    cubin = _version("flashinfer-cubin")
    if cubin and cubin != want:
        raise Failed(f"flashinfer-cubin is {cubin}, flashinfer-python is {want}",
                     "install vLLM's requirements/cuda.txt unchanged")
    return f"flashinfer-python {want}, flashinfer-jit-cache {got}" + (
        f", flashinfer-cubin {cubin}" if cubin else "")


def check_triton_ptxas(arch: str, tmp: str) -> str:
    try:
        from triton.backends.nvidia import compiler  # type: ignore[import-not-found]
    except Exception as exc:  # noqa: BLE001 (any import failure is the finding)
        raise Failed(f"cannot import Triton's NVIDIA backend: {exc}",
                     "install vLLM's requirements (torch pins triton)") from None
    m = ARCH.match(arch)
    assert m
    tool = compiler.get_ptxas(int(m.group(1)))
    isa = compiler.ptx_get_version(tool.version)
    proc = assemble(tool.path, arch, f"{isa // 10}.{isa % 10}", tmp)
    if proc.returncode != 0:
        raise Failed(f"Triton picks {tool.path} (CUDA {tool.version}) for {arch}, and it "
                     f"rejects PTX {isa // 10}.{isa % 10}: {last_line(proc)}",
                     "set TRITON_PTXAS_PATH and TRITON_PTXAS_BLACKWELL_PATH to the CUDA "
                     "toolkit's ptxas")
    return f"Triton uses {tool.path} (CUDA {tool.version}), PTX {isa // 10}.{isa % 10} for {arch}"


CHECKS: dict[str, Callable[[str, str], str]] = {
    "python-headers": check_python_headers, "c-compiler": check_c_compiler,
    "ptxas": check_ptxas, "triton-ptxas-env": check_triton_ptxas_env, "nvcc": check_nvcc,
    "nvrtc": check_nvrtc, "ninja": check_ninja,
    "flashinfer-jit-cache": check_flashinfer_jit_cache, "triton-ptxas": check_triton_ptxas,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", required=True, help="GPU arch, e.g. sm_121a")
    ap.add_argument("--phase", choices=("toolchain", "installed", "all"), default="all")
    ap.add_argument("--require-triton-env", action="store_true",
                    help="TRITON_PTXAS_PATH and TRITON_PTXAS_BLACKWELL_PATH must be set")
    ap.add_argument("--only", default="", help="comma-separated check names")
    ap.add_argument("--may-skip", default="",
                    help="comma-separated checks that may skip when their component is "
                         "absent altogether (never when it is present and broken)")
    args = ap.parse_args(argv)
    if not ARCH.match(args.arch):
        print(f"runtime-selfcheck: --arch {args.arch}: want a name like sm_121a", file=sys.stderr)
        return 2
    names = {"toolchain": TOOLCHAIN, "installed": INSTALLED,
             "all": TOOLCHAIN + INSTALLED}[args.phase]
    if args.only:
        only = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in only if n not in CHECKS]
        if unknown:
            print(f"runtime-selfcheck: unknown check(s) {', '.join(unknown)}; known: "
                  f"{', '.join(CHECKS)}", file=sys.stderr)
            return 2
        names = tuple(only)
    may_skip = {n.strip() for n in args.may_skip.split(",") if n.strip()}
    if may_skip - set(CHECKS):
        print(f"runtime-selfcheck: --may-skip {', '.join(sorted(may_skip - set(CHECKS)))}: "
              f"unknown check(s); known: {', '.join(CHECKS)}", file=sys.stderr)
        return 2
    failed = skipped = 0
    with tempfile.TemporaryDirectory(prefix="runtime-selfcheck.") as tmp:
        for name in names:
            try:
                if name == "triton-ptxas-env":
                    detail = check_triton_ptxas_env(args.arch, tmp, args.require_triton_env)
                else:
                    detail = CHECKS[name](args.arch, tmp)
                print(f"ok   {name}: {detail}")
            except Absent as exc:
                if name not in may_skip:
                    failed += 1
                    print(f"FAIL {name}: {exc.detail}\n     fix: {exc.fix}", file=sys.stderr)
                else:
                    skipped += 1
                    print(f"skip {name}: {exc.detail} (allowed by --may-skip)")
            except Failed as exc:
                failed += 1
                print(f"FAIL {name}: {exc.detail}\n     fix: {exc.fix}", file=sys.stderr)
    if failed:
        print(f"runtime-selfcheck: {failed} of {len(names)} check(s) failed", file=sys.stderr)
        return 1
    print(f"runtime-selfcheck: {len(names) - skipped} check(s) passed for {args.arch}"
          + (f", {skipped} skipped" if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
