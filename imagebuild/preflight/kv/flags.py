"""The serve flags that shape the KV cache, as preflight/kvcache.py and the kv/ modules
read them (below both, so neither imports the other for it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVFlags:
    """The serve flags (and platform facts) that shape the KV cache; names follow `vllm serve`."""

    # whose recorded facts the prediction uses (the cell's engine vllm_version); required
    vllm_version: str | None = None
    tensor_parallel_size: int = 1
    kv_cache_dtype: str = "auto"  # a value the version's CacheDType takes
    mamba_cache_dtype: str = "auto"  # auto|float32|float16|bfloat16
    mamba_ssm_cache_dtype: str = "auto"
    block_size: int | None = None  # --block-size
    num_speculative_tokens: int = 0
    speculative_method: str | None = None  # None|"mtp"|"dflash"|"eagle"|"eagle3"|"ngram"
    attention_backend: str | None = None  # picks the kernel alignment when known
    model_dtype: str | None = None  # --dtype; default from config dtype/torch_dtype
    kernel_block_alignment: int = 16  # used when attention_backend is None or unknown
    # CUDA platforms start from 16; the CPU platform starts from 128 (platforms/cpu.py).
    default_block_size: int = 16
    # --enable-prefix-caching / --no-enable-prefix-caching; None: vLLM's default, which is
    # off for hybrid and attention-free models and on for the rest (EngineArgs).
    enable_prefix_caching: bool | None = None
    max_model_len: int | None = None  # mamba block size when prefix caching is off
    mamba_block_size: int | None = None  # --mamba-block-size
    mamba_cache_mode: str = "none"  # --mamba-cache-mode (none = let vLLM pick)
    enable_chunked_prefill: bool | None = None
    max_num_batched_tokens: int | None = None  # --max-num-batched-tokens
    # the platform's default when the flag is absent; None: unknown (CUDA: 2048 or 8192)
    default_max_num_batched_tokens: int | None = None
    kv_cache_dtype_skip_layers: tuple[str, ...] = ()  # --kv-cache-dtype-skip-layers
    disable_hybrid_kv_cache_manager: bool = False
    platform: str = "cuda"  # "cuda" | "cpu" (vLLM's CPU platform: no MLA, blocks of 128)
