"""KV-cache facts of the installed vLLM, from its own code, executed:

- the values `--kv-cache-dtype`, `--mamba-cache-dtype` and `--mamba-cache-mode` take
  (config/cache.py CacheDType, MambaDType, MambaCacheMode), each cache dtype's storage
  dtype and KV quantization mode (v1/kv_cache_interface.py get_kv_quant_mode);
- the KV-cache spec classes the version has, with their fields;
- per attention layer kind (full, sliding window, MLA), attention backend and cache dtype,
  the page each spec takes per token and KV head, for a grid of head sizes: the spec is
  built by the layer's own `get_kv_cache_spec` (model_executor/layers/attention, called
  with a stand-in for the layer) and, where the version has it, handed to the backend
  as the model runner does (v1/worker/utils.py customize_attention_spec), so a backend
  that packs quantized KV its own way is measured, not assumed;
- the block size a sliding-window layer takes for each requested block size (from 0.32 a
  sliding layer picks its own from its backend's kernel block sizes);
- how `unify_kv_cache_spec_page_size` (v1/core/kv_cache_utils.py) treats each kind of
  page that differs from the largest, by running it on probe specs: scale the block,
  pad the page, or raise (which exception). `--module vllm.v1.core.kv_cache_utils=FILE`
  runs a patched copy of that module instead, so a patch that changes unification is
  recorded from its own code. Where the version's AttentionSpec has
  `indexes_kv_by_block_stride` (0.28), an attention page that does not divide the
  largest is padded only when that flag is set, so those probes are also run with it set
  (`<probe>_by_block_stride`), and each backend's answer is recorded
  (`block_stride_backends`: the backend's own indexes_kv_by_block_stride(), as the model
  runner's get_kv_cache_spec sets it);
- the "one type of layer" shortcut of get_kv_cache_groups on probe specs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Callable
from typing import Any, get_args

from common import Context, header, vllm_root


def _said(exc: BaseException) -> str:
    """An exception as facts record it: paths under site-packages as vllm/... (the venv the
    recorder ran in is no fact of the version)."""
    return f"{type(exc).__name__}: {exc}".replace(str(vllm_root().parent) + "/", "")


SOURCE = ("vLLM's KV-cache spec classes, attention layers, backends and "
          "unify_kv_cache_spec_page_size, executed on probe specs")
HEAD_SIZES = (32, 48, 64, 72, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 512, 576)
MODEL_DTYPES = ("bfloat16", "float16", "float32")
SLIDING_BLOCKS = (1, 8, 16, 32, 48, 64, 96, 128, 256, 512, 1024, 2048, 4096)
# backends whose page model is recorded (when this install can import them)
BACKENDS = ("CPU_ATTN", "FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION",
            "TURBOQUANT", "TRITON_MLA", "FLASHMLA", "CUTLASS_MLA", "FLASHINFER_MLA",
            "FLASH_ATTN_MLA")
UNIFY_MODULE = "vllm.v1.core.kv_cache_utils"


class StandIn:
    """Stands in for a layer or a config object: the attributes given, and a clear error
    naming any other the version's code reads (the recorder then needs teaching)."""

    def __init__(self, what: str, **attrs: Any):
        self.__dict__.update(attrs)
        self._what = what

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the recorder's stand-in {self._what} has no {name!r} (vLLM's "
                             "code reads it: teach imagebuild/facts/recorder/kv.py)")


def _literal(module: Any, name: str) -> list[str] | None:
    value = getattr(module, name, None)
    return [str(v) for v in get_args(value)] if value is not None else None


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def dtypes_facts() -> dict[str, Any]:
    import vllm.config.cache as cache
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.kv_cache_interface import get_kv_quant_mode

    cache_dtypes = _literal(cache, "CacheDType") or []
    return {
        "cache_dtypes": cache_dtypes,
        "mamba_dtypes": _literal(cache, "MambaDType"),
        "mamba_cache_modes": _literal(cache, "MambaCacheMode"),
        "storage": {d: _dtype_name(STR_DTYPE_TO_TORCH_DTYPE[d]) for d in cache_dtypes
                    if d in STR_DTYPE_TO_TORCH_DTYPE},
        "quant_mode": {d: get_kv_quant_mode(d).name for d in cache_dtypes},
    }


def spec_classes() -> dict[str, list[str]]:
    import vllm.v1.kv_cache_interface as kvi

    out = {}
    for name in dir(kvi):
        cls = getattr(kvi, name)
        if (isinstance(cls, type) and issubclass(cls, kvi.KVCacheSpec)
                and dataclasses.is_dataclass(cls)):
            out[name] = sorted(f.name for f in dataclasses.fields(cls) if f.init)
    return out


# --- specs as the layers build them ---------------------------------------------------------

