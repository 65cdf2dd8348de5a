"""Each hybrid family's cache layers, read from config.json the way vLLM 0.23's model code reads
its config object (transformers 5 / vLLM config classes: a field missing from the JSON takes the
class default listed here; a field with no default makes the layout unknown).

Per family, from vllm/model_executor/models/<module>.py: which layers are attention and which
keep a recurrent state, the attention shape, the state shapes of the layers themselves
(`get_state_shape`) and of the model's `get_mamba_state_shape_from_config` (the alignment sizes
the mamba page from that one; for Bamba-style MambaMixer2 models only the layers add the
speculative tokens to the conv state), the state dtypes, and whether the family has the "all"
prefix-caching mode (SupportsMambaPrefixCaching) with its chunk size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from imagebuild.preflight.kv.dtypes import STORAGE, mamba_state_dtype
from imagebuild.preflight.kv.errors import CannotPredict, VllmRefuses
from imagebuild.preflight.kv.layout import (
    AttnLayer,
    Fields,
    MambaLayer,
    ModelLayout,
    attention_heads,
    gdn_shapes,
    kda_shapes,
    linear_attention_shapes,
    mamba1_shapes,
    mamba2_shapes,
    short_conv_shapes,
)


@dataclass(frozen=True)
class Ctx:
    tp: int
    num_spec: int  # vllm_config.num_speculative_tokens (0 without speculation)
    model_dtype: str
    mamba_cache_dtype: str  # --mamba-cache-dtype
    mamba_ssm_cache_dtype: str  # --mamba-ssm-cache-dtype


def _two_dtypes(ctx: Ctx, ssm_flag: str | None = None) -> tuple[str, str]:
    """MambaStateDtypeCalculator._mamba_state_dtype: (conv, temporal)."""
    conv = mamba_state_dtype(ctx.mamba_cache_dtype, ctx.model_dtype)
    ssm = ctx.mamba_ssm_cache_dtype if ssm_flag is None else ssm_flag
    if ssm not in STORAGE and ssm != "auto":
        raise CannotPredict(f"mamba ssm dtype {ssm!r} is not one vLLM knows")
    return conv, (conv if ssm == "auto" else STORAGE[ssm])


def _head_size(f: Fields) -> int:
    """ModelArchConfigConvertorBase.get_head_size for non-MLA text configs."""
    if f.opt("head_dim") is not None:
        return f.int("head_dim")
    if f.opt("hidden_size_per_head") is not None:
        return f.int("hidden_size_per_head")
    return f.int("hidden_size") // f.int("num_attention_heads")


def _kv_heads(f: Fields) -> int:
    """get_total_num_kv_heads: the first KV-head field present, else the attention heads."""
    for key in ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num",
                "num_attention_groups"):
        if f.opt(key) is not None:
            return f.int(key)
    return f.int("num_attention_heads")


def _attn(f: Fields, ctx: Ctx, name: str, index: int, head: int, kv_total: int,
          window: int | None = None) -> AttnLayer:
    kv = attention_heads(kv_total, f.int("num_attention_heads"), ctx.tp, f"{f.family} config")
    return AttnLayer(name, kv, head, head, window, index=index)


# --- Gated DeltaNet: Qwen3.5 / Qwen3.6, Qwen3-Next -------------------------------------------

_QWEN_GDN = dict(head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128,
                 linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32)
_QWEN3_5_DENSE = dict(_QWEN_GDN, num_hidden_layers=32, num_attention_heads=16,
                      num_key_value_heads=4, hidden_size=4096)
_QWEN3_5_MOE = dict(_QWEN_GDN, num_hidden_layers=40, num_attention_heads=16,
                    num_key_value_heads=2, hidden_size=2048)
_QWEN3_NEXT = dict(_QWEN_GDN, num_hidden_layers=48, num_attention_heads=16,
                   num_key_value_heads=2, hidden_size=2048)


def _gdn(f: Fields, ctx: Ctx, layer_types: list[str], ssm_flag: str | None,
         mtp_layers: int) -> ModelLayout:
    nk, nv = f.int("linear_num_key_heads"), f.int("linear_num_value_heads")
    dk, dv = f.int("linear_key_head_dim"), f.int("linear_value_head_dim")
    kernel = f.int("linear_conv_kernel_dim")
    shapes = gdn_shapes(ctx.tp, nk, nv, dk, dv, kernel, ctx.num_spec)
    dtypes = _two_dtypes(ctx, ssm_flag)
    # Qwen3NextAttention: head_dim = config.head_dim or hidden_size // num_attention_heads
    head = f.int("head_dim") if f.opt("head_dim") else f.int("hidden_size") // f.int(
        "num_attention_heads")
    kv_total = f.int("num_key_value_heads")
    layers: list[AttnLayer | MambaLayer] = []
    for i, kind in enumerate(layer_types):
        if kind == "linear_attention":
            layers.append(MambaLayer(f"model.layers.{i}.linear_attn", shapes, dtypes, "GDN_ATTN"))
        elif kind == "full_attention":
            layers.append(_attn(f, ctx, f"model.layers.{i}.self_attn.attn", i, head, kv_total))
        else:
            raise CannotPredict(f"{f.family} layer type {kind!r} is not one its model code builds")
    n = len(layer_types)
    mtp = tuple(_attn(f, ctx, f"mtp.layers.{n + i}.self_attn.attn", n + i, head, kv_total)
                for i in range(mtp_layers))
    return ModelLayout(
        f.family, tuple(layers), hybrid=True, align_shapes=shapes, align_dtypes=dtypes,
        arch_kv_heads=_kv_heads(f), arch_head_size=_head_size(f),
        tq_attention_indices=tuple(i for i, t in enumerate(layer_types) if t == "full_attention"),
        mtp=mtp)


def qwen3_5(cfg: dict, ctx: Ctx) -> ModelLayout:
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise CannotPredict("Qwen3.5 config.json has no text_config")
    moe = "Moe" in str((cfg.get("architectures") or [""])[0])
    f = Fields("Qwen3.5", text, _QWEN3_5_MOE if moe else _QWEN3_5_DENSE)
    n = f.int("num_hidden_layers")
    every = int(text.get("full_attention_interval") or 4)
    layer_types = text.get("layer_types") or [
        "linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    # Qwen3_5ForConditionalGenerationConfig: an `auto` ssm dtype follows mamba_ssm_dtype
    ssm = ctx.mamba_ssm_cache_dtype
    if ssm == "auto" and text.get("mamba_ssm_dtype"):
        ssm = str(text["mamba_ssm_dtype"])
    return _gdn(f, ctx, list(layer_types), ssm, int(text.get("mtp_num_hidden_layers") or 1))


def qwen3_next(cfg: dict, ctx: Ctx) -> ModelLayout:
    f = Fields("Qwen3-Next", cfg, _QWEN3_NEXT)
    n = f.int("num_hidden_layers")
    # vLLM's Qwen3NextConfig ignores full_attention_interval: every 4th layer is attention
    layer_types = cfg.get("layer_types") or [
        "linear_attention" if (i + 1) % 4 else "full_attention" for i in range(n)]
    return _gdn(f, ctx, list(layer_types), None, int(cfg.get("num_nextn_predict_layers") or 1))


# --- Mamba2 hybrids -------------------------------------------------------------------------

# transformers 5's NemotronHConfig (the class vLLM 0.23 loads for model_type nemotron_h)
_NEMOTRON_H = dict(num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                   hidden_size=4096, mamba_num_heads=128, mamba_head_dim=64, n_groups=8,
                   ssm_state_size=128, conv_kernel=4, chunk_size=128)
_NEMOTRON_CHARS = {"linear_attention": "M", "moe": "E", "full_attention": "*", "mlp": "-"}
_NEMOTRON_TYPES = {v: k for k, v in _NEMOTRON_CHARS.items()}
_LEGACY = {"mamba": "linear_attention", "attention": "full_attention"}


def _nemotron_types(cfg: dict, list_key: str, pattern_key: str, default: list[str]) -> list[str]:
    """NemotronHConfig.__post_init__: an explicit list wins over the pattern string."""
    raw = cfg.get(list_key)
    if list_key == "layers_block_type" and raw is None:
        raw = cfg.get("layer_types")  # attribute_map alias
    if raw is not None:
        types = [_LEGACY.get(t, t) for t in raw]
    elif cfg.get(pattern_key) is not None:
        unknown = sorted(set(str(cfg[pattern_key])) - set(_NEMOTRON_TYPES))
        if unknown:
            raise VllmRefuses("KeyError", f"{unknown[0]!r}",
                              f"NemotronH {pattern_key} has characters {unknown} the config "
                              "class does not know")
        types = [_NEMOTRON_TYPES[ch] for ch in str(cfg[pattern_key])]
    else:
        types = list(default)
    invalid = sorted(set(types) - set(_NEMOTRON_CHARS))
    if invalid:
        raise VllmRefuses("ValueError", f"`layers_block_type` contains invalid types: {invalid}",
                          f"NemotronH layer types {invalid} are not ones the config class takes")
    return types


def nemotron_h(cfg: dict, ctx: Ctx) -> ModelLayout:
    """nemotron_h.py over transformers 5's NemotronHConfig (layers_block_type, or the legacy
    hybrid_override_pattern: M mamba2, * attention, - MLP, E MoE; num_hidden_layers is derived
    from it; mamba_n_groups / mamba_d_conv / mamba_chunk_size win over n_groups / conv_kernel /
    chunk_size)."""
    if cfg.get("block_configs"):
        raise CannotPredict("NemotronH config.json has per-layer block_configs (a Puzzle "
                            "variant); its per-layer shapes are not modelled")
    f = Fields("NemotronH", cfg, _NEMOTRON_H)
    types = _nemotron_types(cfg, "layers_block_type", "hybrid_override_pattern",
                            ["linear_attention", "moe", "full_attention", "mlp"])
    heads, head_dim = f.int("mamba_num_heads"), f.int("mamba_head_dim")
    shapes = mamba2_shapes(ctx.tp, heads * head_dim, f.int("mamba_n_groups", "n_groups"), heads,
                           head_dim, f.int("ssm_state_size"),
                           f.int("mamba_d_conv", "conv_kernel"), ctx.num_spec)
    # NemotronHForCausalLMConfig: `auto` ssm dtype -> the config's mamba_ssm_cache_dtype
    # (a field defaulting to float32)
    ssm = ctx.mamba_ssm_cache_dtype
    if ssm == "auto":
        ssm = str(cfg.get("mamba_ssm_cache_dtype") or "float32")
    dtypes = _two_dtypes(ctx, ssm)
    head = (f.int("head_dim") if "head_dim" not in cfg or cfg["head_dim"] is not None
            else f.int("hidden_size") // f.int("num_attention_heads"))
    kv = f.int("num_key_value_heads")
    window = cfg.get("sliding_window")  # per-layer window on every attention layer
    layers: list[AttnLayer | MambaLayer] = []
    for i, t in enumerate(types):
        if t == "linear_attention":
            layers.append(MambaLayer(f"model.layers.{i}.mixer", shapes, dtypes, "MAMBA2"))
        elif t == "full_attention":
            layers.append(_attn(f, ctx, f"model.layers.{i}.mixer.attn", i, head, kv, window))
    n = len(types)
    mtp_types = _nemotron_types(cfg, "mtp_layers_block_type", "mtp_hybrid_override_pattern",
                                ["full_attention", "moe"])
    mtp: tuple[AttnLayer, ...] | VllmRefuses
    steps = int(cfg.get("num_nextn_predict_layers") or 0)
    if steps != 1:
        mtp = VllmRefuses("AssertionError", "Only one MTP layer is supported for NemotronH-MTP",
                          f"NemotronH MTP needs num_nextn_predict_layers 1 (config: {steps})")
    elif set(mtp_types) - {"full_attention", "moe"}:
        mtp = VllmRefuses("NotImplementedError", "Pattern char not implemented",
                          f"NemotronH MTP builds only attention and MoE layers ({mtp_types})")
    else:
        mtp = tuple(_attn(f, ctx, f"mtp.layers.{i}.mixer.attn", n + i, head, kv, window)
                    for i, t in enumerate(mtp_types) if t == "full_attention")
    return ModelLayout(
        "NemotronH", tuple(layers), hybrid=True, align_shapes=shapes, align_dtypes=dtypes,
        arch_kv_heads=_kv_heads(f), arch_head_size=head, all_mode=True,
        chunk_size=f.int("mamba_chunk_size", "chunk_size"), cache_window=window,
        tq_attention_indices=tuple(i for i, t in enumerate(types) if t == "full_attention"),
        mtp=mtp)


def _chunk(f: Fields, *keys: str) -> int:
    """ModelConfig.get_mamba_chunk_size: mamba_chunk_size, else chunk_size, else 2048."""
    for key in ("mamba_chunk_size", "chunk_size"):
        if key in keys and f.opt(key) is not None:
            return f.int(key)
    return 2048


_FALCON_H1 = dict(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                  hidden_size=4096, mamba_d_ssm=1024, mamba_n_heads=128, mamba_d_head="auto",
                  mamba_n_groups=1, mamba_d_state=256, mamba_d_conv=4, mamba_expand=2,
                  mamba_chunk_size=256)


def falcon_h1(cfg: dict, ctx: Ctx) -> ModelLayout:
    """falcon_h1.py: every layer runs attention and a Mamba2 mixer side by side."""
    f = Fields("FalconH1", cfg, _FALCON_H1)
    hidden = f.int("hidden_size")
    # mamba_d_ssm defaults to 1024; an explicit null means mamba_expand x hidden_size
    d_ssm = cfg.get("mamba_d_ssm", 1024)
    inner = int(float(f.get("mamba_expand")) * hidden) if d_ssm is None else int(d_ssm)
    heads = f.int("mamba_n_heads")
    d_head = f.get("mamba_d_head")
    d_head = inner // heads if d_head == "auto" else int(d_head)
    args = (inner, f.int("mamba_n_groups"), heads, d_head, f.int("mamba_d_state"),
            f.int("mamba_d_conv"))
    layer_shapes = mamba2_shapes(ctx.tp, *args, num_spec=ctx.num_spec)
    align_shapes = mamba2_shapes(ctx.tp, *args)  # the classmethod leaves num_spec out
    dtypes = _two_dtypes(ctx)
    head = f.int("head_dim") if f.opt("head_dim") is not None else hidden // f.int(
        "num_attention_heads")
    kv = f.int("num_key_value_heads")
    layers: list[AttnLayer | MambaLayer] = []
    for i in range(f.int("num_hidden_layers")):
        layers.append(_attn(f, ctx, f"model.layers.{i}.attn", i, head, kv))
        layers.append(MambaLayer(f"model.layers.{i}.mamba", layer_shapes, dtypes, "MAMBA2"))
    return ModelLayout(
        "FalconH1", tuple(layers), hybrid=True, align_shapes=align_shapes, align_dtypes=dtypes,
        arch_kv_heads=_kv_heads(f), arch_head_size=_head_size(f), all_mode=True,
        chunk_size=_chunk(f, "mamba_chunk_size"),
        # layer_types is all "hybrid": TurboQuant finds no full-attention layer
        tq_attention_indices=())


_ZAMBA2 = dict(num_hidden_layers=54, num_attention_heads=32, hidden_size=2560,
               mamba_d_state=64, mamba_d_conv=4, mamba_expand=2, mamba_ngroups=1,
               n_mamba_heads=8, chunk_size=256)
_ZAMBA2_TYPES = (["mamba"] + (["mamba"] * 5 + ["hybrid"]) * 7 + ["mamba"] * 4 + ["hybrid"]
                 + ["mamba"] * 3 + ["hybrid"] + ["mamba"] * 2)


def zamba2(cfg: dict, ctx: Ctx) -> ModelLayout:
    """zamba2.py: shared attention blocks on the "hybrid" layers, Mamba2 on every layer."""
    f = Fields("Zamba2", cfg, _ZAMBA2)
    hidden, heads = f.int("hidden_size"), f.int("num_attention_heads")
    types = cfg.get("layers_block_type") or _ZAMBA2_TYPES
    # Zamba2Config derives these and ignores the JSON's copies
    attn_head = 2 * hidden // heads
    n_mamba = f.int("n_mamba_heads")
    inner = f.int("mamba_expand") * hidden
    shapes_args = (inner, f.int("mamba_ngroups"), n_mamba, inner // n_mamba,
                   f.int("mamba_d_state"), f.int("mamba_d_conv"))
    dtypes = _two_dtypes(ctx)
    layer_shapes = mamba2_shapes(ctx.tp, *shapes_args, num_spec=ctx.num_spec)
    kv_total = heads  # Zamba2Attention builds Attention without num_kv_heads
    hybrid_ids = [i for i, t in enumerate(types) if t == "hybrid"]
    # one Attention per hybrid layer, named model.attn.<j>: j is what
    # --kv-cache-dtype-skip-layers matches (extract_layer_index), not the layer index
    layers: list[AttnLayer | MambaLayer] = [
        _attn(f, ctx, f"model.attn.{j}", j, attn_head, kv_total)
        for j, _ in enumerate(hybrid_ids)]
    layers += [MambaLayer(f"model.layers.{i}.mamba", layer_shapes, dtypes, "MAMBA2")
               for i in range(len(types))]
    kv_cfg = cfg.get("num_key_value_heads")
    return ModelLayout(
        "Zamba2", tuple(layers), hybrid=True, align_shapes=mamba2_shapes(ctx.tp, *shapes_args),
        align_dtypes=dtypes, arch_kv_heads=int(kv_cfg) if kv_cfg else heads,
        arch_head_size=attn_head, all_mode=True, chunk_size=_chunk(f, "chunk_size"),
        tq_attention_indices=())


def plamo2(cfg: dict, ctx: Ctx) -> ModelLayout:
    """plamo2.py (remote-code config: every field must be in config.json)."""
    f = Fields("Plamo2", cfg)
    # remote code reads these without defaults: a config lacking one fails to build
    for key in ("mamba_chunk_size", "intermediate_size", "rms_norm_eps", "vocab_size",
                "max_position_embeddings", "hidden_size", "tie_word_embeddings"):
        if cfg.get(key) is None:
            raise CannotPredict(f"Plamo2 config.json lacks {key}, which vLLM's plamo2.py reads")
    n, step = f.int("num_hidden_layers"), f.int("mamba_step")
    if step <= 1:
        raise CannotPredict("Plamo2 mamba_step must be > 1 (vLLM asserts)")

    def is_mamba(i: int) -> bool:
        if n <= step // 2:
            return i != n - 1
        return i % step != step // 2

    heads, per_head = f.int("mamba_num_heads"), f.int("hidden_size_per_head")
    shapes = mamba2_shapes(ctx.tp, heads * per_head, 0, heads, per_head, f.int("mamba_d_state"),
                           f.int("mamba_d_conv"))
    dtypes = _two_dtypes(ctx)
    kv = f.int("num_key_value_heads")
    layers: list[AttnLayer | MambaLayer] = [
        MambaLayer(f"model.layers.layers.{i}.mixer", shapes, dtypes, "MAMBA2") if is_mamba(i)
        else _attn(f, ctx, f"model.layers.layers.{i}.mixer.attn", i, per_head, kv)
        for i in range(n)]
    return ModelLayout(
        "Plamo2", tuple(layers), hybrid=True, align_shapes=shapes, align_dtypes=dtypes,
        arch_kv_heads=_kv_heads(f), arch_head_size=_head_size(f),
        chunk_size=_chunk(f, "mamba_chunk_size", "chunk_size"), tq_attention_indices=())


# --- Mamba1 hybrid: Jamba --------------------------------------------------------------------

_JAMBA = dict(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
              hidden_size=4096, attn_layer_period=8, attn_layer_offset=4, mamba_d_state=16,
              mamba_d_conv=4, mamba_expand=2)


def jamba(cfg: dict, ctx: Ctx) -> ModelLayout:
    f = Fields("Jamba", cfg, _JAMBA)
    hidden = f.int("hidden_size")
    period, offset = f.int("attn_layer_period"), f.int("attn_layer_offset")
    shapes = mamba1_shapes(ctx.tp, f.int("mamba_expand") * hidden, f.int("mamba_d_state"),
                           f.int("mamba_d_conv"))
    dtypes = _two_dtypes(ctx)
    head = hidden // f.int("num_attention_heads")
    kv = f.int("num_key_value_heads")
    n = f.int("num_hidden_layers")
    attn_ids = [i for i in range(n) if i % period == offset]
    layers: list[AttnLayer | MambaLayer] = [
        _attn(f, ctx, f"model.layers.{i}.attn", i, head, kv) if i in attn_ids
        else MambaLayer(f"model.layers.{i}.mixer", shapes, dtypes, "MAMBA1") for i in range(n)]
    return ModelLayout(
        "Jamba", tuple(layers), hybrid=True, align_shapes=shapes, align_dtypes=dtypes,
        arch_kv_heads=_kv_heads(f), arch_head_size=_head_size(f), all_mode=True,
        chunk_size=_chunk(f, "mamba_chunk_size", "chunk_size"),
        tq_attention_indices=tuple(attn_ids))


# --- linear attention: MiniMax-Text-01 / M1 ---------------------------------------------------

_MINIMAX = dict(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                hidden_size=4096)


def minimax(cfg: dict, ctx: Ctx) -> ModelLayout:
    """minimax_text_01.py: attn_type_list (0 linear, 1 full), else layer_types."""
    f = Fields("MiniMax-Text-01", cfg, _MINIMAX)
    n = f.int("num_hidden_layers")
    types = cfg.get("attn_type_list") or cfg.get("decoder_attention_types")
    layer_types = cfg.get("layer_types") or [
        "full_attention" if (i + 1) % 2 else "linear_attention" for i in range(n)]
    if not types:
        table = {"linear_attention": 0, "full_attention": 1}
        unknown = sorted({t for t in layer_types if t not in table})
        if unknown:
            raise CannotPredict(f"MiniMax layer types {unknown}: vLLM raises ValueError")
        types = [table[t] for t in layer_types]
    if cfg.get("head_dim") is None:
        raise CannotPredict("MiniMax config.json lacks head_dim, which its linear-attention "
                            "state is sized from")
    head = f.int("head_dim")
    heads = f.int("num_attention_heads")
    shapes = linear_attention_shapes(ctx.tp, heads, head)
    dtypes = (mamba_state_dtype(ctx.mamba_cache_dtype, ctx.model_dtype),)
    kv = f.int("num_key_value_heads")
    window = cfg.get("sliding_window")
    layers: list[AttnLayer | MambaLayer] = []
    for i in range(n):
        if types[i] == 0:
            layers.append(MambaLayer(f"model.layers.{i}", shapes, dtypes, "LINEAR"))
        elif types[i] == 1:
            layers.append(_attn(f, ctx, f"model.layers.{i}.attn", i, head, kv, window))
        else:
            raise CannotPredict(f"MiniMax attention_type {types[i]!r}: vLLM raises ValueError")
    return ModelLayout(
        "MiniMax-Text-01", tuple(layers), hybrid=True, align_shapes=shapes, align_dtypes=dtypes,
        arch_kv_heads=_kv_heads(f), arch_head_size=_head_size(f),
        tq_attention_indices=tuple(i for i, t in enumerate(layer_types)
                                   if t in ("full_attention", "attention")))


# --- short convolution: LFM2 -----------------------------------------------------------------

_LFM2 = dict(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
             hidden_size=2560, conv_L_cache=3)
_LFM2_MOE = dict(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 hidden_size=2048, conv_L_cache=3)


def _lfm2(f: Fields, ctx: Ctx, layer_types: list[str], conv_dim: int) -> ModelLayout:
    shapes = short_conv_shapes(ctx.tp, conv_dim, f.int("conv_L_cache"))
    dtypes = (mamba_state_dtype(ctx.mamba_cache_dtype, ctx.model_dtype),)
    head = f.int("hidden_size") // f.int("num_attention_heads")
    kv = f.int("num_key_value_heads")
    layers: list[AttnLayer | MambaLayer] = [
        _attn(f, ctx, f"model.layers.{i}.self_attn.attn", i, head, kv) if t == "full_attention"
        else MambaLayer(f"model.layers.{i}.conv", shapes, dtypes, "SHORT_CONV")
        for i, t in enumerate(layer_types)]
    return ModelLayout(
        f.family, tuple(layers), hybrid=True, align_shapes=shapes, align_dtypes=dtypes,
        arch_kv_heads=_kv_heads(f), arch_head_size=_head_size(f),
        tq_attention_indices=tuple(i for i, t in enumerate(layer_types)
                                   if t == "full_attention"))


def lfm2(cfg: dict, ctx: Ctx) -> ModelLayout:
    f = Fields("LFM2", cfg, _LFM2)
    n = f.int("num_hidden_layers")
    idxs = cfg.get("full_attn_idxs")
    layer_types = cfg.get("layer_types") or [
        "full_attention" if idxs is None or i in idxs else "conv" for i in range(n)]
    for key in ("conv_dim", "block_dim"):
        if cfg.get(key) is None:
            raise CannotPredict(f"LFM2 config.json lacks {key} (vLLM 0.23's lfm2.py reads it; "
                                "transformers' Lfm2Config has no default)")
    return _lfm2(f, ctx, list(layer_types), f.int("conv_dim"))


def lfm2_moe(cfg: dict, ctx: Ctx) -> ModelLayout:
    f = Fields("LFM2-MoE", cfg, _LFM2_MOE)
    if not cfg.get("layer_types"):
        raise CannotPredict("LFM2-MoE config.json lacks layer_types (vLLM's Lfm2MoeConfig "
                            "has no default; its model code indexes it)")
    return _lfm2(f, ctx, list(cfg["layer_types"]), f.int("hidden_size"))


# --- Kimi Delta Attention + MLA: Kimi-Linear ---------------------------------------------------

def kimi_linear(cfg: dict, ctx: Ctx) -> ModelLayout:
    """kimi_linear.py over vLLM's KimiLinearConfig: KDA layers (1-based kda_layers), the rest
    multi-head latent attention (MLAAttentionSpec: one latent of kv_lora_rank + rope dims)."""
    f = Fields("Kimi-Linear", cfg)
    la = cfg.get("linear_attn_config")
    if not isinstance(la, dict):
        raise CannotPredict("Kimi-Linear config.json lacks linear_attn_config")
    for key in ("kda_layers", "num_heads", "head_dim", "short_conv_kernel_size"):
        if la.get(key) is None:
            raise CannotPredict(f"Kimi-Linear linear_attn_config lacks {key}")
    if cfg.get("kv_lora_rank") is None:
        raise CannotPredict("Kimi-Linear config.json has no kv_lora_rank (no MLA layout)")
    if cfg.get("mla_use_nope") is not True or cfg.get("q_lora_rank") is not None:
        raise VllmRefuses("AssertionError", "assert self.use_nope is True",
                          "vLLM 0.23's KimiMLAAttention needs mla_use_nope true and no "
                          "q_lora_rank")
    heads = f.int("num_attention_heads")
    if heads % ctx.tp:
        raise CannotPredict(f"tensor_parallel_size {ctx.tp} does not divide the heads")
    latent = f.int("kv_lora_rank") + f.int("qk_rope_head_dim")
    shapes = kda_shapes(ctx.tp, int(la["num_heads"]), int(la["head_dim"]),
                        int(la["short_conv_kernel_size"]))
    # kda_state_dtype: the conv state follows --mamba-cache-dtype, the recurrent one is float32
    dtypes = (mamba_state_dtype(ctx.mamba_cache_dtype, ctx.model_dtype), "float32")
    kda = {int(x) for x in la["kda_layers"]}
    layers: list[AttnLayer | MambaLayer] = [
        MambaLayer(f"model.layers.{i}.self_attn", shapes, dtypes, "KDA") if i + 1 in kda
        else AttnLayer(f"model.layers.{i}.self_attn.attn", 1, latent, latent, mla=True, index=i)
        for i in range(f.int("num_hidden_layers"))]
    return ModelLayout(
        "Kimi-Linear", tuple(layers), hybrid=True, align_shapes=shapes, align_dtypes=dtypes,
        arch_kv_heads=1, arch_head_size=latent, mla=True)


# --- attention-free Mamba models --------------------------------------------------------------

def mamba(cfg: dict, ctx: Ctx) -> ModelLayout:
    """MambaForCausalLM / FalconMambaForCausalLM (mamba1, no attention)."""
    f = Fields("Mamba", cfg, dict(num_hidden_layers=32, hidden_size=768, conv_kernel=4,
                                  expand=2, state_size=16))
    inner = f.int("intermediate_size") if cfg.get("intermediate_size") else (
        f.int("expand") * f.int("hidden_size"))
    shapes = mamba1_shapes(ctx.tp, inner, f.int("state_size"), f.int("conv_kernel"))
    dtypes = _two_dtypes(ctx)
    layers = tuple(MambaLayer(f"backbone.layers.{i}.mixer", shapes, dtypes, "MAMBA1")
                   for i in range(f.int("num_hidden_layers")))
    return ModelLayout("Mamba", layers, hybrid=False, attention_free=True, align_shapes=shapes,
                       align_dtypes=dtypes, all_mode=True)


def mamba2(cfg: dict, ctx: Ctx) -> ModelLayout:
    f = Fields("Mamba2", cfg, dict(num_hidden_layers=64, hidden_size=4096, head_dim=64,
                                   num_heads=128, n_groups=8, conv_kernel=4, expand=2,
                                   state_size=128, chunk_size=256))
    inner = f.int("expand") * f.int("hidden_size")
    shapes = mamba2_shapes(ctx.tp, inner, f.int("n_groups"), f.int("num_heads"),
                           f.int("head_dim"), f.int("state_size"), f.int("conv_kernel"),
                           ctx.num_spec)
    dtypes = _two_dtypes(ctx)
    layers = tuple(MambaLayer(f"backbone.layers.{i}.mixer", shapes, dtypes, "MAMBA2")
                   for i in range(f.int("num_hidden_layers")))
    return ModelLayout("Mamba2", layers, hybrid=False, attention_free=True, align_shapes=shapes,
                       align_dtypes=dtypes, all_mode=True, chunk_size=f.int("chunk_size"))


# --- families vLLM 0.23 marks hybrid that fail to build, or that are not modelled ---------------

def _transformers5_keyerror(family: str, module: str) -> Callable[[dict, Ctx], ModelLayout]:
    def read(cfg: dict, ctx: Ctx) -> ModelLayout:
        raise CannotPredict(
            f"vLLM 0.23's {module} looks its layers up by the names 'attention'/'mamba', but "
            f"transformers 5 renames them 'full_attention'/'linear_attention', so building "
            f"{family} fails with KeyError at model init; with transformers 4.x it builds. "
            "Which transformers the image installs decides it")
    return read


FAMILIES: dict[str, Callable[[dict, Ctx], ModelLayout]] = {
    "Qwen3_5ForConditionalGeneration": qwen3_5,
    "Qwen3_5MoeForConditionalGeneration": qwen3_5,
    "Qwen3NextForCausalLM": qwen3_next,
    "NemotronHForCausalLM": nemotron_h,
    "NemotronHPuzzleForCausalLM": nemotron_h,
    "FalconH1ForCausalLM": falcon_h1,
    "Zamba2ForCausalLM": zamba2,
    "Plamo2ForCausalLM": plamo2,
    "JambaForCausalLM": jamba,
    "MiniMaxText01ForCausalLM": minimax,
    "MiniMaxForCausalLM": minimax,
    "MiniMaxM1ForCausalLM": minimax,
    "Lfm2ForCausalLM": lfm2,
    "Lfm2MoeForCausalLM": lfm2_moe,
    "KimiLinearForCausalLM": kimi_linear,
    "MambaForCausalLM": mamba,
    "FalconMambaForCausalLM": mamba,
    "Mamba2ForCausalLM": mamba2,
    "BambaForCausalLM": _transformers5_keyerror("Bamba", "bamba.py"),
    "GraniteMoeHybridForCausalLM": _transformers5_keyerror("Granite-4.0-H", "granitemoehybrid.py"),
}

# Every architecture vLLM 0.23's registry marks IsHybrid / HasInnerState / IsAttentionFree
# (enumerated with the registry's own interface checks) that is not modelled above.
UNMODELLED_RECURRENT = {
    "BailingMoeV2_5ForCausalLM": "Bailing MoE V2.5 (linear attention + MLA)",
    "ColBERTLfm2Model": "ColBERT LFM2 (a pooling model)",
    "ColQwen3_5": "ColQwen3.5 (a pooling model)",
    "InternS2PreviewForConditionalGeneration": "InternS2 preview (GDN)",
    "JambaForSequenceClassification": "Jamba classifier (a pooling model)",
    "Lfm2VlForConditionalGeneration": "LFM2-VL",
    "MiniCPMV4_6ForConditionalGeneration": "MiniCPM-V 4.6 (GDN)",
    "NemotronH_Nano_VL_V2": "Nemotron-H Nano VL",
    "NemotronH_Nano_Omni_Reasoning_V3": "Nemotron-H Nano Omni",
    "NemotronH_Super_Omni_Reasoning_V3": "Nemotron-H Super Omni",
    "OlmoHybridForCausalLM": "OLMo hybrid (GDN)",
}

# config.json keys that only recurrent-state models carry: an architecture we do not know
# with any of these is treated as an unknown hybrid, never as plain attention.
RECURRENT_KEYS = (
    "hybrid_override_pattern", "attn_layer_indices", "attn_layer_period", "layers_block_type",
    "attn_type_list", "linear_attn_config", "full_attention_interval", "ssm_state_size",
    "mamba_d_state", "mamba_num_heads", "mamba_n_heads", "mamba_expand", "state_size",
    "linear_num_key_heads", "linear_conv_kernel_dim", "conv_L_cache", "mamba_step",
    "time_step_rank", "conv_kernel",
)
RECURRENT_LAYER_TYPES = {"linear_attention", "mamba", "conv", "hybrid", "mamba2", "ssm",
                         "recurrent", "gdn", "kda", "short_conv"}
