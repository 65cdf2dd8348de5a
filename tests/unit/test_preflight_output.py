"""Waivers (a written reason in matrix.yaml, visible in the output) and the table/JSON
output of `check`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imagebuild.errors import UserError
from imagebuild.preflight.findings import WIDTH, Finding, format_table, has_errors
from imagebuild.preflight.run import render
from tests.support.matrices import (
    blocking_rules,
    check,
    edit,
)

SPARK = ("  spark:\n    description: Qwen3.6-35B-A3B NVFP4 targets with DFlash or MTP on "
         "DGX Spark\n")
REASON = "shared Spark measured at 0.90 with nothing else running"


def waive(root: Path, rule: str, reason: str = REASON) -> None:
    edit(root, SPARK, SPARK + f"    waivers:\n      - rule: {rule}\n        reason: {reason}\n")


def test_a_waived_rule_does_not_block_and_shows_its_reason(locked: Path) -> None:
    edit(locked, "gpu-memory-utilization: 0.85", "gpu-memory-utilization: 0.9")
    assert blocking_rules(check(locked, target="gb10", engine="dflashfix")) == {
        "gpu-mem-util-unified"}
    waive(locked, "gpu-mem-util-unified")
    findings = check(locked, target="gb10", engine="dflashfix")
    assert not has_errors(findings)
    waived = [f for f in findings if f.rule == "gpu-mem-util-unified"]
    assert len(waived) == 7 and all(f.waived == REASON for f in waived)
    table = render(findings)
    assert "waived error gpu-mem-util-unified  gb10/" in table
    assert f"waived: {REASON}" in table
    assert json.loads(render(findings, "json"))["counts"]["waived"] == 7


def test_a_waiver_applies_only_to_its_own_family(locked: Path) -> None:
    waive(locked, "no-pip-install-in-image", "the cpu image is rebuilt nightly anyway")
    edit(locked, '      VLLM_CPU_KVCACHE_SPACE: "1"\n',
         '      VLLM_CPU_KVCACHE_SPACE: "1"\n      PRESTART: "pip install -U transformers"\n')
    findings = check(locked, target="cpu", engine="dflashfix")
    assert blocking_rules(findings) == {"no-pip-install-in-image"}


def test_a_waiver_for_an_unknown_rule_is_refused(locked: Path) -> None:
    waive(locked, "gpu-mem-util")
    findings = check(locked, target="gb10", engine="dflashfix")
    assert blocking_rules(findings) == {"waiver-invalid"}
    (f,) = [f for f in findings if f.rule == "waiver-invalid"]
    assert "no such rule" in f.message and f.where and "matrix.yaml:" in f.where


def test_a_waiver_that_waives_nothing_warns(locked: Path) -> None:
    waive(locked, "aeon-max-num-seqs")
    findings = check(locked, target="gb10", engine="dflashfix")
    assert not has_errors(findings)
    assert [f.severity for f in findings if f.rule == "waiver-unused"] == ["warning"]


def test_a_waiver_needs_a_written_reason(locked: Path) -> None:
    waive(locked, "gpu-mem-util-unified", reason="ok")
    with pytest.raises(UserError) as exc:
        check(locked, target="gb10", engine="dflashfix")
    assert "waivers" in exc.value.message


def test_table_says_each_finding_once_with_its_cells_and_fits_the_width() -> None:
    """Issue 38, item 12: one mistake was one line per cell it reached (once per engine),
    lines up to 650 characters. Now a finding shared by cells is said once naming them,
    and its text wraps under its header; the summary counts one per cell, as JSON does."""
    long = "word " * 60
    findings = [
        Finding("gb10/a@one", "rule-one", "error", "broken", fix="mend it", where="m.yaml:3:5"),
        Finding("gb10/a@two", "rule-one", "error", "broken", fix="mend it", where="m.yaml:3:5"),
        Finding("gb10/a-longer", "r2", "warning", long.strip(), fix=None),
        Finding("matrix", "r3", "info", "fyi"),
        *(Finding(f"gb10/c{i}", "r4", "warning", "shared", fix="x") for i in range(6)),
    ]
    table = format_table(findings)
    lines = table.splitlines()
    assert lines[:4] == ["error    rule-one  gb10/a@one, gb10/a@two", "         broken",
                         "         at m.yaml:3:5", "         fix: mend it"]
    assert lines[4] == "warning  r2  gb10/a-longer"
    assert all(len(line) <= WIDTH for line in lines), max(map(len, lines))
    assert " ".join(x.strip() for x in lines[5:9]) == long.strip()
    assert table.count("shared") == 1
    assert "gb10/c0, gb10/c1, gb10/c2 and 3 more cells (--format json lists each)" in table
    assert lines[-1] == "2 error(s), 7 warning(s), 0 waived, 1 info -- check FAILED"
    assert "fyi" not in format_table(findings, show_info=False)


def test_one_typo_in_a_profile_is_said_once_for_every_engine(locked: Path) -> None:
    edit(locked, "      max-num-seqs: 8\n", "      max-num-seq: 8\n")
    findings = check(locked, target="cpu")
    assert sum(f.rule == "serve-flag-unknown" for f in findings) == 3  # every engine's cell
    table = render(findings)
    # said once per vLLM version whose facts it comes from
    assert table.count("--max-num-seq abbreviates") == 2, table
    assert "error    serve-flag-unknown  cpu/cpu-tiny-ngram@dflashfix, " \
           "cpu/cpu-tiny-ngram@pr41703\n" in table
    assert "error    serve-flag-unknown  cpu/cpu-tiny-ngram@vllm032\n" in table


def test_json_lists_findings_counts_and_the_rules_used(locked: Path) -> None:
    edit(locked, "attention-backend: flash_attn", "attention-backend: flashinfer")
    doc = json.loads(render(check(locked, target="gb10", engine="dflashfix"), "json",
                            {"tag": "2026-06-18-dflashfix"}))
    assert doc["tag"] == "2026-06-18-dflashfix" and doc["ok"] is False
    # the spark-dflash profile's three cells and the AEON cell, whose profile extends it:
    # the flag rule, and the kernel prediction (vLLM then picks FLASHINFER, not the
    # FLASH_ATTN the profile expects)
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert doc["counts"]["error"] == len(errors) == 8
    assert sorted(f["rule"] for f in errors) == ["attention-backend-flash-attn"] * 4 + [
        "kernels-expected"] * 4
    rule = doc["rules"]["attention-backend-flash-attn"]
    assert rule["hardware"] == ["cuda"] and rule["methods"] == ["dflash"] and rule["why"]
    first = doc["findings"][0]
    assert set(first) == {"cell", "rule", "severity", "message", "fix", "where", "waived",
                          "facts"}
    # a rule that reads vLLM facts names the version and folder it read them from
    # attention-backend-flash-attn reads the flag through the version's parser
    assert first["facts"] == "facts: vLLM 0.23.0 (imagebuild/facts/recorded/0.23.0)"
    assert next(f for f in doc["findings"] if f["rule"] == "pin-unresolved")["facts"] is None
    kernels = next(f for f in doc["findings"] if f["rule"] == "kernels-expected")
    assert kernels["facts"] == "facts: vLLM 0.23.0 (imagebuild/facts/recorded/0.23.0)"