def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def _backends(ctx: Context) -> dict[str, Any]:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    out: dict[str, Any] = {}
    for name in BACKENDS:
        member = AttentionBackendEnum.__members__.get(name)
        if member is None:
            continue
        try:
            out[name] = member.get_class()
        except Exception as exc:  # noqa: BLE001 - not importable on this install
            out[name] = exc
    return out


def _customize() -> Callable[[Any, Any], Any] | None:
    """The model runner's hand-over of a layer's spec to its backend, where it exists."""
    try:
        from vllm.v1.worker.utils import customize_attention_spec
    except ImportError:
        return None
    return customize_attention_spec


def layer_spec(kind: str, backend: Any, cache_dtype: str, model_dtype: str, heads: int,
               head_size: int, block_size: int, window: int = 4096) -> Any:
    """The spec the version's attention layer hands the KV-cache manager for one layer."""
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.kv_cache_interface import AttentionSpec

    model = StandIn("model_config", dtype=_torch_dtype(model_dtype), use_mla=kind == "mla")
    cache = StandIn("cache_config", block_size=block_size, cache_dtype=cache_dtype,
                    skip_page_size_padded=None)
    config = StandIn("vllm_config", model_config=model, cache_config=cache)
    if cache_dtype == "auto":
        torch_dtype = _torch_dtype(model_dtype)
    else:
        from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE

        torch_dtype = STR_DTYPE_TO_TORCH_DTYPE[cache_dtype]
    if kind == "mla":
        from vllm.model_executor.layers.attention.mla_attention import MLAAttention

        layer = StandIn("MLA layer", kv_cache_dtype=cache_dtype, head_size=head_size,
                        sliding_window=None, indexer=None, attn_backend=backend,
                        non_causal_multi_token_decode=False)
        spec = MLAAttention.get_kv_cache_spec(layer, config)
    else:
        from vllm.model_executor.layers.attention.attention import Attention

        layer = StandIn("attention layer", attn_type=AttentionType.DECODER,
                        kv_cache_dtype=cache_dtype, num_kv_heads=heads, head_size=head_size,
                        head_size_v=head_size, kv_cache_torch_dtype=torch_dtype,
                        sliding_window=window if kind == "sliding" else None,
                        attn_backend=backend)
        spec = Attention.get_kv_cache_spec(layer, config)
    customize = _customize()
    if customize is not None and backend is not None and isinstance(spec, AttentionSpec):
        spec = customize(backend, spec)
    return spec


def _per_token_head(kind: str, backend: Any, dtype: str, model_dtype: str, head: int
                    ) -> Any:
    """Bytes per cached token and KV head, checked to scale with tokens and heads; or the
    error vLLM's code raised for this combination."""
    try:
        pages = {(b, h): layer_spec(kind, backend, dtype, model_dtype, h, head, b)
                 for b in (16, 32) for h in (1, 2)}
    except AttributeError as exc:
        if "stand-in" in str(exc):
            raise
        return {"raises": _said(exc)}
    except Exception as exc:  # noqa: BLE001 - a combination the version refuses
        return {"raises": _said(exc)}
    base = pages[(16, 1)]
    if kind == "mla":  # one latent vector per token: no KV heads
        pages = {k: v for k, v in pages.items() if k[1] == 1}
    per = base.page_size_bytes / base.block_size
    heads = {h for _, h in pages}
    linear = all(s.page_size_bytes == per * s.block_size * (h if kind != "mla" else 1)
                 for (_, h), s in pages.items())
    if not linear or per != int(per):
        return {"pages": {f"{b}x{h}": s.page_size_bytes for (b, h), s in pages.items()},
                "class": type(base).__name__}
    out: dict[str, Any] = {"bytes": int(per), "class": type(base).__name__}
    if heads == {1}:
        out["per_head"] = False
    return out


def page_facts(ctx: Context, backends: dict[str, Any]) -> dict[str, Any]:
    """pages[kind][backend or "layer"][dtype][head size] (model dtypes for `auto`)."""
    import vllm.config.cache as cache

    dtypes = [d for d in (_literal(cache, "CacheDType") or []) if d != "auto"]
    columns: dict[str, Any] = {"layer": None}
    if _customize() is not None:
        columns.update({k: v for k, v in backends.items() if not isinstance(v, Exception)})
    out: dict[str, Any] = {}
    for kind in ("full", "sliding", "mla"):
        out[kind] = {}
        for column, backend in columns.items():
            if kind == "mla" and backend is not None and not backend.is_mla():
                continue
            if kind != "mla" and backend is not None and backend.is_mla():
                continue
            table: dict[str, Any] = {}
            for dtype in [*(f"auto:{m}" for m in MODEL_DTYPES), *dtypes]:
                cache_dtype, _, model = dtype.partition(":")
                table[dtype] = _compact({h: _per_token_head(kind, backend, cache_dtype,
                                                            model or "bfloat16", h)
                                         for h in HEAD_SIZES})
            out[kind][column] = table
    return out


