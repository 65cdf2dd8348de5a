"""The release gates' conditions without a server (imagebuild/gates): the loads cut to a
server's shape (prefix-cache hits need whole KV blocks, preemption needs more than the
pool), vLLM's counters read from its /metrics text, each condition's verdict (a mismatch
names the condition, a load that did not happen is untrusted, a condition that cannot run
says why), acceptance per draft position window by window, and what the summary, the
capture and the table carry. The real servers: tests/e2e/test_release_gates_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imagebuild.facts import facts_for
from imagebuild.gates import FAIL, NOT_RUN, PASS, UNTRUSTED
from imagebuild.gates.capture import load_capture, save_capture
from imagebuild.gates.conditions import (
    ACCEPTANCE_DECAY,
    CONCURRENT,
    CONDITIONS,
    NEAR_MAX_LEN,
    PREEMPTION,
    REPEAT,
    SHARED_PREFIX,
    make_plan,
    preemption_load,
)
from imagebuild.gates.condverdict import combine, judge_conditions
from imagebuild.gates.decay import judge_decay
from imagebuild.gates.metrics import COUNTERS, Counters, parse
from imagebuild.gates.prompts import FRESH
from imagebuild.gates.run import judge
from imagebuild.gates.shape import prefix_caching_source, spec_tokens
from imagebuild.gates.summary import summary
from imagebuild.release.compat import _lossless, gate_checks
from imagebuild.spec.gates import (
    AcceptanceDecayGate,
    ConditionsGate,
    GateSettings,
    LongGenerationGate,
    LosslessGate,
)
from tests.support.gateruns import CPU_SHAPE, POOL, readings, runs

# the cpu target's thresholds (matrix.yaml), short
ST = GateSettings(lossless=LosslessGate(max_tokens=16, min_compared_tokens=32),
                  long_generation=LongGenerationGate(tokens=64),
                  conditions=ConditionsGate(max_tokens=16, max_concurrency=8,
                                            max_prompt_tokens=4096,
                                            acceptance_decay=AcceptanceDecayGate(tokens=448)))

# what vLLM 0.23.0's /metrics says (a cpu server's lines, labels as it writes them)
METRICS = """\
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 128.0
vllm:prefix_cache_hits_created{engine="0",model_name="tiny"} 1.79e+09
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 400.0
vllm:num_preemptions_total{engine="0",model_name="tiny"} 2.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} 18.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} 34.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="0"} 15.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="2"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="1"} 12.0
vllm:cache_config_info{block_size="128",enable_prefix_caching="True",engine="0",\
num_gpu_blocks="16",prefix_caching_hash_algo="sha256"} 1.0
"""


# ------------------------------------------------------------------ what a server says


def test_the_counters_and_cache_settings_are_read_from_vllms_metrics_text():
    c, info = parse(METRICS)
    assert (c.prefix_hits, c.prefix_queries, c.preemptions) == (128.0, 400.0, 2.0)
    assert (c.drafts, c.accepted, c.per_pos) == (18.0, 34.0, (15.0, 12.0, 7.0))
    assert info["block_size"] == "128" and info["enable_prefix_caching"] == "True"
    assert c.minus(parse("")[0]) == c


def test_the_metric_names_are_vllm_0_23_0s_own():
    recorded = (facts_for("0.23.0").metrics or {})["metrics"]
    for name in (*COUNTERS, "vllm:cache_config_info"):
        assert name in recorded, name
    kinds = {n: recorded[n]["kind"] for n in COUNTERS}
    assert set(kinds.values()) == {"counter"}, kinds


def test_the_draft_length_and_the_prefix_caching_source_come_from_the_command():
    spec = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3}'
    assert spec_tokens(["vllm", "serve", "--speculative-config", spec]) == 3
    assert spec_tokens(["vllm", "serve"]) == 0
    assert prefix_caching_source(["--no-enable-prefix-caching"], "0.23.0") == \
        "the profile: --no-enable-prefix-caching"
    assert prefix_caching_source(["--enable-prefix-caching"], "0.23.0") == \
        "the profile: --enable-prefix-caching"
    left = prefix_caching_source(["vllm", "serve", "/model"], "0.23.0")
    # the recorded serve parser's default, and how 0.23.0 resolves it
    assert "left to vLLM 0.23.0: its serve parser's default is None" in left
    assert "on for a decoder-only model, off for a hybrid one" in left
    assert "not recorded" in prefix_caching_source([], "9.9.9")


# ------------------------------------------------------------------ the loads


def _first_blocks(plan, cond: str) -> set[tuple[int, ...]]:
    return {r.prompt[:CPU_SHAPE.block_size] for p in plan.phases if p.condition == cond
            for r in p.requests}


def test_the_cpu_plan_runs_every_condition_cut_to_its_shape():
    plan = make_plan(ST, CPU_SHAPE, POOL, speculative=True)
    assert [p.condition for p in plan.phases] == list(CONDITIONS) and plan.not_run == {}
    phases = {p.condition: p for p in plan.phases}
    B = CPU_SHAPE.block_size
    shared = [r.prompt for r in phases[SHARED_PREFIX].requests]
    # two whole blocks shared, a different tail: the second request hits the first's blocks
    assert shared[0][:2 * B] == shared[1][:2 * B] and shared[0] != shared[1]
    assert [r.prompt for r in phases[REPEAT].requests] == shared
    assert len(phases[CONCURRENT].requests) == 8 and phases[CONCURRENT].at_once
    assert len(phases[NEAR_MAX_LEN].requests[0].prompt) == 512 - 16
    decay = phases[ACCEPTANCE_DECAY]
    assert decay.chained and len(decay.requests) == 4
    assert 4 * decay.requests[0].max_tokens + 32 + 3 < 512
    # no two conditions share a first block but the ones meant to
    firsts = [_first_blocks(plan, c) for c in (SHARED_PREFIX, PREEMPTION, NEAR_MAX_LEN)]
    assert len(firsts[0]) == 1 and len(firsts[1]) == 8
    assert not (firsts[0] & firsts[1] or firsts[0] & firsts[2] or firsts[1] & firsts[2])


def test_the_preemption_load_needs_more_blocks_than_the_pool_once_all_are_admitted():
    for shape in (CPU_SHAPE, CPU_SHAPE.__class__(**{**CPU_SHAPE.as_json(), "kv_blocks": 21})):
        c, prompt, gen = preemption_load(ST, shape)
        B, k = shape.block_size, shape.spec_tokens
        blocks = -(-(prompt + 1 + k) // B)
        assert c * blocks <= shape.kv_blocks  # every request admitted at once
        assert c * -(-(prompt + gen) // B) > shape.kv_blocks  # then more than the pool
        assert prompt + gen + k <= shape.max_model_len
    assert preemption_load(ST, CPU_SHAPE) == (8, 229, 38)


def test_a_condition_that_cannot_run_says_why():
    # gb10's cells: a KV pool of millions of tokens, a 262,144-token max-model-len
    spark = CPU_SHAPE.__class__(block_size=1056, kv_blocks=4000, prefix_caching=True,
                                max_model_len=262144, max_num_seqs=64,
                                max_batched_tokens=16384, spec_tokens=11)
    plan = make_plan(ST, spark, POOL, speculative=True)
    assert set(plan.not_run) == {PREEMPTION, NEAR_MAX_LEN}, plan.not_run
    assert "holds 8 requests of max-model-len 262,144 at once" in plan.not_run[PREEMPTION]
    assert "more than max_prompt_tokens 4,096" in plan.not_run[NEAR_MAX_LEN]
    small = ST.model_copy(update={"conditions": ST.conditions.model_copy(
        update={"max_concurrency": 2})})
    load = preemption_load(small, CPU_SHAPE.__class__(
        **{**spark.as_json(), "max_model_len": 1 << 30}))
    assert isinstance(load, str) and "more than max_prompt_tokens" in load
    assert "--num-gpu-blocks-override" in load
    tiny = CPU_SHAPE.__class__(**{**CPU_SHAPE.as_json(), "max_model_len": 100})
    assert "no room for a whole KV block" in make_plan(ST, tiny, POOL, speculative=True
                                                       ).not_run[REPEAT]
    # a server that does not speculate is its own reference: the fresh requests only
    assert [p.condition for p in make_plan(ST, CPU_SHAPE, POOL, speculative=False).phases] \
        == [FRESH]
    # a server that does not say its shape cannot be skipped past: untrusted, not "not run"
    unknown = make_plan(ST, None, (), speculative=True, why_no_shape="no cache_config_info")
    assert unknown.unplanned == "no cache_config_info" and not unknown.not_run
    spec, plain = runs(ST)
    spec.plan = unknown
    res = judge_conditions(spec, plain, ST)
    assert {r.status for r in res.values()} == {UNTRUSTED}
    assert res[REPEAT].reason == "no cache_config_info"


# ------------------------------------------------------------------ the verdicts


def test_every_condition_passes_when_both_runs_agree_and_the_condition_happened():
    spec, plain = runs(ST)
    res = judge_conditions(spec, plain, ST, prefix_said="the profile: --enable-prefix-caching")
    assert {c: r.status for c, r in res.items()} == {c: PASS for c in CONDITIONS[1:]}
    assert "256 of 512 prompt tokens from the prefix cache" in res[REPEAT].reason
    assert "vLLM preempted 2 time(s) (vllm:num_preemptions)" in res[PREEMPTION].reason
    loss, lg = judge(spec, plain, ST, prefix_said="x")
    assert loss.status == PASS and lg.status == PASS
    assert "conditions passed: fresh, shared-prefix, repeat" in loss.reason


def _corrupt_after_hits(name: str, toks: list[int]) -> list[int]:
    if name.startswith((SHARED_PREFIX + "-b", REPEAT)):
        return toks[:3] + [(toks[3] + 1) % 2000] + toks[4:]
    return toks


def test_a_drafter_that_corrupts_output_after_cache_hits_fails_naming_the_condition():
    spec, plain = runs(ST, spec_tokens=_corrupt_after_hits)
    loss, lg = judge(spec, plain, ST, prefix_said="x")
    assert loss.status == FAIL and lg.status == PASS
    assert loss.reason.startswith(f"{SHARED_PREFIX}: {SHARED_PREFIX}-b token 3: "), loss.reason
    conds = loss.detail["conditions"]
    assert conds[FRESH]["status"] == PASS and conds[REPEAT]["status"] == FAIL
    assert conds[CONCURRENT]["status"] == PASS


def test_a_load_that_did_not_put_the_server_in_its_condition_is_untrusted():
    spec, plain = runs(ST, hits=0.0, preemptions=0.0)
    res = judge_conditions(spec, plain, ST, prefix_said="left to vLLM 0.23.0: ...")
    assert res[REPEAT].status == UNTRUSTED and "no prefix-cache hits" in res[REPEAT].reason
    assert res[PREEMPTION].status == UNTRUSTED
    assert "did not make vLLM preempt" in res[PREEMPTION].reason
    assert combine(judge(spec, plain, ST)[0], {}).status == UNTRUSTED


def test_without_prefix_caching_the_cache_conditions_run_without_hits_and_say_so():
    off = CPU_SHAPE.__class__(**{**CPU_SHAPE.as_json(), "prefix_caching": False})
    spec, plain = runs(ST, off, hits=0.0)
    res = judge_conditions(spec, plain, ST, prefix_said="the profile: --no-enable-prefix-caching")
    assert res[REPEAT].status == PASS
    assert "prefix caching off (the profile: --no-enable-prefix-caching): the prompts ran " \
           "without hits" in res[REPEAT].reason


def test_a_plain_server_with_other_cache_settings_is_no_reference():
    spec, plain = runs(ST)
    plain.shape = CPU_SHAPE.__class__(**{**CPU_SHAPE.as_json(), "prefix_caching": False})
    res = judge_conditions(spec, plain, ST)
    assert res[REPEAT].status == UNTRUSTED and "prefix_caching True vs False" in \
        res[REPEAT].reason


def test_a_condition_not_run_is_listed_and_does_not_pass_or_fail_the_gate():
    spark = CPU_SHAPE.__class__(**{**CPU_SHAPE.as_json(), "kv_blocks": 1 << 20})
    spec, plain = runs(ST, spark)
    loss, _ = judge(spec, plain, ST)
    assert loss.status == PASS and loss.detail["conditions"][PREEMPTION]["status"] == NOT_RUN
    assert "; not run: preemption" in loss.reason


# ------------------------------------------------------------------ acceptance per position


def test_acceptance_decaying_towards_zero_fails_and_a_steady_one_passes():
    s = AcceptanceDecayGate(windows=4, min_ratio=0.25, min_drafts=8)
    assert judge_decay(readings([1.6, 1.4, 1.5, 1.2]), s).status == PASS
    decayed = judge_decay(readings([1.6, 0.9, 0.3, 0.1]), s)
    assert decayed.status == FAIL and "decayed towards 0" in decayed.reason
    assert "1.60 in the first of 4 windows, 0.10 in the last" in decayed.reason
    assert decayed.detail["windows"][0]["per_position"] == [0.8, 0.48, 0.32]
    assert judge_decay(readings([0.0, 0.0]), s).status == FAIL
    assert judge_decay(readings([1.0, 1.0], drafts=3), s).status == UNTRUSTED
    assert judge_decay(readings([1.0]), s).status == UNTRUSTED


def _uneven(drafts: list[int], rates: list[float]) -> list[Counters]:
    """Counters of windows holding these many draft rounds at these rates."""
    out, per = [Counters()], [0.0, 0.0, 0.0]
    for n, rate in zip(drafts, rates, strict=True):
        per = [p + n * rate * w for p, w in zip(per, (0.5, 0.3, 0.2), strict=True)]
        out.append(Counters(drafts=out[-1].drafts + n, accepted=sum(per), per_pos=tuple(per)))
    return out


def test_a_first_or_last_window_with_too_few_drafts_takes_in_its_neighbours():
    """ngram drafts only where the text repeats: on one CPU's kernels the greedy request's
    first window held 7 draft rounds (min_drafts 8) and the gate was untrusted on a
    healthy cell. The first part grows until it holds enough (and the last part from the
    end); only a generation whose two parts would overlap is too short to judge."""
    s = AcceptanceDecayGate(windows=4, min_ratio=0.25, min_drafts=8)
    steady = judge_decay(_uneven([7, 12, 30, 23], [1.2, 1.2, 1.2, 1.2]), s)
    assert steady.status == PASS, steady.reason
    assert "in the first 2 of 4 windows, 1.20 in the last (" in steady.reason
    assert (steady.detail["first_windows"], steady.detail["last_windows"]) == (2, 1)
    decayed = judge_decay(_uneven([7, 12, 30, 5, 4], [1.5, 1.5, 1.0, 0.1, 0.1]), s)
    assert decayed.status == FAIL and "in the last 3 " not in decayed.reason
    assert "in the first 2 of 5 windows" in decayed.reason and "in the last 2 (" in decayed.reason
    short = judge_decay(_uneven([3, 2, 2, 3], [1.0, 1.0, 1.0, 1.0]), s)
    assert short.status == UNTRUSTED and "10 in all" in short.reason
    assert judge_decay(_uneven([9, 9], [1.0, 1.0]), s).status == PASS  # parts side by side


def test_the_decay_fails_the_lossless_gate_through_its_condition():
    spec, plain = runs(ST, rates=[1.5, 0.8, 0.2, 0.05])
    loss, _ = judge(spec, plain, ST)
    assert loss.status == FAIL and loss.reason.startswith(f"{ACCEPTANCE_DECAY}: acceptance "
                                                          "decayed towards 0")


# ------------------------------------------------------------------ what is recorded


def test_the_capture_keeps_the_plan_the_counters_and_the_readings(tmp_path: Path):
    spec, _ = runs(ST)
    path = tmp_path / "gates-speculative.json"
    save_capture(path, "sha256:abc", ST, spec)
    back = load_capture(path, "sha256:abc", ST)
    assert back is not None and back.plan == spec.plan and back.shape == spec.shape
    assert back.evidence == spec.evidence and back.decay_readings == spec.decay_readings
    assert [g.tokens for g in back.gens] == [g.tokens for g in spec.gens]


def test_the_summary_and_the_table_say_which_conditions_ran_and_which_failed():
    spec, plain = runs(ST, spec_tokens=_corrupt_after_hits)
    loss, lg = judge(spec, plain, ST)
    doc = {"lossless": {"status": loss.status, "reason": loss.reason, **loss.detail},
           "long_generation": {"status": lg.status, "reason": lg.reason, **lg.detail}}
    s = summary(doc)
    assert list(s["lossless"]["conditions"]) == list(CONDITIONS)
    assert s["lossless"]["conditions"][REPEAT]["status"] == FAIL
    rel = type("Rel", (), {"annotations": {"io.imagebuild.release.gates": json.dumps(s)}})()
    g = gate_checks(rel)["lossless"]  # type: ignore[arg-type]
    cell = _lossless(g)
    assert cell.startswith("**FAILED** (5 req, 128 tokens; failed: shared-prefix, repeat; "), cell
    assert "ran: fresh, shared-prefix, repeat, concurrent, preemption, near-max-len, " \
           "acceptance-decay" in cell


@pytest.mark.parametrize("bad", [{"repeat": "pass"}, {"repeat": {"status": "great"}},
                                 {"<script>": {"status": "pass"}}, ["repeat"]])
def test_the_table_takes_no_condition_from_an_unreadable_record(bad):
    s = {"lossless": {"status": "pass", "reason": "r", "requests": 5, "compared_tokens": 80,
                      "conditions": bad},
         "long_generation": {"status": "pass", "reason": "r", "tokens": 64}}
    rel = type("Rel", (), {"annotations": {"io.imagebuild.release.gates": json.dumps(s)}})()
    g = gate_checks(rel)["lossless"]  # type: ignore[arg-type]
    assert g["status"] == "untrusted" and "conditions" in g["reason"]
