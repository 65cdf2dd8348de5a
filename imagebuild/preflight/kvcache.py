"""Predict vLLM 0.23's KV-cache page layout from config.json files, before any boot.

vLLM keeps every layer's cache in pages of one size. On a hybrid target (Gated DeltaNet +
full attention) a drafter whose attention page outgrows the fixed-size GDN state page makes
`unify_kv_cache_spec_page_size` fail at engine start (DOMAIN.md "Why the page-size assert
happens"). This module replays, in plain arithmetic, what vLLM 0.23.0 does:

1. layer specs: `Attention.get_kv_cache_spec` (attention.py) and
   `MambaBase.get_kv_cache_spec` (mamba/abstract.py), GDN state shapes and dtypes from
   `MambaStateShapeCalculator/MambaStateDtypeCalculator.gated_delta_net_state_*`;
2. the hybrid block size: `Platform._align_hybrid_block_size` (platforms/interface.py),
   chosen from the target alone; the mamba page is padded up to the attention page;
3. `get_kv_cache_groups` (v1/core/kv_cache_utils.py): models whose layers are all of one
   type skip unification; the rest go through `unify_kv_cache_spec_page_size`.

`pad_mamba=True` models the `dflashfix` patch set: inside unify, a mamba page smaller than
the largest page is padded up to it instead of hitting the assert.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from imagebuild.errors import UserError

# Bytes per element, keyed by the dtype strings vLLM accepts (torch_utils.STR_DTYPE_TO_TORCH_DTYPE:
# every fp8 flavour is stored as uint8).
_DTYPE_BYTES = {
    "float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
}
# Canonical names used in predictions and in the oracle protocol.
_CANONICAL = {"float": "float32", "half": "float16", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}

# Smallest kernel block size of each attention backend (get_supported_kernel_block_sizes).
# All are 16 in 0.23 (flash_attn gives [16, 32, 64] for hybrids with float32 mamba state,
# MultipleOf(16) otherwise). vLLM then takes max(this, block_size): on the CPU platform the
# default block size is 128 (platforms/cpu.py), so the effective alignment there is 128.
_BACKEND_ALIGNMENT = {
    "flash_attn": 16, "flashinfer": 16, "triton_attn": 16, "flex_attention": 16,
    "cpu_attn": 16, "rocm_attn": 16, "rocm_aiter_fa": 16, "rocm_aiter_unified_attn": 16,
}

# Architectures whose `auto` mamba_ssm_cache_dtype is taken from config.json's mamba_ssm_dtype
# (models/config.py MODELS_CONFIG_MAP -> Qwen3_5ForConditionalGenerationConfig).
_SSM_DTYPE_FROM_CONFIG = {
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "ColQwen3_5",
}

OUTCOMES = ("ok", "AssertionError", "NotImplementedError")
_SPEC_METHODS = (None, "mtp", "dflash", "eagle", "eagle3", "ngram")


@dataclass(frozen=True)
class KVFlags:
    """The serve flags that shape the KV cache (names follow `vllm serve`)."""

    tensor_parallel_size: int = 1
    kv_cache_dtype: str = "auto"  # auto|bfloat16|float16|fp8|fp8_e4m3|fp8_e5m2
    mamba_cache_dtype: str = "auto"  # auto|float32|float16|bfloat16
    mamba_ssm_cache_dtype: str = "auto"
    block_size: int | None = None  # --block-size
    num_speculative_tokens: int = 0
    speculative_method: str | None = None  # None|"mtp"|"dflash"|"eagle"|"eagle3"|"ngram"
    attention_backend: str | None = None  # picks the kernel alignment when known
    model_dtype: str | None = None  # --dtype; default from config dtype/torch_dtype
    kernel_block_alignment: int = 16  # used when attention_backend is None or unknown
    # CUDA platforms start from 16; the CPU platform starts from 128 (platforms/cpu.py).
    default_block_size: int = 16
    # Prefix caching puts Qwen3.5 mamba layers in "align" mode: 2 + k state pages per
    # request instead of 1 + k (MambaSpec.max_memory_usage_bytes). It does not move the
    # block size for GDN models (they lack mamba "all" mode support).
    enable_prefix_caching: bool = True
    max_model_len: int | None = None  # mamba block size when prefix caching is off


@dataclass(frozen=True)
class LayerSpec:
    """One layer's cache spec as vLLM builds it, before page-size unification."""

    name: str
    owner: str  # "target" | "drafter"
    kind: str  # "full" | "sliding" | "mamba"
    block_size: int
    dtype: str  # attention: KV dtype; mamba: dtype of the first (conv) state
    page_bytes: int  # page_size_bytes, including vLLM's own mamba alignment padding
    num_kv_heads: int | None = None  # per tensor-parallel rank
    head_size: int | None = None
    sliding_window: int | None = None
    shapes: tuple[tuple[int, ...], ...] | None = None  # mamba: (conv, ssm)
    dtypes: tuple[str, ...] | None = None  # mamba
    page_size_padded: int | None = None  # mamba

    @property
    def bytes_per_token(self) -> int | None:
        """Attention bytes per cached token (K and V); None for mamba state."""
        if self.kind == "mamba":
            return None
        return self.page_bytes // self.block_size


