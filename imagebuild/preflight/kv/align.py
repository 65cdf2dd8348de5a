"""The attention and mamba block sizes vLLM settles on before any KV page exists.

The kernel block sizes of each backend and the attention page per token come from the
version's recorded facts (kv/model.py). The order of the steps below was read from vLLM
0.23.0's code (platforms/interface.py update_block_size_for_backend and
_align_hybrid_block_size); vLLM 0.32.0 changed the hybrid step (PROCEDURES): the block is
also a multiple of every attention backend's smallest kernel block (lcm), MLA hybrids align
to at least 128 tokens, and there is no "all" mamba cache mode. A version whose procedure
was not read is not aligned (CannotPredict for its hybrids), never with another's.

Order of work in vLLM (which this replays):
1. config: MambaModelConfig.verify_and_update_config (models/config.py) picks the mamba cache
   mode from prefix caching ("all" for SupportsMambaPrefixCaching families, else "align";
   "none" without prefix caching) and a first mamba block size (the block size given or 16 with
   prefix caching, else max_model_len); the CPU platform then starts attention blocks at 128;
2. after the model is built: Platform.update_block_size_for_backend (platforms/interface.py):
   on CUDA the backend's preferred block size unless --block-size was given, then for hybrids
   `_align_hybrid_block_size`: the smallest attention block (a multiple of the kernel
   alignment, in "all" mode of lcm(chunk size, alignment)) whose page covers the mamba page
   sized by get_mamba_state_shape_from_config; the mamba page is padded up to that page;
3. EngineCore._initialize_kv_caches: get_kv_cache_configs first (page-size unification,
   kv/unify.py, whose errors therefore come first), then cache_config.block_size becomes the
   smallest block of the unified groups and VllmConfig.validate_block_size asserts it is
   <= max_num_batched_tokens in "align" mode (check_batched_tokens, called by kvcache after
   unify).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from imagebuild.preflight.kv.dtypes import STORAGE, AttnPage
from imagebuild.preflight.kv.errors import CannotPredict, VllmRefuses
from imagebuild.preflight.kv.layout import ModelLayout, state_bytes
from imagebuild.preflight.kv.model import KVModel

# The hybrid alignment procedures read from vLLM's code, by the versions they were read at
# (platforms/interface.py _align_hybrid_block_size): "0.23" (0.23.0:560-680), "0.32"
# (0.32.0:939-1120: lcm of every backend's kernel block, MLA >= 128 tokens)
PROCEDURES = {"0.23": ">=0.23,<0.24", "0.32": ">=0.32,<0.33"}
# min(get_supported_kernel_block_sizes()) per backend, read from vLLM 0.23.0's backends
# (v1/attention/backends/...), for backends the recorded facts could not import on the CPU
# install they were recorded with (flash_attn, flashinfer, ...): used for 0.23 only.
KERNEL_MIN_023 = {
    "flash_attn": 16, "flashinfer": 16, "triton_attn": 16, "flex_attention": 16,
    "turboquant": 16, "cpu_attn": 16, "rocm_attn": 16, "rocm_aiter_fa": 16,
    "rocm_aiter_unified_attn": 16, "flash_attn_mla": 16, "triton_mla": 16,
    "flashinfer_mla": 32, "flashinfer_mla_sparse": 32, "tokenspeed_mla": 32, "flashmla": 64,
    "flashmla_sparse": 64, "cutlass_mla": 128,
}
MLA_BACKENDS = {"flash_attn_mla", "triton_mla", "flashinfer_mla", "flashinfer_mla_sparse",
                "tokenspeed_mla", "flashmla", "flashmla_sparse", "cutlass_mla"}
# get_preferred_block_size(16) in vLLM 0.23.0: 16 where supported, else the smallest size
PREFERRED_023 = {name: size for name, size in KERNEL_MIN_023.items()}
PREFERRED_023["rocm_aiter_unified_attn"] = 64

CPU_BLOCK_SIZE = 128  # platforms/cpu.py check_and_update_config
DEFAULT_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE


@dataclass(frozen=True)
class Sizing:
    """The KV-relevant serve settings, already resolved (see kv.flags.KVFlags)."""

    platform: str  # "cuda" | "cpu"
    backend: str | None
    default_block_size: int  # where blocks start: 16 on CUDA, 128 on the CPU platform
    kernel_alignment: int  # used when the backend is not known
    tp: int
    cache_dtype: str  # cache_config.cache_dtype after the model is built
    model_dtype: str
    block_size: int | None  # --block-size
    mamba_block_size: int | None  # --mamba-block-size
    mamba_cache_mode: str  # --mamba-cache-mode (default "none")
    prefix_caching: bool | None  # --[no-]enable-prefix-caching (None: vLLM's default)
    chunked_prefill: bool | None
    max_model_len: int
    max_num_batched_tokens: int | None  # --max-num-batched-tokens
    default_max_num_batched_tokens: int | None  # the platform's default (None: unknown)
    model: KVModel  # the version's recorded KV facts
    skip_layers: tuple[str, ...] = ()

    @property
    def procedure(self) -> str | None:
        return next((name for name, spec in PROCEDURES.items() if self.model.within(spec)),
                    None)


@dataclass(frozen=True)
class Alignment:
    block_size: int  # cache_config.block_size: every attention layer's block size
    mamba_block_size: int | None
    mamba_cache_mode: str
    padded: int | None  # cache_config.mamba_page_size_padded
    kernel_alignment: int
    attn_page_1: int  # one token of attention, as _align_hybrid_block_size sizes it
    mamba_page: int  # the mamba page it aligns to (0: not hybrid)
    prefix_caching: bool
    padding_pct: float


def prefix_caching(layout: ModelLayout, sizing: Sizing) -> bool:
    """EngineArgs default: prefix caching is off for hybrid and attention-free models."""
    if sizing.prefix_caching is not None:
        return sizing.prefix_caching
    return not (layout.hybrid or layout.attention_free)


def attn_page_1(layout: ModelLayout, sizing: Sizing) -> int:
    """The one-token attention page _align_hybrid_block_size sizes from the model config."""
    kv = 1 if layout.mla else max(1, layout.arch_kv_heads // sizing.tp)
    head = layout.arch_head_size
    dtype = sizing.cache_dtype
    model = sizing.model
    if layout.mla and sizing.procedure == "0.23":
        # 0.23 builds MLAAttentionSpec(block_size=1, kv_quant_mode=...) here itself, with
        # per-token-head scales the MLA layer's own spec does not have
        storage = sizing.model_dtype if dtype == "auto" else STORAGE[dtype]
        return AttnPage(kv, head, head, dtype, storage, mla=True).bytes(1)
    kind = "mla" if layout.mla else "full"
    page = model.page(kind, sizing.backend, dtype, sizing.model_dtype, kv, head, 1)
    if dtype.startswith("turboquant_") and sizing.skip_layers:
        skip = model.page("full", sizing.backend, "auto", sizing.model_dtype, kv, head, 1)
        return math.lcm(page, skip)
    return page


def kernel_min(sizing: Sizing) -> int:
    """The smallest kernel block of the backend (recorded), else sizing's default."""
    got = sizing.model.kernel_min(sizing.backend)
    if got is not None:
        return got
    if sizing.backend is None:
        return sizing.kernel_alignment
    if sizing.procedure == "0.23" and sizing.backend in KERNEL_MIN_023:
        return KERNEL_MIN_023[sizing.backend]
    raise CannotPredict(f"the kernel block sizes of attention backend {sizing.backend} are "
                        f"not in vLLM {sizing.model.version}'s recorded facts")


