"""Deltas between two runs and the regression gate `promote` applies before moving latest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def _by_level(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(lv["concurrency"]): lv for lv in doc.get("levels", [])}


def _rel(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old == 0:
        return None
    return new / old - 1


def deltas(candidate: dict[str, Any], baseline: dict[str, Any]) -> dict[int, dict[str, float]]:
    """Relative change per shared concurrency level: tok/s, TTFT p50, TPOT p50; and
    `untrusted` 1.0 where either run's level is flagged (bench/trust.py)."""
    base = _by_level(baseline)
    out: dict[int, dict[str, float]] = {}
    for c, lv in _by_level(candidate).items():
        if c not in base:
            continue
        b = base[c]
        figures = {
            "output_tok_s": _rel(lv["output_tok_s"], b["output_tok_s"]),
            "ttft_p50": _rel((lv.get("ttft_ms") or {}).get("median"),
                             (b.get("ttft_ms") or {}).get("median")),
            "tpot_p50": _rel((lv.get("tpot_ms") or {}).get("median"),
                             (b.get("tpot_ms") or {}).get("median")),
        }
        out[c] = {k: v for k, v in figures.items() if v is not None}
        if lv.get("flags") or b.get("flags"):
            out[c]["untrusted"] = 1.0
    return out


@dataclass(frozen=True)
class Regression:
    concurrency: int
    candidate_tok_s: float
    baseline_tok_s: float

    @property
    def change(self) -> float:
        return self.candidate_tok_s / self.baseline_tok_s - 1

    def line(self) -> str:
        return (f"c={self.concurrency}: {self.candidate_tok_s:,.1f} tok/s vs "
                f"{self.baseline_tok_s:,.1f} ({self.change:+.1%})")


def regressions(candidate: dict[str, Any], baseline: dict[str, Any],
                threshold: float) -> list[Regression]:
    """Levels (run by both) whose aggregate tok/s falls more than `threshold` below baseline."""
    base = _by_level(baseline)
    out = []
    for c, lv in sorted(_by_level(candidate).items()):
        b = base.get(c)
        if b and b["output_tok_s"] > 0 and lv["output_tok_s"] < b["output_tok_s"] * (1 - threshold):
            out.append(Regression(c, lv["output_tok_s"], b["output_tok_s"]))
    return out
