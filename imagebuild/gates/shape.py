"""What the condition loads are cut to, learned from the server as it runs and from its
serve command: vLLM's own resolved cache settings (KV block size, blocks in the pool,
prefix caching on or off: `vllm:cache_config_info`), its max-model-len (`/v1/models`),
max-num-seqs, max-num-batched-tokens and the draft length (the command), and the pool
text's token ids (`/tokenize`: prompts of exact token lengths, sent as ids)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import requests

from imagebuild.expectations import argv_command
from imagebuild.facts import facts_for
from imagebuild.gates.metrics import read
from imagebuild.gates.prompts import POOL_TEXT
from imagebuild.serving.runspec import SPEC_FLAG


@dataclass(frozen=True)
class ServerShape:
    block_size: int  # tokens per KV block: vLLM caches and shares whole blocks only
    kv_blocks: int  # blocks in the KV pool
    prefix_caching: bool  # as vLLM resolved it
    max_model_len: int
    max_num_seqs: int | None  # None: the command leaves it to vLLM
    max_batched_tokens: int | None
    spec_tokens: int  # num_speculative_tokens; 0 without --speculative-config

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ServerShape:
        return cls(**d)


def _int(v: object) -> int | None:
    try:
        return int(str(v))
    except (TypeError, ValueError):
        return None


def spec_tokens(argv: Sequence[str]) -> int:
    raw = argv_command([str(a) for a in argv]).flag(SPEC_FLAG.removeprefix("--"))
    try:
        return int(json.loads(raw).get("num_speculative_tokens") or 0) if isinstance(
            raw, str) else 0
    except (ValueError, AttributeError):
        return 0


def read_shape(base_url: str, argv: Sequence[str]) -> ServerShape:
    """Raises ValueError when the server does not say what the loads need."""
    _, info = read(base_url)
    r = requests.get(f"{base_url}/v1/models", timeout=10)
    r.raise_for_status()
    max_len = _int(r.json()["data"][0].get("max_model_len"))
    block, blocks = _int(info.get("block_size")), _int(info.get("num_gpu_blocks"))
    if not (block and blocks and max_len):
        raise ValueError(f"the server does not say its KV block size, pool or max-model-len "
                         f"(vllm:cache_config_info block_size={info.get('block_size')!r}, "
                         f"num_gpu_blocks={info.get('num_gpu_blocks')!r}; /v1/models "
                         f"max_model_len={max_len!r})")
    cmd = argv_command([str(a) for a in argv])
    return ServerShape(block, blocks, info.get("enable_prefix_caching") == "True", max_len,
                       _int(cmd.flag("max-num-seqs")), _int(cmd.flag("max-num-batched-tokens")),
                       spec_tokens(argv))


def token_pool(base_url: str, model: str) -> tuple[int, ...]:
    """The pool text's token ids in this server's tokenizer."""
    r = requests.post(f"{base_url}/tokenize", json={"model": model, "prompt": POOL_TEXT,
                                                    "add_special_tokens": False}, timeout=30)
    r.raise_for_status()
    return tuple(int(t) for t in r.json()["tokens"])


PREFIX_FLAG = "enable-prefix-caching"
# How a version resolves an unset --enable-prefix-caching, read in its code. 0.23.0:
# engine/arg_utils.py _set_default_chunked_prefill_and_prefix_caching_args takes
# ModelConfig.is_prefix_caching_supported (config/model.py): True for a decoder-only
# generative model, False for a hybrid, attention-free or encoder-decoder one.
RESOLVED = {"0.23.0": ": on for a decoder-only model, off for a hybrid one"}


def prefix_caching_source(argv: Sequence[str], vllm_version: str | None) -> str:
    """Where the server's prefix-caching setting comes from, in words: the profile's flag,
    or vLLM's own default (its recorded serve parser's, and how vLLM resolves it)."""
    cmd = argv_command([str(a) for a in argv])
    for flag in (f"no-{PREFIX_FLAG}", PREFIX_FLAG):
        if cmd.flag(flag) is True:
            return f"the profile: --{flag}"
    version = vllm_version or "of the image"
    facts = facts_for(vllm_version) if vllm_version else None
    opts = ((facts.serve_args if facts else None) or {}).get("options") or {}
    if PREFIX_FLAG not in opts:
        return f"left to vLLM {version}, whose serve parser is not recorded"
    how = RESOLVED.get(version, "")
    return (f"left to vLLM {version}: its serve parser's default is "
            f"{opts[PREFIX_FLAG].get('default')!r} ({facts.said if facts else ''}), which vLLM "
            f"resolves at start from the model{how}")