@dataclass(frozen=True)
class FinalLayer:
    """A layer after unification (what the KV cache manager would allocate)."""

    name: str
    block_size: int
    page_bytes: int
    padded_by_dflashfix: bool = False


@dataclass(frozen=True)
class KVPrediction:
    target_layers: tuple[LayerSpec, ...]
    drafter_layers: tuple[LayerSpec, ...]
    hybrid: bool
    attention_block_size: int  # block size every attention layer starts with
    kernel_block_alignment: int  # effective: max(backend minimum, starting block size)
    mamba_page_bytes: int | None  # GDN state page before any padding
    mamba_padding_pct: float  # vLLM's own alignment padding, as it logs it
    unify_needed: bool  # False when all layers are of one type (no unification runs)
    outcome: str  # "ok" | "AssertionError" | "NotImplementedError"
    padded_by_dflashfix: bool  # ok only because pad_mamba padded mamba pages
    # Extra mamba memory per request that the dflashfix padding costs: every mamba layer's
    # page grows from vLLM's own (attention-aligned) size to the largest page, times the
    # state pages each request holds (1 + k, or 2 + k with prefix caching; k = spec tokens).
    extra_bytes_per_request: int
    max_page_bytes: int
    final_layers: tuple[FinalLayer, ...]  # empty when unification fails
    message: str  # the exception text vLLM would print ("" when ok)
    cause: str
    fix: str | None
    flags: KVFlags = field(default_factory=KVFlags)

    @property
    def layers(self) -> tuple[LayerSpec, ...]:
        return self.target_layers + self.drafter_layers

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)


