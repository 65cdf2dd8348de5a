"""The rendered gb10 engine recipe against the pinned vLLM source itself (slow: CI).

The source is the vLLM 0.23.0 sdist, fetched once from the index pip is configured with,
sha256-pinned, cached under .cache/. Its docker/Dockerfile is vLLM's own recipe at that
release; the parity test reads it, so a vLLM pin bump that changes what the runtime stage
installs fails here instead of building an image that cannot compile at run time.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from imagebuild.lock.lockfile import read_lock
from imagebuild.render import VLLM_PATHS, render_engine
from imagebuild.spec import matrix as mx
from imagebuild.vllmsource.patches import touched_files
from imagebuild.vllmsource.sdist import sdist_tree
from tests.support.dockerfile_text import (
    apt_packages,
    copied_sources,
    env_names,
    pip_installs,
    stages,
)

pytestmark = pytest.mark.slow
FILES = REPO_ROOT / "images" / "engine" / "files"
GB10_ENGINES = ("dflashfix", "pr41703")

# What vLLM's runtime stage (`vllm-base`) installs that ours does not, each on purpose.
# Keep in step with the comment above `FROM ... AS runtime` in images/engine/Dockerfile.j2.
DELIBERATE_APT = {
    "software-properties-common": "adds the deadsnakes PPA; Ubuntu 24.04 has Python 3.12",
    "curl": "fetches get-pip.py and PPA keys; we install nothing with curl",
    "sudo": "their image's non-root helpers; ours runs as its serve user",
    "libibverbs-dev": "RDMA headers for building DeepEP / EP kernels; the runtime libraries "
                      "NCCL's RoCE transport loads (libibverbs1, ibverbs-providers) are",
}
DELIBERATE_PIP = {
    "uv": "installer; this recipe installs with pip",
    "accelerate": "OpenAI-server extra for other models",
    "modelscope": "OpenAI-server extra: ModelScope hub loader",
    "bitsandbytes": "OpenAI-server extra: bitsandbytes quantization, not these checkpoints",
    "timm": "OpenAI-server extra for other vision models",
    "runai-model-streamer": "OpenAI-server extra: streaming loader from object stores",
}
DELIBERATE_ENV = {
    "UV_HTTP_TIMEOUT": "uv", "UV_INDEX_STRATEGY": "uv", "UV_LINK_MODE": "uv",
    "UV_PYTHON_INSTALL_DIR": "uv", "UV_CACHE_DIR": "uv",
    "VLLM_ENABLE_CUDA_COMPATIBILITY": "0 is vLLM's default; forward compatibility is for "
                                      "datacenter GPUs with older drivers",
}


@pytest.fixture(scope="module")
def tree() -> Path:
    return sdist_tree("0.23.0")


@pytest.fixture(scope="module")
def recipes() -> dict[str, str]:
    lm = mx.load(REPO_ROOT / "matrix.yaml")
    return {e: render_engine(lm, "gb10", e, read_lock(lm.root)).text for e in GB10_ENGINES}


@pytest.fixture(scope="module")
def vllm_runtime(tree: Path) -> list[str]:
    dockerfile = tree / "docker" / "Dockerfile"
    assert dockerfile.is_file(), "the sdist carries vLLM's own docker/Dockerfile"
    found = stages(dockerfile.read_text())
    assert "vllm-base" in found, "vLLM's runtime stage is no longer called vllm-base"
    return found["vllm-base"]


def _patched_copy(tree: Path, patches: list[Path], dest: Path) -> Path:
    """The sdist tree as the build sees it after apply-patches.sh: hard links to the
    cache, real copies of the files the series touches (so the cache stays pristine)."""
    shutil.copytree(tree, dest, copy_function=os.link)
    for patch in patches:
        for rel in touched_files(patch):
            if (dest / rel).is_file():
                (dest / rel).unlink()
                shutil.copy2(tree / rel, dest / rel)
    return dest


@pytest.mark.parametrize("engine", GB10_ENGINES)
def test_patch_series_applies_and_every_path_exists(tree, recipes, engine, tmp_path):
    """The rendered source stage, replayed on the sdist with the same scripts and args."""
    src = stages(recipes[engine])["source"]
    apply = next((line for line in src if "apply-patches.sh" in line
                  and line.startswith("RUN")), None)
    check = next(line for line in src if line.startswith("RUN")
                 and "sh /opt/imagebuild/check-source-tree.sh" in line)
    patches = []
    if apply:
        args = shlex.split(apply.split("apply-patches.sh", 1)[1].split("&&")[0])
        patches = [REPO_ROOT / a.removeprefix("/opt/imagebuild/") for a in args[1:]]
        assert args[0] == "/src/vllm" and all(p.is_file() for p in patches)
    work = _patched_copy(tree, patches, tmp_path / "vllm")
    if patches:
        proc = subprocess.run(["sh", str(FILES / "apply-patches.sh"), str(work),
                               *map(str, patches)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    check_args = shlex.split(check.split("check-source-tree.sh", 1)[1].split("&&")[0])
    proc = subprocess.run(["sh", str(FILES / "check-source-tree.sh"), str(work),
                           *check_args[1:]], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    used = set(re.findall(r"/src/vllm/([\w./-]+\.\w+)", recipes[engine]))
    assert used <= set(check_args[1:]) == set(VLLM_PATHS.values())


def test_a_missing_path_fails_the_check_in_seconds(tree, tmp_path):
    """What a recipe written for another vLLM layout meets (requirements/build.txt)."""
    proc = subprocess.run(["sh", str(FILES / "check-source-tree.sh"), str(tree),
                           "requirements/build.txt", "setup.py"], capture_output=True,
                          text=True)
    assert proc.returncode == 1
    assert "requirements/build.txt does not exist" in proc.stderr
    assert "images/engine/Dockerfile.j2" in proc.stderr  # names the fix


def _installs(lines: list[str], cuda_token: str) -> tuple[set[str], set[str], set[str]]:
    """(apt packages, pip packages, requirement files by source path) of a stage; CUDA
    version suffixes become {cuda}, python<ver> becomes python3."""
    apt, pip, req_files = set(), set(), set()
    copies = copied_sources(lines)
    for line in lines:
        if not line.startswith("RUN"):
            continue
        for pkg in apt_packages(line):
            pkg = pkg.replace(cuda_token, "{cuda}").replace("${PYTHON_VERSION}", "3")
            apt.add(pkg)
        names, files = pip_installs(line)
        pip |= names
        req_files |= {copies.get(f, f).removeprefix("/src/vllm/") for f in files}
    return apt, pip, req_files


def test_runtime_stage_covers_what_vllms_own_runtime_stage_installs(recipes, vllm_runtime):
    theirs_apt, theirs_pip, theirs_req = _installs(vllm_runtime, "${CUDA_VERSION_DASH}")
    assert theirs_apt and theirs_pip and theirs_req, "nothing parsed from vLLM's stage"
    theirs_env = env_names(vllm_runtime)
    for engine, text in recipes.items():
        ours = stages(text)["runtime"]
        apt, pip, req = _installs(ours, "$cuda")
        missing_apt = theirs_apt - apt - set(DELIBERATE_APT)
        missing_pip = theirs_pip - pip - set(DELIBERATE_PIP)
        assert not missing_apt, (f"{engine}: vLLM's runtime stage installs {missing_apt}: add "
                                 "them to images/engine/Dockerfile.j2 or list them as "
                                 "deliberate differences (with why)")
        assert not missing_pip, f"{engine}: vLLM's runtime stage pip-installs {missing_pip}"
        assert theirs_req <= req, f"{engine}: requirement files {theirs_req - req}"
        missing_env = theirs_env - env_names(ours) - set(DELIBERATE_ENV)
        assert not missing_env, f"{engine}: vLLM's runtime stage sets {missing_env}"
        # the JIT essentials, named (the parity above would not notice their removal
        # from both recipes at once)
        for pkg in ("cuda-nvcc-{cuda}", "cuda-nvrtc-{cuda}", "python3-dev"):
            assert pkg in apt, pkg
        assert "flashinfer-jit-cache" in pip
    # every deliberate difference still exists upstream (else it is stale here)
    assert set(DELIBERATE_APT) <= theirs_apt and set(DELIBERATE_PIP) <= theirs_pip
    assert set(DELIBERATE_ENV) <= theirs_env


def test_flashinfer_jit_cache_version_follows_vllms_flashinfer_pin(tree, vllm_runtime):
    """Our runtime installs flashinfer-jit-cache at the flashinfer-python version the
    installed requirements carry; vLLM's Dockerfile pins the same version by hand."""
    arg = next(line for line in vllm_runtime if line.startswith("ARG FLASHINFER_VERSION="))
    dockerfile_pin = arg.split("=", 1)[1].strip('"')
    reqs = (tree / VLLM_PATHS["cuda_requirements"]).read_text()
    pins = dict(re.findall(r"^(flashinfer-(?:python|cubin))==(\S+)", reqs, re.M))
    assert pins == {"flashinfer-python": dockerfile_pin, "flashinfer-cubin": dockerfile_pin}


