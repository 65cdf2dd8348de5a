"""Facts recorded by another recorder than this imagebuild's are said to be stale (a
warning naming the command that records them again), per part, from meta.json's
recorder_sha256; facts recorded by today's recorder say nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from imagebuild.facts import SHIPPED, locked_dir
from tests.support.matrices import check


def _stale(findings: list) -> list:
    return [f for f in findings if f.rule == "vllm-facts-stale"]


def test_shipped_facts_are_todays_recorders(locked: Path) -> None:
    assert not _stale(check(locked, target="cpu"))


def test_a_part_an_older_recorder_wrote_is_stale(locked: Path) -> None:
    # the matrix's own facts of 0.32.0 (found before the shipped ones), kv from another day
    mine = locked_dir(locked) / "0.32.0"
    shutil.copytree(SHIPPED / "0.32.0", mine)
    meta = json.loads((mine / "meta.json").read_text())
    meta["parts"]["kv"]["recorder_sha256"] = "0" * 64
    (mine / "meta.json").write_text(json.dumps(meta))
    [found] = _stale(check(locked, target="cpu"))
    assert found.cell.endswith("@vllm032") and found.severity == "warning"
    assert "kv recorded by another recorder" in found.message, found.message
    assert "facts record --python" in (found.fix or "")
    assert "matrix.yaml" in (found.where or "")
