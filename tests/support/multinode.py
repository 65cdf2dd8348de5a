"""A multi-node cell for tests: the real matrix's cpu cell made TP=2 over 2 nodes on
loopback, its per-node compose files rendered into the matrix copy's rendered/."""

from __future__ import annotations

from pathlib import Path

from imagebuild.render import render_node_composes
from imagebuild.spec import matrix as mx
from tests.support.matrices import edit


def two_node_files(matrix_dir: Path) -> list[Path]:
    """The per-node compose files (head, worker1) of the cpu cell made TP=2 over 2 nodes."""
    edit(matrix_dir, "    methods: [ngram]\n",
         "    methods: [ngram]\n    parallel: {tensor_parallel_size: 2, nodes: 2}\n")
    edit(matrix_dir, "    memory_limit: 8g\n",
         "    memory_limit: 8g\n    interconnect: {interfaces: [lo]}\n")
    lm = mx.load(matrix_dir / "matrix.yaml")
    cell = mx.select(mx.expand(lm), target="cpu")[0]
    out = []
    for r in render_node_composes(lm, cell):
        path = matrix_dir / "rendered" / r.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(r.text)
        out.append(path)
    return out
