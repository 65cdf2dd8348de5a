"""Bench figures: percentiles, /metrics deltas, deltas and the regression threshold."""

from __future__ import annotations

import numpy as np
import pytest

from imagebuild.bench import compare, metrics, results
from imagebuild.bench.client import Level, RequestResult


def test_stats_match_numpy_percentiles() -> None:
    values = [0.5, 0.1, 0.9, 0.3, 0.7, 0.2, 0.8]
    s = results.stats(values, 1000)
    assert s is not None
    assert s["min"] == pytest.approx(100) and s["max"] == pytest.approx(900)
    assert s["median"] == pytest.approx(np.percentile(values, 50) * 1000)
    assert s["p90"] == pytest.approx(np.percentile(values, 90) * 1000)
    assert results.stats([]) is None


METRICS_BEFORE = """# HELP vllm:spec_decode_num_drafts_total x
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} 15.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 1.5
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 10.0
"""
METRICS_AFTER = """vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} 50.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 150.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} 105.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 3.5
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 20.0
"""


def test_metrics_delta_gives_acceptance_and_server_ttft() -> None:
    d = metrics.delta(metrics.parse(METRICS_BEFORE), metrics.parse(METRICS_AFTER))
    assert (d.drafts, d.draft_tokens, d.accepted) == (40, 120, 90)
    assert d.acceptance == pytest.approx(0.75)
    assert d.mean_accepted_length == pytest.approx(1 + 90 / 40)
    assert d.server_ttft_mean_s == pytest.approx(0.2)  # 2.0 s over 10 requests


def test_no_drafts_means_no_acceptance_figure() -> None:
    d = metrics.delta({}, {})
    assert d.acceptance is None and d.mean_accepted_length is None
    assert d.server_ttft_mean_s is None


def _req(start: float, ttft: float, e2e: float, tokens: int) -> RequestResult:
    return RequestResult(True, ttft, e2e, tokens, [], start, start + e2e)


def test_summarize_aggregates_over_the_level_span() -> None:
    level = Level(2, [_req(0, 0.1, 1.0, 50), _req(0.5, 0.2, 1.5, 100),
                      RequestResult(False, error="HTTPError: HTTP 500")], 2.5, 0.01, None)
    s = results.summarize(level)
    assert s["completed"] == 2 and s["errors"] == 1
    assert s["duration_s"] == pytest.approx(2.0)  # first start to last end
    assert s["output_tok_s"] == pytest.approx(75.0)
    assert s["tpot_ms"]["min"] == pytest.approx((1.5 - 0.2) / 99 * 1000)
    assert s["tpot_ms"]["max"] == pytest.approx((1.0 - 0.1) / 49 * 1000)
    assert s["error_samples"] == ["HTTPError: HTTP 500"]


def _doc(tps: dict[int, float]) -> dict:
    return {"levels": [{"concurrency": c, "output_tok_s": v, "ttft_ms": {"median": 10.0},
                        "tpot_ms": None} for c, v in tps.items()]}


def test_regression_only_beyond_threshold_and_on_shared_levels() -> None:
    base = _doc({1: 100.0, 8: 400.0, 32: 800.0})
    cand = _doc({1: 96.0, 8: 370.0, 64: 10.0})  # -4% ok, -7.5% not, 64 has no baseline
    found = compare.regressions(cand, base, 0.05)
    assert [r.concurrency for r in found] == [8]
    assert found[0].change == pytest.approx(-0.075)
    assert compare.regressions(cand, base, 0.10) == []
    d = compare.deltas(cand, base)
    assert set(d) == {1, 8} and d[1]["output_tok_s"] == pytest.approx(-0.04)