def preferred_block(sizing: Sizing) -> int:
    """get_preferred_block_size(16): 16 where the backend takes it, else its smallest."""
    sizes = sizing.model.kernel_sizes(sizing.backend)
    if sizes is None:
        if sizing.backend is None:
            return sizing.default_block_size
        if sizing.procedure == "0.23" and sizing.backend in PREFERRED_023:
            return PREFERRED_023[sizing.backend]
        raise CannotPredict(f"the kernel block sizes of attention backend {sizing.backend} "
                            f"are not in vLLM {sizing.model.version}'s recorded facts")
    default = DEFAULT_BLOCK_SIZE
    if any((s == default) if isinstance(s, int) else default % s["multiple_of"] == 0
           for s in sizes):
        return default
    return min(s if isinstance(s, int) else s["multiple_of"] for s in sizes)


def kernel_alignment(sizing: Sizing, block_size: int) -> int:
    return max(kernel_min(sizing), block_size)


def align(layout: ModelLayout, sizing: Sizing, has_attention: bool) -> Alignment:
    """`has_attention`: some layer (target or drafter) is non-SSM attention; without one,
    update_block_size_for_backend finds no backend and aligns nothing."""
    pc = prefix_caching(layout, sizing)
    user_block = sizing.block_size
    mamba_mode = "none"
    mamba_block: int | None = None
    recurrent = layout.hybrid or layout.attention_free
    if recurrent:
        mamba_mode, mamba_block = _mamba_mode(layout, sizing, pc)
    if user_block is not None:
        block = user_block
    elif sizing.platform == "cpu":
        block = sizing.default_block_size  # CPU_BLOCK_SIZE unless a caller knows better
    else:
        # update_block_size_for_backend phase 1: the backend's preferred block size
        block = preferred_block(sizing)
    if layout.hybrid and has_attention and sizing.procedure is None:
        raise CannotPredict(
            f"how vLLM {sizing.model.version} aligns a hybrid model's attention block to its "
            "recurrent-state page was read from vLLM "
            + " and ".join(PROCEDURES) + " only (platforms/interface.py "
            "_align_hybrid_block_size); this version's is not known")
    alignment = kernel_alignment(sizing, block)
    attn1 = attn_page_1(layout, sizing) if layout.hybrid else 0
    mamba_page = (state_bytes(layout.align_shapes, layout.align_dtypes)
                  if layout.hybrid and layout.align_shapes else 0)
    padded: int | None = None
    pct = 0.0
    if layout.hybrid and has_attention and mamba_page:
        if sizing.procedure == "0.32" and layout.mla:
            alignment = max(alignment, 128)  # TRTLLM/FlashInfer MLA kernel-block invariant
        if mamba_mode == "all":
            base = sizing.mamba_block_size or layout.chunk_size
            chunk = math.lcm(base, alignment)
            need = chunk * cdiv(cdiv(mamba_page, attn1), chunk)
            mamba_block = need
        else:
            need = alignment * cdiv(mamba_page, alignment * attn1)
            if sizing.procedure == "0.32":
                # also a multiple of every backend's smallest kernel block: the predictor
                # knows one backend for target and drafter (see kvcache.predict)
                base = kernel_min(sizing)
                need = base * cdiv(need, base)
        block = max(block, need)
        if mamba_mode == "align":
            mamba_block = block
        page = block * attn1
        if page != mamba_page:
            padded = page
            pct = 100 * (page - mamba_page) / mamba_page
    return Alignment(block, mamba_block, mamba_mode, padded, alignment, attn1, mamba_page, pc,
                     round(pct, 4))


