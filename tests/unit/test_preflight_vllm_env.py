"""A VLLM_* variable the cell's vLLM version does not read is refused (issue 38, item 12):
vLLM 0.23.0 only logs "Unknown vLLM environment variable detected" (envs.py
validate_environ), so a misspelt switch silently does nothing. The names come from the
version's recorded envs (imagebuild/facts/recorded/<version>/envs.json)."""

from __future__ import annotations

import json
from pathlib import Path

from imagebuild.cli import main
from imagebuild.facts import SHIPPED
from tests.support.matrices import check, edit

KV = '      VLLM_CPU_KVCACHE_SPACE: "1"\n'


def _variables(version: str) -> set[str]:
    return set(json.loads((SHIPPED / version / "envs.json").read_text())["variables"])


def test_a_misspelt_variable_is_an_error_with_the_name_it_meant(locked: Path, capsys) -> None:
    edit(locked, KV, KV + '      VLLM_CPU_OMP_THREAD_BIND: "0"\n')
    findings = [f for f in check(locked, target="cpu") if f.rule == "vllm-env-unknown"]
    assert {f.severity for f in findings} == {"error"} and len(findings) == 3  # per engine
    assert all("did you mean VLLM_CPU_OMP_THREADS_BIND?" in f.message for f in findings)
    assert {f.fix for f in findings} == {"write VLLM_CPU_OMP_THREADS_BIND"}
    assert main(["check", "--matrix", str(locked / "matrix.yaml")]) == 2
    out = capsys.readouterr().out
    assert out.count("VLLM_CPU_OMP_THREAD_BIND: vLLM 0.23.0 does not know") == 1, out


def test_the_names_are_the_cells_own_versions(locked: Path) -> None:
    """A variable 0.32 added is unknown to a 0.23 cell, with nothing near it to suggest."""
    newer = sorted(_variables("0.32.0") - _variables("0.23.0"))
    name = next(n for n in newer if n.startswith("VLLM_B12X"))
    edit(locked, KV, KV + f'      {name}: "1"\n')
    (f, *_) = [f for f in check(locked, target="cpu") if f.rule == "vllm-env-unknown"]
    assert f.severity == "error" and "vLLM 0.23.0 does not know" in f.message
    assert "did you mean" not in f.message and f.fix.startswith("remove the variable")
