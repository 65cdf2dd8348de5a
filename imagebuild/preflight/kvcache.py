"""Predict the KV-cache page layout of the cell's vLLM version from config.json files,
before any boot.

vLLM keeps every layer's cache in pages of one size. On a hybrid target (attention plus layers
with a fixed-size recurrent state: Mamba1/2, Gated DeltaNet, short convolutions, linear
attention) the attention block size is raised until an attention page covers the state page,
and a drafter whose attention page outgrows it makes `unify_kv_cache_spec_page_size` fail at
engine start. This module replays, in plain arithmetic, what that version does (kv/ holds
the parts); everything that differs between versions comes from the version's recorded
facts (kv/model.py: dtypes, pages per layer kind and backend, sliding-window blocks, kernel
blocks, unification), the rest was read from the code of the versions named where it is:

1. dtypes (kv/dtypes.py, kv/model.py): the `--kv-cache-dtype` values the version takes, what
   `auto` becomes for the checkpoint's own KV quantization (ModelOpt, compressed-tensors,
   read from 0.23.0), the page each dtype takes (recorded per version and backend);
2. layers (kv/families.py): each hybrid family's layer pattern, attention shapes and state
   shapes, read as its model code reads its config; plain attention models below;
3. block sizes (kv/align.py): prefix-caching mode, chunk alignment, the hybrid alignment and
   the block-size checks vLLM asserts;
4. `get_kv_cache_groups` (kv/unify.py): models whose layers are all of one type skip
   unification; the rest go through `unify_kv_cache_spec_page_size`.

A layout the model does not know (an unknown recurrent architecture, a missing config field,
a version without recorded facts, a behaviour read from another version's code) raises
CannotPredict: callers report that as a warning, never as a pass. An engine whose patches
change unification (the dflashfix patch pads mamba pages on 0.23) is predicted from the
unification recorded from the patched code (`facts record --patch`), never from a patch's
name.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from imagebuild.errors import UserError
from imagebuild.facts import facts_for
from imagebuild.preflight.kv import families
from imagebuild.preflight.kv.align import (
    MLA_BACKENDS,
    Alignment,
    Sizing,
    align,
    check_batched_tokens,
)
from imagebuild.preflight.kv.attention import drafter_layers, plain_attention, text_config
from imagebuild.preflight.kv.dtypes import (
    canonical_model_dtype,
    checkpoint_kv,
    tq_slot_size,
)
from imagebuild.preflight.kv.errors import CannotPredict, VllmRefuses
from imagebuild.preflight.kv.flags import KVFlags
from imagebuild.preflight.kv.layout import AttnLayer, MambaLayer, ModelLayout
from imagebuild.preflight.kv.model import KVModel
from imagebuild.preflight.kv.unify import (
    FinalLayer,
    LayerSpec,
    needs_unify,
    simulate_unify,
    without_hybrid_manager,
)

_text_config = text_config  # hf_text_config, as tests and callers read it

__all__ = [
    "CannotPredict", "FinalLayer", "KVFlags", "KVModel", "KVPrediction", "LayerSpec",
    "OUTCOMES", "layout_for_oracle", "model_for", "needs_unify", "predict", "simulate_unify",
]
# behaviour read (not executed) from vLLM 0.23.0's code: refusals and TurboQuant's layout
READ_023 = ">=0.23,<0.24"

OUTCOMES = ("ok", "AssertionError", "NotImplementedError", "ValueError")
_SPEC_METHODS = (None, "mtp", "dflash", "eagle", "eagle3", "ngram")


@dataclass(frozen=True)
class KVPrediction:
    target_layers: tuple[LayerSpec, ...]
    drafter_layers: tuple[LayerSpec, ...]
    hybrid: bool
    attention_block_size: int  # block size every attention layer starts with
    kernel_block_alignment: int  # effective: max(backend minimum, starting block size)
    mamba_page_bytes: int | None  # state page the alignment sizes from, before padding
    mamba_padding_pct: float  # vLLM's own alignment padding, as it logs it
    unify_needed: bool  # False when all layers are of one type (no unification runs)
    outcome: str  # "ok" | "AssertionError" | "NotImplementedError" | "ValueError"
    padded_by_unify: bool  # unify padded some page up to the largest (0.32; dflashfix)
    # Extra memory per request that unify's padding costs: every padded mamba layer's page
    # grows from vLLM's own (attention-aligned) size to the largest page, times the state
    # pages each request holds (1 + k, or 2 + k in "align" mode; k = spec tokens).
    extra_bytes_per_request: int
    max_page_bytes: int
    final_layers: tuple[FinalLayer, ...]  # empty when unification fails
    message: str  # the exception text vLLM would print ("" when ok)
    cause: str
    fix: str | None
    flags: KVFlags = field(default_factory=KVFlags)
    family: str = ""
    cache_dtype: str = "auto"  # cache_config.cache_dtype once the layers are built
    cache_dtype_source: str = ""
    mamba_block_size: int | None = None
    mamba_cache_mode: str = "none"
    prefix_caching: bool = True
    vllm_version: str = ""  # whose recorded facts the prediction used
    unify_from: str = ""  # stock vLLM X, or vLLM X with the patches recorded
    attention_backend: str | None = None  # the backend the pages were taken for

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


def model_for(flags: KVFlags, patches: Iterable[Path] = (),
              extra_dirs: Iterable[Path] = ()) -> KVModel:
    """The KV model of flags.vllm_version from its recorded facts (CannotPredict without)."""
    if not flags.vllm_version:
        raise UserError("the KV predictor needs the vLLM version it predicts for "
                        "(KVFlags.vllm_version)", fix="pass the cell's engine vllm_version")
    return KVModel.of(facts_for(flags.vllm_version, extra_dirs), flags.vllm_version, patches)


def predict(
    target_config: dict,
    drafter_config: dict | None,
    flags: KVFlags,
    *,
    model: KVModel | None = None,
    patches: Iterable[Path] = (),
    hf_quant_config: dict | None = None,
) -> KVPrediction:
    """Predict the KV layout and whether vLLM unifies it (see module docstring), for the
    version `model` describes (default: flags.vllm_version's recorded facts, with the
    unification of `patches`, the engine's patch files, where they change it).

    Raises CannotPredict when the layout is not known, UserError for inputs vLLM would reject
    while reading them (a TP size that does not divide the heads, an unknown dtype)."""
    model = model or model_for(flags, patches)
    _check_flags(flags, model)
    text = text_config(target_config)
    method = flags.speculative_method
    num_spec = flags.num_speculative_tokens if method else 0
    backend = (flags.attention_backend or "").lower() or None
    if backend is None and flags.platform == "cpu":
        backend = "cpu_attn"  # the CPU platform's one non-MLA backend (platforms/cpu.py)
    try:
        model_dtype = _model_dtype(target_config, text, flags)
        ckpt = checkpoint_kv(target_config, hf_quant_config)
        cache_dtype, source = _cache_dtype(flags, ckpt, model)
        ctx = families.Ctx(flags.tensor_parallel_size, num_spec, model_dtype,
                           flags.mamba_cache_dtype, flags.mamba_ssm_cache_dtype)
        layout = read_layout(target_config, text, ctx)
        drafter = drafter_layers(method, layout, text, drafter_config, flags)
        tq = cache_dtype.startswith("turboquant_")
        if (tq or cache_dtype == "ultraquant_4bit") and not model.has_class(
                "TQFullAttentionSpec"):
            raise CannotPredict(
                f"on vLLM {model.version} TurboQuant-style KV caches are laid out by their "
                "own attention backend (kv_quant_mode and the backend's customize_spec), "
                "which this predictor does not model")
        if layout.hybrid and tq and not layout.tq_attention_indices:
            raise VllmRefuses(
                "NotImplementedError", "TurboQuant KV cache requires identifiable "
                "full-attention layers, but none were found in the hybrid model config.",
                f"{layout.family}'s config names no full-attention layer the way TurboQuant "
                "looks for them (layer_types / layers_block_type / attn_type_list)",
                "use another --kv-cache-dtype for this model")
        skip = _skip_layers(flags, layout, cache_dtype, text)
        if skip and drafter:
            raise CannotPredict("layers kept out of KV quantization (--kv-cache-dtype-skip-"
                                "layers, TurboQuant's boundary layers) with a drafter: which "
                                "drafter layers the indices match is not modelled")
        if skip and not model.within(READ_023):
            raise CannotPredict(f"how vLLM {model.version} aligns pages of layers kept out of "
                                "KV quantization (--kv-cache-dtype-skip-layers) is not "
                                "modelled for this version")
        if drafter and model.backend_decides and flags.platform != "cpu":
            raise CannotPredict(
                f"on vLLM {model.version} the drafter's attention backend (not inherited from "
                "the target) also sets the block alignment and its pages; which one vLLM "
                "picks for the drafter on this GPU is not modelled")
        sizing = Sizing(
            platform=flags.platform, backend=backend,
            default_block_size=flags.default_block_size,
            kernel_alignment=flags.kernel_block_alignment, tp=flags.tensor_parallel_size,
            cache_dtype=cache_dtype, model_dtype=model_dtype, block_size=flags.block_size,
            mamba_block_size=flags.mamba_block_size, mamba_cache_mode=flags.mamba_cache_mode,
            prefix_caching=flags.enable_prefix_caching,
            chunked_prefill=flags.enable_chunked_prefill,
            max_model_len=_max_model_len(text, flags),
            max_num_batched_tokens=flags.max_num_batched_tokens,
            default_max_num_batched_tokens=flags.default_max_num_batched_tokens,
            model=model, skip_layers=skip)
        if layout.mla and sizing.platform == "cpu":
            if not model.within(READ_023):
                raise CannotPredict(f"MLA on vLLM {model.version}'s CPU platform: its block "
                                    "size depends on the CPU's AMX support (platforms/cpu.py)")
            raise VllmRefuses("NotImplementedError", "MLA is not supported on CPU.",
                              f"{layout.family} uses multi-head latent attention, which vLLM's "
                              "CPU backend does not run")
        if layout.mla and cache_dtype == "nvfp4" and model.within(READ_023):
            raise VllmRefuses("ValueError", "nvfp4 KV cache is not supported with MLA",
                              "vLLM 0.23 refuses --kv-cache-dtype nvfp4 for multi-head latent "
                              "attention", "use fp8 or auto")
        if layout.mla and layout.hybrid and sizing.backend not in MLA_BACKENDS:
            raise CannotPredict(
                f"{layout.family} uses multi-head latent attention: the MLA backend vLLM picks "
                "on this GPU sets the block alignment (16 to 128 tokens); name it with "
                "--attention-backend to predict the layout")
        has_attention = bool(drafter) or any(isinstance(x, AttnLayer) for x in layout.layers)
        al = align(layout, sizing, has_attention)
        return _finish(layout, drafter, al, sizing, cache_dtype, source, model_dtype, skip,
                       num_spec, flags)
    except VllmRefuses as exc:
        return _refused(exc, flags, model)


def read_layout(cfg: dict, text: dict, ctx: families.Ctx) -> ModelLayout:
    """The family's layout, plain attention for non-recurrent models, or CannotPredict."""
    arch = _architecture(cfg)
    reader = families.FAMILIES.get(arch)
    if reader is not None:
        return reader(cfg, ctx)
    if arch in families.UNMODELLED_RECURRENT:
        raise CannotPredict(f"{arch} ({families.UNMODELLED_RECURRENT[arch]}) keeps a "
                            "recurrent state whose KV layout this preflight does not model")
    recurrent = sorted(k for k in families.RECURRENT_KEYS if k in text or k in cfg)
    kinds = set(text.get("layer_types") or []) & families.RECURRENT_LAYER_TYPES
    if recurrent or kinds:
        what = ", ".join(recurrent + sorted(kinds))
        raise CannotPredict(f"architecture {arch or '(none)'} is not a family this preflight "
                            f"knows, and its config has recurrent-state fields ({what}): an "
                            "unknown hybrid layout")
    return plain_attention(cfg, text, ctx)


# --- from layers and block sizes to specs, unify, explanation ---------------------------------

def _finish(layout: ModelLayout, drafter: list[AttnLayer], al: Alignment, sizing: Sizing,
            cache_dtype: str, source: str, model_dtype: str, skip: tuple[str, ...],
            num_spec: int, flags: KVFlags) -> KVPrediction:
    model = sizing.model
    target = [_spec(x, "target", al, cache_dtype, model_dtype, skip, sizing)
              for x in layout.layers]
    drafts = [_spec(x, "drafter", al, cache_dtype, model_dtype, skip, sizing) for x in drafter]
    specs = target + drafts
    for s, layer in zip(target, layout.layers, strict=True):
        if isinstance(layer, MambaLayer) and s.page_size_padded is not None and (
                s.page_size_padded < layer.page_bytes):
            if not model.within(READ_023):
                raise CannotPredict(
                    f"{layout.family}'s layers add the speculative tokens to their conv state "
                    "beyond the page vLLM aligned for it; what vLLM "
                    f"{model.version} does then was read from 0.23 only")
            raise VllmRefuses(
                "AssertionError", "assert self.page_size_padded >= page_size",
                f"{layout.family}'s layers add the {num_spec} speculative tokens to their conv "
                f"state ({layer.page_bytes} B) but get_mamba_state_shape_from_config does not, "
                f"so the page vLLM padded to ({s.page_size_padded} B) is too small",
                "serve this model without speculative decoding, or with fewer speculative "
                "tokens")
    if flags.disable_hybrid_kv_cache_manager:
        converted = without_hybrid_manager(specs)
        if converted is None:
            raise VllmRefuses(
                "ValueError", "Hybrid KV cache manager is disabled but failed to convert the "
                "KV cache specs to one unified type.",
                "--disable-hybrid-kv-cache-manager needs all layers to be one attention type; "
                f"{layout.family} mixes {sorted({s.kind for s in specs})}",
                "drop --disable-hybrid-kv-cache-manager")
        specs = converted
    unify_needed = needs_unify(specs)
    if unify_needed:
        outcome, message, finals = simulate_unify(
            specs, lambda situation: model.does(situation, sizing.backend))
    else:
        outcome, message = "ok", ""
        finals = [FinalLayer(s.name, s.block_size, s.page_bytes) for s in specs]
    if outcome == "ok" and finals:
        # EngineCore: validate_block_size runs after get_kv_cache_configs, on the smallest
        # block of the unified groups, so a unify error is what vLLM reports first
        check_batched_tokens(min(f.block_size for f in finals), al.mamba_cache_mode, sizing)
    max_page = max((s.page_bytes for s in specs), default=0)
    by_fix = any(f.padded for f in finals)
    padded_mamba = {f.name for f in finals if f.padded} & {s.name for s in specs
                                                           if s.kind == "mamba"}
    pages_per_request = (2 if al.mamba_cache_mode == "align" else 1) + num_spec
    extra = 0
    if padded_mamba:
        stock = al.padded or al.mamba_page
        extra = len(padded_mamba) * (max_page - stock) * pages_per_request
    attn_1 = al.attn_page_1 or (next((s.bytes_per_token for s in specs if s.kind != "mamba"),
                                     0) or 0)
    cause, fix = _explain(outcome, by_fix, specs, max_page, al.block_size, attn_1,
                          al.mamba_page, extra, flags.speculative_method, unify_needed,
                          layout.family, model.unify_from)
    return KVPrediction(
        target_layers=tuple(specs[:len(target)]), drafter_layers=tuple(specs[len(target):]),
        hybrid=layout.hybrid, attention_block_size=al.block_size,
        kernel_block_alignment=al.kernel_alignment, mamba_page_bytes=al.mamba_page or None,
        mamba_padding_pct=al.padding_pct, unify_needed=unify_needed, outcome=outcome,
        padded_by_unify=by_fix, extra_bytes_per_request=extra, max_page_bytes=max_page,
        final_layers=tuple(finals), message=message, cause=cause, fix=fix, flags=flags,
        family=layout.family, cache_dtype=cache_dtype, cache_dtype_source=source,
        mamba_block_size=al.mamba_block_size, mamba_cache_mode=al.mamba_cache_mode,
        prefix_caching=al.prefix_caching, vllm_version=model.version,
        unify_from=model.unify_from, attention_backend=sizing.backend)


def _spec(layer: AttnLayer | MambaLayer, owner: str, al: Alignment, cache_dtype: str,
          model_dtype: str, skip: tuple[str, ...], sizing: Sizing) -> LayerSpec:
    model = sizing.model
    if isinstance(layer, MambaLayer):
        return LayerSpec(
            name=layer.name, owner=owner, kind="mamba", block_size=al.mamba_block_size or 0,
            dtype=layer.dtypes[0], page_bytes=al.padded or layer.page_bytes,
            shapes=layer.shapes, dtypes=layer.dtypes, page_size_padded=al.padded,
            mamba_type=layer.mamba_type)
    dtype = cache_dtype
    if skip and (str(layer.index) in skip or (layer.sliding_window and "sliding_window" in skip)):
        dtype = "auto"  # Attention.__init__: skipped layers keep the model dtype
    # SlidingWindowSpec has no TurboQuant layout; TQFullAttentionSpec is for full layers only
    tq = (tq_slot_size(dtype, layer.head_size)
          if dtype.startswith("turboquant_") and not layer.sliding_window and not layer.mla
          and model.has_class("TQFullAttentionSpec") else None)
    kind = "mla" if layer.mla else "sliding" if layer.sliding_window else "full"
    block = al.block_size
    if kind == "sliding":  # 0.32: a sliding layer picks its own kernel-sized block
        block = model.sliding_block(sizing.backend, block)
    page = model.page(kind, sizing.backend, dtype, model_dtype, layer.num_kv_heads,
                      layer.head_size, block)
    return LayerSpec(
        name=layer.name, owner=owner, kind="sliding" if layer.sliding_window else "full",
        block_size=block, dtype=model_dtype if dtype == "auto" else dtype,
        page_bytes=page, num_kv_heads=layer.num_kv_heads, head_size=layer.head_size,
        sliding_window=layer.sliding_window or None, head_size_v=layer.head_size_v,
        tq_slot=tq, mla=layer.mla, cache_dtype=dtype, model_dtype=model_dtype,
        cache_block_size=al.block_size)


def _refused(exc: VllmRefuses, flags: KVFlags, model: KVModel) -> KVPrediction:
    return KVPrediction(
        target_layers=(), drafter_layers=(), hybrid=False, attention_block_size=0,
        kernel_block_alignment=0, mamba_page_bytes=None, mamba_padding_pct=0.0,
        unify_needed=False, outcome=exc.kind, padded_by_unify=False,
        extra_bytes_per_request=0, max_page_bytes=0, final_layers=(), message=exc.message,
        cause=exc.cause, fix=exc.fix, flags=flags, vllm_version=model.version,
        unify_from=model.unify_from)


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
            "head_size_v": s.head_size_v,
            "dtype": s.dtype,
            "sliding_window": s.sliding_window,
            "tq_slot": s.tq_slot,
            "mla": s.mla,
            "shapes": [list(x) for x in s.shapes] if s.shapes else None,
            "dtypes": list(s.dtypes) if s.dtypes else None,
            "page_size_padded": s.page_size_padded,
            "cache_dtype": s.cache_dtype,
            "model_dtype": s.model_dtype,
            "cache_block_size": s.cache_block_size,
            "backend": prediction.attention_backend,
        }
    return {"specs": specs}


