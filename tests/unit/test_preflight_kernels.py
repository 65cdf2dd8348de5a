"""The kernels vLLM 0.23.0 picks on GB10, predicted before a build (preflight/kernels.py on
kernel_select's recorded facts): the committed spark profiles get what they expect; each
of their switches taken back, and each known trap put back, is refused with the switch
that fixes it. Also the Triton ptxas rule (vllm#29469)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.matrices import check, edit, of

ENV = ("      VLLM_USE_FLASHINFER_MOE_FP4: \"0\"\n      VLLM_USE_FLASHINFER_MOE_FP16: \"0\"\n"
       "      VLLM_DISABLED_KERNELS: FlashInferCutlassNvFp4LinearKernel\n")
MTP = ("    expect_backends: {nvfp4_gemm: CUTLASS, moe: VLLM_CUTLASS, speculative: mtp,\n"
       "                      drafter_moe: TRITON}\n")
BLOCKING = ("kernels-expected", "kernels-boot-fails", "flashinfer-moe-sm121",
            "nvfp4-gemm-asserted", "triton-ptxas-sm121a", "architecture-matches-checkpoint")


def _blocking(findings: list, cell: str | None = None) -> list:
    return [f for f in findings if f.rule in BLOCKING and f.blocking
            and (cell is None or f.cell == cell)]


def _predicted(findings: list, cell: str) -> str:
    (f,) = [f for f in of(findings, "kernels-predicted") if f.cell == cell]
    return f.message


def test_the_committed_gb10_profiles_get_what_they_expect(locked: Path) -> None:
    findings = check(locked, target="gb10", engine="dflashfix")
    assert _blocking(findings) == []
    heretic = _predicted(findings, "gb10/spark-heretic-mtp")
    assert heretic.endswith("nvfp4_gemm CUTLASS, moe VLLM_CUTLASS, attention FLASH_ATTN, "
                            "sampler FLASHINFER, drafter_moe TRITON, drafter_attention FLASH_ATTN")
    # the weight-only ModelOpt checkpoint: Marlin, its GEMM pinned without a log line
    nvfp4 = _predicted(findings, "gb10/spark-nvfp4-mtp")
    assert "nvfp4_gemm MARLIN (pinned, not logged)" in nvfp4 and "moe MARLIN" in nvfp4
    assert "drafter_attention FLASH_ATTN" in _predicted(findings, "gb10/spark-heretic-zlab")


def test_unlocked_checkpoints_are_predicted_for_every_layout_they_can_have(
        matrix_dir: Path) -> None:
    """The repository's lock has no metadata for the Spark checkpoints: every NVFP4 layout
    their declared quantization allows is predicted, none is an error."""
    findings = check(matrix_dir, target="gb10", engine="dflashfix")
    assert _blocking(findings) == []
    cell = [f.message for f in of(findings, "kernels-predicted")
            if f.cell == "gb10/spark-heretic-mtp"]
    assert len(cell) == 2
    assert "[assumed NVFP4 W4A4]" in cell[0] and "[assumed NVFP4 W4A16]" in cell[1]
    # the W4A16 reading of a W4A4 profile's checkpoint: a warning naming the right profile
    (w, *_) = [f for f in of(findings, "kernels-expected") if f.cell == "gb10/spark-heretic-mtp"]
    assert w.severity == "warning" and "NVFP4 W4A16" in w.message
    assert "spark-w4a16-mtp" in w.fix


@pytest.mark.parametrize("taken_back,kind,switch", [
    ("      VLLM_USE_FLASHINFER_MOE_FP4: \"0\"\n", "for the target", "VLLM_USE_FLASHINFER_MOE_FP4"),
    ("      VLLM_USE_FLASHINFER_MOE_FP16: \"0\"\n", "for the drafter",
     "VLLM_USE_FLASHINFER_MOE_FP16"),
])
def test_flashinfers_fused_moe_on_sm121_is_refused_with_the_switch(
        locked: Path, taken_back: str, kind: str, switch: str) -> None:
    edit(locked, taken_back, "")
    findings = check(locked, target="gb10", engine="dflashfix")
    traps = [f for f in of(findings, "flashinfer-moe-sm121") if f.cell == "gb10/spark-heretic-mtp"]
    assert traps and all(f.blocking for f in traps)
    (trap,) = [f for f in traps if kind in f.message]
    assert "FLASHINFER_CUTLASS" in trap.message and "on sm_121" in trap.message
    assert f"env {switch}: \"0\"" in (trap.fix or "")


def test_flashinfers_nvfp4_gemm_is_refused_with_the_switch(locked: Path) -> None:
    edit(locked, "      VLLM_DISABLED_KERNELS: FlashInferCutlassNvFp4LinearKernel\n", "")
    findings = check(locked, target="gb10", engine="dflashfix")
    (f, *_) = [f for f in of(findings, "kernels-expected") if f.cell == "gb10/spark-heretic-mtp"]
    assert f.blocking
    assert ("expect_backends.nvfp4_gemm is CUTLASS, but vLLM 0.23.0 picks FLASHINFER_CUTLASS "
            "(vLLM logs: \"Using FlashInferCutlassNvFp4LinearKernel for NVFP4 GEMM\")"
            in f.message)
    assert "env VLLM_DISABLED_KERNELS: \"FlashInferCutlassNvFp4LinearKernel\"" in f.fix


def test_a_global_cutlass_moe_backend_breaks_the_mtp_head(locked: Path) -> None:
    """--moe-backend cutlass reaches the MTP head's unquantized experts, which have none."""
    edit(locked, "    env:\n" + ENV, "")
    edit(locked, MTP, MTP + "    args:\n      moe-backend: cutlass\n"
                            "      linear-backend: cutlass\n")
    findings = check(locked, target="gb10", engine="dflashfix")
    (f,) = [f for f in of(findings, "kernels-boot-fails") if f.cell == "gb10/spark-heretic-mtp"]
    assert f.blocking and "raises while choosing drafter_moe: ValueError: moe_backend='cutlass' " \
                          "is not supported for unquantized MoE" in f.message
    assert "speculative-config moe_backend: triton" in f.fix \
           or "VLLM_USE_FLASHINFER_MOE_FP16" in f.fix


