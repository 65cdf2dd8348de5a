"""One greedy request with logprobs: temperature 0, a fixed seed, EOS ignored (every
response is exactly max_tokens long, so a shorter one is truncated), token ids rather
than text (two runs are compared by id, never by detokenized text)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import requests

from imagebuild.gates.prompts import GateRequest

TOP_LOGPROBS = 5  # per position: enough to find the other run's token near a tie
ID_PREFIX = "token_id:"  # vLLM's `return_tokens_as_token_ids` spelling


@dataclass
class Generation:
    """What one run answered for one request."""

    name: str
    max_tokens: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # of the chosen token
    top: list[dict[int, float]] = field(default_factory=list)  # top-k per position
    finish_reason: str | None = None
    error: str | None = None  # an HTTP error or an answer we cannot read
    seconds: float = 0.0

    @property
    def truncated(self) -> bool:
        return self.error is None and len(self.tokens) < self.max_tokens

    def logprob_of(self, pos: int, token: int) -> float | None:
        """This run's logprob of `token` at `pos`, None when not among its top-k."""
        if pos < len(self.tokens) and self.tokens[pos] == token:
            return self.logprobs[pos]
        return self.top[pos].get(token) if pos < len(self.top) else None

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "max_tokens": self.max_tokens, "tokens": len(self.tokens),
                "finish_reason": self.finish_reason, "error": self.error,
                "seconds": round(self.seconds, 2)}


def _token_id(text: str) -> int:
    if not text.startswith(ID_PREFIX):
        raise ValueError(f"token {text[:40]!r} is not {ID_PREFIX}N")
    return int(text[len(ID_PREFIX):])


def parse_choice(gen: Generation, choice: dict[str, Any]) -> Generation:
    lp = choice.get("logprobs") or {}
    gen.tokens = [_token_id(t) for t in lp.get("tokens") or []]
    gen.logprobs = [float(x) if x is not None else float("-inf")
                    for x in lp.get("token_logprobs") or []]
    gen.top = [{_token_id(k): float(v) for k, v in (d or {}).items()}
               for d in lp.get("top_logprobs") or []]
    gen.finish_reason = choice.get("finish_reason")
    if not (len(gen.tokens) == len(gen.logprobs) == len(gen.top)):
        raise ValueError(f"{len(gen.tokens)} tokens but {len(gen.logprobs)} logprobs and "
                         f"{len(gen.top)} top-logprob entries")
    return gen


def generate(base_url: str, model: str, req: GateRequest, *, seed: int,
             timeout_s: float) -> Generation:
    return generate_batch(base_url, model, [req], seed=seed, timeout_s=timeout_s)[0]


def generate_batch(base_url: str, model: str, reqs: list[GateRequest], *, seed: int,
                   timeout_s: float) -> list[Generation]:
    """Requests of one max_tokens and one prompt kind as one completion request with a
    list of prompts: vLLM queues them together (separate HTTP requests arrive spread over
    a busy API server's loop, and the first ones may finish before the last begin)."""
    gens = [Generation(r.name, r.max_tokens) for r in reqs]
    prompts = [r.prompt if isinstance(r.prompt, str) else list(r.prompt) for r in reqs]
    body = {"model": model, "prompt": prompts[0] if len(prompts) == 1 else prompts,
            "max_tokens": reqs[0].max_tokens, "temperature": 0.0, "seed": seed,
            "logprobs": TOP_LOGPROBS, "ignore_eos": True, "return_tokens_as_token_ids": True}
    t0 = time.monotonic()
    error = None
    try:
        r = requests.post(f"{base_url}/v1/completions", json=body, timeout=timeout_s)
        if r.status_code != 200:
            error = f"HTTP {r.status_code}: {r.text[:300]}"
        else:
            choices = sorted(r.json()["choices"], key=lambda c: int(c["index"]))
            if len(choices) != len(gens):
                raise ValueError(f"{len(choices)} choices for {len(gens)} prompts")
            for gen, choice in zip(gens, choices, strict=True):
                parse_choice(gen, choice)
    except (requests.RequestException, ValueError, KeyError, IndexError, TypeError) as exc:
        error = f"{type(exc).__name__}: {str(exc)[:300]}"
    for gen in gens:
        gen.error = error or gen.error
        gen.seconds = time.monotonic() - t0
    return gens


def served_model(base_url: str) -> str:
    """The first served name (the one responses report)."""
    r = requests.get(f"{base_url}/v1/models", timeout=10)
    r.raise_for_status()
    return str(r.json()["data"][0]["id"])