def _mamba_mode(layout: ModelLayout, sizing: Sizing, pc: bool) -> tuple[str, int]:
    """MambaModelConfig.verify_and_update_config and VllmConfig.validate_mamba_block_size."""
    if not pc:
        if sizing.mamba_block_size is not None and sizing.mamba_block_size != sizing.max_model_len:
            raise VllmRefuses(
                "ValueError", "--mamba-block-size can only be set with --enable-prefix-caching",
                "--mamba-block-size is given while prefix caching is off",
                "drop --mamba-block-size or enable prefix caching")
        return "none", sizing.mamba_block_size or sizing.max_model_len
    mode = sizing.mamba_cache_mode
    has_all = "all" in sizing.model.mamba_cache_modes  # 0.32 has only align and none
    if mode == "none":
        mode = "all" if layout.all_mode and has_all else "align"
    if mode == "all" and not (layout.all_mode and has_all):
        mode = "align"
    if mode == "align" and sizing.chunked_prefill is False:
        raise VllmRefuses(
            "AssertionError", "Chunked prefill is required for mamba cache mode 'align'.",
            f"{layout.family} caches its recurrent state in 'align' mode with prefix caching, "
            "which needs chunked prefill", "drop --no-enable-chunked-prefill")
    return mode, sizing.mamba_block_size or sizing.block_size or DEFAULT_BLOCK_SIZE


def check_batched_tokens(block: int, mamba_cache_mode: str, sizing: Sizing) -> None:
    """validate_block_size, after unification: in align mode a block (the smallest of the
    unified groups) must fit in one scheduler step."""
    if mamba_cache_mode != "align":
        return
    limit = sizing.max_num_batched_tokens
    if limit is None and sizing.default_max_num_batched_tokens is not None:
        limit = sizing.default_max_num_batched_tokens
    if limit is not None:
        if block > limit:
            raise VllmRefuses(
                "AssertionError",
                f"In Mamba cache align mode, block_size ({block}) must be <= "
                f"max_num_batched_tokens ({limit}).",
                f"with prefix caching the recurrent state is cached per block of {block} "
                f"tokens, more than one scheduler step ({limit} tokens)",
                f"set --max-num-batched-tokens to at least {block}")
        return
    # CUDA default: 8192 on GPUs with >= 70 GiB (not A100), else 2048 (arg_utils.py)
    if block > 8192:
        raise VllmRefuses(
            "AssertionError",
            f"In Mamba cache align mode, block_size ({block}) must be <= max_num_batched_tokens",
            f"the aligned block of {block} tokens exceeds every default max_num_batched_tokens",
            f"set --max-num-batched-tokens to at least {block}")
    if block > 2048:
        raise CannotPredict(
            f"the aligned attention block is {block} tokens; vLLM asserts it is <= "
            "max_num_batched_tokens, whose default (2048 or 8192) depends on the GPU's memory: "
            f"set --max-num-batched-tokens (>= {block}) to make it certain")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
