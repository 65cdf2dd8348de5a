#!/usr/bin/env python3
"""Everything that runs on the GPU in an image, per library: does it carry code for the
target GPU, and which kind?

check-cuda-arch.py gates vLLM's own `_C*.so`; the kernels a profile selects also come from
FlashInfer (shipped cubins, the JIT cache), vllm-flash-attn, torch and any other wheel with
device code. Each library is listed with the best code it has for the target:

  sm_121a        a cubin for exactly the target (arch-specific features: NVFP4 MMA)
  sm_120 family  cubins of the same major at or below the target's minor, not arch-specific
                 (sm_120, sm_120f; NVIDIA's family rules run them on sm_121)
  PTX-only       PTX the driver JIT-compiles at load (slow first start, no arch features)
  none           no device code that runs on the target (other GPUs' code only, or none)

and a library with `none` for a kernel family the profile selects (expect_backends) is an
error. Standard library only: `build` runs this file as a script inside the image it
built, with the host's cuobjdump mounted read-only (`table_for_image`), so nothing is
copied out of a multi-GB image; the rehearsal and tests import it.

    archtable.py --expect sm_121a --cuobjdump PATH [--json] [--site-packages] ROOT_OR_FILE...
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import asdict, dataclass, field
from pathlib import Path

# cuobjdump --list-elf --list-ptx: "ELF file 1: x.1.sm_121a.cubin", "PTX file 1: x.sm_90a.ptx"
_LINE = re.compile(r"^(ELF|PTX) file\s+\d+:\s+.*\.(sm_\d+[a-z]?)\.(cubin|ptx)$")
_ARCH = re.compile(r"^sm_(\d+)(\d)([a-z]?)$")
DEVICE_SUFFIXES = (".so", ".cubin", ".fatbin")
NONE, PTX = "none", "PTX-only"
# A library is the top-level package of site-packages, except these subpackages
SUBLIBRARIES = ("vllm/vllm_flash_attn", "vllm/third_party")

# which libraries a selected backend's kernels live in (expect_backends values)
FLASHINFER = ("flashinfer", "flashinfer_cubin", "flashinfer_jit_cache")
BACKEND_LIBRARIES: dict[tuple[str, str], tuple[str, ...]] = {
    ("attention", "FLASH_ATTN"): ("vllm/vllm_flash_attn",),
    ("attention", "FLASHINFER"): FLASHINFER,
    ("nvfp4_gemm", "CUTLASS"): ("vllm",),
    ("nvfp4_gemm", "MARLIN"): ("vllm",),
    ("moe", "VLLM_CUTLASS"): ("vllm",),
    ("moe", "MARLIN"): ("vllm",),
    ("sampler", "FLASHINFER"): FLASHINFER,
}
FLASHINFER_PREFIX = {"attention", "nvfp4_gemm", "moe"}


@dataclass
class Row:
    library: str
    verdict: str  # the best code the library has for the target (see rank)
    files: int = 0  # files holding device code
    cubins: list[str] = field(default_factory=list)  # arches seen, sorted
    ptx: list[str] = field(default_factory=list)
    worst: str = NONE  # the verdict of its weakest file (one kernel without target code)


def _arch(name: str) -> tuple[int, int, str] | None:
    m = _ARCH.match(name)
    return (int(m.group(1)), int(m.group(2)), m.group(3)) if m else None


def rank(verdict: str) -> int:
    """0 the target's own cubin, 1 its family's, 2 PTX only, 3 nothing (best first)."""
    return {NONE: 3, PTX: 2}.get(verdict, 1 if verdict.endswith(" family") else 0)


def classify(cubins: list[str], ptx: list[str], expect: str) -> str:
    """`expect` (its own cubin), `sm_<major>0 family`, PTX-only or none (always none
    for `expect` "none": a target without a GPU, whose table only lists what is there)."""
    if expect == NONE:
        return NONE
    want = _arch(expect)
    if want is None:
        raise ValueError(f"--expect {expect}: want a name like sm_121a")
    if expect in cubins:
        return expect
    for c in cubins:  # same major, not above the target's minor, not arch-specific
        a = _arch(c)
        if a and a[0] == want[0] and a[1] <= want[1] and a[2] in ("", "f"):
            return f"sm_{want[0]}0 family"
    for p in ptx:  # PTX of a lower arch JIT-compiles forward; arch-specific PTX does not
        a = _arch(p)
        if a and (a[0], a[1]) <= want[:2] and (a[2] in ("", "f") or p == expect):
            return PTX
    return NONE


def library_of(path: Path, root: Path) -> str:
    try:
        rel = path.relative_to(root).as_posix()
    except ValueError:
        return path.parent.name or path.name
    for sub in SUBLIBRARIES:
        if rel.startswith(sub + "/"):
            return sub
    return rel.split("/", 1)[0] if "/" in rel else Path(rel).stem.split(".")[0]


def list_images(cuobjdump: str, path: Path) -> tuple[list[str], list[str]]:
    proc = subprocess.run([cuobjdump, "--list-elf", "--list-ptx", str(path)],
                          capture_output=True, text=True, check=False, timeout=300)
    cubins: list[str] = []
    ptx: list[str] = []
    for line in proc.stdout.splitlines():
        m = _LINE.match(line.strip())
        if m:
            (cubins if m.group(1) == "ELF" else ptx).append(m.group(2))
    return cubins, ptx


def candidates(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    out = []
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            if f.endswith(DEVICE_SUFFIXES) or ".so." in f:
                p = Path(dirpath, f)
                if not p.is_symlink():
                    out.append(p)
    return sorted(out)


def scan(paths: list[Path], expect: str, cuobjdump: str,
         library: str | None = None) -> list[Row]:
    """One row per library with device code, by name (`library`: all of them are one)."""
    rows: dict[str, Row] = {}
    for root in paths:
        base = root if root.is_dir() else root.parent
        for f in candidates(root):
            cubins, ptx = list_images(cuobjdump, f)
            if not cubins and not ptx:
                continue
            lib = library or library_of(f, base)
            row = rows.setdefault(lib, Row(lib, NONE, worst=expect))
            if expect == NONE:
                row.worst = NONE
            row.files += 1
            row.cubins = sorted(set(row.cubins) | set(cubins))
            row.ptx = sorted(set(row.ptx) | set(ptx))
            mine = classify(cubins, ptx, expect)
            if rank(mine) > rank(row.worst):
                row.worst = mine
    for row in rows.values():
        row.verdict = classify(row.cubins, row.ptx, expect)
    return sorted(rows.values(), key=lambda r: r.library)


def required(expect_backends: dict[str, str]) -> dict[str, str]:
    """library -> the selected backend that needs it (vLLM's own kernels always)."""
    out = {"vllm": "vLLM's own kernels"}
    for kind, value in expect_backends.items():
        name = value.upper().replace("-", "_")
        libs = BACKEND_LIBRARIES.get((kind, name))
        if libs is None and kind in FLASHINFER_PREFIX and name.startswith("FLASHINFER"):
            libs = FLASHINFER
        for lib in libs or ():
            out.setdefault(lib, f"{kind} {value}")
    return out


def problems(rows: list[Row], expect_backends: dict[str, str], gpu: bool,
             expect: str = NONE) -> list[str]:
    """A selected kernel family whose libraries have no code for the target `expect`
    (GPU only). For FlashInfer any one of its packages with code is enough (cubins or JIT
    cache), except FlashInfer's MoE on an arch-specific target (sm_121a): its family code
    (sm_120) gives garbage there (flashinfer#3294, the trap preflight/kernels.py refuses),
    so only the target's own cubins count."""
    if not gpu:
        return []
    by_lib = {r.library: r for r in rows}
    out = []
    need = required(expect_backends)
    groups: dict[str, list[str]] = {}
    for lib, why in need.items():
        groups.setdefault(why if lib not in FLASHINFER else f"flashinfer:{why}", []).append(lib)
    own_only = expect.endswith("a")
    for key, libs in groups.items():
        why = key.split(":", 1)[-1]
        strict = own_only and key.startswith("flashinfer:moe ")
        if all(by_lib.get(lib) is None or by_lib[lib].verdict == NONE
               or (strict and rank(by_lib[lib].verdict) > 0) for lib in libs):
            found = "; ".join(f"{lib}: {by_lib[lib].verdict} ({', '.join(by_lib[lib].cubins)})"
                              if lib in by_lib else f"{lib}: not installed / no device code"
                              for lib in libs)
            what = (f"{expect} code (family code is wrong there, flashinfer#3294)" if strict
                    else "code for the target")
            out.append(f"{why} needs {' or '.join(libs)}, which carry no {what} ({found})")
    return out


def markdown(rows: list[Row], expect: str) -> str:
    what = f"code for {expect}" if expect != NONE else "code for this target (no GPU)"
    lines = [f"| library | {what} | weakest file | files | cubins | PTX |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.library} | {r.verdict} | {r.worst} | {r.files} | "
                     f"{', '.join(r.cubins) or '-'} | {', '.join(r.ptx) or '-'} |")
    if not rows:
        lines.append("| (no library carries device code) | none | - | 0 | - | - |")
    return "\n".join(lines)


def as_json(rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in rows]


# ------------------------------------------------------------------- on a built image

PROBE_DIR = "/opt/imagebuild-archtable"


def table_for_image(image: str, expect: str, cuobjdump: str, probe=None) -> list[Row]:  # noqa: ANN001
    """Run this file inside `image` (its own python3, no network, read-only, the host's
    cuobjdump mounted) over the image interpreter's site-packages. `probe`: how to run
    it (docker.DockerEngine.probe, the one Docker seam; tests pass another)."""
    if probe is None:
        from imagebuild.docker import (  # deferred: also runs inside the image
            engine,
        )

        probe = engine().probe
    script = Path(__file__).resolve()
    code, out = probe(image, [f"{PROBE_DIR}/archtable.py", "--json", "--expect", expect,
                              "--cuobjdump", f"{PROBE_DIR}/cuobjdump", "--site-packages"],
                      entrypoint="python3",
                      mounts={str(script): f"{PROBE_DIR}/archtable.py",
                              str(Path(cuobjdump).resolve()): f"{PROBE_DIR}/cuobjdump"})
    if code != 0:
        raise RuntimeError(f"arch table in {image} failed (exit {code}): {out.strip()[-500:]}")
    return [Row(**r) for r in json.loads(out)]


def site_packages() -> list[Path]:
    paths = sysconfig.get_paths()
    return [Path(p) for p in sorted({paths["purelib"], paths["platlib"]})]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--expect", required=True, help="target arch, e.g. sm_121a")
    ap.add_argument("--cuobjdump", required=True)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--site-packages", action="store_true",
                    help="scan this interpreter's site-packages (inside an image)")
    ap.add_argument("paths", nargs="*", type=Path)
    args = ap.parse_args(argv)
    paths = list(args.paths) + (site_packages() if args.site_packages else [])
    if not paths:
        ap.error("give ROOT_OR_FILE... or --site-packages")
    if _arch(args.expect) is None and args.expect != NONE:
        print(f"archtable: --expect {args.expect}: want a name like sm_121a", file=sys.stderr)
        return 2
    rows = scan([p for p in paths if p.exists()], args.expect, args.cuobjdump)
    print(json.dumps(as_json(rows)) if args.json else markdown(rows, args.expect))
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ------------------------------------------------------------------------ for `build`

def find_cuobjdump() -> str | None:
    """IMAGEBUILD_CUOBJDUMP, PATH, or the nvidia-cuda-cuobjdump wheel of this Python."""
    wheel = [c for p in sys.path for c in glob.glob(os.path.join(p, "nvidia/cu*/bin/cuobjdump"))]
    for cand in (os.environ.get("IMAGEBUILD_CUOBJDUMP"), shutil.which("cuobjdump"), *wheel):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None
