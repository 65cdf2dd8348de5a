"""Collapse of a long generation: a repetition loop at its end, and how varied its tokens
are (Shannon entropy of their distribution), each judged against a reference output.

A greedy run of a weak model may loop by itself, so a loop or low entropy alone proves
nothing; what a broken engine shows is a loop the plain run does not have, or a tail far
poorer in tokens than the plain run's (docs/release-gates.md)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

MAX_PERIOD = 64  # longer cycles are not what a collapsed decoder repeats
MIN_REPEATS = 4  # a cycle seen this many times in a row at the end is a loop
MIN_LOOP_TOKENS = 16  # and covers at least this many tokens


@dataclass(frozen=True)
class Loop:
    period: int
    start: int  # the first position of the periodic tail

    def describe(self, total: int) -> str:
        return (f"a loop of period {self.period} from token {self.start} to the end "
                f"({total - self.start} tokens)")


def tail_loop(tokens: Sequence[int]) -> Loop | None:
    """The shortest period the end of `tokens` repeats with, if it repeats long enough;
    with where that periodic tail starts."""
    n = len(tokens)
    for p in range(1, MAX_PERIOD + 1):
        need = max(p * MIN_REPEATS, MIN_LOOP_TOKENS)
        if need > n:
            break
        if all(tokens[i] == tokens[i + p] for i in range(n - need, n - p)):
            start = n - need
            while start > 0 and tokens[start - 1] == tokens[start - 1 + p]:
                start -= 1
            return Loop(p, start)
    return None


def entropy(tokens: Sequence[int]) -> float:
    """Shannon entropy (bits) of the token distribution."""
    if not tokens:
        return 0.0
    counts = Counter(tokens)
    n = len(tokens)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def tail(tokens: Sequence[int]) -> Sequence[int]:
    """The second half, where a late collapse shows."""
    return tokens[len(tokens) // 2:]


def collapse_reason(tokens: Sequence[int], ref: Sequence[int], min_entropy_ratio: float, *,
                    what: str = "the speculative run", ref_what: str = "the plain run"
                    ) -> str | None:
    """Why `tokens` collapsed where `ref` did not, or None."""
    loop, ref_loop = tail_loop(tokens), tail_loop(ref)
    if loop and (ref_loop is None or loop.start < ref_loop.start - MAX_PERIOD * MIN_REPEATS):
        return (f"{what} ends in {loop.describe(len(tokens))}; {ref_what} "
                + (f"loops only from token {ref_loop.start}" if ref_loop else "does not loop"))
    h, h_ref = entropy(tail(tokens)), entropy(tail(ref))
    if h_ref > 0 and h < min_entropy_ratio * h_ref:
        return (f"the token entropy of {what}'s second half is {h:.2f} bits, below "
                f"{min_entropy_ratio} x {ref_what}'s {h_ref:.2f} bits")
    return None
