"""Per-node commands of a multi-node cell (spec/nodecmd.py) and the check every node's
command must pass against the head's (node_differences: the launcher and preflight)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from imagebuild.spec import matrix as mx
from imagebuild.spec.nodecmd import MASTER_ADDR, NodeCommand, node_commands, node_differences
from imagebuild.spec.servecmd import serve_command
from tests.support.matrices import edit


def _cpu_cell(root: Path, layout: str):
    edit(root, "    methods: [ngram]\n", f"    methods: [ngram]\n    parallel: {layout}\n")
    edit(root, "    memory_limit: 8g\n",
         "    memory_limit: 8g\n    interconnect: {interfaces: [lo, lo2], env: {A: b}}\n")
    lm = mx.load(root / "matrix.yaml")
    return mx.select(mx.expand(lm), target="cpu")[0]


def test_mp_nodes_share_the_serve_command_and_add_their_own_rank(matrix_dir: Path) -> None:
    cell = _cpu_cell(matrix_dir, "{tensor_parallel_size: 4, nodes: 2, master_port: 29600}")
    shared = list(serve_command(cell).argv)
    cmd = serve_command(cell)
    assert (cmd.flag("tensor-parallel-size"), cmd.flag("distributed-executor-backend")) == (
        "4", "mp")
    head, worker = node_commands(cell)
    assert (head.name, worker.name) == ("head", "worker1")
    tail = ["--nnodes", "2", "--node-rank", "0", "--master-addr", MASTER_ADDR,
            "--master-port", "29600"]
    assert list(head.argv) == shared + tail
    assert list(worker.argv) == shared + [*tail[:3], "1", *tail[4:], "--headless"]
    assert dict(head.env) == {"A": "b", "NCCL_SOCKET_IFNAME": "lo,lo2",
                              "GLOO_SOCKET_IFNAME": "lo,lo2"} == dict(worker.env)
    assert "--master-addr ${MASTER_ADDR}" in worker.shell()
    assert not node_differences((head, worker))


def test_ray_head_starts_a_ray_head_and_workers_join_it(matrix_dir: Path) -> None:
    cell = _cpu_cell(matrix_dir, "{tensor_parallel_size: 2, nodes: 2, backend: ray}")
    head, worker = node_commands(cell)
    assert head.argv[:2] == ("sh", "-c") and head.argv[2].startswith(
        'ray start --head --port=29501 --node-ip-address="$MASTER_ADDR" && exec vllm serve')
    assert "--distributed-executor-backend ray" in head.argv[2]
    assert "--nnodes" not in head.argv[2]  # vLLM 0.23 refuses nnodes > 1 with ray
    assert worker.argv == ("sh", "-c", 'exec ray start --address="$MASTER_ADDR:29501" --block')
    assert not node_differences((head, worker))


def test_single_node_cells_have_no_node_commands(matrix_dir: Path) -> None:
    cell = _cpu_cell(matrix_dir, "{tensor_parallel_size: 2}")
    assert node_commands(cell) == ()
    assert serve_command(cell).flag("tensor-parallel-size") == "2"
    assert serve_command(cell).flag("distributed-executor-backend") is None


def _pair() -> tuple[NodeCommand, NodeCommand]:
    common = ("vllm", "serve", "/model", "--max-model-len", "512", "--tensor-parallel-size", "2")
    env = (("NCCL_SOCKET_IFNAME", "lo"),)
    return (NodeCommand(0, (*common, "--node-rank", "0"), env),
            NodeCommand(1, (*common, "--node-rank", "1", "--headless"), env))


def test_every_way_a_worker_can_disagree_with_the_head() -> None:
    head, worker = _pair()
    assert node_differences((head, worker)) == []
    cases = {
        "has --max-model-len '1024', the head '512'":
            replace(worker, argv=tuple("1024" if a == "512" else a for a in worker.argv)),
        "has --enforce-eager (bare flag), the head (not set)":
            replace(worker, argv=(*worker.argv, "--enforce-eager")),
        "runs 'vllm serve /other'": replace(worker, argv=("vllm", "serve", "/other",
                                                          *worker.argv[3:])),
        "passes --node-rank '0'":
            replace(worker, argv=tuple("0" if a == "1" else a for a in worker.argv)),
        "is not --headless": replace(worker, argv=worker.argv[:-1]),
        "has NCCL_SOCKET_IFNAME='eth0', the head NCCL_SOCKET_IFNAME='lo'":
            replace(worker, env=(("NCCL_SOCKET_IFNAME", "eth0"),)),
    }
    for problem, bad in cases.items():
        found = node_differences((head, bad))
        assert any(problem in p for p in found), (problem, found)
    assert any("ranks are [0, 0]" in p for p in node_differences((head, replace(worker,
                                                                                rank=0))))
    headless_head = replace(head, argv=(*head.argv, "--headless"))
    assert any("nothing would serve the API" in p
               for p in node_differences((headless_head, worker)))
