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


def windows(readings: list[Counters]) -> list[Window]:
    """One window between each two consecutive readings."""
    return [Window(d.drafts, d.per_pos)
            for d in (b.minus(a) for a, b in zip(readings, readings[1:], strict=False))]


def judge_decay(readings: list[Counters], s: AcceptanceDecayGate) -> GateResult:
    ws = windows(readings)
    detail: dict[str, Any] = {"windows": [w.as_json() for w in ws]}
    if len(ws) < 2:
        return GateResult(UNTRUSTED, f"{len(readings)} readings of vLLM's counters: too few "
                                     "for two windows", detail)
    head, last = ws[0], ws[-1]
    if min(head.drafts, last.drafts) < s.min_drafts:
        return GateResult(UNTRUSTED, f"the first and last windows hold {int(head.drafts)} and "
                                     f"{int(last.drafts)} draft rounds (min_drafts "
                                     f"{s.min_drafts}): too few to judge", detail)
    trend = (f"accepted tokens per draft {head.rate:.2f} in the first of {len(ws)} windows, "
             f"{last.rate:.2f} in the last (position 0: {head.pos_rate(0):.2f} -> "
             f"{last.pos_rate(0):.2f}; {int(sum(w.drafts for w in ws))} draft rounds)")
    if head.rate == 0 and last.rate == 0:
        return GateResult(FAIL, f"no drafted token accepted: {trend}", detail)
    if last.rate < s.min_ratio * head.rate:
        return GateResult(FAIL, f"acceptance decayed towards 0: {trend}, below min_ratio "
                                f"{s.min_ratio} x the first", detail)
    return GateResult(PASS, trend, detail)
