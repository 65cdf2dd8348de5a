"""Speculative decoding is on and pays: draft and accepted counters rise, ratio >= floor."""

from __future__ import annotations

import pytest

from imagebuild.smoke.probes import SPEC_ACCEPTED, SPEC_DRAFT, metric_sum

# Greedy decoding of a repetitive prompt: n-gram lookup finds its drafts in the prompt and
# the draft models of gb10 cells predict it well (docs/domain.md: ~0.45-0.60 on structured text).
PROMPT = "Repeat the list exactly, twice: " + "alpha beta gamma delta " * 12
REQUESTS = 4


def _counters(api) -> tuple[float | None, float | None, str]:
    text = api("GET", "/metrics", timeout=30).text
    return metric_sum(text, SPEC_DRAFT), metric_sum(text, SPEC_ACCEPTED), text


def test_speculative_decoding_fires(api, chat, expect, log, record_property):
    method = expect["speculative_method"]
    if not method:
        pytest.skip("the cell serves without speculative decoding (drafter none: no "
                    "--speculative-config, so there are no draft tokens to count)")
    if expect["metrics_missing"]:  # preflight refuses this cell (smoke-signal-missing)
        pytest.fail("the counters this check reads are not this vLLM's: "
                    + "; ".join(expect["metrics_missing"].values()))
    draft0, acc0, _ = _counters(api)
    if draft0 is None:
        pytest.fail(f"speculative decoding is off: /metrics has no {SPEC_DRAFT}, but the cell "
                    f"serves method {method!r} (was --speculative-config dropped?)\n"
                    f"{log('speculative|Speculative|spec_decode')}")
    for _ in range(REQUESTS):
        r = chat(PROMPT, max_tokens=64, min_tokens=32)
        assert r.status_code == 200, f"chat answered {r.status_code}: {r.text[:300]}\n{log()}"
    draft1, acc1, _ = _counters(api)
    assert draft1 is not None and acc1 is not None and acc0 is not None
    drafted, accepted = draft1 - draft0, acc1 - acc0
    assert drafted > 0, (f"speculative decoding is not firing: {SPEC_DRAFT} stayed at "
                         f"{draft0:.0f} over {REQUESTS} greedy requests (method {method})\n"
                         f"{log('speculative|Speculative|spec_decode')}")
    ratio = accepted / drafted
    for key, value in (("drafted", drafted), ("accepted", accepted),
                       ("acceptance", round(ratio, 3))):
        record_property(key, value)
    assert ratio >= expect["acceptance_floor"], (
        f"acceptance {accepted:.0f}/{drafted:.0f} = {ratio:.2f} is below the cell's floor "
        f"{expect['acceptance_floor']} (method {method})\n{log('Speculative|SpecDecoding')}")
