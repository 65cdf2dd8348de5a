"""images/engine/files/strip-native.py: the native files of the distributions a layer
installed lose their debug sections and symbol tables, keep what the loader binds, and a
stripped copy the loader would refuse is never put in place."""

from __future__ import annotations

import ctypes
import json
import runpy
import shutil
import subprocess
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT

SCRIPT = REPO_ROOT / "images/engine/files/strip-native.py"
strip = runpy.run_path(str(SCRIPT), run_name="strip_native")

needs_binutils = pytest.mark.skipif(
    not (shutil.which("gcc") and shutil.which("strip") and shutil.which("ldd")),
    reason="gcc, binutils and ldd (scripts/setup-tests.sh installs them)")
LIB = "static int hidden(int a) { return a * 3; }\nint exported(int a) { return hidden(a) + 1; }\n"


def installed(site: Path, files: dict[str, Path]) -> None:
    """A distribution `nativepkg` in SITE, as pip leaves it (its RECORD lists its files)."""
    pkg = site / "nativepkg"
    pkg.mkdir(parents=True)
    for name, src in files.items():
        shutil.copy(src, pkg / name)
    info = site / "nativepkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nativepkg\nVersion: 1.0\n")
    (info / "RECORD").write_text("".join(f"nativepkg/{n},,\n" for n in files)
                                 + "nativepkg-1.0.dist-info/METADATA,,\n"
                                 + "nativepkg-1.0.dist-info/RECORD,,\n")


def built(tmp_path: Path, *flags: str) -> Path:
    (tmp_path / "lib.c").write_text(LIB)
    out = tmp_path / "build" / "libnative.so"
    out.parent.mkdir(exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", *flags, "-o", str(out), str(tmp_path / "lib.c")],
                   check=True)
    return out


@needs_binutils
def test_debug_sections_and_symbol_tables_go_and_the_exports_stay(tmp_path, monkeypatch):
    site = tmp_path / "site"
    installed(site, {"libnative.so": built(tmp_path, "-g"), "data.txt": tmp_path / "lib.c"})
    monkeypatch.syspath_prepend(str(site))
    lib = site / "nativepkg/libnative.so"
    before = strip["sections"](lib)
    assert ".debug_info" in before and ".symtab" in before and strip["strippable"](lib) > 0
    (tmp_path / "reqs.txt").write_text("nativepkg==1.0 --hash=sha256:00\n")
    record = tmp_path / "record" / "native.json"

    strip["main"](["/", str(record), str(tmp_path / "reqs.txt")])
    after = strip["sections"](lib)
    assert not [s for s in after if s.startswith(".debug") or s in (".symtab", ".strtab")]
    assert ".dynsym" in after and strip["strippable"](lib) == 0
    assert ctypes.CDLL(str(lib)).exported(2) == 7  # still loads; its export still binds
    written = json.loads(record.read_text())
    assert written["distributions"] == ["nativepkg"] and written["kept"] == {}
    [(path, (size_before, size_after))] = written["stripped"].items()
    assert path.endswith("nativepkg/libnative.so") and size_after == lib.stat().st_size
    assert written["bytes_saved"] == size_before - size_after > 0
    assert (lib.stat().st_mode & 0o777) == 0o755

    strip["main"](["/", str(record), str(tmp_path / "reqs.txt")])  # nothing left to strip
    assert json.loads(record.read_text())["stripped"] == {}


def fake_tools(root: Path, strip_source: str) -> None:
    """A root file system whose `strip` is STRIP_SOURCE, built against this system's C
    library, with that loader and library copied in (as the slim-tools stage has them)."""
    binary = root / "usr/bin/x86_64-fake-strip"
    binary.parent.mkdir(parents=True)
    (root / "strip.c").write_text(strip_source)
    subprocess.run(["gcc", "-o", str(binary), str(root / "strip.c")], check=True)
    (root / "usr/bin/strip").symlink_to("x86_64-fake-strip")
    real = Path(strip["interpreter"](binary))
    loader = root / real.relative_to("/")
    loader.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(real.resolve(), loader)
    for folder in strip["strip_command"](Path("/"))[2].split(":"):
        if (Path(folder) / "libc.so.6").exists():
            libs = root / Path(folder).relative_to("/")
            libs.mkdir(parents=True, exist_ok=True)
            shutil.copy((Path(folder) / "libc.so.6").resolve(), libs / "libc.so.6")
            break


# strip -o OUT IN writing a file the loader cannot map: the first half of IN
HALF = r"""
#include <stdio.h>
int main(int argc, char **argv) {
  FILE *in = fopen(argv[argc - 1], "rb"), *out = fopen(argv[argc - 2], "wb");
  fseek(in, 0, SEEK_END); long n = ftell(in) / 2; rewind(in);
  for (long i = 0; i < n; i++) fputc(fgetc(in), out);
  return 0;
}
"""


@needs_binutils
def test_a_stripped_copy_the_loader_refuses_is_dropped(tmp_path, monkeypatch):
    site = tmp_path / "site"
    installed(site, {"libnative.so": built(tmp_path, "-g")})
    monkeypatch.syspath_prepend(str(site))
    lib = site / "nativepkg/libnative.so"
    original = lib.read_bytes()
    tools = tmp_path / "tools"
    fake_tools(tools, HALF)
    (tmp_path / "reqs.txt").write_text("nativepkg==1.0\n")
    record = tmp_path / "native.json"

    strip["main"]([str(tools), str(record), str(tmp_path / "reqs.txt")])
    assert lib.read_bytes() == original
    assert not list(lib.parent.glob(".*stripped"))
    kept = json.loads(record.read_text())["kept"]
    assert list(kept.values()) == ["the loader refuses the stripped copy"]


def test_tools_are_found_inside_their_root_whatever_their_links_say(tmp_path):
    """Absolute links (Debian's /usr/lib64/ld-linux-x86-64.so.2) resolve in the mounted
    root, not on the machine running the strip."""
    (tmp_path / "usr/lib/real").mkdir(parents=True)
    (tmp_path / "usr/lib/real/ld.so").write_text("")
    (tmp_path / "usr/lib64").mkdir()
    (tmp_path / "usr/lib64/ld.so").symlink_to("/usr/lib/real/ld.so")
    (tmp_path / "lib64").symlink_to("usr/lib64")
    assert strip["inside"](tmp_path, "/lib64/ld.so") == tmp_path / "usr/lib/real/ld.so"
    assert strip["inside"](tmp_path, "/usr/lib64/../lib/real/ld.so") == (
        tmp_path / "usr/lib/real/ld.so")
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(SystemExit, match="too many symbolic links"):
        strip["inside"](tmp_path, "/loop")


def test_a_layer_naming_no_distribution_is_refused(tmp_path):
    (tmp_path / "reqs.txt").write_text("# nothing\n")
    with pytest.raises(SystemExit, match="names no distribution"):
        strip["main"](["/", str(tmp_path / "r.json"), str(tmp_path / "reqs.txt")])
