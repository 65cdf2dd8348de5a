"""The conditions under which speculative decoding was seen to break while passing fresh
one-at-a-time requests, and the load that puts a server in each (pure: a plan from the
settings and the server's shape; send.py sends it, condverdict.py judges it).

- shared-prefix / repeat: prompts sharing whole KV blocks, then the same prompts again,
  so later requests start from prefix-cache hits (MTP + prefix caching on hybrid
  Qwen3.6 loses accuracy: vllm#43559; DFlash2 greedy output diverges: vllm#54928).
  vLLM caches whole blocks only, so these prompts are cut to the server's block size.
- concurrent: the short prompts at the profile's concurrency at once (batch shapes a
  single request never has).
- preemption: more KV than the pool holds, at once, so vLLM preempts and recomputes.
- near-max-len: a prompt filling max-model-len but for the last few tokens.
- acceptance-decay: a long generation as consecutive requests, each continuing the one
  before (from cache hits, prefix caching on), acceptance per draft position read
  between them (decay.py).

The shipped server's shape decides the plan; the plain server is sent exactly the same
requests (the plan travels with the speculative run, capture.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from imagebuild.gates.prompts import FRESH, SHORT_PROMPTS, GateRequest, gate_requests
from imagebuild.gates.shape import ServerShape
from imagebuild.spec.gates import GateSettings

SHARED_PREFIX, REPEAT, CONCURRENT = "shared-prefix", "repeat", "concurrent"
PREEMPTION, NEAR_MAX_LEN, ACCEPTANCE_DECAY = "preemption", "near-max-len", "acceptance-decay"
CONDITIONS = (FRESH, SHARED_PREFIX, REPEAT, CONCURRENT, PREEMPTION, NEAR_MAX_LEN,
              ACCEPTANCE_DECAY)
SUFFIX_TOKENS = 24  # what tells the shared-prefix prompts apart
DECAY_PROMPT_TOKENS = 32  # the continued generation's first prompt
# vLLM 0.23.0's smallest API-server default max-num-batched-tokens on CUDA and CPU
# (engine/arg_utils.py EngineArgs.get_batch_defaults): assumed when the command leaves it
# to vLLM, it gives the preemption load's slack the most prefill steps, never too few
DEFAULT_BATCHED = 2048


@dataclass(frozen=True)
class Phase:
    condition: str
    requests: tuple[GateRequest, ...]
    # all requests in flight together (one completion request with a list of prompts, of
    # one max_tokens and one prompt kind), else one after another
    at_once: bool = False
    # each request's prompt is the first's followed by every answer before it (token ids)
    chained: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"condition": self.condition, "at_once": self.at_once, "chained": self.chained,
                "requests": [r.as_json() for r in self.requests]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Phase:
        return cls(str(d["condition"]), tuple(GateRequest.from_json(r) for r in d["requests"]),
                   bool(d.get("at_once")), bool(d.get("chained")))


@dataclass(frozen=True)
class Plan:
    phases: tuple[Phase, ...]
    not_run: dict[str, str] = field(default_factory=dict)  # condition -> why
    shape: ServerShape | None = None  # of the server the plan was cut for
    # why no condition could be cut for a speculative server (it did not say its shape):
    # every condition is then untrusted, never skipped
    unplanned: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"phases": [p.as_json() for p in self.phases], "not_run": self.not_run,
                "shape": self.shape.as_json() if self.shape else None,
                "unplanned": self.unplanned}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Plan:
        return cls(tuple(Phase.from_json(p) for p in d["phases"]), dict(d.get("not_run") or {}),
                   ServerShape.from_json(d["shape"]) if d.get("shape") else None,
                   str(d.get("unplanned") or ""))

    @property
    def requests(self) -> list[GateRequest]:
        return [r for p in self.phases for r in p.requests]


def cut(pool: tuple[int, ...], offset: int, n: int) -> tuple[int, ...]:
    """n tokens of the pool from `offset`, wrapping around (prompts longer than the pool)."""
    return tuple(pool[(offset + i) % len(pool)] for i in range(n))


def concurrency(s: GateSettings, shape: ServerShape) -> int:
    """The profile's max-num-seqs, capped; the cap when the profile leaves it to vLLM."""
    cap = s.conditions.max_concurrency
    return max(2, min(shape.max_num_seqs or cap, cap))


