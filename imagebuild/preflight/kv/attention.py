"""Plain attention models (dense, sliding-window, MLA) and the drafter layers that join a
target's KV cache: DFlash, EAGLE/EAGLE3 drafters and MTP heads."""

from __future__ import annotations

from dataclasses import replace

from imagebuild.errors import UserError
from imagebuild.preflight.kv.errors import CannotPredict
from imagebuild.preflight.kv.families import Ctx
from imagebuild.preflight.kv.flags import KVFlags
from imagebuild.preflight.kv.layout import AttnLayer, ModelLayout, attention_heads


def text_config(cfg: dict) -> dict:
    """hf_text_config: the nested text_config of multimodal configs, else the config itself."""
    if not isinstance(cfg, dict):
        raise UserError("config.json must be a JSON object", fix="check the file's contents")
    text = cfg.get("text_config")
    return text if isinstance(text, dict) else cfg


def require_int(cfg: dict, key: str, where: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UserError(f"{where} lacks a positive integer {key!r}", fix="fix the config.json")
    return value


# --- plain attention models ----------------------------------------------------------------

_MLA_TYPES = {"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "longcat_flash",
              "glm4_moe_lite", "pangu_ultra_moe", "AXK1"}


def plain_attention(cfg: dict, text: dict, ctx: Ctx) -> ModelLayout:
    layer_types = _layer_types(text)
    # CacheConfig.sliding_window: the target's window, only when not interleaved (arg_utils).
    cache_window = None if len(set(layer_types)) > 1 else _sliding_window(text)
    mla = text.get("model_type") in _MLA_TYPES and text.get("kv_lora_rank") is not None
    if mla:
        head = int(text["kv_lora_rank"]) + int(text.get("qk_rope_head_dim") or 0)
        layers = tuple(AttnLayer(f"model.layers.{i}.self_attn.attn", 1, head, head, None,
                                 mla=True, index=i) for i in range(len(layer_types)))
        return ModelLayout("MLA attention", layers, hybrid=False, mla=True,
                           arch_kv_heads=1, arch_head_size=head)
    kv, head = _attention_shape(text, ctx.tp, "target config")
    layers = tuple(
        AttnLayer(f"model.layers.{i}", kv, head, head,
                  _sliding_window(text) if kind == "sliding" else cache_window, index=i)
        for i, kind in enumerate(layer_types))
    return ModelLayout("attention", layers, hybrid=False, cache_window=cache_window,
                       arch_kv_heads=kv * ctx.tp, arch_head_size=head)


def _layer_types(text: dict) -> list[str]:
    """Per target layer: "full" or "sliding"."""
    n = require_int(text, "num_hidden_layers", "target config")
    raw = text.get("layer_types")
    if raw is None:
        return ["full"] * n
    if len(raw) != n:
        raise UserError(
            f"layer_types has {len(raw)} entries but num_hidden_layers is {n}",
            fix="fix the target config.json",
        )
    table = {"sliding_attention": "sliding", "full_attention": "full", "attention": "full"}
    unknown = sorted({t for t in raw if t not in table})
    if unknown:
        raise CannotPredict(f"layer types {unknown} are not modelled by the KV-cache preflight")
    return [table[t] for t in raw]


def _sliding_window(cfg: dict) -> int | None:
    # transformers' Qwen2/Qwen3 configs drop the window when use_sliding_window is false.
    if cfg.get("use_sliding_window") is False:
        return None
    window = cfg.get("sliding_window")
    return int(window) if window else None


def _attention_shape(text: dict, tp: int, where: str) -> tuple[int, int]:
    """(KV heads per rank, head size), with the divisibility the Qwen/Llama layers assert."""
    heads = require_int(text, "num_attention_heads", where)
    kv = int(text.get("num_key_value_heads") or heads)
    head_size = text.get("head_dim") or require_int(text, "hidden_size", where) // heads
    return attention_heads(kv, heads, tp, where), int(head_size)


# --- drafters ---------------------------------------------------------------------------------

def drafter_layers(method, layout: ModelLayout, text: dict, drafter: dict | None,
                    flags: KVFlags) -> list[AttnLayer]:
    tp = flags.tensor_parallel_size
    n_target = len(layout.layers)
    if method in (None, "ngram"):
        return []
    if method == "mtp":
        if isinstance(layout.mtp, Exception):
            raise layout.mtp
        if layout.mtp is not None:
            return list(layout.mtp)
        if layout.hybrid:
            raise CannotPredict(f"{layout.family}'s MTP layers are not modelled")
        # DeepSeek-style configs: num_nextn_predict_layers decoder layers shaped like the target
        n = text.get("mtp_num_hidden_layers", text.get("num_nextn_predict_layers"))
        if not n:
            raise UserError(
                "speculative method 'mtp' but the target config has no MTP layers "
                "(mtp_num_hidden_layers / num_nextn_predict_layers)",
                fix="use a drafter (dflash/eagle) or a target that ships an MTP head",
            )
        if layout.mla:
            raise CannotPredict("MTP on a multi-head latent attention target is not modelled")
        first = next(x for x in layout.layers if isinstance(x, AttnLayer))
        return [replace(first, name=f"mtp.layers.{n_target + i}", sliding_window=(
            layout.cache_window), index=n_target + i) for i in range(int(n))]
    if drafter is None:
        raise UserError(
            f"speculative method {method!r} needs the drafter's config.json",
            fix="pin a drafter in matrix.yaml so its config can be read",
        )
    if layout.mla:
        raise CannotPredict("drafters on a multi-head latent attention target are not modelled")
    dtext = text_config(drafter)
    heads, size = _attention_shape(dtext, tp, "drafter config")
    n = require_int(dtext, "num_hidden_layers", "drafter config")
    dtypes = dtext.get("layer_types") or []
    layers = []
    for i in range(n):
        if method == "dflash":
            # qwen3_dflash.py builds Attention without per_layer_sliding_window, so 0.23
            # ignores the drafter's own window and uses CacheConfig's (the target's).
            window = layout.cache_window
        else:
            # llama.py (EAGLE drafters): sliding per layer_types, else CacheConfig's window.
            is_sliding = i < len(dtypes) and dtypes[i] == "sliding_attention"
            window = _sliding_window(dtext) if is_sliding else layout.cache_window
        layers.append(AttnLayer(f"drafter.layers.{n_target + i}", heads, size, size, window,
                                index=n_target + i))
    return layers
