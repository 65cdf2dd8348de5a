"""The gates' requests sent to a healthy server, with the server's identity before and
after: what the gates' own runs (run.py) and smoke's recording of them
(smoke/suite/test_gates_capture.py) both do. A leaf: no server is started here.

The shipped server's shape decides the plan (conditions.py); the plain server gets that
same plan. Each phase is sent one request after another, all at once, or as a chain of
continuations, with vLLM's counters read before and after it (the evidence that its
condition happened: prefix-cache hits, preemptions) and, in a chain, after each request
(decay.py's windows)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import requests

from imagebuild import progress
from imagebuild.gates.client import Generation, generate, generate_batch, served_model
from imagebuild.gates.conditions import Phase, Plan, make_plan
from imagebuild.gates.identity import changed, identity
from imagebuild.gates.metrics import Counters, read
from imagebuild.gates.prompts import GateRequest
from imagebuild.gates.runrecord import Run
from imagebuild.gates.shape import ServerShape, read_shape, token_pool
from imagebuild.spec.gates import GateSettings


def request_timeout(max_tokens: int, prompt_tokens: int = 0) -> float:
    """Generous: a server slower than 2 tokens/s at a batch of one is broken anyway (and
    than 200 prompt tokens/s in prefill)."""
    return 60.0 + max_tokens / 2 + prompt_tokens / 200


def _one(base_url: str, model: str, r: GateRequest, seed: int) -> Generation:
    n = len(r.prompt) if isinstance(r.prompt, tuple) else 0
    return generate(base_url, model, r, seed=seed, timeout_s=request_timeout(r.max_tokens, n))


def _counters(base_url: str) -> Counters | None:
    try:
        return read(base_url)[0]
    except (requests.RequestException, ValueError):
        return None


def _chain(run: Run, base_url: str, model: str, phase: Phase, seed: int) -> None:
    """Each request continues the one before: its prompt is the first's plus every answer
    so far; the counters are read after each (decay.py's windows)."""
    sofar: tuple[int, ...] = ()
    for r in phase.requests:
        assert not isinstance(r.prompt, str), "a chain continues token ids"
        progress.wait("gates", f"{r.name} ({r.max_tokens} tokens) on the {run.what} server")
        gen = _one(base_url, model, replace(r, prompt=r.prompt + sofar), seed)
        run.gens.append(gen)
        reading = _counters(base_url)
        if reading is None:  # a window missed: none can be told apart (decay.py: untrusted)
            run.decay_readings = []
        elif run.decay_readings:
            run.decay_readings.append(reading)
        if gen.error or gen.truncated:
            break
        sofar += tuple(gen.tokens)


def send_phase(run: Run, base_url: str, model: str, phase: Phase, seed: int) -> None:
    t0 = time.monotonic()
    before = _counters(base_url)
    if phase.chained:
        run.decay_readings = [before] if before is not None else []
        _chain(run, base_url, model, phase, seed)
    elif phase.at_once:
        progress.wait("gates", f"{phase.condition}: {len(phase.requests)} requests at once "
                               f"on the {run.what} server")
        longest = max(len(r.prompt) if isinstance(r.prompt, tuple) else 0
                      for r in phase.requests)
        run.gens += generate_batch(base_url, model, list(phase.requests), seed=seed,
                                   timeout_s=request_timeout(phase.requests[0].max_tokens,
                                                             longest * len(phase.requests)))
    else:
        for r in phase.requests:
            progress.wait("gates", f"{r.name} ({r.max_tokens} tokens) on the {run.what} server")
            run.gens.append(_one(base_url, model, r, seed))
    after = _counters(base_url)
    if before is not None and after is not None:
        run.evidence[phase.condition] = after.minus(before)
    run.phase_seconds[phase.condition] = round(time.monotonic() - t0, 2)


def plan_for(run: Run, base_url: str, model: str, settings: GateSettings,
             command: Sequence[str]) -> Plan:
    """The plan cut for this server (the shipped one): its shape and tokenizer."""
    shape: ServerShape | None = None
    pool: tuple[int, ...] = ()
    why = ""
    speculative = run.what == "speculative"
    if speculative:
        try:
            shape = read_shape(base_url, command)
            pool = token_pool(base_url, model)
        except (requests.RequestException, ValueError, KeyError, IndexError) as exc:
            why = f"the server did not say what the condition loads need: {exc}"[:400]
    return make_plan(settings, shape, pool, speculative=speculative, why_no_shape=why)


def send_all(run: Run, container: str, base_url: str, settings: GateSettings, *,
             command: Sequence[str] = (), plan: Plan | None = None) -> Run:
    """Every phase of `plan` (None: the plan cut for this server) to a healthy server, with
    its identity before and after (a restart in between makes the run untrusted)."""
    seed = settings.lossless.seed
    model = served_model(base_url)
    run.before = identity(container)
    run.plan = plan or plan_for(run, base_url, model, settings, command)
    if run.plan.shape is not None:
        try:  # this server's own, to compare with the one the plan was cut for
            run.shape = read_shape(base_url, command)
        except (requests.RequestException, ValueError, KeyError, IndexError):
            run.shape = None
    for phase in run.plan.phases:
        send_phase(run, base_url, model, phase, seed)
    run.after = identity(container)
    why = changed(run.before, run.after)
    if why:
        run.untrusted = f"the {run.what} run: {why}"
    return run
