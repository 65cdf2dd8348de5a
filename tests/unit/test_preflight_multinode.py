"""Preflight of tensor parallelism and multi-node cells: each rule refuses the layout it is
about, on a copy of examples/two-spark-tp2 (a clean TP=2 cell over two Sparks, locked from
the recorded Hub answers) edited to bring the problem in, and nothing else fires."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from imagebuild.preflight.multinode import head_problems
from imagebuild.preflight.serve_args import load_cli
from imagebuild.render import render_node_composes
from imagebuild.spec import matrix as mx
from tests.support.matrices import blocking_rules, check, edit, locked_copy

EXAMPLE = REPO_ROOT / "examples" / "two-spark-tp2"
# Qwen3.6-35B-A3B text_config (docs/domain.md)
QWEN36 = {"num_attention_heads": 16, "num_key_value_heads": 2, "num_experts": 256,
          "linear_num_key_heads": 16, "linear_num_value_heads": 32}


@pytest.fixture(scope="module")
def example_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return locked_copy(EXAMPLE, tmp_path_factory.mktemp("pair"))


@pytest.fixture
def pair(example_template: Path, tmp_path: Path) -> Path:
    root = tmp_path / "two-spark-tp2"
    shutil.copytree(example_template, root)
    return root


def refused(root: Path, rule: str) -> list:
    findings = check(root, target="gb10")
    blocking = {r for r in blocking_rules(findings) if r != "pin-unresolved"}
    assert blocking == {rule}, [f for f in findings if f.blocking]
    return [f for f in findings if f.rule == rule and f.blocking]


def test_the_example_passes_and_reports_what_each_node_holds(pair: Path) -> None:
    findings = check(pair, target="gb10")
    assert not {r for r in blocking_rules(findings) if r != "pin-unresolved"}
    memory = [f for f in findings if f.rule == "tp-memory-per-node"]
    assert len(memory) == 1 and memory[0].severity == "info"
    assert "1 rank(s) x (weights 21.8 GiB/2" in memory[0].message


def test_a_tp_that_does_not_divide_the_heads_is_refused(pair: Path) -> None:
    edit(pair, "tensor_parallel_size: 2\n      nodes: 2", "tensor_parallel_size: 6\n      nodes: 2")
    found = refused(pair, "tp-divides-heads")
    assert "16 attention heads are not divisible by 6" in found[0].message
    assert "matrix.yaml:" in (found[0].where or "")


@pytest.mark.parametrize(("tp", "problem"), [
    (3, "16 attention heads are not divisible by 3"),
    (3, "3 is not a multiple of the 2 KV heads"),
    (32, "16 attention heads are not divisible by 32"),
    (512, "TP 512 exceeds the 256 experts"),
    (32, "16 linear-attention key heads"),
    (64, "32 linear-attention value heads"),
])
def test_each_split_vllm_checks(tp: int, problem: str) -> None:
    assert any(problem in p for p in head_problems(QWEN36, tp)), head_problems(QWEN36, tp)


def test_kv_heads_replicated_or_split_as_vllm_allows() -> None:
    assert head_problems(QWEN36, 2) == [] and head_problems(QWEN36, 4) == []
    assert head_problems({"num_attention_heads": 32, "num_key_value_heads": 8}, 16) == []
    assert head_problems({"num_attention_heads": 24, "num_key_value_heads": 6}, 4) == [
        "6 KV heads are not divisible by 4"]


def test_a_layout_that_does_not_fit_per_node_is_refused(pair: Path) -> None:
    edit(pair, "    memory_limit: 120g\n", "    memory_limit: 16g\n")
    found = refused(pair, "tp-memory-per-node")
    assert "does not fit: per node" in found[0].message
    assert "budget 0.85 x 16g = 13.6 GiB" in found[0].message


def test_the_same_layout_on_one_node_holds_twice_the_weights(pair: Path) -> None:
    edit(pair, "    memory_limit: 120g\n", "    memory_limit: 24g\n")
    assert not [f for f in check(pair, target="gb10") if f.blocking
                and f.rule != "pin-unresolved"]
    edit(pair, "      nodes: 2\n", "      nodes: 1\n")
    refused(pair, "tp-memory-per-node")


def test_a_target_without_interconnect_is_refused(pair: Path) -> None:
    text = (pair / "matrix.yaml").read_text()
    start = text.index("    interconnect:\n")
    end = text.index("\nengines:")
    (pair / "matrix.yaml").write_text(text[:start] + text[end:])
    found = refused(pair, "multinode-interconnect")
    assert "has no interconnect" in found[0].message


def test_no_interfaces_is_refused(pair: Path) -> None:
    edit(pair, "      interfaces: [enp1s0f1np1]\n", "")
    assert "interfaces is empty" in refused(pair, "multinode-interconnect")[0].message


def test_no_ib_hca_is_refused_unless_ib_is_off(pair: Path) -> None:
    edit(pair, "        NCCL_IB_HCA: rocep1s0f1,roceP2p1s0f1\n", "")
    assert "no NCCL_IB_HCA" in refused(pair, "multinode-interconnect")[0].message
    edit(pair, 'NCCL_IB_DISABLE: "0"', 'NCCL_IB_DISABLE: "1"')
    assert not [f for f in check(pair, target="gb10") if f.rule == "multinode-interconnect"]


def test_custom_all_reduce_left_on_is_refused(pair: Path) -> None:
    edit(pair, "      disable-custom-all-reduce: true\n", "")
    found = refused(pair, "multinode-allreduce")
    assert [f.message for f in found] == ["custom all-reduce is on across nodes"]


def test_flashinfer_allreduce_fusion_left_on_is_refused(pair: Path) -> None:
    edit(pair, "      compilation-config: {pass_config: {fuse_allreduce_rms: false}}\n", "")
    found = refused(pair, "multinode-allreduce")
    assert "fuse_allreduce_rms" in found[0].message


def test_the_flags_the_rules_name_are_vllm_023s() -> None:
    options = (load_cli("0.23.0") or {})["options"]
    assert "disable-custom-all-reduce" in options
    assert "pass_config" in options["compilation-config"]["fields"]
    for flag in ("tensor-parallel-size", "nnodes", "node-rank", "master-addr",
                 "master-port", "headless", "distributed-executor-backend"):
        assert flag in options, flag


def test_a_hand_edited_worker_file_is_refused(pair: Path) -> None:
    lm = mx.load(pair / "matrix.yaml")
    cell = mx.expand(lm)[0]
    for r in render_node_composes(lm, cell):
        path = pair / "rendered" / r.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(r.text.replace("NCCL_IB_HCA: rocep1s0f1,roceP2p1s0f1",
                                       "NCCL_IB_HCA: rocep1s0f0") if "worker1" in r.path
                        else r.text)
    found = refused(pair, "multinode-node-flags")
    assert "worker1 (node-rank 1) has NCCL_IB_HCA='rocep1s0f0', the head " in found[0].message
    assert (found[0].where or "").endswith("pair-nvfp4-tp2.*.compose.yaml")
