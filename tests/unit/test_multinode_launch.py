"""`build.py launch`: the per-node files must agree and every host must hold the same
image before anything starts; then workers start before the head, with MASTER_ADDR.

Hosts are stood in for by a Runner (the real-engine test is tests/e2e/test_multinode_
launch.py); the per-node files are the ones render writes for a TP=2, 2-node cell."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from imagebuild.cli import main
from imagebuild.errors import OperationFailed, UserError
from imagebuild.serving import launch as ln
from tests.support.multinode import two_node_files

IMAGE = "127.0.0.1:5000/vllm-spark/cpu-tiny-ngram@sha256:" + "ab" * 32
ID_A, ID_B = "sha256:" + "1" * 64, "sha256:" + "2" * 64


class Hosts:
    """A Runner standing in for Docker engines: image IDs per DOCKER_HOST; every call kept."""

    def __init__(self, ids: dict[str, str]):
        self.ids = ids
        self.calls: list[tuple[list[str], dict[str, str]]] = []

    def __call__(self, argv: Sequence[str], env: Mapping[str, str]) -> tuple[int, str, str]:
        self.calls.append((list(argv), dict(env)))
        if argv[:3] == ["docker", "image", "inspect"]:
            found = self.ids.get(env["DOCKER_HOST"])
            return (0, found + "\n", "") if found else (1, "", "Error: No such image")
        return 0, "", ""

    @property
    def started(self) -> list[tuple[str, str]]:
        return [(env["DOCKER_HOST"], argv[argv.index("-f") + 1]) for argv, env in self.calls
                if "up" in argv]


def test_hosts_with_different_images_stop_the_launch_before_anything_starts(
        matrix_dir: Path) -> None:
    files = two_node_files(matrix_dir)
    hosts = Hosts({"ssh://spark1": ID_A, "ssh://spark2": ID_B})
    with pytest.raises(OperationFailed) as err:
        ln.launch(IMAGE, files, ln.parse_hosts("spark1,spark2"), runner=hosts)
    assert "different images" in err.value.message
    assert "spark1: " + ID_A[:19] in err.value.message and ID_B[:19] in err.value.message
    assert hosts.started == []


def test_a_host_without_the_image_stops_the_launch(matrix_dir: Path) -> None:
    files = two_node_files(matrix_dir)
    hosts = Hosts({"ssh://spark1": ID_A})
    with pytest.raises(OperationFailed) as err:
        ln.launch(IMAGE, files, ln.parse_hosts("spark1,spark2"), runner=hosts)
    assert "spark2: cannot inspect" in err.value.message and "docker pull" in (err.value.fix
                                                                                 or "")
    assert hosts.started == []


def test_workers_start_before_the_head_with_the_heads_address(matrix_dir: Path) -> None:
    files = two_node_files(matrix_dir)
    hosts = Hosts({"ssh://spark1": ID_A, "ssh://u@spark2": ID_A})
    lines: list[str] = []
    code = ln.launch(IMAGE, list(reversed(files)), ln.parse_hosts("spark1,ssh://u@spark2"),
                     runner=hosts, say=lines.append, master_addr="192.168.177.11")
    assert code == 0
    assert [(h, Path(f).name) for h, f in hosts.started] == [
        ("ssh://u@spark2", "cpu-tiny-ngram.worker1.compose.yaml"),
        ("ssh://spark1", "cpu-tiny-ngram.head.compose.yaml")]
    ups = [env for argv, env in hosts.calls if "up" in argv]
    assert all(env["MASTER_ADDR"] == "192.168.177.11" and env["IMAGEBUILD_IMAGE"] == IMAGE
               for env in ups)
    assert lines[0].startswith(f"every host has {IMAGE} as {ID_A[:19]}")


def test_the_heads_name_is_the_master_address_by_default() -> None:
    assert ln.parse_hosts("u@spark1:22,spark2")[0].address == "spark1"
    assert ln.Host("unix:///var/run/docker.sock").address == "127.0.0.1"
    with pytest.raises(UserError):
        ln.parse_hosts("spark1,,spark2")


def test_a_worker_file_edited_to_other_flags_is_refused_and_nothing_runs(
        matrix_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = two_node_files(matrix_dir)
    worker = next(p for p in files if "worker1" in p.name)
    worker.write_text(worker.read_text().replace("- '512'\n", "- '1024'\n", 1))
    hosts = Hosts({"ssh://spark1": ID_A, "ssh://spark2": ID_A})
    with pytest.raises(UserError) as err:
        ln.launch(IMAGE, files, ln.parse_hosts("spark1,spark2"), runner=hosts)
    assert "worker1 (node-rank 1) has --max-model-len '1024', the head '512'" in (
        err.value.message)
    assert hosts.calls == []
    # the command line says the same, exit 2
    code = main(["launch", IMAGE, *map(str, files), "--hosts", "spark1,spark2", "--dry-run"])
    assert code == 2 and "--max-model-len '1024'" in capsys.readouterr().err


def test_one_file_per_host(matrix_dir: Path) -> None:
    files = two_node_files(matrix_dir)
    with pytest.raises(UserError, match="2 per-node compose file"):
        ln.launch(IMAGE, files, ln.parse_hosts("spark1"), runner=Hosts({}))
