"""From the two runs' answers to each gate's status and reason.

Order of judgement: a run that cannot be trusted (the server restarted) says only that;
then errors and real mismatches fail; then a truncated answer or too few compared tokens
are untrusted (too little evidence to pass); then the tie rate. Nothing passes by default:
`pass` needs every request answered in full and compared."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from imagebuild.gates import FAIL, NOT_APPLICABLE, PASS, UNTRUSTED
from imagebuild.gates.client import Generation
from imagebuild.gates.collapse import collapse_reason, entropy, tail, tail_loop
from imagebuild.gates.compare import MISMATCH, TIE, Comparison, compare
from imagebuild.spec.gates import LongGenerationGate, LosslessGate


@dataclass
class GateResult:
    status: str
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)


def _errors(runs: dict[str, list[Generation]]) -> list[str]:
    return [f"{g.name} on the {what} server: {g.error}" for what, gens in runs.items()
            for g in gens if g.error]


def _truncated(runs: dict[str, list[Generation]]) -> list[str]:
    return [f"{g.name} on the {what} server: {len(g.tokens)} of {g.max_tokens} tokens "
            f"(finish_reason {g.finish_reason})" for what, gens in runs.items()
            for g in gens if g.truncated]


def lossless(spec: list[Generation], ref: list[Generation], s: LosslessGate, *,
             untrusted: str | None) -> GateResult:
    comps = [compare(a, b, s.tie_logprob_epsilon) for a, b in zip(spec, ref, strict=True)
             if not (a.error or b.error)]
    compared = sum(c.compared for c in comps)
    ties = [c for c in comps if c.kind == TIE]
    bad = [c for c in comps if c.kind == MISMATCH]
    rate = len(ties) / len(spec) if spec else 0.0
    detail = {"requests": len(spec), "compared_tokens": compared, "ties": len(ties),
              "tie_rate": round(rate, 4), "comparisons": [c.as_json() for c in comps]}

    def result(status: str, reason: str) -> GateResult:
        return GateResult(status, reason, detail)

    runs = {"speculative": spec, "plain": ref}
    if untrusted:
        return result(UNTRUSTED, untrusted)
    if errors := _errors(runs):
        return result(FAIL, f"{len(errors)} request(s) failed: " + "; ".join(errors))
    if bad:
        return result(FAIL, bad[0].divergence.reason if bad[0].divergence else "mismatch")
    if truncated := _truncated(runs):
        return result(UNTRUSTED, "truncated answer(s): " + "; ".join(truncated))
    if rate > s.max_tie_rate:
        return result(FAIL, f"{len(ties)} of {len(spec)} requests ended in a numerical tie "
                            f"(rate {rate:.2f} > max_tie_rate {s.max_tie_rate}); first: "
                            + (ties[0].divergence.reason if ties[0].divergence else ""))
    if compared < s.min_compared_tokens:
        return result(UNTRUSTED, f"only {compared} tokens compared (min_compared_tokens "
                                 f"{s.min_compared_tokens}): too little to call it lossless")
    n = len(spec)
    return result(PASS, f"{n} request{'s' if n != 1 else ''}, {compared} tokens identical to "
                        "plain decoding"
                        + (f", {len(ties)} numerical tie(s) within epsilon "
                           f"{s.tie_logprob_epsilon}" if ties else ""))


def not_applicable() -> GateResult:
    return GateResult(NOT_APPLICABLE, "the cell has no drafter: nothing to compare",
                      {"requests": 0, "compared_tokens": 0, "ties": 0, "tie_rate": 0.0})


def _shape(g: Generation) -> dict[str, Any]:
    loop = tail_loop(g.tokens)
    return {"tokens": len(g.tokens), "tail_entropy_bits": round(entropy(tail(g.tokens)), 3),
            "loop": {"period": loop.period, "start": loop.start} if loop else None}


def long_generation(run: Generation, ref: Generation | None, s: LongGenerationGate, *,
                    epsilon: float, untrusted: str | None) -> GateResult:
    """`run`: the cell as it ships; `ref`: the plain run (None for a cell without a
    drafter, whose own run is the plain decoding: checked against its own first half)."""
    detail: dict[str, Any] = {"tokens": len(run.tokens), "requested": s.tokens,
                              "run": _shape(run), "plain": _shape(ref) if ref else None}

    def result(status: str, reason: str) -> GateResult:
        return GateResult(status, reason, detail)

    if untrusted:
        return result(UNTRUSTED, untrusted)
    gens = [run] + ([ref] if ref else [])
    if errors := _errors({"tested": gens}):
        return result(FAIL, "; ".join(errors))
    if truncated := _truncated({"tested": gens}):
        return result(UNTRUSTED, "truncated: " + "; ".join(truncated))
    equal_to = None
    if ref is not None:
        comp: Comparison = compare(run, ref, epsilon)
        detail["comparison"] = comp.as_json()
        if comp.kind == MISMATCH and comp.divergence:
            return result(FAIL, comp.divergence.reason)
        equal_to = comp.compared - (1 if comp.divergence else 0)
        why = collapse_reason(run.tokens, ref.tokens, s.min_entropy_ratio)
    else:  # no reference run: the second half against the first
        half = len(run.tokens) // 2
        why = collapse_reason(run.tokens[half:], run.tokens[:half], s.min_entropy_ratio,
                              what="the second half", ref_what="the first half")
    if why:
        return result(FAIL, f"collapse after {len(run.tokens)} tokens: {why}")
    same = ("" if equal_to is None else
            f", identical to plain decoding for all {equal_to} tokens" if equal_to == len(
                run.tokens) else f", identical to plain decoding up to token {equal_to} "
                                 "(then a numerical tie)")
    return result(PASS, f"{len(run.tokens)} tokens without errors or collapse{same}")