# --- config reading ---------------------------------------------------------------------------

def _architecture(cfg: dict) -> str:
    archs = cfg.get("architectures") or [""]
    return str(archs[0])


def _model_dtype(cfg: dict, text: dict, flags: KVFlags) -> str:
    if flags.model_dtype and flags.model_dtype != "auto":
        return canonical_model_dtype(flags.model_dtype)
    raw = cfg.get("dtype") or cfg.get("torch_dtype") or text.get("dtype") or text.get(
        "torch_dtype") or "float32"
    dtype = canonical_model_dtype(str(raw))
    # _resolve_auto_dtype: float32 checkpoints are served in the platform's preferred
    # dtype, bfloat16 on GB10 (and on AVX512-bf16 CPUs).
    return "bfloat16" if dtype == "float32" else dtype


def _cache_dtype(flags: KVFlags, ckpt, model: KVModel) -> tuple[str, str]:
    """cache_config.cache_dtype once the attention layers exist (how the checkpoint's own
    KV quantization resolves `auto`, and the fp8_e5m2 refusal, were read from vLLM 0.23.0's
    code; a checkpoint that declares no KV quantization leaves `auto` alone in every
    version). Another version: only what does not depend on those readings is predicted
    (0.32 refuses fp8_e5m2 on fewer checkpoints: V32 attention.py:205-220)."""
    if not model.within(READ_023):
        named = ckpt.cache_dtype not in (None, "auto")
        if (flags.kv_cache_dtype == "auto" and named) or (
                flags.kv_cache_dtype == "fp8_e5m2" and ckpt.kv_method):
            raise CannotPredict(
                f"how vLLM {model.version} resolves the checkpoint's own KV quantization "
                f"({ckpt.source or 'its quantization config'}) was read from vLLM 0.23 only")
    if flags.kv_cache_dtype != "auto":
        if flags.kv_cache_dtype == "fp8_e5m2" and ckpt.kv_method:
            raise VllmRefuses(
                "ValueError", "fp8_e5m2 kv-cache is not supported with fp8 checkpoints.",
                "the checkpoint's quantization loads KV scales for FP8 E4M3; vLLM refuses "
                "--kv-cache-dtype fp8_e5m2 with it", "use --kv-cache-dtype fp8 (or auto)")
        return flags.kv_cache_dtype, "--kv-cache-dtype"
    if ckpt.cache_dtype not in (None, "auto"):
        return ckpt.cache_dtype, ckpt.source
    return "auto", "model dtype"


