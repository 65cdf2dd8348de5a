"""Parts of the gb10 recipe that need a real Docker engine (slow; heavy lock).

- ensure-serve-user.sh in real containers: on the debootstrapped cpu base (no UID 1000)
  and on a base that, like every Ubuntu 24.04 CUDA image, already has `ubuntu` with UID
  1000, where the old `useradd --uid 1000` fails.
- `build.py lock --update TARGET` records base and runtime digests through the Docker
  engine, from a real registry on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from imagebuild import REPO_ROOT
from imagebuild.builder.bootstrap import DEFAULT_BASE_REF, ensure_base_image
from imagebuild.cli import main
from tests.support.registry import docker_login, push_tiny_image, running_registry

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
DOCKER = "/usr/bin/docker"
SCRIPT = REPO_ROOT / "images" / "serve" / "files" / "ensure-serve-user.sh"
UBUNTU_LIKE = "imagebuild-test/ubuntu-uid-1000:e2e"


def _docker(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True,
                          env={**os.environ, "DOCKER_BUILDKIT": "1"}, **kw)


@pytest.fixture(scope="module")
def cpu_base(docker_engine, tmp_path_factory) -> str:
    ensure_base_image(DEFAULT_BASE_REF, workdir=tmp_path_factory.mktemp("boot"))
    return DEFAULT_BASE_REF


@pytest.fixture(scope="module")
def ubuntu_like(cpu_base, tmp_path_factory) -> str:
    """The cpu base plus what Ubuntu 24.04 images ship: user and group `ubuntu`, 1000."""
    ctx = tmp_path_factory.mktemp("ubuntu-like")
    (ctx / "Dockerfile").write_text(
        f"FROM {cpu_base}\n"
        "RUN useradd --uid 1000 --user-group --create-home --shell /bin/bash ubuntu \\\n"
        "    && echo kept > /home/ubuntu/.profile-marker\n")
    proc = _docker("build", "--network", "host", "-t", UBUNTU_LIKE, str(ctx))
    assert proc.returncode == 0, proc.stderr[-2000:]
    yield UBUNTU_LIKE
    _docker("rmi", "-f", UBUNTU_LIKE)


def _in(image: str, script: str) -> subprocess.CompletedProcess[str]:
    """Run a shell snippet as root in a throwaway container with the script mounted."""
    return _docker("run", "--rm", "--network", "host", "-v", f"{SCRIPT}:/ensure.sh:ro",
                   "--entrypoint", "sh", image, "-c", script)


def test_old_useradd_fails_on_an_ubuntu_base(ubuntu_like):
    proc = _in(ubuntu_like, "useradd --uid 1000 --user-group --create-home vllm")
    assert proc.returncode != 0 and "not unique" in proc.stderr  # the defect, for real


@pytest.mark.parametrize("base", ["cpu", "ubuntu"])
def test_serve_user_is_uid_1000_named_vllm_with_its_home(base, cpu_base, ubuntu_like):
    image = cpu_base if base == "cpu" else ubuntu_like
    proc = _in(image, "sh /ensure.sh --check 1000 vllm /home/vllm && "
                      "sh /ensure.sh 1000 vllm /home/vllm && "
                      "sh /ensure.sh 1000 vllm /home/vllm && "  # idempotent
                      "id vllm && getent group 1000 && stat -c '%u:%g %n' /home/vllm "
                      "/home/vllm/.cache && ls -a /home/vllm && ! getent passwd ubuntu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "uid=1000(vllm) gid=1000(vllm)" in proc.stdout
    assert "vllm:x:1000:" in proc.stdout
    assert "1000:1000 /home/vllm\n1000:1000 /home/vllm/.cache" in proc.stdout
    if base == "ubuntu":
        assert "can rename user ubuntu (UID 1000) to vllm, rename group ubuntu" in proc.stdout
        assert ".profile-marker" in proc.stdout  # the home moved with its files
    else:
        assert "can create user vllm (UID 1000" in proc.stdout


def test_serve_user_conflicts_fail_with_the_reason(cpu_base):
    proc = _in(cpu_base, "useradd --uid 1001 vllm && sh /ensure.sh --check 1000 vllm /home/vllm")
    assert proc.returncode == 1
    assert "user vllm exists with UID 1001, not 1000" in proc.stderr


# --------------------------------------------------------- lock --update: image digests


@pytest.fixture
def github_standin(tmp_path, monkeypatch):
    """`lock --update gb10` also resolves the engine's FetchContent tags with `git ls-remote`
    on GitHub, which only a runner reaches: here each tagged repository of the lock is a
    local bare repository holding that tag, and git rewrites https://github.com/ to them."""
    root = tmp_path / "github"
    lock = json.loads((REPO_ROOT / "matrix.lock.json").read_text())
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "-c",
           "init.defaultBranch=main"]
    tagged = {(dep["repository"], dep["ref"]) for engine in lock["engines"].values()
              for dep in engine.get("gb10", {}).get("dependencies", {}).values()
              if dep.get("ref")}  # engines share sources: each repository and tag once
    assert tagged, "the lock names no tagged FetchContent source any more: drop this fixture"
    for repository, ref in sorted(tagged):
        bare = root / repository.removeprefix("https://github.com/")
        work = tmp_path / "work" / bare.name
        subprocess.run([*git, "init", "-q", "--bare", str(bare)], check=True)
        subprocess.run([*git, "init", "-q", str(work)], check=True)
        subprocess.run([*git, "-C", str(work), "commit", "-q", "--allow-empty", "-m", "x"],
                       check=True)
        subprocess.run([*git, "-C", str(work), "tag", "-a", "-m", "t", ref], check=True)
        subprocess.run([*git, "-C", str(work), "push", "-q", str(bare), "--tags"],
                       check=True)
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", f"url.file://{root}/.insteadOf")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "https://github.com/")
    return root


