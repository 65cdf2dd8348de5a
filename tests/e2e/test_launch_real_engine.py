"""`build.py launch` against the real Docker engine, reached under two names (its socket
and a second path to it), as two "hosts" of a TP=2 cell of the cpu image: the image IDs
are read on each host by `docker image inspect`, then each node's command is printed
(--dry-run: starting vLLM across containers is the multi-node smoke's job). A reference no
host has is a failed step that starts nothing. Only loopback: the engine is this machine's.
Reuses the session's cpu serve image; ~2 s beyond it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from imagebuild.cli import main
from tests.support.multinode import two_node_files

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
SOCKET = Path("/var/run/docker.sock")


@pytest.fixture
def two_names(tmp_path: Path) -> str:
    """Two Docker host URLs for this machine's one engine."""
    second = tmp_path / "spark2.sock"
    second.symlink_to(SOCKET)
    return f"unix://{SOCKET},unix://{second}"


def test_launch_reads_each_hosts_image_id_then_prints_the_node_commands(
        cpu_serve_image, two_names: str, matrix_dir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    files = two_node_files(matrix_dir)
    code = main(["launch", cpu_serve_image.ref, *map(str, files), "--hosts", two_names,
                 "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"every host has {cpu_serve_image.ref} as sha256:")
    worker, head = lines[1], lines[2]  # workers first
    assert worker.startswith("worker1 on unix://") and "spark2.sock" in worker
    assert head.startswith(f"head on unix://{SOCKET}")
    assert all("MASTER_ADDR=127.0.0.1" in line for line in (worker, head))


def test_a_reference_no_host_has_fails_before_anything_starts(
        docker_engine: str, two_names: str, matrix_dir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    files = two_node_files(matrix_dir)
    missing = "127.0.0.1:5000/vllm-spark/no-such-image:" + os.urandom(4).hex()
    code = main(["launch", missing, *map(str, files), "--hosts", two_names])
    out, err = capsys.readouterr()
    assert code == 1 and f"cannot inspect {missing}" in err and "docker pull" in err
    assert "head on" not in out and "worker1 on" not in out
