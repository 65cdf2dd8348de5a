"""Untrusted figures: each check flags what it must (issue 15's burst among them), the
tables and JSON carry the flag, and the regression gate never compares them silently."""

from __future__ import annotations

import pytest

from imagebuild.bench import gate, results, store, trust
from imagebuild.bench.client import Level, RequestResult
from imagebuild.bench.clientcpu import ClientLoad
from imagebuild.bench.metrics import LevelMetrics
from imagebuild.errors import UserError


def _request(start: float, ttft: float, gap: float, tokens: int = 64) -> RequestResult:
    itl = [gap] * (tokens - 1)
    e2e = ttft + sum(itl)
    return RequestResult(True, ttft, e2e, tokens, itl, start, start + e2e)


def _level(ttft: float, gap: float, server_ttft: float, *, cpu: float = 0.05,
           wait: float = 0.01, lag: float = 0.2, c: int = 1) -> dict:
    reqs = [_request(i * 0.5, ttft, gap) for i in range(8)]
    wall = max(r.end for r in reqs)
    held = ClientLoad(cpu_s=cpu * wall, wait_s=wait * wall, lag_ms=[lag] * 50)
    return results.summarize(Level(c, reqs, wall, held.cpu_s,
                                   LevelMetrics(0, 0, 0, server_ttft), held))


def codes(level: dict) -> list[str]:
    return [f["code"] for f in level["flags"]]


def test_a_healthy_level_carries_no_flag() -> None:
    lv = _level(ttft=0.018, gap=0.003, server_ttft=0.012)
    assert lv["flags"] == []
    assert "| ok |" in results.markdown(_doc([lv]))


def test_the_issue_burst_is_flagged_twice_with_the_reasons() -> None:
    """Client TTFT 140 ms vs the server's 12.8 ms, every gap near zero (issue 15)."""
    lv = _level(ttft=0.140, gap=0.00001, server_ttft=0.0128)
    assert codes(lv) == ["ttft-diverges", "gaps-collapse"]
    assert "140.0 ms vs the server's own 12.8 ms" in lv["flags"][0]["reason"]
    assert lv["itl_collapsed_share"] == 1.0
    md = results.markdown(_doc([lv]))
    assert "**UNTRUSTED** (ttft-diverges, gaps-collapse)" in md
    assert "**Untrusted figures**" in md and "c=1: client TTFT mean 140.0 ms" in md


def test_transport_overhead_is_not_a_divergence() -> None:
    # 11 ms over the server's histogram: HTTP, template and tokenization (README)
    assert _level(ttft=0.024, gap=0.003, server_ttft=0.013)["flags"] == []
    # at load the API server queues, which is real latency: a quarter of TTFT is allowed
    assert _level(ttft=0.400, gap=0.02, server_ttft=0.320)["flags"] == []
    assert codes(_level(ttft=0.040, gap=0.003, server_ttft=0.013)) == ["ttft-diverges"]


def test_client_faster_than_server_means_mistimed() -> None:
    assert codes(_level(ttft=0.010, gap=0.003, server_ttft=0.050)) == ["ttft-below-server"]


def test_a_quarter_of_collapsed_gaps_is_enough() -> None:
    reqs = [_request(0, 0.015, 0.003)]
    reqs[0].itl_s[:20] = [0.00005] * 20  # a burst later in the stream (20 of 63 gaps)
    lv = results.summarize(Level(1, reqs, 1.0, 0.01, LevelMetrics(0, 0, 0, 0.012),
                                 ClientLoad(0.01, 0.0, [0.1])))
    assert codes(lv) == ["gaps-collapse"]


def test_client_cpu_bound_and_client_starved() -> None:
    assert codes(_level(0.018, 0.003, 0.012, cpu=0.95)) == ["client-cpu-bound"]
    assert codes(_level(0.018, 0.003, 0.012, wait=0.3)) == ["client-starved"]
    assert codes(_level(0.018, 0.003, 0.012, lag=12.0)) == ["client-starved"]


def test_no_server_metrics_no_ttft_check() -> None:
    reqs = [_request(0, 0.2, 0.003)]
    lv = results.summarize(Level(1, reqs, 1.0, 0.01, None, ClientLoad(0.01, 0.0, [0.1])))
    assert lv["flags"] == []


