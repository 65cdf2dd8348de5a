"""Token-by-token comparison of the speculative run with the plain one, and what the
first divergence of a request is.

Both runs are greedy on the same image and prompt, so every token must be equal. At the
first position where they differ the comparison of that request ends (what follows is
generated from different contexts). The divergence is classified with both runs'
logprobs of both tokens: when the two tokens are within `epsilon` of each other in
*both* runs, greedy decoding flipped between near-equal candidates (a numerical tie:
batch-shape-dependent kernels, vllm#42517); otherwise the speculative path produced a
token plain decoding would not have, which is exactly the loss speculative decoding
promises never to cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from imagebuild.gates.client import TOP_LOGPROBS, Generation

MATCH, TIE, MISMATCH = "match", "tie", "mismatch"


@dataclass(frozen=True)
class Divergence:
    position: int  # 0-based index among the generated tokens
    spec_token: int
    ref_token: int
    # logprob of each token in each run; None: not among that run's top-k there
    spec_lp_spec: float | None
    spec_lp_ref: float | None
    ref_lp_spec: float | None
    ref_lp_ref: float | None
    kind: str  # TIE | MISMATCH
    reason: str

    def as_json(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 4)
        return {"position": self.position, "kind": self.kind, "reason": self.reason,
                "speculative": {"token": self.spec_token,
                                "logprobs": {"speculative_token": r(self.spec_lp_spec),
                                             "plain_token": r(self.spec_lp_ref)}},
                "plain": {"token": self.ref_token,
                          "logprobs": {"speculative_token": r(self.ref_lp_spec),
                                       "plain_token": r(self.ref_lp_ref)}}}


@dataclass(frozen=True)
class Comparison:
    name: str
    compared: int  # positions compared (up to and including a divergence)
    divergence: Divergence | None

    @property
    def kind(self) -> str:
        return self.divergence.kind if self.divergence else MATCH

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "compared_tokens": self.compared, "result": self.kind,
                "divergence": self.divergence.as_json() if self.divergence else None}


def _fmt(x: float | None) -> str:
    return f"{x:.4f}" if x is not None else f"not in its top-{TOP_LOGPROBS}"


def classify(pos: int, spec: Generation, ref: Generation, epsilon: float) -> Divergence:
    a, b = spec.tokens[pos], ref.tokens[pos]
    s_a, s_b = spec.logprob_of(pos, a), spec.logprob_of(pos, b)
    r_a, r_b = ref.logprob_of(pos, a), ref.logprob_of(pos, b)
    gaps = [abs(x - y) for x, y in ((s_a, s_b), (r_a, r_b)) if x is not None and y is not None]
    tie = len(gaps) == 2 and max(gaps) < epsilon
    where = (f"{spec.name} token {pos}: speculative decoding emitted {a} (logprob "
             f"{_fmt(s_a)} in the speculative run, {_fmt(r_a)} in the plain run) where plain "
             f"decoding emitted {b} ({_fmt(r_b)} plain, {_fmt(s_b)} speculative)")
    if tie:
        reason = (f"{where}: a numerical tie, the two differ by at most {max(gaps):.4f} < "
                  f"epsilon {epsilon} in both runs")
    elif len(gaps) < 2:
        reason = (f"{where}: not a tie, one token is not among the other run's top-"
                  f"{TOP_LOGPROBS} candidates")
    else:
        reason = (f"{where}: not a tie, they differ by {max(gaps):.4f} >= epsilon "
                  f"{epsilon}: the speculative path changed the output")
    return Divergence(pos, a, b, s_a, s_b, r_a, r_b, TIE if tie else MISMATCH, reason)


def compare(spec: Generation, ref: Generation, epsilon: float) -> Comparison:
    """The first divergence of two error-free runs of one request (None: equal as far as
    both go)."""
    n = min(len(spec.tokens), len(ref.tokens))
    for pos in range(n):
        if spec.tokens[pos] != ref.tokens[pos]:
            return Comparison(spec.name, pos + 1, classify(pos, spec, ref, epsilon))
    return Comparison(spec.name, n, None)
