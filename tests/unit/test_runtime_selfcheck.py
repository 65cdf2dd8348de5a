"""runtime-selfcheck.py (images/engine/files): a skip is explicit and only for a component
that is absent altogether and that the caller may skip; a present FlashInfer without its
jit-cache fails (issue 20.8)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from imagebuild.rehearse.step_selfcheck import outcomes, tally

SCRIPT = Path(__file__).resolve().parents[2] / "images/engine/files/runtime-selfcheck.py"


@pytest.fixture
def selfcheck(monkeypatch: pytest.MonkeyPatch):
    spec = importlib.util.spec_from_file_location("runtime_selfcheck", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def installed(**versions: str | None) -> None:
        monkeypatch.setattr(mod, "_version", lambda dist: versions.get(dist))

    mod.installed = installed
    return mod


def _run(mod, capsys, *args: str) -> tuple[int, str]:
    code = mod.main(["--arch", "sm_121a", "--only", "flashinfer-jit-cache", *args])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_flashinfer_without_its_jit_cache_fails_even_when_skips_are_allowed(selfcheck, capsys):
    selfcheck.installed(**{"flashinfer-python": "0.6.1"})
    code, text = _run(selfcheck, capsys, "--may-skip", "flashinfer-jit-cache")
    assert code == 1
    assert "FAIL flashinfer-jit-cache: flashinfer-jit-cache is not installed" in text
    # what the rehearsal reads from it: a failure, not a skip
    assert outcomes(text)["flashinfer-jit-cache"][0] == "FAIL"


def test_absent_flashinfer_fails_unless_the_caller_may_skip_it(selfcheck, capsys):
    selfcheck.installed()
    code, text = _run(selfcheck, capsys)
    assert code == 1 and "FAIL flashinfer-jit-cache: flashinfer-python is not installed" in text
    code, text = _run(selfcheck, capsys, "--may-skip", "flashinfer-jit-cache")
    assert code == 0 and "skip flashinfer-jit-cache: flashinfer-python is not installed" in text
    assert "0 check(s) passed for sm_121a, 1 skipped" in text
    assert outcomes(text)["flashinfer-jit-cache"][0] == "skip"


def test_matching_jit_cache_passes(selfcheck, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VERSION", "13.0.1")
    selfcheck.installed(**{"flashinfer-python": "0.6.1", "flashinfer-jit-cache": "0.6.1+cu130"})
    code, text = _run(selfcheck, capsys)
    assert code == 0 and "ok   flashinfer-jit-cache" in text


@pytest.mark.parametrize("wheel", ["0.6.1+cu128", "0.6.1+cu129", "0.6.1", "0.6.1+cu130.post1"])
def test_a_jit_cache_for_another_cuda_fails(selfcheck, capsys, monkeypatch, wheel):
    """The local part counts: a +cu128/+cu129 wheel from the wrong index is not this CUDA's."""
    monkeypatch.setenv("CUDA_VERSION", "13.0.1")
    selfcheck.installed(**{"flashinfer-python": "0.6.1", "flashinfer-jit-cache": wheel})
    code, text = _run(selfcheck, capsys)
    assert code == 1
    assert f"FAIL flashinfer-jit-cache: flashinfer-jit-cache is {wheel}" in text
    assert "it must be 0.6.1+cu130" in text and "flashinfer-jit-cache==0.6.1+cu130" in text


def test_the_cuda_comes_from_the_image_or_its_nvcc(selfcheck, monkeypatch):
    monkeypatch.setenv("CUDA_VERSION", "12.9.1")
    assert selfcheck.cuda_tag() == "cu129"
    monkeypatch.delenv("CUDA_VERSION")
    monkeypatch.setattr(selfcheck.shutil, "which", lambda name: "/bin/echo")

    class Proc:
        stdout = "Cuda compilation tools, release 13.0, V13.0.88"

    monkeypatch.setattr(selfcheck, "run", lambda cmd, cwd=None: Proc())
    assert selfcheck.cuda_tag() == "cu130"


def test_an_unknown_may_skip_is_bad_usage(selfcheck, capsys):
    assert _run(selfcheck, capsys, "--may-skip", "flashinfer")[0] == 2


def test_the_rehearsal_never_reads_a_failure_as_a_skip():
    text = ("ok   ninja: /usr/bin/ninja 1.11\n"
            "FAIL flashinfer-jit-cache: flashinfer-jit-cache is not installed, "
            "flashinfer-python is 0.6.1\n     fix: install it\n")
    assert outcomes(text) == {
        "ninja": ("ok", "/usr/bin/ninja 1.11"),
        "flashinfer-jit-cache": ("FAIL", "flashinfer-jit-cache is not installed, "
                                         "flashinfer-python is 0.6.1")}
    assert tally(text) == {"ok": ["ninja"], "FAIL": ["flashinfer-jit-cache"], "skip": []}
