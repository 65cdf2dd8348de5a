"""Every measured GB10 serve-flag trap (docs/domain.md "do not undo", 1-11): a copy of the real
matrix.yaml edited to bring the trap back is refused with the matching rule id, and nothing
else; the unedited matrix passes. The Spark flags are stated once, in the `spark` profile
the others extend, so an edit there reaches every gb10 cell."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagebuild.preflight import flags
from imagebuild.preflight.run import RULES
from tests.support.matrices import (
    blocking_rules,
    check,
    edit,
)

ENV_AFTER_DFLASH = ("      attention-backend: flash_attn\n    acceptance_floor: 0.2\n"
                    "  spark-dflash-aeon:")


def refused(root: Path, rule: str, *, target: str = "gb10", engine: str = "dflashfix"
            ) -> list:
    findings = check(root, target=target, engine=engine)
    assert blocking_rules(findings, kernels=False) == {rule}, [f for f in findings
                                                               if f.blocking]
    return [f for f in findings if f.rule == rule and f.blocking]


@pytest.mark.parametrize("target", ["gb10", "cpu"])
@pytest.mark.parametrize("engine", ["dflashfix", "pr41703"])
def test_the_real_matrix_passes(locked: Path, target: str, engine: str) -> None:
    findings = check(locked, target=target, engine=engine)
    assert not blocking_rules(findings), [f for f in findings if f.blocking]
    # every DFlash/MTP cell reports the attention block size it will get
    layouts = [f for f in findings if f.rule == "kv-layout"]
    assert len(layouts) == len({f.cell for f in findings if f.rule == "kv-layout"}) > 0


GB10 = frozenset({"cuda", "arm64", "unified-memory", "sm_121", "native-fp4"})
CPU = frozenset({"cpu", "amd64"})


def test_every_trap_has_a_rule_with_why_fix_and_scope() -> None:
    beyond_traps = {"multimodal-modalities", "tool-call-probe"}
    ids = {r.id for r in flags.RULES} - beyond_traps | {"quantization-matches-checkpoint"}
    assert ids == {
        "no-force-fp8-marlin", "quantization-matches-checkpoint", "max-batched-tokens-ceiling",
        "gpu-mem-util-unified", "no-mamba-block-size", "dflash-no-kv-cache-dtype",
        "dflash-no-attention-backend-in-spec-config", "dflash-spec-tokens", "keep-vision-on",
        "attention-backend-flash-attn", "aeon-max-num-seqs", "no-pip-install-in-image"}
    for rid in ids:
        rule = RULES[rid]
        assert rule.why and rule.fix and rule.severity == "error", rule
    assert RULES["attention-backend-flash-attn"].applies(GB10, "dflash")
    assert not RULES["attention-backend-flash-attn"].applies(GB10, "mtp")
    assert not RULES["gpu-mem-util-unified"].applies(CPU, "ngram")


# 1
def test_force_fp8_marlin_is_refused(locked: Path) -> None:
    edit(locked, ENV_AFTER_DFLASH, ENV_AFTER_DFLASH.replace(
        "    acceptance_floor", "    env:\n      VLLM_TEST_FORCE_FP8_MARLIN: \"1\"\n"
        "    acceptance_floor"))
    (f, *_) = refused(locked, "no-force-fp8-marlin")
    assert "VLLM_TEST_FORCE_FP8_MARLIN=1" in f.message
    assert f.where and f.where.startswith(f"{locked}/matrix.yaml:")


# 2
def test_quantization_not_matching_the_checkpoint_is_refused(locked: Path) -> None:
    edit(locked, "quantization: modelopt", "quantization: compressed-tensors")
    found = refused(locked, "quantization-matches-checkpoint")
    assert {f.cell for f in found} == {"gb10/spark-nvfp4-zlab", "gb10/spark-nvfp4-mtp"}
    assert "says modelopt" in found[0].message and found[0].fix == "set quantization: modelopt"


# 3
def test_batched_tokens_above_the_compile_ceiling_are_refused(locked: Path) -> None:
    edit(locked, "max-num-batched-tokens: 16384", "max-num-batched-tokens: 65536")
    found = refused(locked, "max-batched-tokens-ceiling")
    assert len({f.cell for f in found}) == 7  # the `spark` profile: every gb10 cell
    # an override in one child profile reaches only its cells
    edit(locked, "max-num-batched-tokens: 65536", "max-num-batched-tokens: 16384")
    edit(locked, "      attention-backend: flash_attn\n",
         "      attention-backend: flash_attn\n      max-num-batched-tokens: 65536\n")
    found = refused(locked, "max-batched-tokens-ceiling")
    assert {f.cell for f in found} == {"gb10/spark-heretic-zlab", "gb10/spark-nvfp4-zlab",
                                       "gb10/spark-ornith-zlab", "gb10/spark-heretic-aeon"}


# 4
def test_gpu_memory_utilization_above_088_is_refused(locked: Path) -> None:
    edit(locked, "gpu-memory-utilization: 0.85", "gpu-memory-utilization: 0.95")
    found = refused(locked, "gpu-mem-util-unified")
    assert len(found) == 7 and "0.95 > 0.88" in found[0].message


def test_unset_gpu_memory_utilization_means_vllms_recorded_default_and_is_refused(
        locked: Path) -> None:
    # vLLM 0.23's default is 0.92 (config/cache.py CacheConfig.gpu_memory_utilization, the
    # serve parser's default), read from its recorded facts; the rule once typed 0.9
    edit(locked, "      gpu-memory-utilization: 0.85\n", "")
    found = refused(locked, "gpu-mem-util-unified")
    assert "default 0.92 (from vLLM 0.23.0's recorded facts) > 0.88" in found[0].message
    assert found[0].facts.startswith("facts: vLLM 0.23.0")


# 5
def test_mamba_block_size_is_refused(locked: Path) -> None:
    edit(locked, "      max-num-seqs: 64\n",
         "      max-num-seqs: 64\n      mamba-block-size: 256\n")
    found = refused(locked, "no-mamba-block-size")
    assert "0.23.0" in found[0].message


# 6
def test_kv_cache_dtype_with_dflash_is_refused(locked: Path) -> None:
    edit(locked, "      attention-backend: flash_attn\n",
         "      attention-backend: flash_attn\n      kv-cache-dtype: fp8\n")
    found = refused(locked, "dflash-no-kv-cache-dtype")
    assert {f.cell for f in found} == {"gb10/spark-heretic-zlab", "gb10/spark-nvfp4-zlab",
                                       "gb10/spark-ornith-zlab", "gb10/spark-heretic-aeon"}


def test_attention_backend_inside_speculative_config_is_refused(locked: Path) -> None:
    edit(locked, "    num_speculative_tokens: 11\n    targets: [gb10]\n  aeon:",
         "    num_speculative_tokens: 11\n    options: {attention_backend: flash_attn}\n"
         "    targets: [gb10]\n  aeon:")
    found = refused(locked, "dflash-no-attention-backend-in-spec-config")
    assert "attention_backend=flash_attn" in found[0].message


# 7
def test_fifteen_dflash_speculative_tokens_are_refused(locked: Path) -> None:
    edit(locked, "num_speculative_tokens: 11", "num_speculative_tokens: 15", count=2)
    found = refused(locked, "dflash-spec-tokens")
    assert len(found) == 4 and "15 wastes draft compute" in found[0].message


def test_few_dflash_speculative_tokens_only_warn(locked: Path) -> None:
    edit(locked, "num_speculative_tokens: 11", "num_speculative_tokens: 6")
    findings = check(locked, target="gb10", engine="dflashfix")
    assert not blocking_rules(findings)
    assert {f.severity for f in findings if f.rule == "dflash-spec-tokens"} == {"warning"}


# 8
def test_vision_off_is_refused(locked: Path) -> None:
    edit(locked, "    quantization: compressed-tensors\n    served_names: [qwen36-35b-heretic, "
         "qwen36-fast, qwen36-deep]\n    multimodal: {image: 4, video: 2}\n",
         "    quantization: compressed-tensors\n    served_names: [qwen36-35b-heretic, "
         "qwen36-fast, qwen36-deep]\n")
    found = refused(locked, "keep-vision-on")
    assert {f.cell for f in found} == {"gb10/spark-heretic-zlab", "gb10/spark-heretic-mtp",
                                       "gb10/spark-heretic-aeon"}
    assert "vision tower" in found[0].message  # known from the locked config.json


def test_zero_images_is_refused(locked: Path) -> None:
    edit(locked, "multimodal: {image: 4, video: 2}", "multimodal: {image: 0, video: 2}")
    refused(locked, "keep-vision-on")


# 9
def test_dflash_on_another_attention_backend_is_refused(locked: Path) -> None:
    edit(locked, "attention-backend: flash_attn", "attention-backend: flashinfer")
    found = refused(locked, "attention-backend-flash-attn")
    assert "flashinfer" in found[0].message


def test_dflash_without_attention_backend_is_refused(locked: Path) -> None:
    edit(locked, "    args:\n      attention-backend: flash_attn\n", "")
    assert len(refused(locked, "attention-backend-flash-attn")) == 4


# 10
def test_aeon_drafter_with_the_64_seq_profile_is_refused(locked: Path) -> None:
    edit(locked, "drafter: aeon, profile: spark-dflash-aeon}", "drafter: aeon, profile: "
         "spark-dflash}", count=2)
    (f,) = refused(locked, "aeon-max-num-seqs")
    assert f.cell == "gb10/spark-heretic-aeon" and "--max-num-seqs 64" in f.message


# 11
def test_pip_install_in_the_serve_environment_is_refused(locked: Path) -> None:
    edit(locked, '      VLLM_CPU_KVCACHE_SPACE: "1"\n',
         '      VLLM_CPU_KVCACHE_SPACE: "1"\n      PRESTART: "pip install -U transformers"\n')
    (f,) = refused(locked, "no-pip-install-in-image", target="cpu")
    assert "PRESTART" in f.message


def test_flag_reading_takes_the_last_occurrence() -> None:
    argv = ("vllm", "serve", "/model", "--served-model-name", "a", "b", "--quantization", "x",
            "--enforce-eager", "--quantization=y", "--served-model-name", "c")
    assert flags.flag_value(argv, "quantization") == "y"
    assert flags.flag_value(argv, "enforce-eager") is True
    assert flags.flag_value(argv, "dtype") is None
    assert flags.flag_values(argv, "served-model-name") == ["c"]


def test_a_tool_parser_smoke_cannot_drive_is_a_warning_before_the_build(locked: Path) -> None:
    edit(locked, "tool-call-parser: hermes", "tool-call-parser: openai")
    findings = check(locked, target="cpu", engine="dflashfix")
    assert not blocking_rules(findings)
    (f,) = [f for f in findings if f.rule == "tool-call-probe"]
    assert f.severity == "warning" and "'openai' parser" in f.message and "harmony" in f.message