def _skip_layers(flags: KVFlags, layout: ModelLayout, cache_dtype: str,
                 text: dict) -> tuple[str, ...]:
    """--kv-cache-dtype-skip-layers, plus TurboQuant's boundary layers on dense models."""
    skip = set(flags.kv_cache_dtype_skip_layers)
    # TurboQuant's boundary layers (read from vLLM 0.23.0; TurboQuant on others: predict())
    if cache_dtype.startswith("turboquant_") and not layout.hybrid:
        n = int(text.get("num_hidden_layers") or 0)
        k = min(2, n // 2)
        skip |= {str(i) for i in (*range(k), *range(n - k, n))}
    return tuple(sorted(skip))


def _max_model_len(text: dict, flags: KVFlags) -> int:
    if flags.max_model_len:
        return flags.max_model_len
    keys = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
            "model_max_length", "max_target_positions", "max_sequence_length",
            "max_seq_length", "seq_len")
    found = [int(text[k]) for k in keys if isinstance(text.get(k), int)]
    return min(found) if found else 2048


def _check_flags(flags: KVFlags, model: KVModel) -> None:
    if flags.speculative_method not in _SPEC_METHODS:
        raise UserError(
            f"speculative method {flags.speculative_method!r} is not modelled",
            fix=f"use one of {[m for m in _SPEC_METHODS if m]}",
        )
    if flags.tensor_parallel_size < 1 or flags.num_speculative_tokens < 0:
        raise UserError("tensor_parallel_size must be >= 1 and num_speculative_tokens >= 0")
    if flags.block_size is not None and flags.block_size < 1:
        raise UserError("--block-size must be a positive integer")
    v = model.version
    if flags.kv_cache_dtype not in model.cache_dtypes:
        raise UserError(f"--kv-cache-dtype {flags.kv_cache_dtype!r} is not one vLLM {v} accepts "
                        f"(its recorded facts)", fix=f"use one of {model.cache_dtypes}")
    for name, value in (("--mamba-cache-dtype", flags.mamba_cache_dtype),
                        ("--mamba-ssm-cache-dtype", flags.mamba_ssm_cache_dtype)):
        if value not in model.mamba_dtypes:
            raise UserError(f"{name} {value!r} is not one vLLM {v} accepts (its recorded "
                            "facts)", fix=f"use one of {model.mamba_dtypes}")
    if flags.platform not in ("cuda", "cpu"):
        raise UserError(f"platform {flags.platform!r} is not modelled (cuda or cpu)")
    if flags.mamba_cache_mode not in model.mamba_cache_modes:
        raise UserError(f"--mamba-cache-mode {flags.mamba_cache_mode!r} is not one vLLM {v} "
                        f"accepts (its recorded facts)",
                        fix=f"use one of {model.mamba_cache_modes}")


