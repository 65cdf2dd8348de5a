"""KV predictor: each hybrid family's reading, each KV cache dtype, the checkpoint's own KV
quantization and the cases it must call unknown. Hand arithmetic in the comments; the same
fixtures are checked against vLLM's own code in tests/e2e/test_kvcache_families_vs_vllm.py.

CUDA with flash_attn unless said otherwise: blocks start at 16 tokens and align to 16.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from imagebuild.errors import UserError
from imagebuild.facts import facts_for
from imagebuild.preflight.kvcache import CannotPredict, KVFlags, predict
from tests.support.paths import CONFIGS as CONFIGS_DIR
from tests.support.paths import HUB_DATA

CONFIGS = CONFIGS_DIR
PC = KVFlags(vllm_version="0.23.0", attention_backend="flash_attn", enable_prefix_caching=True,
             max_num_batched_tokens=16384)
NO_PC = replace(PC, enable_prefix_caching=False)


def cfg(name: str) -> dict:
    raw = json.loads((CONFIGS / f"{name}.json").read_text())
    return {k: v for k, v in raw.items() if not k.startswith("_")}


def kinds(p) -> list[str]:
    return [s.kind for s in p.target_layers]


def state(p):
    return next(s for s in p.target_layers if s.kind == "mamba")


def attn(p):
    return next(s for s in p.target_layers if s.kind != "mamba")


# --- families -------------------------------------------------------------------------------

def test_nemotron_h_is_a_hybrid_with_chunk_aligned_blocks():
    # The defect of issue 13: NemotronH was read as pure attention, block 16, "ok".
    p = predict(cfg("nemotron-h-8b"), None, PC)
    assert p.hybrid and p.family == "NemotronH"
    assert kinds(p).count("mamba") == 24 and kinds(p).count("full") == 4  # M and * in pattern
    # Mamba2: 128 heads x 64 = 8192 inner, 8 groups x 128 state -> conv dim 8192 + 2048 =
    # 10240; conv (3, 10240) bf16 = 61,440; ssm (128, 64, 128) float32 (NemotronH's `auto`
    # ssm dtype) = 4,194,304; state page 4,255,744.
    m = state(p)
    assert m.shapes == ((3, 10240), (128, 64, 128)) and m.dtypes == ("bfloat16", "float32")
    assert p.mamba_page_bytes == 4_255_744
    # attention 8 KV heads x (128 + 128) x 2 B = 4096 B/token. Prefix caching -> "all" mode:
    # lcm(chunk_size 256, 16) = 256; 4,255,744 / 4096 = 1039 tokens -> 256 x 5 = 1280.
    assert attn(p).bytes_per_token == 4096
    assert p.mamba_cache_mode == "all"
    assert (p.attention_block_size, p.mamba_block_size) == (1280, 1280)
    assert m.page_size_padded == 1280 * 4096 and p.outcome == "ok"
    # Without prefix caching: 16 x ceil(4,255,744 / 65,536) = 16 x 65 = 1040 tokens, and the
    # state keeps one block of max_model_len tokens.
    q = predict(cfg("nemotron-h-8b"), None, NO_PC)
    assert (q.attention_block_size, q.mamba_cache_mode) == (1040, "none")
    assert q.mamba_block_size == 8192  # max_position_embeddings
    assert state(q).page_size_padded == 1040 * 4096


def test_nemotron_h_reads_transformers5_field_names_and_defaults():
    base = cfg("nemotron-h-8b")
    # mamba_n_groups / mamba_d_conv / mamba_chunk_size win over n_groups / conv_kernel /
    # chunk_size; chunk_size defaults to 128 in transformers 5's NemotronHConfig.
    alias = dict(base, mamba_n_groups=1, mamba_d_conv=8)
    del alias["chunk_size"]
    m = state(predict(alias, None, PC))
    # conv dim 8192 + 2 x 1 x 128 = 8448, kernel 8 -> 7 rows
    assert m.shapes == ((7, 8448), (128, 64, 128))
    p = predict(alias, None, PC)
    # state: 7 x 8448 x 2 + 4,194,304 = 4,312,576 -> 1053 tokens -> lcm(128, 16) = 128 x 9
    assert p.attention_block_size == 1152
    # an explicit layers_block_type wins over the pattern; legacy names are remapped
    listed = dict(base, layers_block_type=["mamba", "attention", "mlp", "mamba"])
    assert kinds(predict(listed, None, PC)) == ["mamba", "full", "mamba"]


def test_jamba_mamba1_and_the_2048_token_default_chunk():
    p = predict(cfg("jamba-v0.1"), None, PC)
    # attention every 8th layer from 4: layers 4, 12, 20, 28
    assert [i for i, k in enumerate(kinds(p)) if k == "full"] == [4, 12, 20, 28]
    # Mamba1: inner 2 x 4096 = 8192; conv (3, 8192) bf16 = 49,152; ssm (8192, 16) bf16 =
    # 262,144 -> 311,296. No chunk size in the config: 2048 -> one chunk covers 76 tokens.
    assert state(p).shapes == ((3, 8192), (8192, 16)) and p.mamba_page_bytes == 311_296
    assert p.attention_block_size == 2048
    # without prefix caching: 16 x ceil(311,296 / 65,536) = 80
    assert predict(cfg("jamba-v0.1"), None, NO_PC).attention_block_size == 80


def test_falcon_h1_runs_attention_and_mamba_in_every_layer():
    p = predict(cfg("falcon-h1-0.5b"), None, NO_PC)
    assert kinds(p) == ["full", "mamba"] * 36
    # mamba_d_ssm 1536 inner, 1 group x 128 state -> conv dim 1792; ssm (24, 64, 128) bf16
    assert state(p).shapes == ((3, 1792), (24, 64, 128))
    # 3 x 1792 x 2 + 24 x 64 x 128 x 2 = 10,752 + 393,216 = 403,968; attention 2 x 128 x 2 =
    # 512 B/token -> 16 x ceil(403,968 / 8192) = 16 x 50 = 800
    assert p.mamba_page_bytes == 403_968 and p.attention_block_size == 800


def test_falcon_h1_speculative_tokens_outgrow_the_padded_page():
    # Its layers add the k speculative tokens to the conv state, its
    # get_mamba_state_shape_from_config does not: vLLM pads to the smaller page. FP8 KV:
    # 256 B/token, "all" mode, chunk 128: 403,968 / 256 = 1578 -> 128 x 13 = 1664 tokens,
    # padded page 425,984 = 22,016 B of slack; each token adds 1792 x 2 = 3584 B.
    flags = replace(PC, kv_cache_dtype="fp8", speculative_method="ngram")
    ok = predict(cfg("falcon-h1-0.5b"), None, replace(flags, num_speculative_tokens=6))
    assert ok.outcome == "ok"  # 6 x 3584 = 21,504 fits
    bad = predict(cfg("falcon-h1-0.5b"), None, replace(flags, num_speculative_tokens=7))
    assert bad.outcome == "AssertionError" and "page_size_padded" in bad.message


def test_zamba2_shared_attention_on_hybrid_layers():
    p = predict(cfg("zamba2-2.7b"), None, NO_PC)
    # 9 hybrid layers in the default layout get an attention block each; all 54 keep a state
    assert kinds(p) == ["full"] * 9 + ["mamba"] * 54
    # attention: no GQA, head 2 x 2560 / 32 = 160 -> 32 x 320 x 2 = 20,480 B/token
    assert attn(p).bytes_per_token == 20_480 and attn(p).head_size == 160
    # inner 5120, 80 heads of 64, 1 group x 64 state: conv dim 5248
    assert state(p).shapes == ((3, 5248), (80, 64, 64))


def test_minimax_linear_attention_state():
    p = predict(cfg("minimax-text-01"), None, NO_PC)
    assert kinds(p).count("mamba") == 70 and kinds(p)[7] == "full"
    # one state (64 heads, 128, 128) bf16 = 2,097,152 = 512 tokens x 4096 B exactly
    assert state(p).shapes == ((64, 128, 128),)
    assert p.attention_block_size == 512 and state(p).page_size_padded is None


def test_lfm2_short_convolutions():
    p = predict(cfg("lfm2-1.2b"), None, NO_PC)
    assert kinds(p).count("full") == 6
    # conv (2, 2048) bf16 = 8192 B, smaller than one 16-token attention page (32,768): padded
    assert state(p).shapes == ((2, 2048),) and p.attention_block_size == 16
    assert state(p).page_size_padded == 32_768
    moe = predict(cfg("lfm2-8b-a1b"), None, NO_PC)
    assert state(moe).shapes == ((2, 2048),)  # LFM2-MoE: conv dim = hidden_size


def test_plamo2_pattern_and_no_groups():
    p = predict(cfg("plamo2-1b"), None, NO_PC)
    assert kinds(p) == ["mamba", "full"] * 8  # mamba_step 2: attention on odd layers
    # inner 32 x 128 = 4096, n_groups 0 -> conv (3, 4096); ssm (32, 128, 64)
    assert state(p).shapes == ((3, 4096), (32, 128, 64))


def test_qwen3_next_ignores_full_attention_interval():
    # vLLM's Qwen3NextConfig puts attention on every 4th layer whatever the interval says
    two = dict(cfg("qwen3-next-80b-a3b"), full_attention_interval=2)
    assert [i for i, k in enumerate(kinds(predict(two, None, NO_PC))) if k == "full"][:2] == [
        3, 7]


def test_kimi_linear_kda_with_latent_attention():
    kimi = cfg("kimi-linear-48b-a3b")
    p = predict(kimi, None, replace(NO_PC, attention_backend="flashmla"))
    assert kinds(p).count("mamba") == 20 and kinds(p)[3] == "full"  # MLA on layers 4, 8, ...
    # KDA: conv dim 3 x 32 x 128 = 12,288 (no speculative rows); recurrent state float32:
    # 3 x 12,288 x 2 + 32 x 128 x 128 x 4 = 73,728 + 2,097,152 = 2,170,880
    assert state(p).shapes == ((3, 12288), (32, 128, 128))
    assert state(p).dtypes == ("bfloat16", "float32") and p.mamba_page_bytes == 2_170_880
    # MLA: one latent of 512 + 64 per token, bf16 = 1152 B. FlashMLA pages are 64 tokens:
    # 64 x ceil(2,170,880 / 73,728) = 64 x 30 = 1920; Triton MLA aligns to 16: 16 x 118
    assert attn(p).bytes_per_token == 1152 and p.attention_block_size == 1920
    triton = predict(kimi, None, replace(NO_PC, attention_backend="triton_mla"))
    assert triton.attention_block_size == 1888
    # which MLA backend a GPU gets decides the alignment: unknown without the flag
    with pytest.raises(CannotPredict, match="attention-backend"):
        predict(kimi, None, replace(NO_PC, attention_backend=None))
    cpu = predict(kimi, None, replace(NO_PC, platform="cpu", default_block_size=128))
    assert cpu.outcome == "NotImplementedError"  # vLLM's CPU backend has no MLA


def test_attention_free_mamba_needs_no_unification():
    p = predict(cfg("mamba-130m"), None, NO_PC)
    assert set(kinds(p)) == {"mamba"} and not p.unify_needed and p.outcome == "ok"
    assert not p.hybrid and p.mamba_cache_mode == "none"


def test_prefix_caching_defaults_off_for_hybrids():
    p = predict(cfg("qwen3-next-80b-a3b"), None, replace(PC, enable_prefix_caching=None))
    assert not p.prefix_caching and p.mamba_cache_mode == "none"
    assert predict(cfg("qwen3-8b"), None, replace(PC, enable_prefix_caching=None)).prefix_caching


def test_tensor_parallel_splits_states():
    p = predict(cfg("nemotron-h-8b"), None, replace(PC, tensor_parallel_size=2))
    assert state(p).shapes == ((3, 5120), (64, 64, 128)) and attn(p).num_kv_heads == 4
    with pytest.raises(UserError, match="tensor_parallel_size 3"):
        predict(cfg("nemotron-h-8b"), None, replace(PC, tensor_parallel_size=3))


# --- what the predictor must call unknown ----------------------------------------------------

@pytest.mark.parametrize("name", ["bamba-9b", "granite-4.0-h-tiny"])
def test_families_vllm_cannot_build_with_transformers5(name):
    with pytest.raises(CannotPredict, match="KeyError"):
        predict(cfg(name), None, PC)


def test_unknown_hybrid_architecture_is_not_read_as_attention():
    with pytest.raises(CannotPredict, match="unknown hybrid"):
        predict(cfg("unknown-hybrid"), None, PC)
    layered = dict(cfg("qwen3-8b"), architectures=["SomethingNewForCausalLM"],
                   layer_types=["linear_attention", "full_attention"] * 18)
    with pytest.raises(CannotPredict):
        predict(layered, None, PC)


def test_known_but_unmodelled_hybrids_and_missing_fields():
    olmo = dict(cfg("qwen3-8b"), architectures=["OlmoHybridForCausalLM"])
    with pytest.raises(CannotPredict, match="OLMo hybrid"):
        predict(olmo, None, PC)
    lfm2 = cfg("lfm2-1.2b")
    del lfm2["conv_dim"]
    with pytest.raises(CannotPredict, match="conv_dim"):
        predict(lfm2, None, PC)
    plamo = cfg("plamo2-1b")
    del plamo["mamba_step"]  # remote-code config: no default exists
    with pytest.raises(CannotPredict, match="mamba_step"):
        predict(plamo, None, PC)
    with pytest.raises(CannotPredict, match="MTP"):
        predict(cfg("jamba-v0.1"), None, replace(PC, speculative_method="mtp",
                                                 num_speculative_tokens=1))


def test_block_beyond_the_batch_is_an_assertion_or_unknown():
    big = replace(PC, kv_cache_dtype="fp8", mamba_ssm_cache_dtype="float32")
    # Qwen3-Next: conv 49,152 + f32 ssm 2,097,152 = 2,146,304 B; fp8 attention 1024 B/token
    # -> 2,146,304 / 1024 = 2096 = 16 x 131 tokens per block, which "align" mode must fit
    # in one scheduler step
    assert predict(cfg("qwen3-next-80b-a3b"), None, big).attention_block_size == 2096
    small = predict(cfg("qwen3-next-80b-a3b"), None, replace(big, max_num_batched_tokens=2048))
    assert small.outcome == "AssertionError" and "max_num_batched_tokens" in small.message
    # CUDA's default is 2048 or 8192 by GPU memory: unknown -> cannot predict, never ok
    with pytest.raises(CannotPredict, match="max-num-batched-tokens"):
        predict(cfg("qwen3-next-80b-a3b"), None, replace(big, max_num_batched_tokens=None))


def test_other_ways_vllm_refuses():
    qn = cfg("qwen3-next-80b-a3b")
    nohma = predict(qn, None, replace(PC, disable_hybrid_kv_cache_manager=True))
    assert nohma.outcome == "ValueError"
    nochunk = predict(qn, None, replace(PC, enable_chunked_prefill=False))
    assert nochunk.outcome == "AssertionError" and "Chunked prefill" in nochunk.message
    mbs = predict(qn, None, replace(NO_PC, mamba_block_size=64))
    assert mbs.outcome == "ValueError"
    tq = predict(cfg("falcon-h1-0.5b"), None, replace(NO_PC, kv_cache_dtype="turboquant_k8v4"))
    assert tq.outcome == "NotImplementedError"  # no identifiable full-attention layer


# --- KV cache dtypes --------------------------------------------------------------------------

# Qwen3-8B: 8 KV heads of 128 per layer, pages of 16 tokens.
@pytest.mark.parametrize(("dtype", "page"), [
    ("auto", 16 * 8 * 256 * 2),
    ("bfloat16", 16 * 8 * 256 * 2),
    ("float16", 16 * 8 * 256 * 2),
    ("fp8", 16 * 8 * 256),
    ("fp8_e4m3", 16 * 8 * 256),
    ("fp8_e5m2", 16 * 8 * 256),
    ("fp8_inc", 16 * 8 * 256),
    ("fp8_ds_mla", 16 * 8 * 256),  # a plain (non-MLA) layer stores it as one byte
    # per-token-head: float32 K and V scales per token and head on top
    ("fp8_per_token_head", 16 * 8 * 256 + 2 * 16 * 8 * 4),
    ("int8_per_token_head", 16 * 8 * 256 + 2 * 16 * 8 * 4),
    # NVFP4: 128 / 2 data bytes + 128 / 16 scale bytes = 72 per K and per V
    ("nvfp4", 16 * 8 * 144),
    # TurboQuant slots per head and token: k8v4 = 128 + (64 + 4) = 196;
    # 4bit = (64 + 2) + 68 = 134; k3v4 = (48 + 2) + 68 = 118; 3bit = 50 + (48 + 4) = 102
    ("turboquant_k8v4", 16 * 8 * 196),
    ("turboquant_4bit_nc", 16 * 8 * 134),
    ("turboquant_k3v4_nc", 16 * 8 * 118),
    ("turboquant_3bit_nc", 16 * 8 * 102),
])
def test_every_kv_cache_dtype_vllm_accepts(dtype, page):
    p = predict(cfg("qwen3-8b"), None, replace(PC, kv_cache_dtype=dtype))
    assert p.outcome == "ok"
    middle = p.target_layers[10]  # TurboQuant keeps the first and last two layers in bf16
    assert middle.page_bytes == page
    if dtype.startswith("turboquant_"):
        assert p.target_layers[0].page_bytes == 16 * 8 * 256 * 2
        assert p.target_layers[-1].page_bytes == 16 * 8 * 256 * 2


def test_dtype_list_is_the_versions_own_and_nothing_else():
    # vLLM 0.23.0's CacheDType (config/cache.py), as recorded from that version
    assert len(facts_for("0.23.0").kv["cache_dtypes"]) == 15
    with pytest.raises(UserError, match="fp4.*vLLM 0.23.0"):
        predict(cfg("qwen3-8b"), None, replace(PC, kv_cache_dtype="fp4"))


def test_per_token_head_scales_move_the_hybrid_block_size():
    # Qwen3-Next state 1,097,728 B. fp8: 2 x 512 B/token = 1024 -> exactly 1072 = 16 x 67.
    # fp8_per_token_head adds 2 x 2 heads x 4 B = 16 B/token: 1040 -> 16 x ceil(65.97) = 1056.
    qn = cfg("qwen3-next-80b-a3b")
    assert predict(qn, None, replace(NO_PC, kv_cache_dtype="fp8")).attention_block_size == 1072
    pth = predict(qn, None, replace(NO_PC, kv_cache_dtype="fp8_per_token_head"))
    assert pth.attention_block_size == 1056


# --- the checkpoint's own KV quantization ----------------------------------------------------

MODELOPT = {"producer": {"name": "modelopt", "version": "0.29.0"},
            "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}


def test_modelopt_kv_in_a_nested_quantization_block():
    # The defect of issue 13: this was predicted as bf16, about 2x off.
    target = dict(cfg("qwen3-8b"), quantization_config={"quant_method": "modelopt", **MODELOPT})
    p = predict(target, None, PC)
    assert p.cache_dtype == "fp8_e4m3" and p.target_layers[0].page_bytes == 16 * 8 * 256


def test_modelopt_hf_quant_config_json_only_without_config_quantization():
    p = predict(cfg("qwen3-8b"), None, PC, hf_quant_config=MODELOPT)
    assert p.cache_dtype == "fp8_e4m3" and "hf_quant_config.json" in p.cache_dtype_source
    nvfp4 = dict(MODELOPT, quantization={"quant_algo": "FP8", "kv_cache_quant_algo": "NVFP4"})
    assert predict(cfg("qwen3-8b"), None, PC, hf_quant_config=nvfp4).cache_dtype == "nvfp4"
    # config.json's own quantization_config wins; hf_quant_config.json is then not read
    ct = dict(cfg("qwen3-8b"), quantization_config={"quant_method": "compressed-tensors",
                                                     "config_groups": {}})
    assert predict(ct, None, PC, hf_quant_config=MODELOPT).cache_dtype == "auto"


def test_modelopt_unknown_kv_algo_and_mixed_nested_block():
    odd = dict(MODELOPT, quantization={"quant_algo": "FP8", "kv_cache_quant_algo": "INT4"})
    assert predict(cfg("qwen3-8b"), None, PC, hf_quant_config=odd).cache_dtype == "auto"
    mixed = dict(MODELOPT, quantization={"quant_algo": "MIXED_PRECISION"})
    p = predict(cfg("qwen3-8b"), None, PC, hf_quant_config=mixed)
    assert p.outcome == "ValueError" and "MIXED_PRECISION" in p.message


def test_nvidia_qwen36_nvfp4_checkpoint_keeps_bf16_kv():
    # its quantization_config is flat (MIXED_PRECISION, kv_cache_quant_algo null)
    hub = HUB_DATA / "nvidia" / \
        "Qwen3.6-35B-A3B-NVFP4" / "491c2f1ea524c639598bf8fa787a93fed5a6fbce"
    config = json.loads((hub / "config.json").read_text())
    hf_quant = json.loads((hub / "hf_quant_config.json").read_text())
    p = predict(config, None, PC, hf_quant_config=hf_quant)
    assert p.outcome == "ok" and p.cache_dtype == "auto"


def test_compressed_tensors_kv_scheme():
    scheme = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
              "symmetric": True}
    ct = dict(cfg("qwen3-8b"), quantization_config={"quant_method": "compressed-tensors",
                                                     "kv_cache_scheme": scheme})
    assert predict(ct, None, PC).cache_dtype == "fp8"
    # an explicit --kv-cache-dtype wins over the checkpoint's scheme
    assert predict(ct, None, replace(PC, kv_cache_dtype="bfloat16")).cache_dtype == "bfloat16"
    # fp8_e5m2 with a checkpoint that loads FP8 (E4M3) KV scales
    e5m2 = predict(ct, None, replace(PC, kv_cache_dtype="fp8_e5m2"))
    assert e5m2.outcome == "ValueError"
    chan = dict(ct, quantization_config={"quant_method": "compressed-tensors",
                                         "kv_cache_scheme": dict(scheme, strategy="channel")})
    assert predict(chan, None, PC).outcome == "NotImplementedError"
