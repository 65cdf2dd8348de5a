"""KV-cache page-layout predictor: hand arithmetic from docs/domain.md against predict().

Shared numbers for the Qwen3.6-35B-A3B target (text_config: 2 KV heads x head_dim 256, GDN
16 key heads / 32 value heads of dim 128, conv kernel 4, mamba_ssm_dtype float32):
  attention bytes/token (bf16) = 2 heads x (256 + 256) x 2 B           = 2048
  conv_dim = 128 x 16 x 2 + 128 x 32                                    = 8192
  conv state, k spec tokens = (3 + k) x 8192 x 2 B (bf16)
  ssm state = 32 x 128 x 128 x 4 B (float32)                           = 2,097,152
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from imagebuild import REPO_ROOT
from imagebuild.errors import UserError
from imagebuild.preflight.kvcache import KVFlags, layout_for_oracle, predict
from tests.support.paths import CONFIGS as CONFIGS_DIR

CONFIGS = CONFIGS_DIR
# the dflashfix engine's patch that pads mamba pages in unify (its unification is recorded)
DFLASHFIX = REPO_ROOT / "patches" / "kv-page-size-pad-mamba.patch"
SSM = 32 * 128 * 128 * 4


def cfg(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def target() -> dict:
    return cfg("qwen36-35b-a3b")


# The canonical DFlash serve (docs/domain.md): flash_attn, 11 speculative tokens, auto dtypes,
# prefix caching on.
DFLASH = KVFlags(vllm_version="0.23.0", speculative_method="dflash", num_speculative_tokens=11,
                 attention_backend="flash_attn", max_num_batched_tokens=16384,
                 enable_prefix_caching=True)
# Same state shapes without a drafter: ngram speculation also grows the conv state by k.
NGRAM = replace(DFLASH, speculative_method="ngram")


def conv(k: int, tp: int = 1, nbytes: int = 2) -> int:
    return (3 + k) * (8192 // tp) * nbytes


def test_retrained_zlab_drafter_asserts_on_stock_vllm(target):
    p = predict(target, cfg("zlab-dflash-retrained"), DFLASH)
    mamba = conv(11) + SSM  # 229,376 + 2,097,152 = 2,326,528
    assert p.mamba_page_bytes == mamba == 2_326_528
    # 16 x ceil(2,326,528 / (16 x 2048)) = 16 x 71 = 1136, and 1136 x 2048 = 2,326,528:
    # the attention page matches the state page exactly, so vLLM pads nothing.
    assert p.attention_block_size == 1136
    assert p.mamba_padding_pct == 0.0
    # Drafter: 8 KV heads x (128 + 128) x 2 B = 4096 B/token -> 1136 x 4096 = 4,653,056,
    # twice the state page, which cannot grow: the assert in unify fires.
    drafter = p.drafter_layers[0]
    assert (drafter.num_kv_heads, drafter.head_size, drafter.page_bytes) == (8, 128, 4_653_056)
    assert len(p.drafter_layers) == 8
    assert p.outcome == "AssertionError"
    assert not p.padded_by_unify and p.extra_bytes_per_request == 0
    assert p.final_layers == ()
    assert "cannot grow" in p.cause and "31977fbe" in (p.fix or "")


def test_retrained_zlab_drafter_unifies_only_thanks_to_dflashfix_padding(target):
    p = predict(target, cfg("zlab-dflash-retrained"), DFLASH, patches=[DFLASHFIX])
    assert p.outcome == "ok" and p.padded_by_unify
    pages = {f.page_bytes for f in p.final_layers}
    assert pages == {4_653_056}
    padded = [f for f in p.final_layers if f.padded]
    assert len(padded) == 30  # the 30 GDN layers
    # Target attention layers grow by block size: 1136 x 2 = 2272 tokens.
    assert p.final_layers[3].block_size == 2272
    # Extra = 30 GDN layers x (4,653,056 - 2,326,528) B x (2 + 11) state pages per request
    # (prefix caching on -> mamba "align" mode keeps 2 + k pages).
    assert p.extra_bytes_per_request == 30 * 2_326_528 * 13 == 907_345_920
    no_prefix = predict(target, cfg("zlab-dflash-retrained"),
                        replace(DFLASH, enable_prefix_caching=False), patches=[DFLASHFIX])
    assert no_prefix.extra_bytes_per_request == 30 * 2_326_528 * 12


@pytest.mark.parametrize("drafter", ["zlab-dflash-31977fbe", "aeon-dflash"])
def test_small_page_drafters_serve_cleanly(target, drafter):
    for pad in (False, True):
        p = predict(target, cfg(drafter), DFLASH, patches=[DFLASHFIX] if pad else [])
        # 4 KV heads x 256 x 2 B = 2048 B/token, equal to the target's: one page size.
        assert p.outcome == "ok" and not p.padded_by_unify
        assert {f.page_bytes for f in p.final_layers} == {2_326_528}
        assert p.extra_bytes_per_request == 0 and p.fix is None


def test_without_speculation_the_state_page_is_padded(target):
    p = predict(target, None, KVFlags(vllm_version="0.23.0"))
    # conv (3, 8192) bf16 = 49,152; + ssm = 2,146,304 -> 16 x ceil(2,146,304 / 32,768) =
    # 16 x 66 = 1056 tokens; 1056 x 2048 = 2,162,688 -> padding 16,384 B = 0.7634 %.
    assert p.mamba_page_bytes == 2_146_304
    assert p.attention_block_size == 1056
    assert p.mamba_padding_pct == pytest.approx(100 * 16_384 / 2_146_304, abs=1e-3)
    mamba = p.target_layers[0]
    assert mamba.kind == "mamba" and mamba.page_size_padded == 2_162_688
    assert [s.kind for s in p.target_layers[:4]] == ["mamba", "mamba", "mamba", "full"]
    assert p.drafter_layers == () and p.outcome == "ok"


def test_mtp_uses_target_attention_shape(target):
    flags = KVFlags(vllm_version="0.23.0", speculative_method="mtp", num_speculative_tokens=3)
    p = predict(target, None, flags)
    # conv (6, 8192) bf16 = 98,304; + ssm = 2,195,456 = 67 x 32,768 -> block 1072, no padding.
    assert p.attention_block_size == 1072 and p.mamba_padding_pct == 0.0
    assert len(p.drafter_layers) == 1  # mtp_num_hidden_layers
    mtp = p.drafter_layers[0]
    assert (mtp.kind, mtp.num_kv_heads, mtp.head_size, mtp.page_bytes) == (
        "full", 2, 256, 1072 * 2048)
    assert p.outcome == "ok"


def test_mtp_without_mtp_head_is_a_user_error():
    with pytest.raises(UserError, match="MTP"):
        predict(cfg("qwen3-8b"), None, KVFlags(vllm_version="0.23.0", speculative_method="mtp",
                                               num_speculative_tokens=1))


@pytest.mark.parametrize(
    ("tp", "block", "pad_pct", "retrained_outcome"),
    [
        # TP2: 1 KV head/rank -> 1024 B/token; conv (14, 4096) bf16 = 114,688; ssm
        # 16 x 128 x 128 x 4 = 1,048,576; sum 1,163,264 = 71 x 16,384 -> block 1136, exact.
        # Retrained drafter: 4 heads/rank x 512 B = 2048 B/token, twice the target: assert.
        (2, 1136, 0.0, "AssertionError"),
        # TP4: 2 KV heads replicate to 1/rank -> 1024 B/token; conv (14, 2048) = 57,344;
        # ssm 8 x 128 x 128 x 4 = 524,288; sum 581,632 -> 16 x ceil(35.5) = 576 tokens,
        # page 589,824 (+8,192 B = 1.4085 %). Retrained drafter: 2 heads/rank -> 1024 B/token,
        # equal to the target: it fits at TP4.
        (4, 576, 100 * 8192 / 581_632, "ok"),
    ],
)
def test_tensor_parallel(target, tp, block, pad_pct, retrained_outcome):
    flags = replace(DFLASH, tensor_parallel_size=tp)
    p = predict(target, cfg("zlab-dflash-retrained"), flags)
    assert p.attention_block_size == block
    assert p.mamba_padding_pct == pytest.approx(pad_pct, abs=1e-3)
    assert p.target_layers[3].num_kv_heads == 1
    assert p.drafter_layers[0].num_kv_heads == 8 // tp
    assert p.outcome == retrained_outcome
    small = predict(target, cfg("zlab-dflash-31977fbe"), flags)
    assert small.outcome == "ok"
    assert small.drafter_layers[0].num_kv_heads == 4 // tp


def test_tp_that_does_not_divide_heads_is_a_user_error(target):
    with pytest.raises(UserError, match="tensor_parallel_size 3"):
        predict(target, None, KVFlags(vllm_version="0.23.0", tensor_parallel_size=3))


def test_fp8_kv_cache_halves_attention_bytes(target):
    flags = replace(DFLASH, kv_cache_dtype="fp8")
    p = predict(target, cfg("zlab-dflash-retrained"), flags)
    # 2 heads x 512 x 1 B = 1024 B/token -> 16 x ceil(2,326,528 / 16,384) = 16 x 142 = 2272.
    assert p.attention_block_size == 2272
    assert p.target_layers[3].dtype == "fp8"
    # Drafter 8 x 256 x 1 B = 2048 B/token: still twice the target -> assert.
    assert p.outcome == "AssertionError"
    assert predict(target, cfg("zlab-dflash-31977fbe"), flags).outcome == "ok"


def test_checkpoint_fp8_kv_scheme_is_followed_when_auto(target):
    fp8_target = json.loads(json.dumps(target))
    fp8_target["quantization_config"]["kv_cache_scheme"] = {
        "num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
        "symmetric": True}
    p = predict(fp8_target, None, KVFlags(vllm_version="0.23.0", max_num_batched_tokens=16384))
    assert p.target_layers[3].dtype == "fp8"
    assert p.cache_dtype_source.endswith("(compressed-tensors)")


def test_float32_conv_state_vs_auto(target):
    auto = predict(target, None, NGRAM)
    f32 = predict(target, None, replace(NGRAM, mamba_cache_dtype="float32"))
    assert auto.target_layers[0].dtypes == ("bfloat16", "float32")  # ssm from config
    assert f32.target_layers[0].dtypes == ("float32", "float32")
    # conv (14, 8192) fp32 = 458,752; + 2,097,152 = 2,555,904 = 78 x 32,768 -> 1248 tokens.
    assert f32.mamba_page_bytes == 2_555_904 and f32.attention_block_size == 1248
    assert auto.attention_block_size == 1136
    # An explicit bf16 ssm state overrides config.json's float32: 229,376 + 1,048,576 =
    # 1,277,952 = 39 x 32,768 -> 624 tokens.
    bf16 = predict(target, None, replace(NGRAM, mamba_ssm_cache_dtype="bfloat16"))
    assert bf16.attention_block_size == 624


def test_user_block_size_raises_the_alignment(target):
    # --block-size 64: alignment max(16, 64) = 64 -> 64 x ceil(2,326,528 / 131,072) = 1152
    # tokens; page 2,359,296, mamba padded by 32,768 B.
    p = predict(target, None, replace(NGRAM, block_size=64))
    assert p.kernel_block_alignment == 64 and p.attention_block_size == 1152
    assert p.target_layers[0].page_size_padded == 2_359_296
    # CPU platform: default block 128 -> alignment 128 -> 128 x ceil(2,326,528 / 262,144)
    # = 128 x 9 = 1152.
    cpu = predict(target, None, replace(NGRAM, default_block_size=128, platform="cpu",
                                        attention_backend="cpu_attn"))
    assert cpu.attention_block_size == 1152


def test_non_dividing_drafter_page_raises_not_implemented(target):
    drafter = cfg("zlab-dflash-31977fbe")
    drafter.update(num_key_value_heads=3, num_attention_heads=24)
    p = predict(target, drafter, DFLASH)
    # 3 x 256 x 2 B = 1536 B/token -> 1136 x 1536 = 1,744,896, which does not divide the
    # largest page 2,326,528.
    assert p.drafter_layers[0].page_bytes == 1_744_896
    assert p.outcome == "NotImplementedError"
    assert "does not divide" in p.cause
    # Padding mamba does not help an attention page that does not divide.
    assert predict(target, drafter, DFLASH, patches=[DFLASHFIX]).outcome == "NotImplementedError"


def test_bigger_non_dividing_drafter_raises_not_implemented_first(target):
    drafter = cfg("zlab-dflash-31977fbe")
    drafter.update(num_key_value_heads=6, num_attention_heads=24)
    # 6 x 256 x 2 = 3072 B/token -> 3,489,792 B: the first layer (a GDN page of 2,326,528)
    # does not divide it, and vLLM checks divisibility before the assert.
    p = predict(target, drafter, DFLASH)
    assert p.outcome == "NotImplementedError"
    # dflashfix pads the state pages, but the target's attention pages still do not divide.
    assert predict(target, drafter, DFLASH, patches=[DFLASHFIX]).outcome == "NotImplementedError"


def test_unify_is_checked_before_the_block_fits_one_scheduler_step(target):
    """vLLM 0.23 EngineCore: get_kv_cache_configs (unify) first, then validate_block_size;
    a non-dividing hybrid layout with prefix caching on (align mode) whose block of 1136
    tokens is also over --max-num-batched-tokens fails unification, not the block check."""
    drafter = cfg("zlab-dflash-31977fbe")
    drafter.update(num_key_value_heads=3, num_attention_heads=24)
    small = replace(DFLASH, max_num_batched_tokens=1024)
    p = predict(target, drafter, small)
    assert p.outcome == "NotImplementedError", (p.outcome, p.message)
    assert "not divisible by the maximum page size" in p.message
    # once the layout unifies, the block check still fires, on the unified block size
    fine = predict(target, cfg("zlab-dflash-31977fbe"), small)
    assert fine.outcome == "AssertionError"
    assert "block_size (1136) must be <= max_num_batched_tokens (1024)" in fine.message


def test_prefix_caching_left_to_vllm_is_off_for_hybrids(target):
    assert KVFlags(vllm_version="0.23.0").enable_prefix_caching is None  # as `vllm serve` leaves it
    flags = replace(DFLASH, enable_prefix_caching=None)
    hybrid = predict(target, cfg("zlab-dflash-31977fbe"), flags)
    assert not hybrid.prefix_caching and hybrid.mamba_cache_mode == "none"
    assert predict(cfg("qwen3-8b"), None, KVFlags(vllm_version="0.23.0")).prefix_caching


def test_pure_attention_target():
    q = cfg("qwen3-8b")
    p = predict(q, None, KVFlags(vllm_version="0.23.0"))
    assert not p.hybrid and p.mamba_page_bytes is None
    assert p.attention_block_size == 16
    # 8 KV heads x 256 x 2 B = 4096 B/token x 16 = 65,536 per page, all 36 layers full.
    assert {(s.kind, s.page_bytes) for s in p.target_layers} == {("full", 65_536)}
    assert p.outcome == "ok" and not p.unify_needed
    tp4 = predict(q, None, KVFlags(vllm_version="0.23.0", tensor_parallel_size=4))
    assert tp4.target_layers[0].page_bytes == 65_536 // 4


def test_eagle_drafter_on_pure_attention_target():
    q = cfg("qwen3-8b")
    eagle = {"architectures": ["Eagle3LlamaForCausalLM"], "model_type": "llama",
             "num_hidden_layers": 1, "num_attention_heads": 32, "num_key_value_heads": 4,
             "hidden_size": 4096, "torch_dtype": "bfloat16"}
    flags = KVFlags(vllm_version="0.23.0", speculative_method="eagle3", num_speculative_tokens=3)
    p = predict(q, eagle, flags)
    # All full attention, one block size: vLLM keeps per-layer pages without unifying.
    assert not p.unify_needed and p.outcome == "ok"
    assert p.drafter_layers[0].page_bytes == 16 * 4 * 256 * 2
    # A sliding drafter layer makes the layout mixed: unify runs; 32,768 divides 65,536.
    sliding = dict(eagle, layer_types=["sliding_attention"], sliding_window=2048)
    s = predict(q, sliding, flags)
    assert s.unify_needed and s.outcome == "ok"
    assert s.drafter_layers[0].kind == "sliding"
    assert s.final_layers[-1].block_size == 32


def test_sliding_window_layers_in_target():
    gemma_like = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4,
                  "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
                  "layer_types": ["sliding_attention", "full_attention"] * 2,
                  "sliding_window": 512, "torch_dtype": "float16"}
    p = predict(gemma_like, None, KVFlags(vllm_version="0.23.0"))
    assert [s.kind for s in p.target_layers] == ["sliding", "full"] * 2
    assert p.target_layers[0].sliding_window == 512 and p.target_layers[1].sliding_window is None
    assert {s.page_bytes for s in p.target_layers} == {16 * 4 * 128 * 2}
    assert p.outcome == "ok"


def test_oracle_layout_and_json(target):
    p = predict(target, cfg("zlab-dflash-retrained"), DFLASH)
    layout = layout_for_oracle(p)["specs"]
    assert list(layout)[:4] == [f"model.layers.{i}.linear_attn" for i in range(3)] + [
        "model.layers.3.self_attn.attn"]
    assert len(layout) == 48
    assert layout["model.layers.0.linear_attn"]["shapes"] == [[14, 8192], [32, 128, 128]]
    assert layout["model.layers.0.linear_attn"]["dtypes"] == ["bfloat16", "float32"]
    assert layout["model.layers.3.self_attn.attn"]["block_size"] == 1136
    doc = json.loads(p.to_json())
    assert doc["outcome"] == "AssertionError" and doc["attention_block_size"] == 1136


def test_bad_flags_are_user_errors(target):
    with pytest.raises(UserError):
        predict(target, None, KVFlags(vllm_version="0.23.0", kv_cache_dtype="fp4"))
    with pytest.raises(UserError):
        predict(target, None, KVFlags(vllm_version="0.23.0", speculative_method="medusa"))
    with pytest.raises(UserError, match="drafter"):
        predict(target, None, DFLASH)


def test_predict_is_fast(target):
    drafter = cfg("zlab-dflash-retrained")
    start = time.perf_counter()
    for _ in range(200):
        predict(target, drafter, DFLASH)
    assert (time.perf_counter() - start) / 200 < 0.005
