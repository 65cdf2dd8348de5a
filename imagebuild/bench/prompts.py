"""Prompt sets: built-in ones are fixed text (deterministic runs), JSONL adds your own.

"structured" mixes code, math and extraction: the kind of output speculative decoding
accepts most of; "prose" is open writing, where drafts are accepted least (docs/domain.md,
"accepted/draft ~0.45-0.60 on structured prompts, ~0.21-0.28 on open prose").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from imagebuild.errors import UserError


@dataclass(frozen=True)
class Prompt:
    set: str
    kind: str
    text: str


_STRUCTURED = [
    ("code", "Write a Python function `merge_intervals(intervals)` that merges overlapping "
             "intervals and returns them sorted. Include type hints and a docstring."),
    ("code", "Write a SQL query that returns, for each customer, the total of their orders "
             "in 2024 and the date of their most recent order, sorted by total."),
    ("code", "Implement binary search in Rust over a sorted slice of i64, returning "
             "Option<usize>, with three unit tests."),
    ("code", "Write a bash script that finds every *.log file older than 7 days under "
             "/var/log/app, compresses it with gzip and prints how many it compressed."),
    ("math", "Solve step by step: a train leaves at 09:40 travelling at 84 km/h; a second "
             "train leaves the same station at 10:10 at 108 km/h. When does it catch up?"),
    ("math", "Compute the derivative of f(x) = x^3 * ln(x) - 4x^2 + 7, then evaluate it at "
             "x = 2. Show each step."),
    ("math", "List the prime factorisations of 360, 1001 and 2024, then give their greatest "
             "common divisor and least common multiple."),
    ("extraction", "Extract a JSON object with keys name, date, amount, currency from: "
                   "'Invoice 4471 to Maria Lopez, issued 3 March 2025, total 1,240.50 EUR, "
                   "due in 30 days.'"),
    ("extraction", "From this text return a JSON list of {city, population}: 'Lyon has about "
                   "522,000 people, Porto roughly 232,000, and Graz close to 295,000.'"),
    ("extraction", "Return a YAML mapping of every HTTP header in this request: 'GET /a "
                   "HTTP/1.1 Host: x.test Accept: */* User-Agent: curl/8.5 "
                   "Authorization: Bearer t'"),
]

_PROSE = [
    "Write a short story about a lighthouse keeper who finds a letter in a bottle.",
    "Describe a walk through a city market at dawn, in the second person.",
    "Write a letter from a retired astronaut to their younger self.",
    "Tell the story of a village that wakes up to find the river has changed direction.",
    "Write a poem in free verse about the last train of the night.",
    "Describe the view from a mountain hut during a thunderstorm.",
    "Write a dialogue between a chess player and the clock that times her.",
    "Write a fable about a crow that collects forgotten words.",
]

BUILTIN: dict[str, list[Prompt]] = {
    "structured": [Prompt("structured", k, t) for k, t in _STRUCTURED],
    "prose": [Prompt("prose", "prose", t) for t in _PROSE],
}


MAX_PROMPTS_BYTES = 64 << 20


def load_jsonl(path: Path) -> list[Prompt]:
    """One JSON object per line with a "prompt" string (and an optional "kind")."""
    out: list[Prompt] = []
    try:
        if not path.is_file():
            raise UserError(f"prompts file {path} is not a regular file",
                            fix="give an existing JSONL file", where=f"{path}:1:1")
        with path.open("rb") as fh:
            raw = fh.read(MAX_PROMPTS_BYTES + 1)
    except OSError as exc:
        raise UserError(f"cannot read prompts file {path}: {exc.strerror}",
                        fix="give an existing JSONL file", where=f"{path}:1:1") from None
    if len(raw) > MAX_PROMPTS_BYTES:
        raise UserError(f"prompts file {path} is larger than {MAX_PROMPTS_BYTES} bytes",
                        fix="give a smaller set of prompts", where=f"{path}:1:1")
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        at = raw[:exc.start].count(b"\n") + 1
        raise UserError(f"prompts file {path} is not UTF-8", fix="save it as UTF-8",
                        where=f"{path}:{at}:1") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{n}: not JSON ({exc.msg})", where=f"{path}:{n}:{exc.colno}",
                            fix='one object per line, e.g. {"prompt": "..."}') from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
            raise UserError(f"{path}:{n}: needs a non-empty string \"prompt\"",
                            where=f"{path}:{n}:1", fix='e.g. {"prompt": "Summarise ..."}')
        out.append(Prompt(path.stem, str(obj.get("kind", "custom")), obj["prompt"]))
    if not out:
        raise UserError(f"{path}: no prompts", fix="add one JSON object per line")
    return out


def select(spec: str) -> list[Prompt]:
    """`structured,prose` (built-in names) and/or paths to .jsonl files, comma-separated."""
    out: list[Prompt] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part in BUILTIN:
            out += BUILTIN[part]
        elif part.endswith(".jsonl") or Path(part).is_file():
            out += load_jsonl(Path(part))
        else:
            raise UserError(f"unknown prompt set {part!r}",
                            fix=f"use {', '.join(BUILTIN)} or a path to a .jsonl file")
    if not out:
        raise UserError("no prompts selected", fix="e.g. --prompts structured,prose")
    return out
