"""Which oracle venv runs a recorded vLLM version's code, and what a missing one does: a
version scripts/setup-tests.sh installs fails CI when absent; another skips, saying why."""

from __future__ import annotations

import pytest

from tests.support.vllm_oracle import pythons


def test_ci_installs_an_oracle_of_every_shipped_version():
    """Each version whose facts ship with imagebuild is checked against its own code in CI
    (issue 35: the predictor agrees with 0.23's and 0.32's, in CI)."""
    from imagebuild.facts import SHIPPED, versions

    shipped = {v for v, folder in versions().items() if folder.parent == SHIPPED}
    assert set(pythons.ci_installed()) == shipped == {"0.23.0", "0.32.0"}


def test_a_missing_oracle_of_another_version_skips_in_ci_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("IMAGEBUILD_VLLM_PYTHON_0_30_0", str(tmp_path / "none" / "python"))
    with pytest.raises(pytest.skip.Exception, match="installs 0.23.0, 0.32.0"):
        pythons.need("0.30.0")


@pytest.mark.parametrize("version", ["0.23.0", "0.32.0"])
def test_a_missing_oracle_of_a_ci_version_fails_in_ci(monkeypatch, tmp_path, version):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv(f"IMAGEBUILD_VLLM_PYTHON_{version.replace('.', '_')}",
                       str(tmp_path / "none" / "python"))
    with pytest.raises(pytest.fail.Exception, match=f"no vLLM {version} oracle venv"):
        pythons.need(version)
