"""The measured tables of docs/bench.md are regenerated from the raw data kept in docs/data/, so
they cannot drift from what was measured."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_burst_diagnosis_table_is_its_data() -> None:
    runs = json.loads((ROOT / "docs/data/burst-diagnosis.json").read_text())["runs"]
    assert _tool("diagnose_stream_timing").table(runs) in (ROOT / "docs/bench.md").read_text()


def test_client_comparison_table_is_its_data() -> None:
    rows = json.loads((ROOT / "docs/data/vllm-compare.json").read_text())["levels"]
    tool = _tool("compare_client_with_vllm_bench")
    readme = (ROOT / "docs/bench.md").read_text()
    assert tool.table(rows) in readme
    if "streams" in rows[0]:
        assert tool.table(rows, "ours", "streams") in readme


def test_placement_before_after_table_is_its_data() -> None:
    runs = json.loads((ROOT / "docs/data/placement-before-after.json").read_text())["runs"]
    assert _tool("bench_runs_table").table(runs) in (ROOT / "docs/bench.md").read_text()