def predict(
    target_config: dict,
    drafter_config: dict | None,
    flags: KVFlags,
    *,
    pad_mamba: bool = False,
) -> KVPrediction:
    """Predict the KV layout and whether vLLM 0.23 unifies it (see module docstring)."""
    _check_flags(flags)
    text = _text_config(target_config)
    arch = _architecture(target_config)
    tp = flags.tensor_parallel_size
    method = flags.speculative_method
    num_spec = flags.num_speculative_tokens if method else 0

    model_dtype = _model_dtype(target_config, text, flags)
    kv_dtype = _kv_cache_dtype(target_config, flags, model_dtype)
    kv_bytes = _DTYPE_BYTES[kv_dtype]
    # CacheConfig.sliding_window: the target's window, only when not interleaved (arg_utils).
    layer_types = _layer_types(text)
    cache_window = None if len(set(layer_types)) > 1 else _sliding_window(text)

    kv_heads, head_size = _attention_shape(text, tp, "target config")
    attn_1 = kv_heads * 2 * head_size * kv_bytes  # FullAttentionSpec(block_size=1) page

    hybrid = "mamba" in layer_types
    mamba_shapes: tuple[tuple[int, ...], ...] = ()
    mamba_dtypes: tuple[str, ...] = ()
    mamba_page = 0
    if hybrid:
        mamba_shapes = _gdn_shapes(text, tp, num_spec)
        mamba_dtypes = _gdn_dtypes(text, arch, flags, model_dtype)
        mamba_page = sum(
            math.prod(s) * _DTYPE_BYTES[d] for s, d in zip(mamba_shapes, mamba_dtypes, strict=True)
        )

    start_block = flags.block_size or flags.default_block_size
    backend_min = _BACKEND_ALIGNMENT.get(
        (flags.attention_backend or "").lower(), flags.kernel_block_alignment
    )
    alignment = max(backend_min, start_block)
    block = start_block
    padded: int | None = None
    pct = 0.0
    if hybrid and mamba_page:
        # _align_hybrid_block_size, non-"all" mamba cache mode: the smallest multiple of the
        # alignment whose attention page covers the mamba page; then pad mamba up to it.
        need = alignment * -(-mamba_page // (alignment * attn_1))
        block = max(block, need)
        if block * attn_1 != mamba_page:
            padded = block * attn_1
            pct = 100 * (padded - mamba_page) / mamba_page
    mamba_block = block if flags.enable_prefix_caching else (
        flags.max_model_len or int(text.get("max_position_embeddings") or block)
    )

    target_layers = []
    for i, kind in enumerate(layer_types):
        name = f"model.layers.{i}"
        if kind == "mamba":
            target_layers.append(LayerSpec(
                name=name, owner="target", kind="mamba", block_size=mamba_block,
                dtype=mamba_dtypes[0], page_bytes=padded or mamba_page,
                shapes=mamba_shapes, dtypes=mamba_dtypes, page_size_padded=padded,
            ))
        else:
            window = _sliding_window(text) if kind == "sliding" else cache_window
            target_layers.append(_attn_layer(
                name, "target", block, kv_heads, head_size, kv_dtype, window))

    drafter_layers = _drafter_layers(
        method, text, drafter_config, flags, block, kv_dtype, cache_window, len(layer_types))

    specs = target_layers + drafter_layers
    unify_needed = needs_unify(specs)
    if unify_needed:
        outcome, message, finals = simulate_unify(specs, pad_mamba)
    else:
        outcome, message = "ok", ""
        finals = [FinalLayer(s.name, s.block_size, s.page_bytes) for s in specs]
    max_page = max(s.page_bytes for s in specs)
    by_fix = any(f.padded_by_dflashfix for f in finals)

    n_mamba = sum(1 for s in specs if s.kind == "mamba")
    pages_per_request = (2 if flags.enable_prefix_caching else 1) + num_spec
    extra = 0
    if by_fix:
        stock = padded or mamba_page
        extra = n_mamba * (max_page - stock) * pages_per_request

    cause, fix = _explain(
        outcome, by_fix, specs, finals, max_page, block, attn_1, mamba_page, extra, method,
        unify_needed,
    )
    return KVPrediction(
        target_layers=tuple(target_layers), drafter_layers=tuple(drafter_layers),
        hybrid=hybrid, attention_block_size=block, kernel_block_alignment=alignment,
        mamba_page_bytes=mamba_page or None, mamba_padding_pct=round(pct, 4),
        unify_needed=unify_needed, outcome=outcome, padded_by_dflashfix=by_fix,
        extra_bytes_per_request=extra, max_page_bytes=max_page,
        final_layers=tuple(finals), message=message, cause=cause, fix=fix, flags=flags,
    )


def layout_for_oracle(prediction: KVPrediction) -> dict:
    """The pre-unification specs in the oracle's input format: {"specs": {layer: {...}}}.

    Callers add the case "id". Layer order is vLLM's (target layers, then drafter layers),
    which decides which exception fires first.
    """
    specs: dict[str, dict] = {}
    for s in prediction.layers:
        specs[s.name] = {
            "kind": s.kind,
            "block_size": s.block_size,
            "num_kv_heads": s.num_kv_heads,
            "head_size": s.head_size,
            "dtype": s.dtype,
            "sliding_window": s.sliding_window,
            "shapes": [list(x) for x in s.shapes] if s.shapes else None,
            "dtypes": list(s.dtypes) if s.dtypes else None,
            "page_size_padded": s.page_size_padded,
        }
    return {"specs": specs}


# --- unification (v1/core/kv_cache_utils.py) ------------------------------------------------

def needs_unify(specs: list[LayerSpec] | tuple[LayerSpec, ...]) -> bool:
    """get_kv_cache_groups skips unify when all layers are one type with one block size."""
    if len({s.block_size for s in specs}) > 1:
        return True
    kinds = {s.kind for s in specs}
    if kinds == {"full"} or kinds == {"mamba"}:
        return False
    if kinds == {"sliding"}:
        return len({s.sliding_window for s in specs}) > 1
    return True


def simulate_unify(
    specs: list[LayerSpec] | tuple[LayerSpec, ...], pad_mamba: bool = False
) -> tuple[str, str, list[FinalLayer]]:
    """unify_kv_cache_spec_page_size, plus the dflashfix mamba padding when pad_mamba.

    Returns (outcome, vLLM's exception text, final layers). dflashfix is modelled as: a mamba
    page smaller than the largest is padded up to it before the divisibility check.
    """
    pages = {s.page_bytes for s in specs}
    if len(pages) <= 1:
        return "ok", "", [FinalLayer(s.name, s.block_size, s.page_bytes) for s in specs]
    top = max(pages)
    finals = []
    for s in specs:
        if s.page_bytes == top:
            finals.append(FinalLayer(s.name, s.block_size, top))
            continue
        if pad_mamba and s.kind == "mamba":
            finals.append(FinalLayer(s.name, s.block_size, top, padded_by_dflashfix=True))
            continue
        if top % s.page_bytes:
            return "NotImplementedError", (
                "The page size of the layer is not divisible by the maximum page size. "
                "Cannot unify by adjusting block_size."
            ), []
        if s.kind == "mamba":
            # replace(block_size=...) does not change a mamba page: the assert fires.
            return "AssertionError", "assert new_spec.page_size_bytes == max_page_size", []
        ratio = top // s.page_bytes
        finals.append(FinalLayer(s.name, s.block_size * ratio, top))
    return "ok", "", finals


# --- layer specs ------------------------------------------------------------------------------

def _attn_layer(name, owner, block, kv_heads, head_size, kv_dtype, window) -> LayerSpec:
    # FullAttentionSpec/SlidingWindowSpec: block x heads x (head_size + head_size_v) x bytes;
    # a sliding window does not change the page.
    page = block * kv_heads * 2 * head_size * _DTYPE_BYTES[kv_dtype]
    return LayerSpec(
        name=name, owner=owner, kind="sliding" if window else "full", block_size=block,
        dtype=kv_dtype, page_bytes=page, num_kv_heads=kv_heads, head_size=head_size,
        sliding_window=window or None,
    )


def _drafter_layers(method, text, drafter, flags, block, kv_dtype, cache_window, n_target):
    tp = flags.tensor_parallel_size
    if method in (None, "ngram"):
        return []
    if method == "mtp":
        # qwen3_5_mtp.py: mtp_num_hidden_layers decoder layers of type full_attention with
        # the target's attention shape; DeepSeek-style configs call it num_nextn_predict_layers.
        n = text.get("mtp_num_hidden_layers", text.get("num_nextn_predict_layers"))
        if not n:
            raise UserError(
                "speculative method 'mtp' but the target config has no MTP layers "
                "(mtp_num_hidden_layers / num_nextn_predict_layers)",
                fix="use a drafter (dflash/eagle) or a target that ships an MTP head",
            )
        heads, size = _attention_shape(text, tp, "target config")
        return [
            _attn_layer(f"mtp.layers.{n_target + i}", "drafter", block, heads, size,
                        kv_dtype, cache_window)
            for i in range(int(n))
        ]
    if drafter is None:
        raise UserError(
            f"speculative method {method!r} needs the drafter's config.json",
            fix="pin a drafter in matrix.yaml so its config can be read",
        )
    dtext = _text_config(drafter)
    heads, size = _attention_shape(dtext, tp, "drafter config")
    n = _require_int(dtext, "num_hidden_layers", "drafter config")
    layers = []
    dtypes = dtext.get("layer_types") or []
    for i in range(n):
        if method == "dflash":
            # qwen3_dflash.py builds Attention without per_layer_sliding_window, so 0.23
            # ignores the drafter's own window and uses CacheConfig's (the target's).
            window = cache_window
        else:
            # llama.py (EAGLE drafters): sliding per layer_types, else CacheConfig's window.
            is_sliding = i < len(dtypes) and dtypes[i] == "sliding_attention"
            window = _sliding_window(dtext) if is_sliding else cache_window
        layers.append(_attn_layer(
            f"drafter.layers.{n_target + i}", "drafter", block, heads, size, kv_dtype, window))
    return layers


def _gdn_shapes(text: dict, tp: int, num_spec: int) -> tuple[tuple[int, ...], ...]:
    """gated_delta_net_state_shape, conv state in the default "SD" layout."""
    nk = _require_int(text, "linear_num_key_heads", "target config")
    nv = _require_int(text, "linear_num_value_heads", "target config")
    dk = _require_int(text, "linear_key_head_dim", "target config")
    dv = _require_int(text, "linear_value_head_dim", "target config")
    kernel = _require_int(text, "linear_conv_kernel_dim", "target config")
    conv_dim = dk * nk * 2 + dv * nv
    for what, value in (("conv dim", conv_dim), ("linear_num_value_heads", nv)):
        if value % tp:
            raise UserError(
                f"tensor_parallel_size {tp} does not divide the GDN {what} ({value})",
                fix="pick a tensor-parallel size that divides the linear-attention heads",
            )
    return ((kernel - 1 + num_spec, conv_dim // tp), (nv // tp, dv, dk))


def _gdn_dtypes(text: dict, arch: str, flags: KVFlags, model_dtype: str) -> tuple[str, str]:
    conv = model_dtype if flags.mamba_cache_dtype == "auto" else _canon(flags.mamba_cache_dtype)
    ssm_flag = flags.mamba_ssm_cache_dtype
    if ssm_flag == "auto" and arch in _SSM_DTYPE_FROM_CONFIG and text.get("mamba_ssm_dtype"):
        ssm_flag = text["mamba_ssm_dtype"]
    ssm = conv if ssm_flag == "auto" else _canon(ssm_flag)
    return conv, ssm


# --- config reading ---------------------------------------------------------------------------

def _text_config(cfg: dict) -> dict:
    """hf_text_config: the nested text_config of multimodal configs, else the config itself."""
    if not isinstance(cfg, dict):
        raise UserError("config.json must be a JSON object", fix="check the file's contents")
    text = cfg.get("text_config")
    return text if isinstance(text, dict) else cfg


def _architecture(cfg: dict) -> str:
    archs = cfg.get("architectures") or [""]
    return str(archs[0])


def _layer_types(text: dict) -> list[str]:
    """Per target layer: "full", "sliding" or "mamba" (GDN linear attention)."""
    n = _require_int(text, "num_hidden_layers", "target config")
    raw = text.get("layer_types")
    if raw is None and text.get("full_attention_interval"):
        every = int(text["full_attention_interval"])
        raw = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    if raw is None:
        return ["full"] * n
    if len(raw) != n:
        raise UserError(
            f"layer_types has {len(raw)} entries but num_hidden_layers is {n}",
            fix="fix the target config.json",
        )
    table = {"linear_attention": "mamba", "sliding_attention": "sliding",
             "full_attention": "full", "attention": "full"}
    unknown = sorted({t for t in raw if t not in table})
    if unknown:
        raise UserError(
            f"layer types {unknown} are not modelled by the KV-cache preflight",
            fix="only GDN linear, full and sliding attention layers are supported",
        )
    return [table[t] for t in raw]


def _sliding_window(cfg: dict) -> int | None:
    # transformers' Qwen2/Qwen3 configs drop the window when use_sliding_window is false.
    if cfg.get("use_sliding_window") is False:
        return None
    window = cfg.get("sliding_window")
    return int(window) if window else None


def _attention_shape(text: dict, tp: int, where: str) -> tuple[int, int]:
    """(KV heads per rank, head size), with the divisibility the Qwen/Llama layers assert."""
    heads = _require_int(text, "num_attention_heads", where)
    kv = int(text.get("num_key_value_heads") or heads)
    head_size = text.get("head_dim") or _require_int(text, "hidden_size", where) // heads
    if heads % tp:
        raise UserError(
            f"tensor_parallel_size {tp} does not divide num_attention_heads {heads} ({where})",
            fix="pick a tensor-parallel size that divides the attention heads",
        )
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        raise UserError(
            f"tensor_parallel_size {tp} and num_key_value_heads {kv} do not divide ({where})",
            fix="pick a tensor-parallel size that divides (or is a multiple of) the KV heads",
        )
    return max(1, kv // tp), int(head_size)  # KV heads replicate when fewer than tp


def _model_dtype(cfg: dict, text: dict, flags: KVFlags) -> str:
    if flags.model_dtype and flags.model_dtype != "auto":
        return _canon(flags.model_dtype)
    raw = cfg.get("dtype") or cfg.get("torch_dtype") or text.get("dtype") or text.get(
        "torch_dtype") or "float32"
    dtype = _canon(str(raw).replace("torch.", ""))
    # _resolve_auto_dtype: float32 checkpoints are served in the platform's preferred
    # dtype, bfloat16 on GB10 (and on AVX512-bf16 CPUs).
    return "bfloat16" if dtype == "float32" else dtype


def _kv_cache_dtype(cfg: dict, flags: KVFlags, model_dtype: str) -> str:
    """--kv-cache-dtype; `auto` follows a checkpoint's FP8 KV scheme, else the model dtype."""
    if flags.kv_cache_dtype != "auto":
        return _canon(flags.kv_cache_dtype)
    quant = cfg.get("quantization_config") or {}
    scheme = quant.get("kv_cache_scheme") or quant.get("kv_cache_quant_algo")
    if isinstance(scheme, dict) and scheme.get("num_bits") == 8 and scheme.get("type") == "float":
        return "fp8"
    if isinstance(scheme, str) and scheme.lower().startswith("fp8"):
        return "fp8"
    return model_dtype


def _canon(dtype: str) -> str:
    d = dtype.lower()
    if d not in _DTYPE_BYTES:
        raise UserError(
            f"unknown cache/model dtype {dtype!r}",
            fix=f"use one of {sorted(_DTYPE_BYTES)}",
        )
    return _CANONICAL.get(d, d)


def _require_int(cfg: dict, key: str, where: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UserError(f"{where} lacks a positive integer {key!r}", fix="fix the config.json")
    return value


def _check_flags(flags: KVFlags) -> None:
    if flags.speculative_method not in _SPEC_METHODS:
        raise UserError(
            f"speculative method {flags.speculative_method!r} is not modelled",
            fix=f"use one of {[m for m in _SPEC_METHODS if m]}",
        )
    if flags.tensor_parallel_size < 1 or flags.num_speculative_tokens < 0:
        raise UserError("tensor_parallel_size must be >= 1 and num_speculative_tokens >= 0")
    if flags.block_size is not None and flags.block_size < 1:
        raise UserError("--block-size must be a positive integer")
    for value in (flags.kv_cache_dtype, flags.mamba_cache_dtype, flags.mamba_ssm_cache_dtype):
        if value != "auto":
            _canon(value)


# --- explanation ------------------------------------------------------------------------------

_PIN_FIX = (
    "pin a drafter revision whose KV bytes per token do not exceed the target's and divide "
    "it (e.g. z-lab/Qwen3.6-35B-A3B-DFlash@31977fbe13a86e8b961774f773058175676d89b8)"
)


def _explain(outcome, by_fix, specs, finals, top, block, attn_1, mamba_page, extra, method,
             unify_needed) -> tuple[str, str | None]:
    biggest = next(s for s in specs if s.page_bytes == top)
    if outcome == "ok" and not by_fix:
        if not unify_needed:
            return "all layers are of one attention type; vLLM does not unify their pages", None
        return (f"every page divides the largest ({top} B, {biggest.name}); attention block "
                f"size {block}"), None
    if by_fix:
        return (
            f"{biggest.name} ({biggest.owner}, {biggest.bytes_per_token} B/token) has the "
            f"largest page ({top} B) at block size {block}; stock vLLM 0.23 would assert, "
            f"dflashfix pads each GDN state page to {top} B (+{extra} B per request)"
        ), _PIN_FIX + " to avoid the padding cost"
    if outcome == "AssertionError":
        return (
            f"{biggest.name} ({biggest.owner}) stores {biggest.bytes_per_token} B per token, "
            f"more than the target's {attn_1} B; at the attention block size {block} (chosen "
            f"from the target alone) its page of {top} B exceeds the GDN state page "
            f"({mamba_page} B), which cannot grow with block_size, so "
            f"unify_kv_cache_spec_page_size asserts"
        ), _PIN_FIX + ", or build the dflashfix patch set (pads the state page)"
    small = [s for s in specs if top % s.page_bytes]
    what = small[0] if small else biggest
    return (
        f"{what.name} has a page of {what.page_bytes} B that does not divide the largest "
        f"page ({top} B, {biggest.name}), so vLLM cannot unify by scaling block_size"
    ), (_PIN_FIX if method in ("dflash", "eagle", "eagle3") else
        "choose cache dtypes/shapes whose per-token KV bytes divide each other")