def _compact(by_head: dict[int, Any]) -> dict[str, Any]:
    """{"per_dim": a, "constant": c, ...}: bytes per token and KV head = a x head size + c
    for every head size of the grid (checked, not assumed); else the table itself."""
    values = list(by_head.values())
    first = values[0]
    same = {k: v for k, v in first.items() if k != "bytes"}
    if all("bytes" in v and {k: x for k, x in v.items() if k != "bytes"} == same
           for v in values):
        (h0, v0), (h1, v1) = list(by_head.items())[:2]
        per_dim = (v1["bytes"] - v0["bytes"]) / (h1 - h0)
        constant = v0["bytes"] - per_dim * h0
        if all(v["bytes"] == per_dim * h + constant for h, v in by_head.items()):
            return {**same, "per_dim": per_dim, "constant": constant}
    raised = {json_key(v) for v in values}
    if len(raised) == 1 and "raises" in first:
        return first
    return {"by_head_size": {str(h): v for h, v in by_head.items()}}


def json_key(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True)


def sliding_blocks(backends: dict[str, Any]) -> dict[str, Any]:
    """The block size a sliding-window layer's spec ends with, per requested block size."""
    out: dict[str, Any] = {}
    for name, backend in [("layer", None), *backends.items()]:
        if isinstance(backend, Exception) or (backend is not None and backend.is_mla()):
            continue
        row = {}
        for block in SLIDING_BLOCKS:
            try:
                row[str(block)] = layer_spec("sliding", backend, "auto", "bfloat16", 1, 128,
                                             block).block_size
            except Exception as exc:  # noqa: BLE001
                if "stand-in" in str(exc):
                    raise
                row[str(block)] = {"raises": _said(exc)}
        out[name] = row
    return out


