"""Acceptance per draft position over a long generation, window by window: a drafter
whose acceptance decays towards 0 as the generation goes on (DFlash with prefix caching,
seen on Spark) is still lossless, and the c=1 bench hides it in an average.

The generation is sent as consecutive requests, each continuing the one before
(conditions.py, the acceptance-decay phase: with prefix caching on each starts from
cache hits on all that came before); vLLM's counters (metrics.py: draft rounds and
accepted tokens per position) are read before the first and after each, so every window
is exactly one request's drafts. Read while one long request runs, the counters lag
behind a busy API server by up to a second (measured on the cpu target), so no window
could be trusted. The last window's accepted tokens per draft are compared with the
first's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from imagebuild.gates import FAIL, PASS, UNTRUSTED
from imagebuild.gates.metrics import Counters
from imagebuild.gates.verdict import GateResult
from imagebuild.spec.gates import AcceptanceDecayGate


@dataclass(frozen=True)
class Window:
    drafts: float
    per_pos: tuple[float, ...]  # accepted tokens at each draft position

    @property
    def rate(self) -> float:
        """Accepted tokens per draft round (0 .. k)."""
        return sum(self.per_pos) / self.drafts if self.drafts else 0.0

    def pos_rate(self, i: int) -> float:
        return self.per_pos[i] / self.drafts if self.drafts and i < len(self.per_pos) else 0.0

    def as_json(self) -> dict[str, Any]:
        return {"drafts": int(self.drafts), "accepted_per_draft": round(self.rate, 3),
                "per_position": [round(self.pos_rate(i), 3) for i in range(len(self.per_pos))]}


def between(a: Counters, b: Counters) -> Window:
    """The window from reading `a` to reading `b`."""
    d = b.minus(a)
    return Window(d.drafts, d.per_pos)


def windows(readings: list[Counters]) -> list[Window]:
    """One window between each two consecutive readings."""
    return [between(a, b) for a, b in zip(readings, readings[1:], strict=False)]


def _span(n: int, at: str) -> str:
    return f"the {at} of" if n == 1 else f"the {at} {n} of"


def judge_decay(readings: list[Counters], s: AcceptanceDecayGate) -> GateResult:
    """The last window against the first. A window holds one request's drafts; where the
    first or the last holds fewer than `min_drafts` rounds (ngram drafts only where the
    text repeats, which the same greedy request does sooner on one CPU's kernels than on
    another's), it takes in its neighbours, from the start and from the end, until it
    holds enough; only when the two would overlap is the generation too short to judge."""
    ws = windows(readings)
    detail: dict[str, Any] = {"windows": [w.as_json() for w in ws]}
    if len(ws) < 2:
        return GateResult(UNTRUSTED, f"{len(readings)} readings of vLLM's counters: too few "
                                     "for two windows", detail)
    n = len(readings) - 1
    first = next((i for i in range(1, n + 1)
                  if between(readings[0], readings[i]).drafts >= s.min_drafts), n)
    last = next((j for j in range(n - 1, -1, -1)
                 if between(readings[j], readings[n]).drafts >= s.min_drafts), 0)
    total = int(sum(w.drafts for w in ws))
    if first > last:
        return GateResult(UNTRUSTED, f"the first and last windows hold {int(ws[0].drafts)} and "
                                     f"{int(ws[-1].drafts)} draft rounds, {total} in all "
                                     f"(min_drafts {s.min_drafts} in a first and a last part "
                                     "apart): too few to judge", detail)
    head, tail = between(readings[0], readings[first]), between(readings[last], readings[n])
    detail.update(first_windows=first, last_windows=n - last)
    trend = (f"accepted tokens per draft {head.rate:.2f} in {_span(first, 'first')} {len(ws)} "
             f"windows, {tail.rate:.2f} in the last{'' if n - last == 1 else f' {n - last}'} "
             f"(position 0: {head.pos_rate(0):.2f} -> {tail.pos_rate(0):.2f}; "
             f"{total} draft rounds)")
    if head.rate == 0 and tail.rate == 0:
        return GateResult(FAIL, f"no drafted token accepted: {trend}", detail)
    if tail.rate < s.min_ratio * head.rate:
        return GateResult(FAIL, f"acceptance decayed towards 0: {trend}, below min_ratio "
                                f"{s.min_ratio} x the first", detail)
    return GateResult(PASS, trend, detail)
