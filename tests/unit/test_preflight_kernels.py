"""GB10 kernel traps as preflight rules (preflight/kernels.py): flashinfer#3294,
vllm#53014, vllm#29469. The committed profiles assert their kernels at boot and pass; each
trap put back is refused."""

from __future__ import annotations

from pathlib import Path

from tests.support.matrices import check, edit, of

SPARK = "    expect_backends: {nvfp4_gemm: CUTLASS, moe: VLLM_CUTLASS}\n"
MTP = "    expect_backends: {nvfp4_gemm: CUTLASS, moe: VLLM_CUTLASS, speculative: mtp}\n"
RULES = ("flashinfer-moe-sm121", "nvfp4-gemm-asserted", "triton-ptxas-sm121a")


def _kernel(findings: list) -> list:
    return [f for f in findings if f.rule in RULES]


def test_the_committed_gb10_profiles_pass(locked: Path) -> None:
    assert _kernel(check(locked, target="gb10", engine="dflashfix")) == []


def test_nvfp4_moe_without_asserted_kernels_is_refused(locked: Path) -> None:
    edit(locked, SPARK, "")
    edit(locked, MTP, "")
    findings = check(locked, target="gb10", engine="dflashfix")
    mtp = [f for f in _kernel(findings) if f.cell == "gb10/spark-nvfp4-mtp"]
    assert {f.rule for f in mtp} == {"flashinfer-moe-sm121", "nvfp4-gemm-asserted"}
    assert all(f.blocking for f in mtp)
    gemm = of(mtp, "nvfp4-gemm-asserted")[0]
    assert "vLLM 0.23.0 and no expect_backends.nvfp4_gemm" in gemm.message
    assert "expect_backends: {nvfp4_gemm: CUTLASS}" in (gemm.fix or "")
    # the dflash cells state their own expectations and stay clean
    assert not [f for f in _kernel(findings) if f.cell == "gb10/spark-nvfp4-zlab"]


def test_flashinfer_moe_selected_on_sm121_is_refused(locked: Path) -> None:
    edit(locked, MTP, "    expect_backends: {nvfp4_gemm: CUTLASS, moe: FLASHINFER_CUTLASS}\n")
    (f, *_) = of(check(locked, target="gb10", engine="dflashfix"), "flashinfer-moe-sm121")
    assert f.blocking and "FLASHINFER_CUTLASS on sm_121" in f.message


def test_a_flashinfer_moe_switch_in_the_env_is_refused(locked: Path) -> None:
    edit(locked, MTP, MTP + "    env:\n      VLLM_USE_FLASHINFER_MOE_FP4: \"1\"\n")
    (f, *_) = of(check(locked, target="gb10", engine="dflashfix"), "flashinfer-moe-sm121")
    assert "VLLM_USE_FLASHINFER_MOE_FP4" in f.message and f.where


def test_a_profile_replacing_the_toolkit_ptxas_is_refused(locked: Path) -> None:
    edit(locked, MTP, MTP + "    env:\n      TRITON_PTXAS_PATH: /opt/vllm/bin/ptxas\n")
    (f, *_) = of(check(locked, target="gb10", engine="dflashfix"), "triton-ptxas-sm121a")
    assert f.blocking and "TRITON_PTXAS_PATH" in f.message


def test_the_rules_stay_off_the_cpu_target(locked: Path) -> None:
    assert _kernel(check(locked, target="cpu", engine="dflashfix")) == []


def test_an_engine_runtime_stage_without_the_toolkit_ptxas_is_refused(locked: Path,
                                                                      monkeypatch) -> None:
    import imagebuild.render as render

    real = render.render_engine

    def without_triton_env(*args, **kw):
        out = real(*args, **kw)
        text = "\n".join(line for line in out.text.splitlines()
                         if "TRITON_PTXAS" not in line or line.lstrip().startswith("#"))
        return type(out)(**{**out.__dict__, "text": text})

    monkeypatch.setattr(render, "render_engine", without_triton_env)
    (f, *_) = of(check(locked, target="gb10", engine="dflashfix"), "triton-ptxas-sm121a")
    assert "sets no TRITON_PTXAS_PATH, TRITON_PTXAS_BLACKWELL_PATH" in f.message
