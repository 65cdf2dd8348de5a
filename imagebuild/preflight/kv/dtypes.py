"""KV-cache and state dtypes as vLLM 0.23 stores them, and what `--kv-cache-dtype auto` becomes.

Sources (vLLM 0.23.0): config/cache.py `CacheDType` (every value `--kv-cache-dtype` accepts),
utils/torch_utils.py `STR_DTYPE_TO_TORCH_DTYPE` (the storage dtype of each),
v1/kv_cache_interface.py `get_kv_quant_mode` and the `*AttentionSpec.page_size_bytes`
formulas, model_executor/layers/quantization/turboquant/config.py (TurboQuant slot sizes),
and for the checkpoint's own KV quantization: transformers_utils/config.py (hf_quant_config.json
is read only when config.json has no quantization_config), model_arch_config_convertor.py
`_normalize_quantization_config`, torch_utils.py `get_kv_cache_quant_algo_string` (ModelOpt)
and model_executor/layers/attention/attention.py (a compressed-tensors `kv_cache_scheme`
turns `auto` into fp8 while the layers are built).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from imagebuild.preflight.kv.errors import VllmRefuses

# The --kv-cache-dtype values each version takes are its recorded facts (kv/model.py); the
# tables below are vLLM 0.23.0's, kept for what was read from that version's code alone
# (the hybrid alignment's MLA page, TurboQuant's slot) and the storage of mamba dtypes.
# Storage dtype of each string vLLM maps to a torch dtype (STR_DTYPE_TO_TORCH_DTYPE).
STORAGE = {
    "float32": "float32", "float": "float32", "half": "float16", "float16": "float16",
    "bfloat16": "bfloat16", "fp8": "uint8", "fp8_e4m3": "uint8", "fp8_e5m2": "uint8",
    "int8": "int8", "int8_per_token_head": "int8", "fp8_per_token_head": "uint8",
    "fp8_inc": "float8_e4m3fn", "fp8_ds_mla": "uint8", "turboquant_k8v4": "uint8",
    "turboquant_4bit_nc": "uint8", "turboquant_k3v4_nc": "uint8", "turboquant_3bit_nc": "uint8",
    "nvfp4": "uint8",
}
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1, "int8": 1,
                 "float8_e4m3fn": 1}

# TurboQuant presets: (key bits, value bits); 8-bit keys are stored as FP8 (turboquant/config.py).
TQ_PRESETS = {
    "turboquant_k8v4": (8, 4), "turboquant_4bit_nc": (4, 4),
    "turboquant_k3v4_nc": (3, 4), "turboquant_3bit_nc": (3, 3),
}

# ModelOpt kv_cache_quant_algo strings vLLM maps (MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP).
_MODELOPT_KV = {"fp8": "fp8_e4m3", "nvfp4": "nvfp4"}
_MODELOPT_FP8_ALGOS = {"FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO"}
# compressed-tensors QuantizationStrategy values; vLLM's KV method takes tensor and attn_head.
_CT_STRATEGIES = {"tensor", "channel", "group", "block", "token", "tensor_group", "attn_head"}


def quant_mode(cache_dtype: str) -> str:
    """get_kv_quant_mode: none, fp8_per_tensor, int8/fp8_per_token_head or nvfp4."""
    if cache_dtype in ("int8_per_token_head", "fp8_per_token_head", "nvfp4"):
        return cache_dtype
    if cache_dtype.startswith("fp8"):
        return "fp8_per_tensor"
    return "none"


def storage_dtype(cache_dtype: str, model_dtype: str) -> str:
    """kv_cache_dtype_str_to_dtype: `auto` is the model dtype, the rest a fixed storage dtype."""
    return model_dtype if cache_dtype == "auto" else STORAGE[cache_dtype]


def nvfp4_dim(head_size: int) -> int:
    """nvfp4_kv_cache_full_dim: packed fp4 data plus one fp8 scale per 16 elements."""
    return head_size // 2 + head_size // 16


def tq_slot_size(cache_dtype: str, head_size: int) -> int:
    """TurboQuantConfig.slot_size_aligned: packed key + value bytes per head and token."""
    key_bits, value_bits = TQ_PRESETS[cache_dtype]
    key = head_size if key_bits == 8 else math.ceil(head_size * key_bits / 8) + 2
    value = math.ceil(head_size * value_bits / 8) + 4
    slot = key + value
    return slot + slot % 2


@dataclass(frozen=True)
class AttnPage:
    """What one attention layer's page size depends on (an AttentionSpec without block_size)."""

    num_kv_heads: int
    head_size: int
    head_size_v: int
    cache_dtype: str  # the layer's kv_cache_dtype string ("auto" for skipped layers)
    storage: str  # torch storage dtype name
    mla: bool = False
    tq_slot: int | None = None  # TQFullAttentionSpec.tq_slot_size (non-sliding TurboQuant)
    # MLAAttention.get_kv_cache_spec passes no kv_quant_mode (no per-token-head scales); the
    # hybrid alignment's one-token MLA page does
    scales: bool = True

    def bytes(self, block_size: int) -> int:
        """page_size_bytes of the spec at `block_size` tokens."""
        mode = quant_mode(self.cache_dtype)
        elem = ELEMENT_BYTES[self.storage]
        if self.mla:
            # MLAAttentionSpec.real_page_size_bytes (no NVFP4 layout: vLLM refuses nvfp4 there)
            # MLAAttentionSpec: one latent vector per token (DeepSeek V3.2's fp8_ds_mla: 656 B).
            page = (block_size * 656 if self.cache_dtype == "fp8_ds_mla"
                    else block_size * self.num_kv_heads * self.head_size * elem)
        elif self.tq_slot is not None:
            page = block_size * self.num_kv_heads * self.tq_slot
        elif mode == "nvfp4":
            page = (block_size * self.num_kv_heads
                    * (nvfp4_dim(self.head_size) + nvfp4_dim(self.head_size_v)) * elem)
        else:
            page = block_size * self.num_kv_heads * (self.head_size + self.head_size_v) * elem
        if mode.endswith("per_token_head") and self.scales:
            # per-token-head float32 scales for K and V, carved from the same allocation
            page += 2 * block_size * self.num_kv_heads * 4
        return page


