"""Two servers' answers to the release gates without a server: a run's generations made
from token lists, and whole speculative and plain runs of a real plan (conditions.py
cut to a given shape) with vLLM's counters as a server would move them."""

from __future__ import annotations

from collections.abc import Callable

from imagebuild.gates.client import Generation
from imagebuild.gates.conditions import (
    ACCEPTANCE_DECAY,
    PREEMPTION,
    REPEAT,
    SHARED_PREFIX,
    Plan,
    make_plan,
)
from imagebuild.gates.identity import Identity
from imagebuild.gates.metrics import Counters
from imagebuild.gates.runrecord import Run
from imagebuild.gates.shape import ServerShape
from imagebuild.spec.gates import GateSettings

# the cpu target's server as vLLM 0.23.0 reports it (vllm:cache_config_info, /v1/models)
CPU_SHAPE = ServerShape(block_size=128, kv_blocks=16, prefix_caching=True, max_model_len=512,
                        max_num_seqs=8, max_batched_tokens=512, spec_tokens=3)
POOL = tuple(range(3, 303))  # 300 distinct token ids
SAME = Identity(True, "t", 1, 0, 1)


def gen(name: str, tokens: list[int], *, n: int | None = None, lp: float = -0.5,
        alt: dict[int, float] | None = None, at: int | None = None,
        error: str | None = None) -> Generation:
    """A run's answer: each token with logprob `lp`; at position `at`, the top-k also
    holds `alt` (the other run's candidate)."""
    g = Generation(name, n if n is not None else len(tokens), error=error)
    if error:
        return g
    g.tokens = list(tokens)
    g.logprobs = [lp] * len(tokens)
    g.top = [{t: lp, **(alt if i == at and alt else {})} for i, t in enumerate(tokens)]
    g.finish_reason = "length"
    return g


def varied(n: int, seed: int = 1) -> list[int]:
    """n tokens that do not loop (a linear congruential walk over 2,000 ids)."""
    out, x = [], seed
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2**31
        out.append(x % 2000)
    return out


def readings(rates: list[float], drafts: int = 40, k: int = 3) -> list[Counters]:
    """vLLM's counters before and after each window, accepting `rate` tokens per draft
    (spread over the positions the way acceptance falls with position)."""
    out, total, per = [Counters()], 0.0, [0.0] * k
    for rate in rates:
        total += drafts
        share = [rate * w for w in (0.5, 0.3, 0.2)[:k]]
        per = [p + drafts * s for p, s in zip(per, share, strict=True)]
        out.append(Counters(drafts=total, accepted=sum(per), per_pos=tuple(per)))
    return out


def evidence(plan: Plan, *, hits: float = 256.0, preemptions: float = 2.0
             ) -> dict[str, Counters]:
    """Counter deltas of every phase as a server in each condition moves them."""
    ev = {p.condition: Counters(prefix_queries=100.0) for p in plan.phases}
    for cond in (SHARED_PREFIX, REPEAT, ACCEPTANCE_DECAY):
        ev[cond] = Counters(prefix_hits=hits, prefix_queries=512.0)
    ev[PREEMPTION] = Counters(prefix_queries=4000.0, preemptions=preemptions)
    return ev


def runs(settings: GateSettings, shape: ServerShape = CPU_SHAPE, *,
         spec_tokens: Callable[[str, list[int]], list[int]] | None = None,
         hits: float = 256.0, preemptions: float = 2.0,
         rates: list[float] | None = None) -> tuple[Run, Run]:
    """A speculative and a plain run of the plan cut for `shape`: equal answers unless
    `spec_tokens(name, tokens)` changes the speculative one's."""
    plan = make_plan(settings, shape, POOL, speculative=True)
    plain = Run("plain", before=SAME, after=SAME, plan=plan, shape=shape)
    spec = Run("speculative", before=SAME, after=SAME, plan=plan, shape=shape,
               evidence=evidence(plan, hits=hits, preemptions=preemptions),
               decay_readings=readings(rates or [1.5, 1.4, 1.4, 1.3],
                                       k=shape.spec_tokens))
    for i, r in enumerate(plan.requests):
        toks = varied(r.max_tokens, i + 1)
        plain.gens.append(gen(r.name, toks))
        spec.gens.append(gen(r.name, spec_tokens(r.name, toks) if spec_tokens else toks))
    return spec, plain