def test_build_requirements_and_versioning_match_the_recipe(tree):
    """requirements/build/cuda.txt mirrors pyproject's build system (so pip wheel
    --no-build-isolation has what setup.py needs) and the version is setuptools-scm's,
    which build-vllm-wheel.sh pins. setup.py calls get_version() without a distribution
    name, which reads only the plain SETUPTOOLS_SCM_PRETEND_VERSION (the rehearsal found a
    wheel versioned 0.1.dev1 when only the _FOR_VLLM variable was set)."""
    build = (tree / VLLM_PATHS["build_requirements"]).read_text()
    names = {re.split(r"[<>=!~ ;\[]", line, maxsplit=1)[0].lower()
             for line in build.splitlines() if line.strip() and not line.startswith("#")}
    system = (tree / "pyproject.toml").read_text().split("[build-system]", 1)[1]
    requires = system.split("]", 1)[0]
    for req in re.findall(r'"([^"]+)"', requires):
        assert re.split(r"[<>=!~ ;\[]", req, maxsplit=1)[0].lower() in names, req
    assert "[tool.setuptools_scm]" in (tree / "pyproject.toml").read_text()
    setup = (tree / "setup.py").read_text()
    assert "from setuptools_scm import get_version" in setup
    calls = re.findall(r"get_version\(([^)]*)\)", setup)
    assert calls and not any("dist_name" in c for c in calls), calls
    script = (FILES / "build-vllm-wheel.sh").read_text()
    assert re.search(r'export SETUPTOOLS_SCM_PRETEND_VERSION="\$version"', script)
