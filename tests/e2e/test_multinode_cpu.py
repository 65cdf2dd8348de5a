"""The cpu multi-node smoke for real: vLLM 0.23's CPU build serving the tiny model with
tensor parallelism 2 across two containers (head and headless worker, vLLM's `mp`
executor over loopback), from render's per-node compose files, with the serve image the
suite already built (the parallel layout is in the compose files, not in the image).

One run passes every check through the head and shows each node's rank (and records the
release gates' requests, as the whole job's smoke does); one loses its worker mid-run and
must fail fast, naming the node. Then the release gates of the cell run as the whole job
runs them (gate_jobs): the plain server is both nodes again, booted as smoke boots them,
--speculative-config dropped on each (one extra two-node boot). docs/multi-node-cpu.md
has the figures.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from imagebuild.buildfolder import GATES_FILE, cell_dir
from imagebuild.docker import inspect_image
from imagebuild.expectations import expectations_from_labels
from imagebuild.gates.run import gate_jobs
from imagebuild.plan import load_plan
from imagebuild.serving.nodes import cell_node_files
from imagebuild.serving.runspec import SPEC_FLAG
from imagebuild.smoke.runner import smoke_nodes
from tests.support.leftovers import smoke_leftovers
from tests.support.multinode import CPU_IMAGE, cpu_two_nodes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

PROJECT_LABEL = "com.docker.compose.project"
CPU_TAG = "2026-06-18-dflashfix"  # the session's cpu serve image's tag
# from the worker's exit to the verdict: the head is stopped within WATCH_S, the check
# running fails on a refused connection, pytest's compose teardown takes ~10 s
LOST_BOUND_S = 30


def _leftovers(docker: str) -> list[str]:
    """Containers of smoke's compose projects still around, but another run's."""
    return smoke_leftovers(docker)


@pytest.fixture(scope="module")
def nodes(cpu_serve_image, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The session's cpu serve image, its expectations, the cell's per-node files, and
    its job (the session image is the job's release_ref: same matrix, same tag) with the
    build dir smoke and the gates share."""
    matrix = cpu_two_nodes(tmp_path_factory.mktemp("two-nodes"))
    job = next(j for j in load_plan(matrix, CPU_TAG, "cpu").jobs if j.cell.image == CPU_IMAGE)
    ref = cpu_serve_image.ref
    assert job.release_ref == ref
    return {"ref": ref, "expect": expectations_from_labels(ref, inspect_image(ref)),
            "files": cell_node_files(job.cell, ref), "job": job,
            "build": tmp_path_factory.mktemp("build")}


@pytest.fixture(autouse=True)
def no_container_left(docker_engine: str):
    yield
    assert _leftovers(docker_engine) == [], "a node's container outlived its smoke"


def test_tp2_across_two_containers_passes_every_check_through_the_head(
        nodes: dict, monkeypatch: pytest.MonkeyPatch):
    # the worker through the partner path (compose and the SDK at a Docker host, the
    # image-ID check), at this machine's own socket: a pair runner's, minus SSH
    monkeypatch.setenv("IMAGEBUILD_PARTNERS", "unix:///var/run/docker.sock")
    job = nodes["job"]
    tmp_path = cell_dir(nodes["build"], job.cell)  # where the whole job's smoke writes
    t0 = time.monotonic()
    v = smoke_nodes(nodes["ref"], nodes["expect"], tmp_path, nodes["files"],
                    tensor_parallel_size=2, cpu=True,
                    gates=job.cell.target.gates.model_dump())
    wall = time.monotonic() - t0
    assert v["passed"], json.dumps({k: v[k] for k in ("outcome", "message", "checks")},
                                   indent=1)[:5000]
    ranks = v["checks"]["every_rank_joined"]
    assert ranks["measured"]["ranks"] == "head: TP rank 0; worker1: TP rank 1"
    assert v["checks"]["no_node_lost"]["passed"]
    # the suite's own checks ran through the head: served names, chat, streaming, tools,
    # ngram speculation, the kernels the CPU build chose
    for name in ("models_lists_exactly_the_served_names", "chat_completion_answers",
                 "speculative_decoding_fires", "kernel_backends_are_the_expected_ones"):
        assert v["checks"][name]["passed"], name
    worker_log = (tmp_path / "worker1.log").read_text()
    assert "headless multiproc executor" in worker_log
    assert "VLLM_CPU_OMP_THREADS_BIND='1'" in worker_log  # its own core, not the head's
    print(f"\nFIGURE two-node cpu smoke: boot {v['timings']['boot_s']}s, checks "
          f"{v['timings']['checks_s']}s, wall {wall:.1f}s")


