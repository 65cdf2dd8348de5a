"""The multi-node schema: a profile's `parallel:` block and a target's `interconnect:`.

`parallel` derives the distributed serve flags, so the same flag in `args` is an error at
its own line; a TP that cannot be split evenly over the nodes is refused where written."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagebuild.cli import main
from imagebuild.spec import matrix as mx
from tests.support.matrices import edit

TP2 = ("    args:\n      max-model-len: 262144\n",
       "    parallel: {tensor_parallel_size: 2, nodes: 2}\n"
       "    args:\n      max-model-len: 262144\n")


def _line_of(root: Path, text: str) -> int:
    lines = (root / "matrix.yaml").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def _check(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["plan", "--matrix", str(root / "matrix.yaml"), "--tag",
                 "2026-06-18-dflashfix", "--target", "gb10"])
    return code, capsys.readouterr().err


def test_parallel_and_interconnect_are_read_with_their_defaults(matrix_dir: Path) -> None:
    edit(matrix_dir, *TP2)
    edit(matrix_dir, "    memory_limit: 120g\n",
         "    memory_limit: 120g\n    interconnect:\n      interfaces: [enp1s0f1np1]\n"
         "      env: {NCCL_IB_HCA: rocep1s0f1}\n")
    m = mx.load(matrix_dir / "matrix.yaml").matrix
    par = m.profiles["spark"].parallel
    assert par is not None and (par.tensor_parallel_size, par.nodes, par.backend,
                                par.master_port) == (2, 2, "mp", 29501)
    assert par.ranks_per_node == 1 and par.multi_node
    # extends: the children of `spark` inherit the layout
    assert m.profiles["spark-mtp"].parallel == par
    ic = m.targets["gb10"].interconnect
    assert ic is not None and ic.interfaces == ["enp1s0f1np1"] and ic.hosts_network == "host"
    assert m.targets["cpu"].interconnect is None and m.profiles["cpu-ngram"].parallel is None


@pytest.mark.parametrize("flag", ["tensor-parallel-size: 2", "nnodes: 2", "node-rank: 0",
                                  "master-addr: 10.0.0.1", "headless: true",
                                  "distributed-executor-backend: ray", "master-port: 29501"])
def test_a_derived_flag_in_args_is_an_error_at_its_line(
        matrix_dir: Path, capsys: pytest.CaptureFixture[str], flag: str) -> None:
    edit(matrix_dir, *TP2)
    edit(matrix_dir, "      max-num-seqs: 64\n", f"      max-num-seqs: 64\n      {flag}\n")
    code, err = _check(matrix_dir, capsys)
    key = flag.split(":")[0]
    assert code == 2, err
    assert f"matrix.yaml:{_line_of(matrix_dir, flag)}:" in err
    assert f"--{key} in args" in err and "fix:" in err and "remove it from args" in err


def test_the_same_flag_without_parallel_is_a_plain_serve_flag(
        matrix_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(matrix_dir, "      max-num-seqs: 64\n",
         "      max-num-seqs: 64\n      tensor-parallel-size: 1\n")
    code, err = _check(matrix_dir, capsys)
    assert code == 0, err


@pytest.mark.parametrize(("layout", "message"), [
    ("{tensor_parallel_size: 3, nodes: 2}", "cannot be split evenly over 2 nodes"),
    ("{tensor_parallel_size: 1, nodes: 2}", "cannot be split evenly over 2 nodes"),
    ("{tensor_parallel_size: 0}", "greater than or equal to 1"),
    ("{nodes: 2, tensor_parallel_size: 2, backend: nccl}", "'mp' or 'ray'"),
])
def test_a_layout_the_nodes_cannot_share_is_refused_where_written(
        matrix_dir: Path, capsys: pytest.CaptureFixture[str], layout: str, message: str
        ) -> None:
    edit(matrix_dir, *TP2)
    edit(matrix_dir, "{tensor_parallel_size: 2, nodes: 2}", layout)
    code, err = _check(matrix_dir, capsys)
    assert code == 2 and message in err, err
    assert f"matrix.yaml:{_line_of(matrix_dir, 'parallel:')}:" in err


def test_socket_interfaces_are_written_once(matrix_dir: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    edit(matrix_dir, "    memory_limit: 120g\n",
         "    memory_limit: 120g\n    interconnect:\n"
         "      env: {NCCL_SOCKET_IFNAME: enp1s0f1np1}\n")
    code, err = _check(matrix_dir, capsys)
    assert code == 2 and "set from `interfaces`" in err and "interconnect.interfaces" in err
