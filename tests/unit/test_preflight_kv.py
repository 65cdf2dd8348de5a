"""`check`'s KV-cache findings for targets beyond Qwen3.6: a family it models, and one it
cannot predict (which must warn, never pass), through the real lock and preflight code."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.hub.fake import FakeHub
from tests.support.matrices import check, edit, lock_matrix
from tests.support.paths import CONFIGS as CONFIGS_DIR

CONFIGS = CONFIGS_DIR
ORNITH = "repository: AEON-7/Ornith-1.0-35B-AEON-Ultimate-Uncensored"


def retarget_ornith(root: Path, tmp: Path, fixture: str) -> None:
    """Point the matrix's ornith model at a recorded repo whose config.json is `fixture`."""
    hub = FakeHub()
    config = json.loads((CONFIGS / f"{fixture}.json").read_text())
    hub.add_revision(f"imagebuild-fixtures/{fixture}", {"config.json": config}, tmp)
    edit(root, ORNITH, f"repository: imagebuild-fixtures/{fixture}")
    lock_matrix(root, hub)


def kv(findings: list, cell: str) -> list:
    return [f for f in findings if f.cell == cell and f.rule.startswith("kv-")]


def test_unknown_hybrid_target_warns_that_the_layout_cannot_be_predicted(locked: Path,
                                                                         tmp_path: Path):
    retarget_ornith(locked, tmp_path, "unknown-hybrid")
    findings = check(locked, target="gb10", engine="dflashfix")
    (f,) = kv(findings, "gb10/spark-ornith-mtp")
    assert f.rule == "kv-page-unify" and f.severity == "warning"
    assert f.message.startswith("cannot predict the KV layout") and "unknown hybrid" in f.message


def test_nemotron_h_target_gets_its_own_layout_and_mtp_verdict(locked: Path, tmp_path: Path):
    retarget_ornith(locked, tmp_path, "nemotron-h-8b")
    findings = check(locked, target="gb10", engine="dflashfix")
    # its config has no MTP step (num_nextn_predict_layers 0): NemotronHMTP asserts
    (mtp,) = kv(findings, "gb10/spark-ornith-mtp")
    assert mtp.severity == "error" and "AssertionError" in mtp.message
    # DFlash drafter (4 KV heads x 128 x 2 x 2 B = 2048 B/token) on NemotronH (4096 B/token,
    # block 1280 with prefix caching): its page divides the target's, so it unifies
    (zlab,) = kv(findings, "gb10/spark-ornith-zlab")
    assert zlab.rule == "kv-layout", zlab.message
    assert zlab.message.startswith("attention block size 1280, NemotronH state page")