def kernel_block_sizes(backends: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, backend in backends.items():
        if isinstance(backend, Exception):
            out[name] = {"unavailable": _said(backend)}
            continue
        try:
            sizes = backend.get_supported_kernel_block_sizes()
        except Exception as exc:  # noqa: BLE001
            out[name] = {"raises": _said(exc)}
            continue
        out[name] = {"sizes": [s if isinstance(s, int) else {"multiple_of": s.base}
                               for s in sizes]}
    return out


# --- unification ----------------------------------------------------------------------------

def load_unify(path: str | None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    if not path:
        from vllm.v1.core.kv_cache_utils import unify_kv_cache_spec_page_size

        return unify_kv_cache_spec_page_size
    spec = importlib.util.spec_from_file_location("imagebuild_recorded_kv_cache_utils", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"recorder: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module.unify_kv_cache_spec_page_size


def _build(cls: type, **values: Any) -> Any:
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    return cls(**{k: v for k, v in values.items() if k in names and v is not None})


STRIDE_FIELD = "indexes_kv_by_block_stride"  # 0.28's AttentionSpec: padding allowed


def _probe_spec(kind: str, page_units: int, by_stride: bool | None = None) -> Any:
    """A spec whose page is page_units x 1 KiB at block size 16 (bf16, one KV head);
    by_stride: its indexes_kv_by_block_stride (where the spec has the field)."""
    import torch
    import vllm.v1.kv_cache_interface as kvi

    if kind == "mamba":
        return _build(kvi.MambaSpec, block_size=16, shapes=((page_units * 512,),),
                      dtypes=(torch.bfloat16,))
    head = page_units * 1024 // (16 * 2 * 2)  # K and V, 2 bytes each, 16 tokens
    stride = {STRIDE_FIELD: by_stride}
    if kind == "mla":
        return _build(kvi.MLAAttentionSpec, block_size=16, num_kv_heads=1,
                      head_size=page_units * 1024 // (16 * 2), dtype=torch.bfloat16,
                      cache_dtype_str="auto", **stride)
    return _build(kvi.FullAttentionSpec, block_size=16, num_kv_heads=1, head_size=head,
                  head_size_v=head, dtype=torch.bfloat16, **stride)


def _has_stride_field() -> bool:
    import vllm.v1.kv_cache_interface as kvi

    return STRIDE_FIELD in {f.name for f in dataclasses.fields(kvi.AttentionSpec) if f.init}


def block_stride_backends(backends: dict[str, Any]) -> dict[str, bool]:
    """Each importable backend's indexes_kv_by_block_stride(), read under a default
    config as v1/worker/gpu_model_runner.py get_kv_cache_spec reads it (0.28: the backend's
    KV stride order with and without the layers dimension); empty where vLLM has none."""
    from vllm.config import VllmConfig, set_current_vllm_config

    out: dict[str, bool] = {}
    with set_current_vllm_config(VllmConfig()):
        for name, backend in backends.items():
            if not isinstance(backend, Exception) and hasattr(backend, STRIDE_FIELD):
                out[name] = bool(getattr(backend, STRIDE_FIELD)())
    return out


LAYER = "<layer>"
# (probe name, the layer that differs from the largest, its page units, the largest's)
UNIFY_PROBES = (
    ("attention_divides", "full", 2, 4),
    ("attention_not_dividing", "full", 3, 4),
    ("mla_not_dividing", "mla", 3, 4),
    ("mamba_divides", "mamba", 2, 4),
    ("mamba_not_dividing", "mamba", 3, 4),
)


def unify_facts(unify: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """What unify does with a layer whose page differs from the largest: `scale` (block
    size times the ratio), `pad` (page_size_padded up to the largest) or the exception."""
    out: dict[str, Any] = {}
    probes: list[tuple[str, str, int, int, bool | None]] = [
        (name, kind, small, large, None) for name, kind, small, large in UNIFY_PROBES]
    if _has_stride_field():
        probes += [(f"{name}_by_block_stride", kind, small, large, True)
                   for name, kind, small, large in UNIFY_PROBES if kind != "mamba"]
    for name, kind, small, large, by_stride in probes:
        # the differing layer is named LAYER, so a message vLLM words with the layer's name
        # reads as a template (the predictor puts the real name in)
        specs = {"largest": _probe_spec("full", large, by_stride),
                 LAYER: _probe_spec(kind, small, by_stride)}
        entry: dict[str, Any] = {"layer": kind, "page": small * 1024, "largest": large * 1024}
        try:
            got = unify(specs)[LAYER]
        except Exception as exc:  # noqa: BLE001 - the exception is the behaviour
            entry.update(does="raise", raises=type(exc).__name__, message=str(exc))
        else:
            padded = getattr(got, "page_size_padded", None)
            entry["does"] = ("pad" if padded == large * 1024 and got.block_size == 16 else
                             "scale" if got.block_size == 16 * large // small else "other")
            entry.update(block_size=got.block_size, page_size_bytes=got.page_size_bytes)
        out[name] = entry
    return out


def shortcut_facts() -> dict[str, Any]:
    """get_kv_cache_groups's skip of unification ("one type of layer") on probe specs."""
    import torch
    import vllm.v1.kv_cache_interface as kvi
    from vllm.v1.core.kv_cache_utils import is_kv_cache_spec_uniform

    def full(heads: int) -> Any:
        return _build(kvi.FullAttentionSpec, block_size=16, num_kv_heads=heads,
                      head_size=64, dtype=torch.bfloat16)

    def sliding(window: int) -> Any:
        return _build(kvi.SlidingWindowSpec, block_size=16, num_kv_heads=1, head_size=64,
                      dtype=torch.bfloat16, sliding_window=window)

    mamba = _build(kvi.MambaSpec, block_size=16, shapes=((64,),), dtypes=(torch.float32,))
    probes = {"full_other_heads": {"a": full(1), "b": full(2)},
              "sliding_same_window": {"a": sliding(512), "b": sliding(512)},
              "sliding_other_window": {"a": sliding(512), "b": sliding(1024)},
              "full_and_sliding": {"a": full(1), "b": sliding(512)},
              "mamba_and_full": {"a": mamba, "b": full(1)}}
    out = {}
    for name, specs in probes.items():
        uniform_type = getattr(kvi, "UniformTypeKVCacheSpecs", None)
        skip = bool(is_kv_cache_spec_uniform(specs)) or bool(
            uniform_type is not None and uniform_type.is_uniform_type(specs))
        out[name] = {"skips_unify": skip}
    return out


def record(ctx: Context) -> dict[str, Any]:
    patched = (ctx.options.get("modules") or {}).get(UNIFY_MODULE)
    if patched:  # a patch set's unification only: the rest of the version is the stock one
        return {**header("kv", SOURCE + " (patched " + UNIFY_MODULE + ")"),
                "unify": unify_facts(load_unify(patched))}
    backends = _backends(ctx)
    stride = {"block_stride_backends": block_stride_backends(backends)} if (
        _has_stride_field()) else {}
    return {**header("kv", SOURCE), **dtypes_facts(), "spec_classes": spec_classes(),
            **stride,
            "customize_spec": _customize() is not None,
            "kernel_block_sizes": kernel_block_sizes(backends),
            "sliding_block_size": sliding_blocks(backends),
            "pages": page_facts(ctx, backends),
            "unify": unify_facts(load_unify(None)), "shortcut": shortcut_facts()}