def canonical_model_dtype(raw: str) -> str:
    d = raw.lower().replace("torch.", "")
    names = {"float": "float32", "half": "float16", "float32": "float32", "float16": "float16",
             "bfloat16": "bfloat16"}
    if d not in names:
        raise VllmRefuses("ValueError", f"Unknown dtype: {raw}",
                          f"dtype {raw!r} is not one vLLM serves a model in")
    return names[d]


def mamba_state_dtype(flag: str, model_dtype: str) -> str:
    """get_kv_cache_torch_dtype for --mamba-cache-dtype: `auto` follows the model dtype."""
    return model_dtype if flag == "auto" else STORAGE[flag]


# --- the checkpoint's own KV quantization -------------------------------------------------------

@dataclass(frozen=True)
class CheckpointKV:
    """What the checkpoint says about KV quantization, resolved the way vLLM 0.23 does."""

    cache_dtype: str | None  # what `auto` resolves to from the quant config (None: nothing)
    source: str  # where it came from, for messages
    # The quantization method gives attention layers a KV-cache method (Fp8KVCacheMethod,
    # ModelOptKVCacheMethod, CompressedTensorsKVCacheMethod, QuarkKVCacheMethod): those
    # refuse --kv-cache-dtype fp8_e5m2 (attention.py _init_kv_cache_quant).
    kv_method: bool


def quant_config(cfg: dict, hf_quant: dict | None) -> dict | None:
    """hf_config.quantization_config: config.json's, else hf_quant_config.json (old ModelOpt)."""
    q = cfg.get("quantization_config")
    if q is None and isinstance(hf_quant, dict):
        q = hf_quant
    return dict(q) if isinstance(q, dict) else None


def _normalized_method(q: dict, where: str) -> str:
    """_normalize_quantization_config: ModelOpt's producer block decides quant_method."""
    producer = q.get("producer") or {}
    if isinstance(producer, dict) and producer.get("name") == "modelopt":
        inner = q.get("quantization") or {}
        algo = inner.get("quant_algo") if isinstance(inner, dict) else None
        if algo is not None:
            upper = str(algo).upper()
            if upper in _MODELOPT_FP8_ALGOS:
                q["quant_method"] = "modelopt"
            elif upper == "NVFP4":
                q["quant_method"] = "modelopt_fp4"
            else:
                raise VllmRefuses(
                    "ValueError", f"Unknown ModelOpt quant algo: {algo}",
                    f"{where} has a ModelOpt producer block whose nested quantization.quant_algo "
                    f"{algo!r} vLLM 0.23 does not know (only FP8 variants and NVFP4 there)",
                    "re-export the checkpoint's quantization config with a newer ModelOpt "
                    "layout (quant_method in config.json) or use a checkpoint vLLM 0.23 reads")
    method = str(q.get("quant_method", "")).lower()
    return method.replace("compressed_tensors", "compressed-tensors")


