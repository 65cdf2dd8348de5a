"""The multi-node smoke's own judgement (imagebuild/smoke/nodes.py), without Docker: which
ranks the nodes hold, how nodes sharing a host share its cores, what a lost node does to
the verdict, where the nodes run. tests/e2e/test_multinode_cpu.py runs it for real."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from imagebuild.errors import UserError
from imagebuild.serving.nodes import (
    Lost,
    NodeFile,
    cell_node_files,
    lost_message,
    node_hosts,
    partners_from_env,
    placed,
    placement,
)
from imagebuild.smoke.checks import expected_checks
from imagebuild.smoke.nodes import JudgedNodes, ranks_check
from imagebuild.smoke.report import write_junit
from imagebuild.smoke.runner import _verdict
from tests.support.multinode import HEAD_RANK_LINE, WORKER_RANK_LINE, cpu_two_node_cell

EXPECT = {"concurrency": [8], "cell": "cpu/x", "engine": "e", "target": "cpu", "source": "cell"}
BOOT = {"kind": "ready", "message": "/health 200 after 5.0s", "phase": "ready",
        "seconds": 5.0, "excerpt": "", "attempts": [{"attempt": 1}]}
COMPOSE = yaml.safe_dump({"services": {"vllm": {"image": "img", "environment": {
    "GLOO_SOCKET_IFNAME": "lo"}}}})


# ------------------------------------------------------------------ every rank joined

def test_head_and_worker_lines_make_every_rank():
    check = ranks_check({"head": ["x", HEAD_RANK_LINE], "worker1": [WORKER_RANK_LINE]}, 2, 1)
    assert check["outcome"] == "passed", check
    assert check["measured"]["ranks"] == "head: TP rank 0; worker1: TP rank 1"


def test_a_worker_that_never_joined_fails_with_the_ranks_seen():
    check = ranks_check({"head": [HEAD_RANK_LINE], "worker1": ["booting"]}, 2, 1)
    assert check["outcome"] == "failed"
    assert "the nodes hold TP ranks [0], not 0..1 once each" in check["message"]
    assert "worker1 holds 0 rank(s), not 1" in check["message"]


def test_a_world_size_other_than_the_cells_fails():
    solo = HEAD_RANK_LINE.replace("world size 2", "world size 1")
    check = ranks_check({"head": [solo], "worker1": [WORKER_RANK_LINE]}, 2, 1)
    assert "vLLM reports world size [1, 2], the cell's tensor parallel size is 2" in \
        check["message"]


def test_one_node_holding_both_ranks_fails():
    check = ranks_check({"head": [HEAD_RANK_LINE, WORKER_RANK_LINE], "worker1": []}, 2, 1)
    assert check["outcome"] == "failed" and "head holds 2 rank(s), not 1" in check["message"]


# ------------------------------------------------------------------ one host, its cores

def test_nodes_on_one_host_get_disjoint_cores_and_loopback():
    assert placement(2, [1, 0]) == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_HOST_IP": "127.0.0.1"},
        {"VLLM_CPU_OMP_THREADS_BIND": "1", "VLLM_HOST_IP": "127.0.0.1"}]
    assert [p["VLLM_CPU_OMP_THREADS_BIND"] for p in placement(2, range(8))] == [
        "0,1,2,3", "4,5,6,7"]


def test_more_nodes_than_cores_is_refused():
    with pytest.raises(UserError, match="2 nodes on one host need a CPU each; this host has 1"):
        placement(2, [0])


def test_placement_adds_to_the_nodes_environment_as_compose_reads_it():
    doc = yaml.safe_load(placed(COMPOSE, {"VLLM_CPU_OMP_THREADS_BIND": "0", "X": "a$b"}))
    assert doc["services"]["vllm"]["environment"] == {
        "GLOO_SOCKET_IFNAME": "lo", "VLLM_CPU_OMP_THREADS_BIND": "0", "X": "a$$b"}
    assert placed(COMPOSE, {}) == COMPOSE


# ------------------------------------------------------------------ where nodes run

def test_workers_run_here_unless_partners_are_named(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("IMAGEBUILD_PARTNERS", raising=False)
    assert partners_from_env(1) == [None]
    monkeypatch.setenv("IMAGEBUILD_PARTNERS", "ssh://runner@spark-b")
    assert partners_from_env(1) == ["ssh://runner@spark-b"]
    with pytest.raises(UserError, match="names 1 Docker host.*3 worker node"):
        partners_from_env(3)


def test_gpu_nodes_need_partners_and_partners_need_the_heads_address(
        monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("IMAGEBUILD_PARTNERS", raising=False)
    monkeypatch.delenv("IMAGEBUILD_MASTER_ADDR", raising=False)
    assert node_hosts(1, cpu=True) == ([None], "127.0.0.1", True)
    with pytest.raises(UserError, match="a cell over 2 GPU nodes runs on 2 machines"):
        node_hosts(1, cpu=False)
    monkeypatch.setenv("IMAGEBUILD_PARTNERS", "ssh://runner@spark-b")
    with pytest.raises(UserError, match="cannot reach the head at 127.0.0.1"):
        node_hosts(1, cpu=False)
    monkeypatch.setenv("IMAGEBUILD_MASTER_ADDR", "192.168.177.11")
    assert node_hosts(1, cpu=False) == (["ssh://runner@spark-b"], "192.168.177.11", False)
    # this machine's own socket is a partner on this machine (the e2e test's)
    monkeypatch.setenv("IMAGEBUILD_PARTNERS", "unix:///var/run/docker.sock")
    assert node_hosts(1, cpu=True)[2] is True


def test_render_gives_one_file_per_node_head_first(tmp_path: Path):
    files = cell_node_files(cpu_two_node_cell(tmp_path), "img@sha256:" + "a" * 64)
    assert [(f.name, f.rank) for f in files] == [("head", 0), ("worker1", 1)]
    worker = yaml.safe_load(files[1].text)["services"]["vllm"]
    assert "--headless" in worker["command"]
    assert worker["environment"]["GLOO_SOCKET_IFNAME"] == "lo"


# ------------------------------------------------------------------ the verdict

def _run(tmp_path: Path, *, worker_log: list[str], lost: Lost | None = None) -> JudgedNodes:
    from imagebuild.serving.nodes import _Worker
    from tests.support.memengine import MemoryEngine

    files = [NodeFile("head", 0, COMPOSE), NodeFile("worker1", 1, COMPOSE)]
    run = JudgedNodes("img", files, tmp_path, "imagebuild-smoke-x")
    log = tmp_path / "worker1.log"
    log.write_text("\n".join(worker_log) + "\n")
    run.workers.append(_Worker(files[1], None, "p-worker1", tmp_path / "w.yaml", log,
                               MemoryEngine(), container="c1"))
    run.lost = lost
    return run


def _verdict_with_head_log(tmp_path: Path, lines: list[str], boot: dict = BOOT,
                           checks: list[dict] | None = None, code: int = 0) -> dict:
    (tmp_path / "container.log").write_text("\n".join(lines) + "\n")
    if checks is None:
        checks = [{"name": n, "outcome": "passed", "seconds": 0.1, "message": ""}
                  for n in expected_checks(EXPECT)]
    return _verdict("img", "sha256:" + "a" * 64, EXPECT, boot, checks, code, tmp_path, t0=0.0)


def test_both_nodes_serving_passes_with_the_node_checks(tmp_path: Path):
    v, extra = _run(tmp_path, worker_log=[WORKER_RANK_LINE]).judge(
        _verdict_with_head_log(tmp_path, [HEAD_RANK_LINE]))
    assert v["passed"] and v["outcome"] == "passed"
    assert [c["name"] for c in extra] == ["every_rank_joined", "no_node_lost"]
    assert v["checks"]["every_rank_joined"]["passed"] and v["checks"]["no_node_lost"]["passed"]
    assert v["nodes"][1] == {"name": "worker1", "rank": 1, "container": "c1",
                             "log": str(tmp_path / "worker1.log"), "host": "local"}


def test_a_worker_missing_from_the_ranks_fails_a_green_suite(tmp_path: Path):
    v, _ = _run(tmp_path, worker_log=["no rank line"]).judge(
        _verdict_with_head_log(tmp_path, [HEAD_RANK_LINE]))
    assert not v["passed"] and v["outcome"] == "checks failed"
    assert v["message"].startswith("1 check(s) failed: every_rank_joined: the nodes hold TP "
                                   "ranks [0]")


def test_a_lost_node_is_the_verdicts_reason_whatever_the_suite_saw(tmp_path: Path):
    lost = Lost("worker1", 1, 137, 0.0, 41.5, ("RuntimeError: Connection closed by peer",))
    boot = {**BOOT, "kind": "exited", "message": "the container exited (code 137)"}
    v, extra = _run(tmp_path, worker_log=[WORKER_RANK_LINE], lost=lost).judge(
        _verdict_with_head_log(tmp_path, [HEAD_RANK_LINE], boot=boot, checks=[], code=1))
    assert not v["passed"] and v["outcome"] == "node lost"
    assert v["message"] == ("node worker1 (node-rank 1) was lost 41.5s into the run: its "
                            "container stopped (code 137); the head was stopped at once; its "
                            "log raised: RuntimeError: Connection closed by peer")
    assert v["checks"]["no_node_lost"]["outcome"] == "failed"
    assert "lost_to_verdict_s" in v["timings"]
    # a head that never served cannot show every rank, whatever the logs said
    assert extra[0]["outcome"] == "failed" and extra[0]["message"] == "the head never served"


def test_lost_message_of_a_removed_container():
    assert "its container stopped (removed)" in lost_message(Lost("worker2", 2, None, 0, 3.0, ()))


def test_node_checks_are_cases_of_the_junit_report(tmp_path: Path):
    checks_xml = tmp_path / "checks.xml"
    checks_xml.write_text('<testsuites><testsuite name="s" tests="1" failures="0">'
                          '<testcase name="test_health" time="0.1"/></testsuite></testsuites>')
    extra = [{"name": "every_rank_joined", "outcome": "passed", "seconds": 0.0, "message": ""},
             {"name": "no_node_lost", "outcome": "failed", "seconds": 0.0,
              "message": "node worker1 was lost"}]
    write_junit(tmp_path / "junit.xml", "img", BOOT, checks_xml, extra)
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    names = [c.get("name") for c in suite.iter("testcase")]
    assert names == ["boot", "test_health", "every_rank_joined", "no_node_lost"]
    assert (suite.get("tests"), suite.get("failures")) == ("4", "1")


def test_smoke_of_a_tag_runs_a_multi_node_cell_from_its_node_files(tmp_path: Path,
                                                                  monkeypatch):
    from imagebuild.plan import load_plan
    from imagebuild.smoke import runner
    from tests.support.multinode import cpu_two_nodes

    plan = load_plan(cpu_two_nodes(tmp_path / "m"), "2026-06-18-dflashfix", "cpu")
    calls: list[tuple[str, dict]] = []
    monkeypatch.setattr(runner, "smoke_nodes", lambda ref, expect, out, files, **kw: calls.append(
        ("nodes", {"ref": ref, "files": files, **kw})) or {"passed": True})
    monkeypatch.setattr(runner, "smoke_image", lambda ref, expect, out, **kw: calls.append(
        ("image", {"ref": ref})) or {"passed": True})
    runner.smoke_jobs(plan.lm, plan.jobs, out_root=tmp_path / "out")
    by_image = {j.release_ref: j for j in plan.jobs}
    multi = [c for kind, c in calls if kind == "nodes"]
    assert [by_image[c["ref"]].cell.image for c in multi] == ["cpu-tiny-ngram"]
    (call,) = multi
    assert [f.name for f in call["files"]] == ["head", "worker1"]
    assert call["tensor_parallel_size"] == 2 and call["cpu"] is True
    assert call["ref"] in call["files"][1].text  # the job's image on every node
    # the other cpu cells stay single-node
    assert all(by_image[c["ref"]].cell.image != "cpu-tiny-ngram"
               for kind, c in calls if kind == "image")
