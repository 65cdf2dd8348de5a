"""Routing of the release gates and the bench for a multi-node cell: its nodes are served
the way its smoke runs them (serving/nodes.py serving_nodes), never one container from the
image's command (which for TP=2 over two nodes cannot serve alone); a single-node cell
keeps its one container. The plain server drops --speculative-config on every node."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from imagebuild.gates import run as gates_run
from imagebuild.plan import load_plan
from imagebuild.serving import container
from imagebuild.serving.nodes import cell_node_files, without_flags
from imagebuild.serving.runspec import SERVICE, SPEC_FLAG, Limits
from tests.support.memengine import MemoryEngine, image_doc
from tests.support.multinode import CPU_IMAGE, cpu_two_nodes

TAG = "2026-06-18-dflashfix"


def _job(matrix: Path | None):
    return next(j for j in load_plan(matrix, TAG, "cpu").jobs if j.cell.image == CPU_IMAGE)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []

    @contextlib.contextmanager
    def fake_nodes(image_ref, files, out_dir, **kw):
        seen.append(("nodes", {"files": [f.name for f in files], "out": out_dir, **kw}))
        yield None

    @contextlib.contextmanager
    def fake_one(image, info, expect, **kw):
        seen.append(("one", kw))
        yield None

    monkeypatch.setattr(container, "serving_nodes", fake_nodes)
    monkeypatch.setattr("imagebuild.serving.container.serving", fake_one)
    return seen


def test_a_two_node_cell_is_served_on_both_nodes_without_the_drafter_flag(
        calls: list, tmp_path: Path):
    job = _job(cpu_two_nodes(tmp_path / "m"))
    serve = container.server_for(job.cell, job.release_ref, {"Config": {}}, tmp_path / "out",
                                 limits=Limits.of(job.expect))
    with serve((SPEC_FLAG,)):
        pass
    ((kind, kw),) = calls
    assert kind == "nodes"
    assert kw["files"] == ["head", "worker1"]
    assert kw["drop_flags"] == (SPEC_FLAG,)
    assert kw["tensor_parallel_size"] == 2 and kw["cpu"] is True
    assert kw["out"] == tmp_path / "out" / "nodes-gates"


def test_a_single_node_cell_keeps_its_one_container(calls: list, tmp_path: Path):
    job = _job(None)
    with container.server_for(job.cell, job.release_ref, {"Config": {}}, tmp_path,
                              limits=Limits.of(job.expect))((SPEC_FLAG,)):
        pass
    assert calls == [("one", {"drop_flags": (SPEC_FLAG,), "log": print})]


def test_the_bench_of_a_two_node_cell_boots_its_nodes_as_shipped(calls: list,
                                                                  tmp_path: Path):
    from imagebuild.bench.command import nodes_server

    assert nodes_server(_job(None), {}, tmp_path) is None
    job = _job(cpu_two_nodes(tmp_path / "m"))
    serve = nodes_server(job, {}, tmp_path / "bench")
    assert serve is not None
    with serve(()):
        pass
    ((kind, kw),) = calls
    assert kind == "nodes" and kw["drop_flags"] == ()
    assert kw["out"] == tmp_path / "bench" / CPU_IMAGE / "nodes-bench"


def test_gate_jobs_hands_the_node_server_to_the_gates(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path,
                                                      memory_engine: MemoryEngine):
    job = _job(cpu_two_nodes(tmp_path / "m"))
    got: dict[str, Any] = {}
    memory_engine.add_image(image_doc("x"), job.release_ref)
    monkeypatch.setattr(gates_run, "server_for",
                        lambda cell, ref, info, out, *, limits, log=print: "NODES")
    monkeypatch.setattr(gates_run, "gate_image",
                        lambda *a, serve=None, **kw: got.setdefault("serve", serve))
    gates_run.gate_jobs((job,), tmp_path)
    assert got["serve"] == "NODES"


def test_without_flags_drops_the_flag_and_its_value_on_every_node(tmp_path: Path):
    job = _job(cpu_two_nodes(tmp_path / "m"))
    for f in cell_node_files(job.cell, "img:1"):
        before = yaml.safe_load(f.text)["services"][SERVICE]["command"]
        assert SPEC_FLAG in before
        after = yaml.safe_load(without_flags(f.text, (SPEC_FLAG,)))["services"][SERVICE]
        i = before.index(SPEC_FLAG)
        assert after["command"] == before[:i] + before[i + 2:], f.name
        assert without_flags(f.text, ()) == f.text
