"""MAX_JOBS as vLLM's own setup.py reads it: build-vllm-wheel.sh's environment fed to the
pinned sdist's `compute_num_jobs` (executed, not paraphrased) gives the jobs build.py chose."""

from __future__ import annotations

import ast
import logging
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

from packaging.version import Version

from imagebuild import REPO_ROOT
from imagebuild.vllmsource.sdist import sdist_tree

SCRIPT = REPO_ROOT / "images" / "engine" / "files" / "build-vllm-wheel.sh"


def _setup_py_jobs(env: dict[str, str]) -> tuple[int, int | None]:
    """vLLM 0.23.0's cmake_build_ext.compute_num_jobs, run with `env` on a CUDA 13 build."""
    tree = ast.parse((sdist_tree("0.23.0") / "setup.py").read_text())
    func = next(n for n in ast.walk(tree)
                if isinstance(n, ast.FunctionDef) and n.name == "compute_num_jobs")
    scope = {"envs": SimpleNamespace(MAX_JOBS=env.get("MAX_JOBS"),
                                     NVCC_THREADS=env.get("NVCC_THREADS")),
             "_is_cuda": lambda: True, "CUDA_HOME": "/usr/local/cuda", "Version": Version,
             "get_nvcc_cuda_version": lambda: Version("13.0"), "os": os,
             "logger": logging.getLogger("setup.py")}
    exec(compile(ast.Module([func], []), "setup.py", "exec"), scope)
    return scope["compute_num_jobs"](None)


def _env_given_to_setup_py(tmp_path: Path, **env: str) -> dict[str, str]:
    """What build-vllm-wheel.sh exports when it runs pip (a stand-in python records it)."""
    record = tmp_path / "env"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nenv > "{record}"\nexit 1\n')
    fake.chmod(0o755)
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "setup.py").write_text("")
    subprocess.run(["sh", str(SCRIPT), str(src), str(tmp_path / "out"), "0.23.0"],
                   env={**os.environ, "PYTHON": str(fake), **env}, capture_output=True,
                   text=True, timeout=60)
    return dict(line.split("=", 1) for line in record.read_text().splitlines() if "=" in line)


def test_setup_py_runs_the_jobs_build_py_chose(tmp_path: Path) -> None:
    given = _env_given_to_setup_py(tmp_path, MAX_JOBS="12", NVCC_THREADS="2")
    assert _setup_py_jobs(given) == (12, 2)  # 12 jobs of 2 nvcc threads, not 6
    given = _env_given_to_setup_py(tmp_path, MAX_JOBS="3", NVCC_THREADS="1")
    assert _setup_py_jobs(given) == (3, 1)
