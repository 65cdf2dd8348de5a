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


# --- unresolved pins of the cells a release builds: one rule for check --tag and build ---

TAG = "2026-06-18-dflashfix"


def _check_json(root: Path, capsys: pytest.CaptureFixture[str], *args: str
                ) -> tuple[int, dict]:
    import json as _json

    from imagebuild.cli import main

    code = main(["check", "--matrix", str(root / "matrix.yaml"), "--format", "json", *args])
    return code, _json.loads(capsys.readouterr().out)


def test_check_tag_refuses_the_unresolved_pins_it_would_build(
        matrix_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the committed lock: gb10's base and runtime digests and its Hub pins are unresolved
    code, doc = _check_json(matrix_dir, capsys, "--tag", TAG, "--target", "gb10")
    assert code == 2 and not doc["ok"]
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert errors and {f["rule"] for f in errors} == {"pin-unresolved"}
    assert any("have no digest" in f["message"] for f in errors)
    # one command, the same in every finding, names the target first and every pin it needs
    (fix,) = {f["fix"] for f in errors}
    command = fix.split("`")[1]
    assert command.startswith("python build.py lock --update gb10 --update ")
    assert "runner of target gb10" in fix
    from imagebuild.cliparser import parser

    args = parser().parse_args(command.split()[2:])  # a real command of this CLI
    assert args.command == "lock" and args.update[0] == "gb10"
    assert set(args.update) == {"gb10", "heretic", "nvfp4", "ornith", "zlab", "aeon"}


def test_check_without_a_tag_reviews_and_only_warns(
        matrix_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = _check_json(matrix_dir, capsys, "--target", "gb10")
    assert code == 0 and doc["ok"]
    unresolved = [f for f in doc["findings"] if f["rule"] == "pin-unresolved"]
    assert unresolved and {f["severity"] for f in unresolved} == {"warning"}


def test_a_release_of_resolved_cells_passes(matrix_dir: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = _check_json(matrix_dir, capsys, "--tag", TAG, "--target", "cpu")
    assert code == 0 and doc["ok"]


def test_build_refuses_with_the_findings_check_tag_prints(
        matrix_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from imagebuild.job import buildable
    from imagebuild.plan import load_plan

    plan = load_plan(matrix_dir / "matrix.yaml", TAG, "gb10")
    with pytest.raises(UserError):
        buildable(plan)
    err = capsys.readouterr().err
    assert "pin-unresolved" in err and "lock --update gb10 --update " in err


def test_a_missing_engine_entry_is_reported_once(locked: Path) -> None:
    """verify_cells refuses a lock with no entry for the cell's engine; the unresolved-pin
    pass must not add a second, location-less "engine ... is unresolved" for it."""
    path = locked / "matrix.lock.json"
    data = json.loads(path.read_text())
    del data["engines"]["dflashfix"]["gb10"]
    path.write_text(json.dumps(data, indent=2) + "\n")
    findings = check(locked, target="gb10", engine="dflashfix")
    assert of(findings, "pin-lock-agrees")
    assert not [f for f in findings if "engine dflashfix for gb10 is unresolved" in f.message]
