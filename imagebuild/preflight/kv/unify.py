"""Layer specs and page-size unification (v1/core/kv_cache_utils.py), as the version's own
unify_kv_cache_spec_page_size does it: what it does with a page that differs from the
largest (scale the block, pad the page, or raise) is the recorded behaviour (kv/model.py),
executed from that version's code (or its patched copy), never typed here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class LayerSpec:
    """One layer's cache spec as vLLM builds it, before page-size unification."""

    name: str
    owner: str  # "target" | "drafter"
    kind: str  # "full" | "sliding" | "mamba"
    block_size: int
    dtype: str  # attention: the cache dtype string (model dtype for auto); mamba: first state's
    page_bytes: int  # page_size_bytes, including vLLM's own mamba alignment padding
    num_kv_heads: int | None = None  # per tensor-parallel rank
    head_size: int | None = None
    sliding_window: int | None = None
    shapes: tuple[tuple[int, ...], ...] | None = None  # mamba: state shapes
    dtypes: tuple[str, ...] | None = None  # mamba
    page_size_padded: int | None = None  # mamba
    head_size_v: int | None = None
    tq_slot: int | None = None  # TurboQuant slot bytes per head and token
    mla: bool = False
    mamba_type: str | None = None
    cache_dtype: str | None = None  # attention: the layer's kv_cache_dtype string (or auto)
    model_dtype: str | None = None
    cache_block_size: int | None = None  # the block asked of the layer (cache_config's)

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
    padded: bool = False  # unify padded the page up to the largest (page_size_padded)


def needs_unify(specs: list[LayerSpec] | tuple[LayerSpec, ...]) -> bool:
    """get_kv_cache_groups skips unify when all layers are one spec or one type
    (is_kv_cache_spec_uniform / UniformTypeKVCacheSpecs.is_uniform_type)."""
    if not specs:
        return False
    if len({s.block_size for s in specs}) > 1:
        return True
    kinds = {s.kind for s in specs}
    if kinds == {"full"}:
        return False
    if kinds == {"mamba"}:
        # MambaSpec.is_uniform_with_collection: same num_speculative_blocks (always true here)
        return False
    if kinds == {"sliding"}:
        return len({s.sliding_window for s in specs}) > 1
    return True


def situation(spec: LayerSpec, top: int) -> str:
    """Which recorded probe of unify a layer smaller than the largest page is like."""
    divides = top % spec.page_bytes == 0
    if spec.kind == "mamba":
        return "mamba_divides" if divides else "mamba_not_dividing"
    if divides:
        return "attention_divides"
    return "mla_not_dividing" if spec.mla else "attention_not_dividing"


def simulate_unify(specs: list[LayerSpec] | tuple[LayerSpec, ...],
                   does: Callable[[str], dict[str, Any]]
                   ) -> tuple[str, str, list[FinalLayer]]:
    """unify_kv_cache_spec_page_size with the version's behaviour `does(situation)` (the
    recorded probe: {"does": "scale"|"pad"|"raise", "raises", "message"}).

    Returns (outcome, vLLM's exception text, final layers). Attention pages (also with
    per-token-head scales or packed dtypes) grow linearly with the block size, so scaling
    the block always reaches the largest page exactly; a padded page keeps its block.
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
        got = does(situation(s, top))
        if got["does"] == "scale":
            finals.append(FinalLayer(s.name, s.block_size * (top // s.page_bytes), top))
        elif got["does"] == "pad":
            finals.append(FinalLayer(s.name, s.block_size, top, padded=True))
        else:
            message = str(got.get("message") or "").replace("<layer>", s.name)
            return str(got.get("raises") or "Exception"), message, []
    return "ok", "", finals


def without_hybrid_manager(specs: list[LayerSpec]) -> list[LayerSpec] | None:
    """unify_hybrid_kv_cache_specs (--disable-hybrid-kv-cache-manager): sliding layers become
    full ones when both are present; None when the specs still are not one type (vLLM raises
    ValueError, e.g. for any model with a recurrent state)."""
    if not needs_unify(specs):
        return specs
    kinds = {s.kind for s in specs}
    if "full" in kinds and "sliding" in kinds:
        specs = [replace(s, kind="full") if s.kind == "sliding" else s for s in specs]
    return None if needs_unify(specs) else specs
