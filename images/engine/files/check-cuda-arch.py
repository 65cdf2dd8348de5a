#!/usr/bin/env python3
"""Arch gate for the gb10 engine build: fail unless vLLM's CUDA extensions carry native
code (a cubin) for the GPU the image is for.

Why: vLLM 0.23 built with CUDA 13 lists no 12.1 in CMakeLists.txt CUDA_SUPPORTED_ARCHS,
so TORCH_CUDA_ARCH_LIST=12.1a is silently rewritten to 12.0: generic kernels become
sm_120 code and the NVFP4 kernels sm_120f family code. A GB10 runs both (NVFP4 is not
lost), but the build is then not the one the target asked for, and nothing fails at build
time; so the binaries are checked after the compile, with `cuobjdump --list-elf
--list-ptx`, for cubins of exactly the expected arch.

Usage (inside the CUDA devel image, after vLLM is installed):
    check-cuda-arch.py --expect sm_121a [--cuobjdump PATH] FILE_OR_DIR...

A FILE is checked as given. A DIR contributes every file whose name matches
`_*C*.so` directly inside it (not recursively): for the installed `vllm/` package that
is `_C.abi3.so`, `_moe_C.abi3.so`, `_C_stable_libtorch.abi3.so` and, when built,
`_flashmla_C`, `_flashmla_extension_C`, `_deep_gemm_C`. vllm_flash_attn/ is left out:
its kernels follow that project's own arch list; pass its files explicitly to gate them.

Exit 0: every file holds at least one cubin for the expected arch. Exit 1: a file
lacks one (PTX alone does not count: it is JIT-compiled at load, not native code), a
file holds no device code, or no file matched. Exit 2: bad usage or no cuobjdump.
Standard library only: this runs in the build image, not the project venv.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

PATTERN = "_*C*.so"

# cuobjdump 13.x prints one line per embedded image:
#   "ELF file    1: _C.abi3.1.sm_121a.cubin"
#   "PTX file    1: _C.abi3.1.sm_121a.ptx"
# A family target (sm_120f) is listed without its suffix, as sm_120.
_LINE = re.compile(r"^(ELF|PTX) file\s+\d+:\s+.*\.(sm_\d+[a-z]?)\.(cubin|ptx)$")



def hint(expect: str) -> str:
    """How to get code for `expect` (sm_121a -> TORCH_CUDA_ARCH_LIST=12.1a)."""
    m = re.fullmatch(r"sm_(\d+)(\d)([a-z]?)", expect)
    if not m:
        return f"rebuild for {expect}"
    major, minor, suffix = m.groups()
    return (
        f"build with TORCH_CUDA_ARCH_LIST={major}.{minor}{suffix} and keep {major}.{minor} "
        "in vLLM's CUDA 13 arch list (CMakeLists.txt CUDA_SUPPORTED_ARCHS), otherwise "
        f"it collapses to a lower {major}.x arch"
    )


class GateError(Exception):
    """The check itself could not run (exit 2)."""


@dataclass
class Listing:
    cubins: list[str] = field(default_factory=list)  # arch per ELF image, in order
    ptx: list[str] = field(default_factory=list)


def parse_listing(text: str) -> Listing:
    """Arches of the ELF (cubin) and PTX images in `cuobjdump -lelf -lptx` output."""
    out = Listing()
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            (out.cubins if m.group(1) == "ELF" else out.ptx).append(m.group(2))
    return out


def find_targets(paths: list[str]) -> list[Path]:
    """Files to check: explicit files as given, `_*C*.so` directly inside dirs."""
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found.extend(sorted(f for f in p.glob(PATTERN) if f.is_file()))
        elif p.is_file():
            found.append(p)
        else:
            raise GateError(f"{raw}: no such file or directory")
    return list(dict.fromkeys(found))  # a file named twice is checked once


def resolve_cuobjdump(explicit: str | None) -> str:
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise GateError(f"--cuobjdump {explicit}: not an executable file")
        return explicit
    for cand in (
        shutil.which("cuobjdump"),
        os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump"),
    ):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise GateError("cuobjdump not found on PATH or in $CUDA_HOME/bin; pass --cuobjdump PATH")


def list_images(cuobjdump: str, path: Path) -> tuple[Listing | None, str]:
    """(listing, error). cuobjdump exits non-zero (255) for a file with no device code."""
    proc = subprocess.run(
        [cuobjdump, "--list-elf", "--list-ptx", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    listing = parse_listing(proc.stdout)
    if proc.returncode != 0 and not (listing.cubins or listing.ptx):
        msg = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        last = msg[-1] if msg else f"exited {proc.returncode}"
        return None, re.sub(r"^cuobjdump \w+\s*:\s*", "", last)  # drop "cuobjdump info :"
    return listing, ""


def _found(listing: Listing) -> str:
    parts = sorted(set(listing.cubins))
    parts += [f"PTX {a}" for a in sorted(set(listing.ptx))]
    return ", ".join(parts) or "nothing"


def verdict(name: str, listing: Listing | None, error: str, expect: str) -> tuple[bool, str]:
    """(ok, one line) for one file."""
    if listing is None:
        return False, f"{name}: no device code, no {expect} cubin (cuobjdump: {error})"
    if expect in listing.cubins:
        others = sorted(set(listing.cubins) - {expect})
        extra = f" (also: {', '.join(others)})" if others else ""
        n = listing.cubins.count(expect)
        return True, f"{name}: ok, {n} {expect} cubin(s){extra}"
    why = f"{name}: no {expect} cubin (found: {_found(listing)})"
    if expect in listing.ptx:
        why += "; PTX is JIT-compiled at load time, not the native NVFP4 path"
    return False, f"{why}; {hint(expect)}"


def check(paths: list[str], expect: str, cuobjdump: str) -> tuple[bool, list[str]]:
    targets = find_targets(paths)
    if not targets:
        where = ", ".join(paths)
        return False, [f"no {PATTERN} found in {where}: the CUDA extensions were not built"]
    ok_all, lines = True, []
    for t in targets:
        listing, error = list_images(cuobjdump, t)
        ok, line = verdict(str(t), listing, error, expect)
        ok_all &= ok
        lines.append(line)
    return ok_all, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--expect", required=True, help="arch that must have a cubin, e.g. sm_121a")
    ap.add_argument("--cuobjdump", help="path of cuobjdump (default: PATH, $CUDA_HOME/bin)")
    ap.add_argument("paths", nargs="+", metavar="FILE_OR_DIR")
    args = ap.parse_args(argv)
    if not re.fullmatch(r"sm_\d+[a-z]?", args.expect):
        print(f"check-cuda-arch: --expect {args.expect}: want a name like sm_121a",
              file=sys.stderr)
        return 2
    try:
        ok, lines = check(args.paths, args.expect, resolve_cuobjdump(args.cuobjdump))
    except GateError as e:
        print(f"check-cuda-arch: {e}", file=sys.stderr)
        return 2
    for line in lines:
        print(line, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