def test_a_worker_lost_mid_run_fails_the_verdict_within_seconds(
        nodes: dict, tmp_path: Path, docker_engine: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("IMAGEBUILD_PARTNERS", raising=False)
    killed: dict[str, float] = {}

    def kill_worker_once_serving() -> None:
        deadline = time.monotonic() + 600
        while not (tmp_path / "boot.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)  # the checks are running
        names = subprocess.run([docker_engine, "ps", "--format", '{{.Names}} {{.Label "'
                                + PROJECT_LABEL + '"}}'], capture_output=True, text=True,
                               check=True).stdout.splitlines()
        worker = [n.split()[0] for n in names if n.split()[1:2]
                  and n.split()[1].endswith("-worker1")]
        if worker:
            subprocess.run([docker_engine, "kill", worker[0]], capture_output=True)
            killed["at"] = time.time()

    thread = threading.Thread(target=kill_worker_once_serving, daemon=True)
    thread.start()
    v = smoke_nodes(nodes["ref"], nodes["expect"], tmp_path, nodes["files"],
                    tensor_parallel_size=2, cpu=True)
    done = time.time()
    thread.join(timeout=5)
    assert killed, "the worker was never seen running"
    assert not v["passed"] and v["outcome"] == "node lost", v["message"]
    assert v["message"].startswith("node worker1 (node-rank 1) was lost ")
    assert "its container stopped (code 137); the head was stopped at once" in v["message"]
    assert not v["checks"]["no_node_lost"]["passed"]
    after = done - killed["at"]
    assert after < LOST_BOUND_S, f"{after:.1f}s from the worker's loss to the verdict"
    print(f"\nFIGURE worker lost: verdict {after:.1f}s after `docker kill` "
          f"(lost_to_verdict_s {v['timings']['lost_to_verdict_s']}), bound {LOST_BOUND_S}s")


def test_the_release_gates_of_a_two_node_cell_serve_both_nodes_without_the_drafter(
        nodes: dict):
    """The whole job's gates stage: the speculative run is the one smoke recorded (above;
    booted again if this test runs alone), the plain one both nodes booted as smoke boots
    them, --speculative-config dropped on each; token for token equal."""
    job = nodes["job"]
    t0 = time.monotonic()
    doc = gate_jobs((job,), nodes["build"], log=print)[job.id]
    wall = time.monotonic() - t0
    assert doc["passed"], json.dumps(doc["summary"], indent=1)
    assert doc["summary"]["lossless"]["status"] == "pass"
    runs = {r["what"]: r for r in doc["runs"]}
    assert set(runs) == {"speculative", "plain"}
    assert not runs["plain"].get("untrusted"), runs["plain"]
    plain = cell_dir(nodes["build"], job.cell) / "nodes-gates"
    for node in ("head", "worker1"):
        assert SPEC_FLAG not in (plain / f"{node}.compose.yaml").read_text(), node
    assert "headless multiproc executor" in (plain / "worker1.log").read_text()
    assert (cell_dir(nodes["build"], job.cell) / GATES_FILE).exists()
    print(f"\nFIGURE two-node gates stage: {wall:.1f}s (plain boot "
          f"{runs['plain'].get('boot_s')}s)")
