"""vLLM's Prometheus `/metrics`: the counters and histograms a benchmark level reads.

Read before and after each level; the difference is what that level did. The names are
facts/signals.py's METRICS, which preflight checks against each engine's vLLM version's
recorded metrics (rule smoke-signal-missing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from imagebuild.facts.signals import sample

DRAFTS = sample("drafts")
DRAFT_TOKENS = sample("draft_tokens")
ACCEPTED = sample("accepted_tokens")
TTFT_SUM = sample("ttft", "_sum")
TTFT_COUNT = sample("ttft", "_count")
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse(text: str) -> dict[str, float]:
    """Sum of each family's samples across label sets (one model per server)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


@dataclass(frozen=True)
class LevelMetrics:
    drafts: float
    draft_tokens: float
    accepted: float
    server_ttft_mean_s: float | None  # vLLM's own TTFT histogram over this level

    @property
    def acceptance(self) -> float | None:
        """accepted / draft tokens, None when nothing was drafted (spec decoding off)."""
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens emitted per draft round: the accepted ones plus the target's own token."""
        return 1 + self.accepted / self.drafts if self.drafts else None


def delta(before: dict[str, float], after: dict[str, float]) -> LevelMetrics:
    def d(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)
    n = d(TTFT_COUNT)
    return LevelMetrics(d(DRAFTS), d(DRAFT_TOKENS), d(ACCEPTED),
                        d(TTFT_SUM) / n if n > 0 else None)
