"""What a model family's code builds: its cache layers in vLLM's order, plus the model-level
numbers the hybrid block-size alignment reads. Families fill these in (kv/families.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from imagebuild.errors import UserError
from imagebuild.preflight.kv.dtypes import ELEMENT_BYTES
from imagebuild.preflight.kv.errors import CannotPredict


@dataclass(frozen=True)
class AttnLayer:
    """An Attention layer: its KV heads per rank, head sizes and sliding window."""

    name: str
    num_kv_heads: int
    head_size: int
    head_size_v: int
    sliding_window: int | None = None
    mla: bool = False
    index: int | None = None  # extract_layer_index(prefix), for --kv-cache-dtype-skip-layers


@dataclass(frozen=True)
class MambaLayer:
    """A MambaBase layer (mamba1/2, GDN, KDA, short conv, linear attention): its state."""

    name: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    mamba_type: str  # MambaAttentionBackendEnum name (MAMBA1, MAMBA2, GDN_ATTN, ...)

    @property
    def page_bytes(self) -> int:
        return state_bytes(self.shapes, self.dtypes)


@dataclass(frozen=True)
class ModelLayout:
    family: str
    layers: tuple[AttnLayer | MambaLayer, ...]  # registration order (static_forward_context)
    hybrid: bool  # ModelConfig.is_hybrid
    attention_free: bool = False
    # get_mamba_state_shape_from_config / _dtype_from_config: what _align_hybrid_block_size
    # sizes the mamba page from (may differ from the layers' own shapes, see families).
    align_shapes: tuple[tuple[int, ...], ...] = ()
    align_dtypes: tuple[str, ...] = ()
    arch_kv_heads: int = 0  # ModelConfig.get_total_num_kv_heads()
    arch_head_size: int = 0  # ModelConfig.get_head_size()
    mla: bool = False  # ModelConfig.use_mla
    all_mode: bool = False  # supports_mamba_prefix_caching ("all" cache mode)
    chunk_size: int = 2048  # ModelConfig.get_mamba_chunk_size()
    # TurboQuant on hybrids needs identifiable full-attention layers (turboquant/config.py)
    tq_attention_indices: tuple[int, ...] = ()
    # The attention layers this family's MTP module builds (None: no MTP module known;
    # an exception: what vLLM raises when it builds the MTP module for this config)
    mtp: tuple[AttnLayer, ...] | Exception | None = None
    # CacheConfig.sliding_window: the config's window unless layer_types interleave
    cache_window: int | None = None


def state_bytes(shapes: tuple[tuple[int, ...], ...], dtypes: tuple[str, ...]) -> int:
    return sum(math.prod(s) * ELEMENT_BYTES[d] for s, d in zip(shapes, dtypes, strict=True))


class Fields:
    """A config's fields as the config class exposes them: the JSON value, else the class
    default of vLLM 0.23 / transformers 5 (None in `defaults` means: no default)."""

    def __init__(self, family: str, cfg: dict, defaults: dict[str, Any] | None = None):
        self.family = family
        self.cfg = cfg
        self.defaults = defaults or {}

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None or self.defaults.get(key) is not None

    def opt(self, *keys: str) -> Any:
        """The first key present in the JSON, else the first key's class default, else None."""
        for key in keys:
            if self.cfg.get(key) is not None:
                return self.cfg[key]
        return next((self.defaults[k] for k in keys if self.defaults.get(k) is not None), None)

    def get(self, *keys: str) -> Any:
        value = self.opt(*keys)
        if value is None:
            raise CannotPredict(f"{self.family} config.json lacks {' / '.join(keys)} and the "
                                "config class has no default for it")
        return value

    def int(self, *keys: str) -> int:
        value = self.get(*keys)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or (
                isinstance(value, float) and not value.is_integer()):
            raise CannotPredict(f"{self.family} config field {keys[0]} is {value!r}, "
                                "not a whole number")
        return int(value)


def divide(value: int, tp: int, what: str) -> int:
    """vllm.distributed.divide: asserts the tensor-parallel split is exact."""
    if value % tp:
        raise UserError(
            f"tensor_parallel_size {tp} does not divide the {what} ({value})",
            fix="pick a tensor-parallel size that divides the model's heads and state sizes",
        )
    return value // tp


def attention_heads(kv: int, heads: int, tp: int, where: str) -> int:
    """KV heads per rank with the divisibility the attention layers assert."""
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
    return max(1, kv // tp)  # KV heads replicate when fewer than tp


# --- MambaStateShapeCalculator (layers/mamba/mamba_utils.py), conv state in "SD" layout -----

def mamba1_shapes(tp: int, intermediate: int, state: int, kernel: int):
    inner = divide(intermediate, tp, "mamba intermediate size")
    return ((kernel - 1, inner), (inner, state))


def mamba2_shapes(tp: int, intermediate: int, n_groups: int, heads: int, head_dim: int,
                  state: int, kernel: int, num_spec: int = 0):
    # extra_groups_for_head_shards: groups are replicated so each head shard has its group
    if n_groups % tp:
        n_groups += tp - n_groups
    conv_dim = intermediate + 2 * n_groups * state
    return ((kernel - 1 + num_spec, divide(conv_dim, tp, "mamba2 conv dim")),
            (divide(heads, tp, "mamba heads"), head_dim, state))


def gdn_shapes(tp: int, nk: int, nv: int, dk: int, dv: int, kernel: int, num_spec: int):
    conv_dim = dk * nk * 2 + dv * nv
    return ((kernel - 1 + num_spec, divide(conv_dim, tp, "GDN conv dim")),
            (divide(nv, tp, "GDN value heads"), dv, dk))


def short_conv_shapes(tp: int, dim: int, kernel: int):
    return ((kernel - 1, divide(dim, tp, "short conv dim")),)


def linear_attention_shapes(tp: int, heads: int, head_dim: int):
    return ((heads // tp, head_dim, head_dim),)


def kda_shapes(tp: int, heads: int, head_dim: int, kernel: int):
    conv_dim = heads * head_dim + 2 * heads * head_dim
    return ((kernel - 1, divide(conv_dim, tp, "KDA conv dim")),
            (divide(heads, tp, "KDA heads"), head_dim, head_dim))
