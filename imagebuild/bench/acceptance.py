"""The acceptance gate: a drafter that accepts fewer tokens than `latest`'s keeps a release
from latest, per concurrency level, like tok/s (bench/compare.py).

Why a gate of its own: tok/s at c=1 hides an acceptance collapse (a drafter accepting ~4
of 15 drafted tokens on a quantized target still decodes, just without the speed-up it
is shipped for), and at high concurrency the batch hides it too. The figures are vLLM's
own counters (`/metrics`, bench/metrics.py), read around each level: the acceptance rate
(accepted / drafted tokens) and the mean accepted length (tokens per draft round). A
release whose rate or mean length at any level falls more than the target's
`bench.acceptance_threshold` (else `publish.acceptance_threshold`) below latest's does
not become latest unless a reason is given (`--accept-acceptance-drop REASON`).

Figures that cannot be compared are never passed silently: a cell with a drafter whose
level shows no speculative metrics (nothing drafted, or the counters were not read),
counters that went backwards or accept more than was drafted (the server restarted
during the level: its counters started again from zero), or too few drafted tokens to
make a rate. Those stop promotion like flagged bench figures do (bench/gate.py), and
`--accept-untrusted-bench REASON` ("we could not tell") lets it through.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# fewer drafted tokens than this at a level and one accepted token moves the rate by more
# than a typical threshold: no rate to compare (the cpu bench drafts ~290 per level)
MIN_DRAFT_TOKENS = 50


@dataclass(frozen=True)
class Acceptance:
    rate: float  # accepted / drafted tokens
    mean_length: float  # tokens per draft round: accepted + the target's own
    draft_tokens: float


def level_acceptance(lv: dict[str, Any]) -> tuple[Acceptance | None, str | None]:
    """(figures, None) or (None, why there are none to trust) for one level summary."""
    sd = lv.get("spec_decode")
    if not sd:
        return None, "no speculative metrics (nothing was drafted, or /metrics was not read)"
    try:
        drafts, drafted, accepted = (float(sd[k]) for k in ("drafts", "draft_tokens",
                                                              "accepted_tokens"))
    except (KeyError, TypeError, ValueError):
        return None, "speculative metrics incomplete (drafts, draft and accepted tokens)"
    if drafts < 0 or drafted < 0 or accepted < 0 or accepted > drafted:
        return None, (f"speculative counters went backwards or exceed what was drafted "
                      f"({accepted:g} accepted of {drafted:g}): the server restarted "
                      "during the level")
    if drafted < MIN_DRAFT_TOKENS or drafts <= 0:
        return None, (f"only {drafted:g} tokens drafted (< {MIN_DRAFT_TOKENS}): too few "
                      "for a rate")
    return Acceptance(accepted / drafted, 1 + accepted / drafts, drafted), None


def by_level(doc: dict[str, Any]) -> dict[int, tuple[Acceptance | None, str | None]]:
    return {int(lv["concurrency"]): level_acceptance(lv) for lv in doc.get("levels", [])}


def speculative(doc: dict[str, Any]) -> bool:
    """Whether any level of the run drafted (a plain cell's never does)."""
    return any(lv.get("spec_decode") for lv in doc.get("levels", []))


@dataclass(frozen=True)
class Drop:
    concurrency: int
    candidate: Acceptance
    baseline: Acceptance

    @property
    def rate_change(self) -> float:
        return self.candidate.rate / self.baseline.rate - 1 if self.baseline.rate else 0.0

    @property
    def length_change(self) -> float:
        return self.candidate.mean_length / self.baseline.mean_length - 1

    def line(self) -> str:
        c, b = self.candidate, self.baseline
        return (f"c={self.concurrency}: acceptance {c.rate:.2f} vs {b.rate:.2f} "
                f"({self.rate_change:+.1%}), mean accepted length {c.mean_length:.2f} vs "
                f"{b.mean_length:.2f} ({self.length_change:+.1%})")


@dataclass
class Comparison:
    applicable: bool  # False: a cell without a drafter (nothing to compare)
    drops: list[Drop]
    problems: dict[int, list[str]]  # level -> why its figures cannot be compared
    compared: list[int]  # levels compared


def compare(candidate: dict[str, Any], baseline: dict[str, Any], threshold: float, *,
            drafter: bool | None = None) -> Comparison:
    """Per level run by both (as the tok/s gate: a level only one side ran is not
    compared): drops beyond `threshold` (rate or mean length), and the levels whose
    figures cannot be compared. `drafter`: whether the cell speculates
    (None: whether either run drafted at all)."""
    if drafter is None:
        drafter = speculative(candidate) or speculative(baseline)
    if not drafter:
        return Comparison(False, [], {}, [])
    mine, theirs = by_level(candidate), by_level(baseline)
    drops, problems, compared = [], {}, []
    for c in sorted(set(mine) & set(theirs)):
        (cand, why), (base, why_base) = mine[c], theirs[c]
        reasons = ([why] if why else []) + ([f"latest: {why_base}"] if why_base else [])
        if reasons or cand is None or base is None:
            problems[c] = reasons
            continue
        compared.append(c)
        if (cand.rate < base.rate * (1 - threshold)
                or cand.mean_length < base.mean_length * (1 - threshold)):
            drops.append(Drop(c, cand, base))
    return Comparison(True, drops, problems, compared)
