"""What the gates read from a server's Prometheus `/metrics`: the counters proving a
condition happened (prefix-cache hits, preemptions), the speculative counters per draft
position, and the cache settings vLLM resolved at start (`vllm:cache_config_info`).

Names are vLLM 0.23.0's (v1/metrics/loggers.py: `vllm:prefix_cache_hits`,
`vllm:prefix_cache_queries`, `vllm:num_preemptions`, `vllm:cache_config_info`;
v1/spec_decode/metrics.py: `vllm:spec_decode_num_accepted_tokens_per_pos` with the label
`position`), counters exposed with prometheus_client's `_total` suffix; they are in the
recorded facts of 0.23.0 (facts/recorded/0.23.0/metrics.json, which a test reads)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import requests

PREFIX_HITS = "vllm:prefix_cache_hits"
PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREEMPTIONS = "vllm:num_preemptions"
DRAFTS = "vllm:spec_decode_num_drafts"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
CACHE_INFO = "vllm:cache_config_info"  # a gauge at 1 whose labels are CacheConfig's fields
COUNTERS = (PREFIX_HITS, PREFIX_QUERIES, PREEMPTIONS, DRAFTS, ACCEPTED, PER_POS)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")  # text format
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Counters:
    """vLLM's counters at one moment (or the difference of two moments)."""

    prefix_hits: float = 0.0  # prompt tokens found in the prefix cache
    prefix_queries: float = 0.0  # prompt tokens looked up
    preemptions: float = 0.0
    drafts: float = 0.0  # draft rounds
    accepted: float = 0.0  # accepted draft tokens
    per_pos: tuple[float, ...] = ()  # accepted draft tokens at position 0, 1, ...

    def minus(self, before: Counters) -> Counters:
        n = max(len(self.per_pos), len(before.per_pos))

        def at(c: Counters, i: int) -> float:
            return c.per_pos[i] if i < len(c.per_pos) else 0.0
        return Counters(self.prefix_hits - before.prefix_hits,
                        self.prefix_queries - before.prefix_queries,
                        self.preemptions - before.preemptions, self.drafts - before.drafts,
                        self.accepted - before.accepted,
                        tuple(at(self, i) - at(before, i) for i in range(n)))

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "per_pos": list(self.per_pos)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Counters:
        return cls(**{k: float(d.get(k) or 0.0) for k in
                      ("prefix_hits", "prefix_queries", "preemptions", "drafts", "accepted")},
                   per_pos=tuple(float(x) for x in d.get("per_pos") or ()))


def labels(text: str | None) -> dict[str, str]:
    return dict(_LABEL.findall(text or ""))


def parse(text: str) -> tuple[Counters, dict[str, str]]:
    """The counters (summed over label sets but the position) and cache_config_info's labels."""
    sums: dict[str, float] = {}
    pos: dict[int, float] = {}
    info: dict[str, str] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name = m.group(1)
        if name == CACHE_INFO:
            info = labels(m.group(2))
            continue
        base = name.removesuffix("_total")
        if base not in COUNTERS or base == name:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if base == PER_POS:
            p = int(labels(m.group(2)).get("position", "0"))
            pos[p] = pos.get(p, 0.0) + value
        else:
            sums[base] = sums.get(base, 0.0) + value
    per_pos = tuple(pos.get(i, 0.0) for i in range(max(pos) + 1)) if pos else ()
    return Counters(sums.get(PREFIX_HITS, 0.0), sums.get(PREFIX_QUERIES, 0.0),
                    sums.get(PREEMPTIONS, 0.0), sums.get(DRAFTS, 0.0),
                    sums.get(ACCEPTED, 0.0), per_pos), info


def read(base_url: str) -> tuple[Counters, dict[str, str]]:
    r = requests.get(f"{base_url}/metrics", timeout=30)
    r.raise_for_status()
    return parse(r.text)