def _modelopt_kv(q: dict) -> str | None:
    """get_kv_cache_quant_algo_string for ModelOpt configs (None: no KV quantization named)."""
    inner = q.get("quantization", q)
    if not isinstance(inner, dict):
        inner = q
    algo = (inner.get("kv_cache_scheme") or q.get("kv_cache_scheme")
            or inner.get("kv_cache_quant_algo") or q.get("kv_cache_quant_algo"))
    if isinstance(algo, dict):
        if algo.get("dynamic") is False and algo.get("num_bits") == 8 and algo.get(
                "type") == "float":
            return "fp8_e4m3"
        if algo.get("num_bits") == 4 and algo.get("type") == "float":
            return "nvfp4"
        return "auto"  # vLLM warns and falls back
    if isinstance(algo, str):
        return _MODELOPT_KV.get(algo.lower(), "auto")
    return None


def _ct_config(cfg: dict) -> dict | None:
    """A compressed-tensors quantization config, from config.json or its text_config."""
    for holder in (cfg, cfg.get("text_config") or {}):
        q = holder.get("quantization_config") or holder.get("compression_config")
        if isinstance(q, dict):
            method = str(q.get("quant_method", "")).lower().replace("_", "-")
            return q if method == "compressed-tensors" else None
    return None


def _check_ct_scheme(scheme: dict) -> None:
    """CompressedTensorsKVCacheMethod.validate_kv_cache_scheme (runs while layers are built)."""
    if scheme.get("type") != "float" and scheme.get("num_bits") != 8:
        raise VllmRefuses(
            "NotImplementedError",
            "Currently supported kv cache quantization is num_bits=8, type=float",
            f"the checkpoint's compressed-tensors kv_cache_scheme ({scheme.get('num_bits')} bit "
            f"{scheme.get('type')}) is not one vLLM 0.23 loads")
    strategy = scheme.get("strategy")
    if strategy not in _CT_STRATEGIES:
        raise VllmRefuses("ValueError", f"{strategy!r} is not a valid QuantizationStrategy",
                          "the checkpoint's kv_cache_scheme names no valid strategy")
    if strategy not in ("tensor", "attn_head"):
        raise VllmRefuses(
            "NotImplementedError", "Invalid strategy for compressed-tensors KV cache",
            f"kv_cache_scheme strategy {strategy!r}: vLLM 0.23 takes tensor or attn_head")
    if not scheme.get("symmetric"):
        raise VllmRefuses(
            "NotImplementedError", "Only support symmetric scaling factor for compressed-tensors "
            "KV cache", "the checkpoint's kv_cache_scheme is not symmetric")


def checkpoint_kv(cfg: dict, hf_quant: dict | None) -> CheckpointKV:
    q = quant_config(cfg, hf_quant)
    method = ""
    if q is not None:
        where = ("config.json quantization_config" if cfg.get("quantization_config") is not None
                 else "hf_quant_config.json")
        method = _normalized_method(q, where)
        if method.startswith("modelopt"):
            algo = _modelopt_kv(q)
            nested = q.get("quantization")
            inner: dict = nested if isinstance(nested, dict) else q
            mixed = str(inner.get("quant_algo", "")).upper() == "MIXED_PRECISION"
            named = algo not in (None, "auto")
            return CheckpointKV(algo, f"{where} (ModelOpt kv_cache_quant_algo)",
                                named or not mixed)
    ct = _ct_config(cfg)
    scheme = ct.get("kv_cache_scheme") if ct is not None else None
    if isinstance(scheme, dict):
        _check_ct_scheme(scheme)
        return CheckpointKV("fp8", "config.json quantization_config.kv_cache_scheme "
                                   "(compressed-tensors)", True)
    return CheckpointKV(None, "", ct is not None or method in ("fp8", "quark"))
