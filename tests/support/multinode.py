"""A multi-node cell for tests: the real matrix's cpu cell made TP=2 over 2 nodes on
loopback. `two_node_files`: its per-node compose files rendered into a matrix copy's
rendered/ (launch tests); `cpu_two_nodes`/`cpu_two_node_cell`: a locked copy of the
matrix and the cell itself (the cpu multi-node smoke, tests/e2e/test_multinode_cpu.py).

The serve image is the same one the suite builds (the parallel layout is in the per-node
compose files, not in the image), so no engine or image is built for it.
"""

from __future__ import annotations

from pathlib import Path

from imagebuild import REPO_ROOT
from imagebuild.render import render_node_composes
from imagebuild.spec import matrix as mx
from tests.support.matrices import copy_lock, copy_matrix, edit

CPU_IMAGE = "cpu-tiny-ngram"
# vLLM 0.23's own lines (two processes, TP=2 over nnodes=2, recorded on 2026-12-01)
HEAD_RANK_LINE = ("(Worker pid=24383) INFO 12-01 22:42:24 [parallel_state.py:1903] rank 0 in "
                  "world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, "
                  "EP rank N/A, EPLB rank N/A")
WORKER_RANK_LINE = ("(Worker pid=1711) INFO 12-01 22:42:24 [parallel_state.py:1903] rank 1 "
                    "in world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP "
                    "rank 1, EP rank N/A, EPLB rank N/A")


def _two_nodes(matrix_dir: Path) -> None:
    edit(matrix_dir, "    methods: [ngram]\n",
         "    methods: [ngram]\n    parallel: {tensor_parallel_size: 2, nodes: 2}\n")
    edit(matrix_dir, "    memory_limit: 8g\n",
         "    memory_limit: 8g\n    interconnect: {interfaces: [lo]}\n")


def two_node_files(matrix_dir: Path) -> list[Path]:
    """The per-node compose files (head, worker1) of the cpu cell made TP=2 over 2 nodes."""
    _two_nodes(matrix_dir)
    lm = mx.load(matrix_dir / "matrix.yaml")
    cell = mx.select(mx.expand(lm), target="cpu")[0]
    out = []
    for r in render_node_composes(lm, cell):
        path = matrix_dir / "rendered" / r.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(r.text)
        out.append(path)
    return out


def cpu_two_nodes(dest: Path) -> Path:
    """A copy of the matrix (with the repository's lock: the pins are the same) whose cpu
    profile runs TP=2 over two nodes joined by loopback; returns its matrix.yaml."""
    copy_matrix(dest)
    copy_lock(REPO_ROOT, dest)
    _two_nodes(dest)
    return dest / "matrix.yaml"


def cpu_two_node_cell(dest: Path) -> mx.Cell:
    lm = mx.load(cpu_two_nodes(dest))
    return next(c for c in mx.expand(lm) if c.image == CPU_IMAGE)