def test_a_weight_only_checkpoint_on_a_w4a4_profile_is_refused(locked: Path) -> None:
    """The locked ModelOpt checkpoint says W4A16_NVFP4: its cells need the W4A16 profiles."""
    edit(locked, "        - {model: nvfp4, profile: spark-mtp}\n", "")
    edit(locked, "        - {drafter: mtp, profile: spark-w4a16-dflash}\n",
         "        - {drafter: mtp, profile: spark-w4a16-dflash}\n"
         "        - {model: nvfp4, profile: spark-w4a16-mtp}\n")
    findings = check(locked, target="gb10", engine="dflashfix")
    bad = [f for f in of(findings, "kernels-expected") if f.cell == "gb10/spark-nvfp4-mtp"]
    assert bad and all(f.blocking for f in bad)
    moe = next(f for f in bad if "expect_backends.moe" in f.message)
    assert "is VLLM_CUTLASS, but vLLM 0.23.0 picks MARLIN" in moe.message
    assert "serve it with profile spark-w4a16-mtp" in moe.fix


def test_cutlass_moe_forced_on_a_weight_only_checkpoint_fails_the_boot(locked: Path) -> None:
    edit(locked, "    expect_backends: {moe: MARLIN, speculative: mtp, drafter_moe: TRITON}\n",
         "    expect_backends: {moe: MARLIN, speculative: mtp, drafter_moe: TRITON}\n"
         "    args:\n      moe-backend: cutlass\n")
    findings = check(locked, target="gb10", engine="dflashfix")
    (f, *_) = [f for f in of(findings, "kernels-boot-fails") if f.cell == "gb10/spark-nvfp4-mtp"]
    assert ("ValueError: NvFp4 MoE backend 'VLLM_CUTLASS' does not support the deployment "
            "configuration since kernel does not support quantization scheme") in f.message


def test_fp8_kv_cache_with_flash_attn_fails_the_boot_on_gb10(locked: Path) -> None:
    """FlashAttention takes an FP8 KV cache only as FA3 on 9.x (flash_attn.py
    supports_kv_cache_dtype): on sm_121 --attention-backend flash_attn refuses it."""
    edit(locked, MTP, MTP + "    args:\n      kv-cache-dtype: fp8\n"
                            "      attention-backend: flash_attn\n")
    findings = check(locked, target="gb10", engine="dflashfix")
    (f, *_) = [f for f in of(findings, "kernels-boot-fails") if f.cell == "gb10/spark-heretic-mtp"]
    assert f.blocking and ("Selected backend AttentionBackendEnum.FLASH_ATTN is not valid for "
                           "this configuration. Reason: ['kv_cache_dtype not supported']"
                           in f.message)


