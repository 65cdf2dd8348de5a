#!/usr/bin/env python3
"""Check that a built or installed vLLM carries the version the engine pins.

Usage:
    check-vllm-version.py --expect 0.23.0 [--wheel DIR_OR_FILE.whl]

Without --wheel: the installed distribution, as the image will report it:
`importlib.metadata.version("vllm")` and the `vllm/_version.py` setuptools-scm wrote (read
as a file, so no GPU and no import of vllm are needed). With --wheel: the wheel's file
name, its METADATA `Version:` and the `vllm/_version.py` inside it (a directory is
searched for exactly one vllm-*.whl).

The PUBLIC part of every version found (before "+") must equal --expect exactly. A local
part is allowed: vLLM's setup.py appends `+cu<NNN>` when nvcc is not its main CUDA
version (13.0 for 0.23.0, so a CUDA 13.0 build has none), `+empty` for
VLLM_TARGET_DEVICE=empty, `+cpu`, ...; it says how the wheel was built, not which vLLM it
is. A source fetched by SHA without tags makes setuptools-scm say `0.1.dev1+g<sha>`: that
fails here.

Exit 0: all agree (the versions are printed). Exit 1: a mismatch or nothing found.
Exit 2: bad usage. Standard library only: runs in the build and runtime images.
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import re
import sys
import zipfile
from pathlib import Path


def public(version: str) -> str:
    return version.split("+", 1)[0]


def from_version_py(text: str) -> str | None:
    """`__version__` of a setuptools-scm version file (`__version__ = version = '...'`)."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and any(
                isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets):
            return str(node.value.value)
    return None


def installed_versions() -> list[tuple[str, str]]:
    found = []
    try:
        found.append(("importlib.metadata", importlib.metadata.version("vllm")))
    except importlib.metadata.PackageNotFoundError:
        return []
    spec = importlib.util.find_spec("vllm")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        vfile = Path(loc) / "_version.py"
        if vfile.is_file():
            v = from_version_py(vfile.read_text())
            found.append((str(vfile), v or "(no version in file)"))
    return found


def wheel_versions(path: Path) -> list[tuple[str, str]]:
    if path.is_dir():
        wheels = sorted(path.glob("vllm-*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"check-vllm-version: want exactly one vllm-*.whl in {path}, "
                             f"found {len(wheels)}")
        path = wheels[0]
    found = [(f"file name {path.name}", path.name.split("-")[1])]
    with zipfile.ZipFile(path) as zf:
        for name in zf.namelist():
            if name.endswith(".dist-info/METADATA"):
                m = re.search(r"^Version: (\S+)$", zf.read(name).decode(), re.M)
                found.append((name, m.group(1) if m else "(no Version)"))
            elif name == "vllm/_version.py":
                v = from_version_py(zf.read(name).decode())
                found.append((name, v or "(no version in file)"))
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--expect", required=True, help="the engine's vllm_version, e.g. 0.23.0")
    ap.add_argument("--wheel", type=Path, help="a vllm-*.whl or the directory holding it")
    args = ap.parse_args(argv)
    if "+" in args.expect:
        print("check-vllm-version: --expect takes a public version (no +local part)",
              file=sys.stderr)
        return 2
    try:
        found = wheel_versions(args.wheel) if args.wheel else installed_versions()
    except (OSError, zipfile.BadZipFile, SystemExit) as exc:
        print(f"check-vllm-version: {exc}", file=sys.stderr)
        return 1
    if not found:
        print("check-vllm-version: vllm is not installed in this Python "
              f"({sys.executable})", file=sys.stderr)
        return 1
    bad = [(where, v) for where, v in found if public(v) != args.expect]
    for where, v in found:
        mark = "ok " if (where, v) not in bad else "BAD"
        print(f"{mark} {v}  ({where})", file=sys.stderr if bad else sys.stdout)
    if bad:
        print(f"check-vllm-version: vLLM is {bad[0][1]}, the engine pins {args.expect}. "
              "A SHA fetched without tags versions as 0.1.dev1+g<sha>: build with "
              f"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_VLLM={args.expect} "
              "(images/engine/files/build-vllm-wheel.sh does)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
