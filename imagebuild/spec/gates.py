"""matrix.yaml `targets.<name>.gates`: the thresholds of the release gates (imagebuild/gates).

Every field has a default (docs/release-gates.md lists them); a target sets only what
differs, e.g. the cpu target's long generation is bounded by its tiny model's context.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    # as spec/config.py's Strict: unknown keys are errors, no silent coercion
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True,
                              use_attribute_docstrings=True)  # field docs: schema, reference


class LosslessGate(_Strict):
    """The speculative server against the same image without `--speculative-config`."""

    tie_logprob_epsilon: float = Field(default=0.05, gt=0, le=5)
    """A first divergence between two tokens whose logprobs differ by less than this (nats,
    in both runs) is a numerical tie: batch-shape-dependent kernels, not a lost token."""
    max_tie_rate: float = Field(default=0.25, ge=0, le=1)
    """The share of requests allowed to end in a tie; more fails the cell."""
    max_tokens: int = Field(default=256, ge=8, le=1 << 20)
    """Tokens generated per short request."""
    min_compared_tokens: int = Field(default=256, ge=1, le=1 << 24)
    """Fewer tokens compared in total (a tie ends a request's comparison) is untrusted."""
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    """The sampling seed of every gate request (temperature 0 as well)."""


class LongGenerationGate(_Strict):
    """One request generated to `tokens`: errors, equality with the non-speculative run,
    collapse (a repetition loop the reference does not have; entropy far below its)."""

    tokens: int = Field(default=16384, ge=32, le=1 << 20)
    """Tokens the long request generates (bounded by the profile's max-model-len)."""
    min_entropy_ratio: float = Field(default=0.5, gt=0, le=1)
    """The tail's token distribution must keep this share of the reference's entropy."""


class AcceptanceDecayGate(_Strict):
    """Acceptance per draft position over a long generation, window by window (vLLM's
    `vllm:spec_decode_num_accepted_tokens_per_pos`): DFlash with prefix caching was seen
    to decay towards 0 while staying lossless."""

    tokens: int = Field(default=4096, ge=32, le=1 << 20)
    """Tokens generated in all, as `windows` requests each continuing the one before
    (bounded by max-model-len)."""
    windows: int = Field(default=4, ge=2, le=64)
    """The generation's windows, first to last: one continuation request each."""
    min_ratio: float = Field(default=0.25, gt=0, le=1)
    """The last window's accepted tokens per draft must keep this share of the first's."""
    min_drafts: int = Field(default=8, ge=1, le=1 << 20)
    """Draft rounds the first and the last part must hold: a first (last) window with
    fewer takes in the next (previous) until it does; parts that would overlap are too
    little to judge (untrusted)."""


class ConditionsGate(_Strict):
    """Speculative decoding against plain decoding under the conditions that break it
    (vllm#43559, vllm#54928): prefix-cache hits, shared prefixes, the profile's
    concurrency, preemption, a prompt near max-model-len (docs/release-gates.md)."""

    max_tokens: int = Field(default=32, ge=8, le=1 << 20)
    """Tokens per request of the repeat, shared-prefix and concurrent loads."""
    max_concurrency: int = Field(default=16, ge=2, le=1024)
    """The concurrent and preemption loads send min(max-num-seqs, this) requests at once."""
    max_prompt_tokens: int = Field(default=65536, ge=64, le=1 << 24)
    """A condition whose load needs more prompt tokens than this is not run (and says
    so): preempting a large KV pool, or a prompt near a long max-model-len."""
    near_max_len_tokens: int = Field(default=16, ge=4, le=4096)
    """Tokens the near-max-model-len request generates after a prompt filling the rest."""
    acceptance_decay: AcceptanceDecayGate = Field(default_factory=AcceptanceDecayGate)
    """Acceptance per draft position over the long generation."""


class GateSettings(_Strict):
    """The thresholds of the release gates a target's cells must pass before publish."""

    lossless: LosslessGate = Field(default_factory=LosslessGate)
    """Speculative decoding against plain decoding, token by token."""
    long_generation: LongGenerationGate = Field(default_factory=LongGenerationGate)
    """One long request: errors, equality, collapse."""
    conditions: ConditionsGate = Field(default_factory=ConditionsGate)
    """Losslessness under prefix-cache hits, concurrency, preemption, a long prompt."""