def test_the_gemm_must_be_asserted_for_a_selecting_nvfp4_checkpoint(locked: Path) -> None:
    edit(locked, "    expect_backends: {nvfp4_gemm: CUTLASS, moe: VLLM_CUTLASS}\n",
         "    expect_backends: {moe: VLLM_CUTLASS}\n")
    edit(locked, MTP, "    expect_backends: {moe: VLLM_CUTLASS, speculative: mtp, "
                      "drafter_moe: TRITON}\n")
    findings = check(locked, target="gb10", engine="dflashfix")
    (f,) = [f for f in of(findings, "nvfp4-gemm-asserted") if f.cell == "gb10/spark-heretic-mtp"]
    assert f.blocking and "selects at load" in f.message
    # the weight-only checkpoint's GEMM is pinned, not selected: nothing to assert
    assert not [f for f in of(findings, "nvfp4-gemm-asserted") if "nvfp4" in f.cell]


def test_a_declared_architecture_the_lock_contradicts_is_refused(locked: Path) -> None:
    edit(locked, "(~22 GB)\n    architecture: Qwen3_5MoeForConditionalGeneration",
         "(~22 GB)\n    architecture: Qwen3NextForCausalLM")
    (f, *_) = of(check(locked, target="gb10", engine="dflashfix"),
                 "architecture-matches-checkpoint")
    assert f.blocking and "names Qwen3_5MoeForConditionalGeneration" in f.message


def test_a_profile_replacing_the_toolkit_ptxas_is_refused(locked: Path) -> None:
    edit(locked, MTP, MTP + "    env:\n      TRITON_PTXAS_PATH: /opt/vllm/bin/ptxas\n")
    (f, *_) = of(check(locked, target="gb10", engine="dflashfix"), "triton-ptxas-sm121a")
    assert f.blocking and "TRITON_PTXAS_PATH" in f.message


def test_the_rules_stay_off_the_cpu_target(locked: Path) -> None:
    findings = check(locked, target="cpu", engine="dflashfix")
    assert _blocking(findings) == [] and not of(findings, "kernels-predicted")


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


def test_forcing_flash_attn_for_the_dflash_target_is_what_vllm_picks_anyway(locked: Path) -> None:
    """spark-dflash names flash_attn for the target as well as the drafter (docs/domain.md
    trap 9): on sm_121 vLLM 0.23.0 picks FLASH_ATTN for the target by itself (FA2, the only
    FlashAttention vllm-flash-attn builds for 12.x: 8.0+PTX, JIT-compiled by the driver),
    and the DFlash drafter's non-causal attention has no other backend. The flag costs
    nothing on this GPU; what it adds is a boot failure where FA2 refuses the KV cache
    (test_fp8_kv_cache_with_flash_attn_fails_the_boot_on_gb10)."""
    forced = _predicted(check(locked, target="gb10", engine="dflashfix"),
                        "gb10/spark-heretic-zlab")
    edit(locked, "    args:\n      attention-backend: flash_attn\n", "")
    auto = _predicted(check(locked, target="gb10", engine="dflashfix"), "gb10/spark-heretic-zlab")
    assert forced == auto and "attention FLASH_ATTN" in auto
    assert "drafter_attention FLASH_ATTN" in auto


def test_the_53014_rule_says_what_0_23_0_has() -> None:
    """vllm#53014's weight-only CuTe-DSL kernel landed after 0.23.0 (merged 2026-08-31,
    in no release up to v0.28.1rc0): 0.23.0's recorded NVFP4 GEMM list has none, and the
    rule claims no version bound it cannot read from the facts."""
    from imagebuild.preflight import kernels
    from imagebuild.preflight.kernel_select.facts import load

    candidates = load("0.23.0")["nvfp4_linear"]["candidates"]
    assert candidates[0] == "FlashInferCutlassNvFp4LinearKernel"
    assert not any("CuteDsl" in k or "W4A16" in k for k in candidates)
    why = kernels.BY_ID["nvfp4-gemm-asserted"].why
    assert "vllm#53014, after 0.23.0" in why and "up to v0.29" not in why
    assert not hasattr(kernels, "WEIGHT_ONLY_UNTIL")
