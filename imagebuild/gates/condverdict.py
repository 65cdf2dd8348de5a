"""Each condition's verdict (conditions.py) and the lossless gate's, all conditions together.

A condition passes when its requests' speculative answers equal plain decoding's token for
token (compare.py, ties as for the fresh requests) *and* vLLM's counters show the condition
happened on the speculative server: prefix-cache hits for shared-prefix and repeat (when
prefix caching is on; off, the requests run without hits and the verdict says so), a
preemption for the preemption load. A load that did not put the server in its condition
proves nothing: `untrusted`, never `pass`. The lossless gate is the worst of the fresh
requests' verdict and every condition's; its reason names the condition."""

from __future__ import annotations

from typing import Any

from imagebuild.gates import FAIL, NOT_APPLICABLE, NOT_RUN, PASS, UNTRUSTED
from imagebuild.gates.conditions import (
    ACCEPTANCE_DECAY,
    CONCURRENT,
    CONDITIONS,
    NEAR_MAX_LEN,
    PREEMPTION,
    REPEAT,
    SHARED_PREFIX,
    Phase,
)
from imagebuild.gates.decay import judge_decay
from imagebuild.gates.metrics import Counters
from imagebuild.gates.prompts import FRESH
from imagebuild.gates.runrecord import Run
from imagebuild.gates.verdict import GateResult, lossless
from imagebuild.spec.gates import GateSettings

RANK = {NOT_APPLICABLE: 0, NOT_RUN: 0, PASS: 1, UNTRUSTED: 2, FAIL: 3}
CACHE_CONDITIONS = (SHARED_PREFIX, REPEAT)


def _mismatched_shape(spec: Run, plain: Run) -> str | None:
    """Why the plain server is not the speculative one's settings minus speculation."""
    want, got = spec.plan.shape if spec.plan else None, plain.shape
    if want is None:
        return None
    if got is None:
        return "the plain server's cache settings could not be read"
    diff = [f"{k} {getattr(want, k)} vs {getattr(got, k)}"
            for k in ("block_size", "prefix_caching", "max_model_len")
            if getattr(want, k) != getattr(got, k)]
    return ("the plain server is not the speculative one minus speculation: "
            + ", ".join(diff)) if diff else None


def _evidence(cond: str, ev: Counters | None, phase: Phase, spec: Run,
              prefix_said: str) -> tuple[str | None, str]:
    """(why the condition did not happen, what shows it did)."""
    if ev is None:
        return "vLLM's counters could not be read around the load", ""
    shape = spec.plan.shape if spec.plan else None
    if cond in CACHE_CONDITIONS:
        if shape is not None and not shape.prefix_caching:
            return None, f"prefix caching off ({prefix_said}): the prompts ran without hits"
        if ev.prefix_hits <= 0:
            return (f"no prefix-cache hits (vllm:prefix_cache_hits did not move) though "
                    f"prefix caching is on ({prefix_said})"), ""
        return None, (f"{int(ev.prefix_hits)} of {int(ev.prefix_queries)} prompt tokens from "
                      f"the prefix cache ({prefix_said})")
    if cond == PREEMPTION:
        if ev.preemptions <= 0:
            return ("the load did not make vLLM preempt (vllm:num_preemptions did not move): "
                    "untested"), ""
        return None, f"vLLM preempted {int(ev.preemptions)} time(s) (vllm:num_preemptions)"
    if cond == CONCURRENT:
        return None, f"{len(phase.requests)} requests at once"
    if cond == NEAR_MAX_LEN and shape is not None:
        n = len(phase.requests[0].prompt)
        return None, f"a {n}-token prompt, max-model-len {shape.max_model_len}"
    return None, ""


def _condition(cond: str, phase: Phase, spec: Run, plain: Run, s: GateSettings,
               untrusted: str | None, prefix_said: str) -> GateResult:
    pairs = [(spec.gen(r.name), plain.gen(r.name)) for r in phase.requests]
    missing = [r.name for r, (a, b) in zip(phase.requests, pairs, strict=True)
               if a is None or b is None]
    if missing and not untrusted:
        untrusted = "no answer recorded to " + ", ".join(missing)
    got = [(a, b) for a, b in pairs if a is not None and b is not None]
    # each condition's own requests are few and short: the fresh requests' floor of
    # compared tokens is theirs alone
    res = lossless([a for a, _ in got], [b for _, b in got],
                   s.lossless.model_copy(update={"min_compared_tokens": 1}),
                   untrusted=untrusted)
    if res.status != PASS:
        return res
    if cond == ACCEPTANCE_DECAY:  # lossless as well: the windows' tokens were compared
        decay = judge_decay(spec.decay_readings, s.conditions.acceptance_decay)
        return GateResult(decay.status, res.reason + "; " + decay.reason if decay.status == PASS
                          else decay.reason, {**res.detail, **decay.detail})
    why, shown = _evidence(cond, spec.evidence.get(cond), phase, spec, prefix_said)
    if why:
        return GateResult(UNTRUSTED, why, res.detail)
    return GateResult(PASS, res.reason + (f"; {shown}" if shown else ""), res.detail)


def judge_conditions(spec: Run, plain: Run, s: GateSettings, *,
                     prefix_said: str = "") -> dict[str, GateResult]:
    """Every condition but the fresh requests', in CONDITIONS order."""
    plan = spec.plan
    out: dict[str, GateResult] = {}
    untrusted = "; ".join(u for u in (spec.untrusted, plain.untrusted,
                                      _mismatched_shape(spec, plain)) if u) or None
    phases = {p.condition: p for p in plan.phases} if plan else {}
    for cond in CONDITIONS:
        if cond == FRESH:
            continue
        if plan is not None and plan.unplanned:
            out[cond] = GateResult(UNTRUSTED, plan.unplanned)
        elif plan is not None and cond in plan.not_run:
            out[cond] = GateResult(NOT_RUN, plan.not_run[cond])
        elif cond in phases:
            out[cond] = _condition(cond, phases[cond], spec, plain, s, untrusted, prefix_said)
        else:
            out[cond] = GateResult(UNTRUSTED, "its requests were not sent")
    return out


def combine(fresh: GateResult, conds: dict[str, GateResult]) -> GateResult:
    """The lossless gate: the fresh requests and every condition, the worst one deciding;
    the numbers at the top are the fresh requests' (docs/release-gates.md)."""
    every = {FRESH: fresh, **conds}
    worst = max(every.values(), key=lambda r: RANK.get(r.status, 3))
    detail: dict[str, Any] = {**fresh.detail, "conditions": {
        name: {"status": r.status, "reason": r.reason, **r.detail} for name, r in every.items()}}
    if RANK.get(worst.status, 3) > RANK[PASS] and fresh.status != NOT_APPLICABLE:
        name = next(n for n in CONDITIONS if n in every and every[n].status == worst.status)
        reason = every[name].reason if name == FRESH else f"{name}: {every[name].reason}"
        return GateResult(worst.status, reason, detail)
    ran = [n for n, r in every.items() if r.status == PASS]
    skipped = [n for n, r in every.items() if r.status == NOT_RUN]
    return GateResult(fresh.status, fresh.reason + f"; conditions passed: {', '.join(ran)}"
                      + (f"; not run: {', '.join(skipped)}" if skipped else ""), detail)
