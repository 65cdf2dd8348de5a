"""Layer specs and page-size unification (vLLM 0.23 v1/core/kv_cache_utils.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace


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


def simulate_unify(
    specs: list[LayerSpec] | tuple[LayerSpec, ...], pad_mamba: bool = False
) -> tuple[str, str, list[FinalLayer]]:
    """unify_kv_cache_spec_page_size, plus the dflashfix mamba padding when pad_mamba.

    Returns (outcome, vLLM's exception text, final layers). dflashfix is modelled as: a mamba
    page smaller than the largest is padded up to it before the divisibility check. Attention
    pages (also per-token-head scales, NVFP4 and TurboQuant ones) grow linearly with the block
    size, so scaling the block size always reaches the largest page exactly.
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
