"""Outcome of each rehearsal step and the table that shows them side by side.

Three outcomes only: passed, failed, not rehearsed (with the reason). A step that could
not run is "not rehearsed", never "passed"; any failed step makes the exit code 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PASSED = "passed"
FAILED = "failed"
NOT_REHEARSED = "not rehearsed"


@dataclass
class Step:
    key: str  # "a", "b", ... or "-" for what is not rehearsed at all
    title: str
    status: str = NOT_REHEARSED
    summary: str = ""  # one line for the table
    details: list[str] = field(default_factory=list)  # printed under the table
    seconds: float = 0.0

    def passed(self, summary: str) -> Step:
        self.status, self.summary = PASSED, summary
        return self

    def failed(self, summary: str) -> Step:
        self.status, self.summary = FAILED, summary
        return self

    def skipped(self, why: str) -> Step:
        self.status, self.summary = NOT_REHEARSED, why
        return self


def exit_code(steps: list[Step]) -> int:
    return 1 if any(s.status == FAILED for s in steps) else 0


def _wrap(text: str, width: int) -> list[str]:
    words, lines, line = text.split(), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return lines + [line] if line else lines or [""]


def table(steps: list[Step], width: int = 110) -> str:
    """step | what | outcome | time | summary (wrapped to `width`), one block per step."""
    title_w = max(len(s.title) for s in steps)
    status_w = max(len(s.status) for s in steps)
    pad = 4 + 2 + title_w + 2 + status_w + 2 + 6 + 2
    summary_w = max(40, width - pad)
    rows = [f"{'step':4}  {'what':{title_w}}  {'outcome':{status_w}}  {'time':>6}  summary"]
    for s in steps:
        took = f"{s.seconds:5.1f}s" if s.seconds else ""
        wrapped = _wrap(s.summary, summary_w)
        rows.append(f"{s.key:4}  {s.title:{title_w}}  {s.status:{status_w}}  {took:>6}  "
                    f"{wrapped[0]}")
        rows += [" " * pad + more for more in wrapped[1:]]
    rows.insert(1, "-" * max(len(r) for r in rows))
    return "\n".join(rows)