def test_lock_update_records_base_and_runtime_digests(docker_engine, matrix_dir, monkeypatch,
                                                      github_standin):
    with running_registry() as reg:
        base = push_tiny_image(reg, "nvidia/cuda", ("13.0.1-devel-ubuntu24.04",))
        runtime = push_tiny_image(reg, "nvidia/cuda", ("13.0.1-base-ubuntu24.04",))
        monkeypatch.setenv("DOCKER_CONFIG", str(docker_login(reg)))  # docker-py's auth
        path = matrix_dir / "matrix.yaml"
        data = yaml.safe_load(path.read_text())
        data["targets"]["gb10"]["base_image"] = f"{reg.host}/nvidia/cuda:13.0.1-devel-ubuntu24.04"
        data["targets"]["gb10"]["runtime_image"] = f"{reg.host}/nvidia/cuda:13.0.1-base-ubuntu24.04"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        lock_path = matrix_dir / "matrix.lock.json"
        assert main(["lock", "--matrix", str(path)]) == 0
        before = json.loads(lock_path.read_text())["bases"]["gb10"]
        assert before["status"] == "unresolved" and before["digest"] is None  # not asked
        assert main(["lock", "--matrix", str(path), "--update", "gb10"]) == 0
        entry = json.loads(lock_path.read_text())["bases"]["gb10"]
        assert (entry["digest"], entry["runtime_digest"], entry["status"]) == (
            base.digest, runtime.digest, "resolved")
        assert main(["lock", "--matrix", str(path), "--check"]) == 0
        # and the rendered Dockerfiles start FROM exactly those digests
        assert main(["render", "--matrix", str(path), "--out", str(matrix_dir / "r")]) == 0
        engine = (matrix_dir / "r" / "gb10" / "dflashfix" / "engine.Dockerfile").read_text()
        assert f"nvidia/cuda:13.0.1-base-ubuntu24.04@{runtime.digest} AS runtime" in engine
        based = (matrix_dir / "r" / "gb10" / "base.Dockerfile").read_text()
        assert f"nvidia/cuda:13.0.1-devel-ubuntu24.04@{base.digest}" in based


def test_lock_update_refuses_when_the_registry_cannot_answer(docker_engine, matrix_dir,
                                                             capsys, github_standin):
    path = matrix_dir / "matrix.yaml"
    data = yaml.safe_load(path.read_text())
    data["targets"]["gb10"]["base_image"] = "127.0.0.1:9/nowhere/cuda:13.0.1-devel-ubuntu24.04"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    before = (matrix_dir / "matrix.lock.json").read_text()
    assert main(["lock", "--matrix", str(path), "--update", "gb10"]) == 1
    err = capsys.readouterr().err
    assert "cannot look up the digest of 127.0.0.1:9/nowhere/cuda" in err and "fix:" in err
    assert (matrix_dir / "matrix.lock.json").read_text() == before  # nothing written
