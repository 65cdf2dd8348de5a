"""The checks the smoke suite must run for every image: a verdict can only pass when each
of them ran (passed, or skipped as not applicable with its reason).

A suite that crashed at import, collected nothing or lost a module must not read as green;
tests/unit/test_smoke_verdict.py keeps this list equal to what the suite collects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

ALWAYS = (
    "health",
    "models_lists_exactly_the_served_names",
    "no_weights_skipped_at_load",
    "chat_completion_answers",
    "streaming_ends_with_done",
    "forced_tool_call_is_parsed",
    "image_request",
    "speculative_decoding_fires",
    "served_files_match_the_lock",
    "no_credentials_in_the_environment",
    "model_is_read_only",
    "kernel_backends_are_the_expected_ones",
    "release_gate_requests_answered",
)
PER_LEVEL = ("burst_has_no_errors",)  # parametrized by the image's smoke concurrency


def expected_checks(expect: Mapping[str, Any]) -> list[str]:
    levels = expect.get("concurrency") or []
    return list(ALWAYS) + [f"{name}[c{c}]" for name in PER_LEVEL for c in levels]


def missing_checks(ran: Iterable[str], expect: Mapping[str, Any]) -> list[str]:
    seen = set(ran)
    return [name for name in expected_checks(expect) if name not in seen]
