"""The real matrix with its cpu cell spread over two nodes: the cpu multi-node smoke's
cell (tests/e2e/test_multinode_cpu.py) and the unit tests of what it is made of.

The serve image is the same one the suite builds (the parallel layout lives in the
per-node compose files, not in the image), so no engine or image is built for it.
"""

from __future__ import annotations

from pathlib import Path

from imagebuild import REPO_ROOT
from tests.support.matrices import copy_lock, copy_matrix

CPU_IMAGE = "cpu-tiny-ngram"
# vLLM 0.23's own lines (two processes, TP=2 over nnodes=2, recorded on 2026-12-01)
HEAD_RANK_LINE = ("(Worker pid=24383) INFO 12-01 22:42:24 [parallel_state.py:1903] rank 0 in "
                  "world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, "
                  "EP rank N/A, EPLB rank N/A")
WORKER_RANK_LINE = ("(Worker pid=1711) INFO 12-01 22:42:24 [parallel_state.py:1903] rank 1 "
                    "in world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP "
                    "rank 1, EP rank N/A, EPLB rank N/A")


def cpu_two_nodes(dest: Path) -> Path:
    """A copy of the matrix whose cpu profile runs TP=2 over two nodes joined by loopback;
    returns its matrix.yaml. The lock is the repository's (the pins are the same)."""
    copy_matrix(dest)
    copy_lock(REPO_ROOT, dest)
    path = dest / "matrix.yaml"
    text = path.read_text()
    for old, new in (
            ("    expect_backends: {attention: CPU_ATTN, speculative: ngram}\n",
             "    expect_backends: {attention: CPU_ATTN, speculative: ngram}\n"
             "    parallel: {tensor_parallel_size: 2, nodes: 2}\n"),
            ("    memory_limit: 8g\n",
             "    memory_limit: 8g\n    interconnect: {interfaces: [lo]}\n")):
        assert text.count(old) == 1, f"matrix.yaml changed: {old!r} is not there once"
        text = text.replace(old, new)
    path.write_text(text)
    return path


def cpu_two_node_cell(dest: Path):  # noqa: ANN201 - a Cell
    from imagebuild.spec.matrix import expand, load

    lm = load(cpu_two_nodes(dest))
    return next(c for c in expand(lm) if c.image == CPU_IMAGE)