def _doc(levels: list[dict]) -> dict:
    return {"image": {"tag": "t"}, "hardware": {"model": "cpu"},
            "settings": {"prompts": "structured", "max_tokens": 64}, "levels": levels}


def _gate_doc(tok_s: dict[int, float], flagged: tuple[int, ...] = ()) -> dict:
    return {"levels": [{"concurrency": c, "output_tok_s": v,
                        "flags": [{"code": "gaps-collapse", "reason": f"burst at c={c}"}]
                        if c in flagged else []} for c, v in tok_s.items()]}


def _judge(cand: dict, base: dict, **kw):
    kw = {"accept_regression": None, "accept_untrusted": None, **kw}
    return gate.judge(cand, base, what="r: T", threshold=0.05, log=lambda _: None, **kw)


def test_gate_refuses_flagged_figures_without_an_explicit_reason() -> None:
    base, cand = _gate_doc({1: 100, 4: 300}), _gate_doc({1: 100, 4: 300}, flagged=(4,))
    with pytest.raises(UserError, match="cannot be trusted at 1 of 2") as exc:
        _judge(cand, base)
    assert "c=4: burst at c=4" in exc.value.message
    assert "--accept-untrusted-bench" in (exc.value.fix or "")
    # --accept-regression is about "slower is fine", not about "we could not tell"
    with pytest.raises(UserError, match="cannot be trusted"):
        _judge(cand, base, accept_regression="known")


def test_the_baselines_flags_count_too() -> None:
    with pytest.raises(UserError, match="latest: burst at c=1"):
        _judge(_gate_doc({1: 100}), _gate_doc({1: 100}, flagged=(1,)))


def test_accepted_untrusted_levels_are_skipped_and_the_rest_still_gated() -> None:
    base = _gate_doc({1: 100, 4: 300})
    cand = _gate_doc({1: 50, 4: 10}, flagged=(4,))  # c=4 "collapsed"; c=1 truly slower
    with pytest.raises(UserError, match="slower than latest.*c=1"):
        _judge(cand, base, accept_untrusted="shared runner")
    res, recorded = _judge(cand, base, accept_untrusted="shared runner",
                           accept_regression="known slower")
    assert [r.concurrency for r in res.regressions] == [1]  # c=4 was not compared
    assert recorded == {store.A_UNTRUSTED: "shared runner", store.A_ACCEPTED: "known slower"}
    assert "untrusted bench figures**: shared runner" in res.notes_markdown()
    assert "c=4: burst at c=4" in res.notes_markdown()


def test_unflagged_runs_gate_as_before_and_old_documents_count_as_trusted() -> None:
    base = {"levels": [{"concurrency": 1, "output_tok_s": 100.0}]}  # before flags existed
    res, recorded = _judge(_gate_doc({1: 99}), base)
    assert res.regressions == [] and recorded == {} and res.untrusted == {}
    assert trust.untrusted(base) == {}


def test_placement_never_shares_a_cpu_between_server_and_client() -> None:
    from imagebuild.bench.placement import choose

    auto = choose(available={0, 1})
    assert (auto.server_cpus, auto.client_cpus) == ("0", frozenset({1}))
    wide = choose(available=set(range(20)))
    assert wide.client_cpus == frozenset({19}) and wide.server_cpus == ",".join(
        str(c) for c in range(19))
    # one side given: the other gets what is left, not "anywhere" (issue 15's run with
    # only the client pinned read every token of a request at once)
    assert choose(client_cpus={0}, available={0, 1}).server_cpus == "1"
    assert choose(server_cpus="0-2", available={0, 1, 2, 3}).client_cpus == frozenset({3})
    assert choose(available={0}).server_cpus is None  # one CPU: nothing to split
    assert choose(available={0}).why.startswith("not split")


def test_deltas_against_a_flagged_baseline_say_so() -> None:
    from imagebuild.bench import compare

    base = _level(ttft=0.140, gap=0.00001, server_ttft=0.0128)  # the issue's burst
    cand = _level(ttft=0.018, gap=0.003, server_ttft=0.012)
    d = compare.deltas(_doc([cand]), _doc([base]))
    assert d[1]["untrusted"] == 1.0
    assert "(untrusted) |" in results.markdown(_doc([cand]), d)
    assert "untrusted" not in compare.deltas(_doc([cand]), _doc([cand]))[1]
