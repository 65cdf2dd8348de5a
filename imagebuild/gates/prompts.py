"""The gates' fixed texts: short requests of several kinds (a repetitive one the ngram
drafter proposes from, prose, code, a list), one long generation, and the text whose
tokens the condition loads are cut from (conditions.py: prompts of exact token lengths,
sent as token ids). The same texts on every target; only the lengths come from
matrix.yaml and from the server (its KV block size, pool and max-model-len)."""

from __future__ import annotations

from dataclasses import dataclass

from imagebuild.spec.gates import GateSettings

FRESH = "fresh"  # the condition of the requests each sent once, alone
SHORT_PROMPTS = (
    ("repetitive", "one two three four one two three four one two three four one two"),
    ("prose", "The history of the lighthouse begins on a small island where"),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("list", "Ten facts about the moon:\n1."),
)
LONG_PROMPT = ("long", "Write a very long, detailed story about a cartographer who maps "
                       "a city that changes every night.")
# Varied text, no sentence twice: prompts cut from its tokens at different offsets share
# no KV block unless a condition makes them share one (a periodic text would).
POOL_TEXT = (
    "The harbour master kept a ledger of every ship that entered the bay after dusk. "
    "In 1887 a storm moved the sandbar three hundred metres to the east overnight. "
    "def merge(a, b):\n    return sorted(set(a) | set(b))\n"
    "Seven bridges cross the river; only two of them were built before the railway. "
    "SELECT city, COUNT(*) FROM orders WHERE year = 2024 GROUP BY city ORDER BY 2 DESC; "
    "Her grandmother grew quinces, medlars and a fig tree that never bore fruit. "
    "The derivative of x^3 ln(x) is 3x^2 ln(x) + x^2, which at x = 2 is 12 ln 2 + 4. "
    "Tram line 9 was rerouted through the old market when the tunnel flooded in May. "
    "{\"name\": \"Maria Lopez\", \"amount\": 1240.50, \"currency\": \"EUR\"} "
    "A cartographer measures twice and draws once, the apprentices were told. "
    "Wolves returned to the valley in the winter the mill burned down. "
    "for i in range(10):\n    print(i * i, end=' ')\n"
)


@dataclass(frozen=True)
class GateRequest:
    name: str  # unique in a run: the two runs' answers are paired by it
    prompt: str | tuple[int, ...]  # text, or token ids (the condition loads)
    max_tokens: int
    long: bool = False  # the long-generation request
    condition: str = FRESH

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "max_tokens": self.max_tokens, "long": self.long,
                "condition": self.condition,
                "prompt": self.prompt if isinstance(self.prompt, str) else list(self.prompt)}

    @classmethod
    def from_json(cls, d: dict) -> GateRequest:
        p = d["prompt"]
        return cls(str(d["name"]), p if isinstance(p, str) else tuple(int(t) for t in p),
                   int(d["max_tokens"]), bool(d.get("long")), str(d.get("condition", FRESH)))


def gate_requests(settings: GateSettings) -> list[GateRequest]:
    """The fresh requests: each prompt sent once, alone (no cache hit, no batch)."""
    n = settings.lossless.max_tokens
    return ([GateRequest(name, text, n) for name, text in SHORT_PROMPTS]
            + [GateRequest(LONG_PROMPT[0], LONG_PROMPT[1], settings.long_generation.tokens,
                           long=True)])
