"""examples/two-spark-tp2, beyond what every example gets (test_examples.py): its check
findings against a golden file, and its per-node compose files read back as the commands
plan shows (what the launcher and preflight read is what render wrote).
UPDATE_GOLDEN=1 rewrites tests/data/golden-examples/two-spark-tp2/check.json."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from imagebuild.render import render_node_composes
from imagebuild.serving.nodefiles import read_node_file
from imagebuild.spec import matrix as mx
from imagebuild.spec.nodecmd import node_commands, node_differences
from tests.support.matrices import check, locked_copy
from tests.support.paths import GOLDEN_EXAMPLES

EXAMPLE = REPO_ROOT / "examples" / "two-spark-tp2"
GOLDEN = GOLDEN_EXAMPLES / "two-spark-tp2" / "check.json"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return locked_copy(EXAMPLE, tmp_path_factory.mktemp("pair"))


def test_check_findings_are_the_golden_ones(pair: Path) -> None:
    found = [{"rule": f.rule, "severity": f.severity, "message": f.message}
             for f in check(pair, target="gb10")]
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(found, indent=2) + "\n")
    assert found == json.loads(GOLDEN.read_text()), f"{GOLDEN} differs (UPDATE_GOLDEN=1)"
    assert {f["rule"] for f in found} >= {"tp-memory-per-node", "kv-layout"}


def test_node_files_read_back_as_the_commands_plan_shows(pair: Path, tmp_path: Path) -> None:
    lm = mx.load(pair / "matrix.yaml")
    cell = mx.expand(lm)[0]
    nodes = node_commands(cell)
    assert [n.name for n in nodes] == ["head", "worker1"] and not node_differences(nodes)
    for r in render_node_composes(lm, cell):
        path = tmp_path / Path(r.path).name
        path.write_text(r.text)
        back = read_node_file(path)
        node = nodes[back.rank]
        assert back.env == node.env
        # render moves --host/--port to the end (runspec.with_listen); the rest is in order
        strip = {"--host", "127.0.0.1", "--port", "8000"}
        assert [a for a in back.argv if a not in strip] == [
            a for a in node.argv if a not in strip]
