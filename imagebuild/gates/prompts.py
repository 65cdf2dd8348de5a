"""The gates' fixed prompt set: short requests of several kinds (a repetitive one the
ngram drafter proposes from, prose, code, a list) and one long generation. The same
texts on every target; only the lengths come from matrix.yaml."""

from __future__ import annotations

from dataclasses import dataclass

from imagebuild.spec.gates import GateSettings

SHORT_PROMPTS = (
    ("repetitive", "one two three four one two three four one two three four one two"),
    ("prose", "The history of the lighthouse begins on a small island where"),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("list", "Ten facts about the moon:\n1."),
)
LONG_PROMPT = ("long", "Write a very long, detailed story about a cartographer who maps "
                       "a city that changes every night.")


@dataclass(frozen=True)
class GateRequest:
    name: str
    prompt: str
    max_tokens: int
    long: bool = False  # the long-generation request


def gate_requests(settings: GateSettings) -> list[GateRequest]:
    n = settings.lossless.max_tokens
    return ([GateRequest(name, text, n) for name, text in SHORT_PROMPTS]
            + [GateRequest(LONG_PROMPT[0], LONG_PROMPT[1], settings.long_generation.tokens,
                           long=True)])
