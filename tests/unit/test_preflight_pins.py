"""Pin rules: every pin a full SHA in matrix.lock.json, and the lock agreeing with
matrix.yaml (decided by lock.verify_cells, the code build itself runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imagebuild.errors import UserError
from tests.support.hub.fake import FakeHub
from tests.support.matrices import (
    blocking_rules,
    check,
    edit,
    lock_matrix,
    of,
)

AEON = "AEON-7/AEON-DFlash-Qwen3.6-35B-A3B"


def test_no_lock_is_an_error(matrix_dir: Path) -> None:
    (matrix_dir / "matrix.lock.json").unlink()
    findings = check(matrix_dir, target="cpu", engine="dflashfix")
    (f,) = of(findings, "pin-lock-agrees")
    assert f.blocking and f.cell == "matrix" and "no matrix.lock.json" in f.message


def test_a_pin_moved_in_matrix_yaml_but_not_in_the_lock_is_refused(locked: Path) -> None:
    edit(locked, "revision: 31977fbe13a86e8b961774f773058175676d89b8",
         "revision: f98dc5c2908b")
    findings = check(locked, target="gb10", engine="dflashfix")
    assert blocking_rules(findings) == {"pin-lock-agrees"}
    (f, *_) = of(findings, "pin-lock-agrees")
    assert "not revision 'f98dc5c2908b'" in f.message
    assert f.fix == "run `python build.py lock --update zlab`"
    assert f.where and ":" in f.where


def test_a_changed_patch_is_refused(locked: Path) -> None:
    patch = locked / "patches" / "cpu-ngram-fp64-gumbel.patch"
    patch.write_text(patch.read_text() + "\n")
    findings = check(locked, target="cpu", engine="pr41703")
    assert blocking_rules(findings) == {"pin-lock-agrees"}
    assert "changed since it was locked" in of(findings, "pin-lock-agrees")[0].message


def test_unresolved_pins_warn_once_per_pin(matrix_dir: Path) -> None:
    lock_matrix(matrix_dir, FakeHub(offline=(AEON,)))
    findings = check(matrix_dir, target="gb10", engine="dflashfix")
    assert not blocking_rules(findings)
    aeon = [f for f in of(findings, "pin-unresolved") if "drafter aeon" in f.message]
    assert len(aeon) == 1 and aeon[0].severity == "warning"
    assert "missing: sha, files, metadata" in aeon[0].message
    assert "lock --update aeon" in (aeon[0].fix or "")


def test_a_lock_entry_with_a_short_sha_is_refused(locked: Path) -> None:
    path = locked / "matrix.lock.json"
    data = json.loads(path.read_text())
    entry = data["drafters"]["aeon"]
    entry["sha"] = entry["sha"][:12]  # a hand-edited lock; the track pin still "agrees"
    text = json.dumps(data, indent=2)
    path.write_text(text)
    # refused where the lock is read, at the edited value, before any rule runs
    with pytest.raises(UserError) as info:
        check(locked, target="gb10", engine="dflashfix")
    line = text[:text.index(f'"sha": "{entry["sha"]}"')].count("\n") + 1
    assert info.value.where.startswith(f"matrix.lock.json:{line}:"), info.value.where
    assert "drafters.aeon.sha" in info.value.message
    assert "is not 40 lowercase hex characters" in info.value.message


def test_pin_rules_cannot_be_waived(locked: Path) -> None:
    edit(locked, "revision: 31977fbe13a86e8b961774f773058175676d89b8",
         "revision: f98dc5c2908b")
    edit(locked, "  spark:\n    description: Qwen3.6-35B-A3B NVFP4 targets with DFlash or MTP on "
                 "DGX Spark\n",
         "  spark:\n    description: Qwen3.6-35B-A3B NVFP4 targets with DFlash or MTP on "
         "DGX Spark\n    waivers:\n      - {rule: pin-lock-agrees, reason: we know what we do}\n")
    findings = check(locked, target="gb10", engine="dflashfix")
    assert blocking_rules(findings) == {"pin-lock-agrees", "waiver-invalid"}
    assert "cannot be waived" in of(findings, "waiver-invalid")[0].message