def _shared(s: GateSettings, shape: ServerShape, pool: tuple[int, ...]
            ) -> tuple[list[Phase], str | None]:
    """Two prompts over the same whole blocks, then both again."""
    B, n = shape.block_size, s.conditions.max_tokens
    blocks = min(2, (shape.max_model_len - SUFFIX_TOKENS - n) // B)
    if blocks < 1:
        return [], (f"max-model-len {shape.max_model_len} leaves no room for a whole KV block "
                    f"of {B} tokens plus {SUFFIX_TOKENS + n} more")
    if blocks * B + SUFFIX_TOKENS > s.conditions.max_prompt_tokens:
        return [], (f"a whole KV block is {B} tokens, more than max_prompt_tokens "
                    f"{s.conditions.max_prompt_tokens}")
    prefix = cut(pool, 0, blocks * B)
    prompts = [prefix + cut(pool, off, SUFFIX_TOKENS) for off in (101, 211)]
    first = tuple(GateRequest(f"{SHARED_PREFIX}-{c}", p, n, condition=SHARED_PREFIX)
                  for c, p in zip("ab", prompts, strict=True))
    again = tuple(GateRequest(f"{REPEAT}-{c}", p, n, condition=REPEAT)
                  for c, p in zip("ab", prompts, strict=True))
    return [Phase(SHARED_PREFIX, first), Phase(REPEAT, again)], None


def _concurrent(s: GateSettings, shape: ServerShape) -> Phase:
    c = concurrency(s, shape)
    return Phase(CONCURRENT, tuple(
        GateRequest(f"{CONCURRENT}-{i}-{SHORT_PROMPTS[i % len(SHORT_PROMPTS)][0]}",
                    SHORT_PROMPTS[i % len(SHORT_PROMPTS)][1], s.conditions.max_tokens,
                    condition=CONCURRENT) for i in range(c)), at_once=True)


def preemption_load(s: GateSettings, shape: ServerShape) -> tuple[int, int, int] | str:
    """(requests, prompt tokens, tokens to generate) of a load vLLM must preempt under,
    or why there is none within the settings.

    c requests whose prompts fill the pool's fair share each (its blocks divided among
    them) but for a slack, all admitted at once; each then grows one block past its
    share, so together they need more blocks than the pool has while all are running.
    The slack covers what the first admitted decode while the others prefill ((1 + k)
    tokens a step, over c x prompt / max-num-batched-tokens steps). When the shares use
    the whole pool, the first request to cross its share finds no free block and vLLM
    preempts another (v1/core/sched/scheduler.py schedule(): a running request that
    cannot allocate preempts the last one running); a request finishes only after it
    crossed. With r blocks left over, r requests cross for free and the (r+1)-th must
    cross before any finishes: generating (1 + k) x slack makes even a request accepting
    no draft cross before one accepting every draft finishes."""
    B, k = shape.block_size, shape.spec_tokens
    c = concurrency(s, shape)
    fair = shape.kv_blocks // c
    if fair < 1:
        return f"the KV pool ({shape.kv_blocks} blocks) is smaller than {c} requests"
    steps = -(-c * fair * B // (shape.max_batched_tokens or DEFAULT_BATCHED))
    slack = (1 + k) * steps + k + 8
    spare = shape.kv_blocks - c * fair
    gen = slack + k + 8 if spare == 0 else (1 + k) * slack
    prompt = fair * B - slack
    if prompt < 1 or gen - slack > B:
        return (f"a KV block of {B} tokens is too small for a load that surely preempts "
                f"({c} requests at once, {k} draft tokens)")
    if prompt + gen + k > shape.max_model_len:
        return (f"the KV pool ({shape.kv_blocks:,} blocks of {B} tokens) holds {c} requests "
                f"of max-model-len {shape.max_model_len:,} at once: {c} requests (max-num-seqs "
                f"{shape.max_num_seqs or 'left to vLLM'}, at most max_concurrency "
                f"{s.conditions.max_concurrency}) cannot make vLLM preempt")
    if c * prompt > s.conditions.max_prompt_tokens:
        return (f"preempting a pool of {shape.kv_blocks * B:,} tokens takes {c * prompt:,} "
                f"prompt tokens, more than max_prompt_tokens {s.conditions.max_prompt_tokens:,}"
                " (a smaller KV pool, e.g. --num-gpu-blocks-override, makes it run)")
    return c, prompt, gen


def _preemption(s: GateSettings, shape: ServerShape, pool: tuple[int, ...]
                ) -> tuple[Phase | None, str | None]:
    load = preemption_load(s, shape)
    if isinstance(load, str):
        return None, load
    c, prompt, gen = load
    return Phase(PREEMPTION, tuple(
        GateRequest(f"{PREEMPTION}-{i}", cut(pool, 307 + 13 * i, prompt), gen,
                    condition=PREEMPTION) for i in range(c)), at_once=True), None


def _near_max_len(s: GateSettings, shape: ServerShape, pool: tuple[int, ...]
                  ) -> tuple[Phase | None, str | None]:
    n = s.conditions.near_max_len_tokens
    prompt = shape.max_model_len - n
    if prompt < 1:
        return None, f"max-model-len {shape.max_model_len} is not above {n} tokens"
    if prompt > s.conditions.max_prompt_tokens:
        return None, (f"a prompt of {prompt:,} tokens is more than max_prompt_tokens "
                      f"{s.conditions.max_prompt_tokens:,}")
    return Phase(NEAR_MAX_LEN, (GateRequest(NEAR_MAX_LEN, cut(pool, 53, prompt), n,
                                            condition=NEAR_MAX_LEN),)), None


def _decay_chain(s: GateSettings, shape: ServerShape, pool: tuple[int, ...]
                 ) -> tuple[Phase | None, str | None]:
    d = s.conditions.acceptance_decay
    room = shape.max_model_len - DECAY_PROMPT_TOKENS - shape.spec_tokens - 1
    per = min(d.tokens, room) // d.windows
    if per < 8:
        return None, (f"max-model-len {shape.max_model_len} leaves {room} tokens: too few for "
                      f"{d.windows} windows")
    head = cut(pool, 401, DECAY_PROMPT_TOKENS)
    return Phase(ACCEPTANCE_DECAY, tuple(
        GateRequest(f"{ACCEPTANCE_DECAY}-{i + 1}", head, per, condition=ACCEPTANCE_DECAY)
        for i in range(d.windows)), chained=True), None


def make_plan(s: GateSettings, shape: ServerShape | None, pool: tuple[int, ...], *,
              speculative: bool, why_no_shape: str = "") -> Plan:
    """Every phase, in the order sent: fresh first (nothing cached yet), then the cache
    conditions, the concurrent loads, the long prompt, the continued generation. A server
    that does not speculate gets only the fresh requests (its own decoding is the
    reference)."""
    fresh = Phase(FRESH, tuple(gate_requests(s)))
    if not speculative:
        return Plan((fresh,), shape=shape)
    if shape is None or not pool:
        return Plan((fresh,), shape=shape, unplanned=why_no_shape or "the server's tokenizer "
                    "gave no tokens for the pool text")
    phases, not_run = [fresh], {}
    shared, no_cache = _shared(s, shape, pool)
    phases += shared
    if no_cache:
        not_run.update({SHARED_PREFIX: no_cache, REPEAT: no_cache})
    phases.append(_concurrent(s, shape))
    for cond, (phase, why) in ((PREEMPTION, _preemption(s, shape, pool)),
                               (NEAR_MAX_LEN, _near_max_len(s, shape, pool)),
                               (ACCEPTANCE_DECAY, _decay_chain(s, shape, pool))):
        if phase is not None:
            phases.append(phase)
        else:
            not_run[cond] = why or ""
    return Plan(tuple(phases), not_run, shape)