# --- explanation ------------------------------------------------------------------------------

_PIN_FIX = (
    "pin a drafter revision whose KV bytes per token do not exceed the target's and divide "
    "it (e.g. z-lab/Qwen3.6-35B-A3B-DFlash@31977fbe13a86e8b961774f773058175676d89b8)"
)


def _explain(outcome, by_fix, specs, top, block, attn_1, mamba_page, extra, method,
             unify_needed, family, unify_from="") -> tuple[str, str | None]:
    if not specs:
        return "the model keeps no KV cache", None
    biggest = next(s for s in specs if s.page_bytes == top)
    if outcome == "ok" and not by_fix:
        if not unify_needed:
            return "all layers are of one cache type; vLLM does not unify their pages", None
        return (f"every page divides the largest ({top} B, {biggest.name}); attention block "
                f"size {block}"), None
    if by_fix:
        return (
            f"{biggest.name} ({biggest.owner}, {biggest.bytes_per_token} B/token) has the "
            f"largest page ({top} B) at block size {block}; {unify_from} pads the smaller "
            f"pages to {top} B (+{extra} B of recurrent state per request)"
        ), _PIN_FIX + " to avoid the padding cost"
    if outcome == "AssertionError":
        return (
            f"{biggest.name} ({biggest.owner}) stores {biggest.bytes_per_token} B per token, "
            f"more than the target's {attn_1} B; at the attention block size {block} (chosen "
            f"from the target alone) its page of {top} B exceeds the {family} state page "
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
