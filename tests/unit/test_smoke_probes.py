"""Helpers the smoke suite judges a server with, and the JUnit/verdict it writes."""

from __future__ import annotations

import json
import re
import struct
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import pytest

from imagebuild.facts import facts_for
from imagebuild.smoke.probes import (
    SPEC_DRAFT,
    TOOL_CALL_TEXT,
    degenerate,
    message_text,
    metric_sum,
    png,
    quote_log,
    sse_events,
    stream_text,
    tool_probe,
)
from imagebuild.smoke.report import read_junit, summary_markdown, write_junit

METRICS = """# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 120.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="tiny"} 30.0
vllm:spec_decode_num_draft_tokens_total_created{engine="0"} 1.7e9
vllm:num_requests_running{engine="0"} 0.0
"""


def test_metric_sum_adds_label_sets_and_knows_absence():
    assert metric_sum(METRICS, SPEC_DRAFT) == 150.0
    assert metric_sum(METRICS, "vllm:spec_decode_num_accepted_tokens_total") is None


@pytest.mark.parametrize("parser", sorted(TOOL_CALL_TEXT))
def test_tool_regex_matches_only_its_text(parser):
    rx, why = tool_probe(parser)
    assert rx is not None and why == ""
    assert re.fullmatch(rx, TOOL_CALL_TEXT[parser])
    assert not re.fullmatch(rx, TOOL_CALL_TEXT[parser].replace("Paris", "Lyon"))


def test_hermes_call_is_json_between_tags():
    inner = TOOL_CALL_TEXT["hermes"].removeprefix("<tool_call>").removesuffix("</tool_call>")
    assert json.loads(inner) == {"name": "get_weather", "arguments": {"city": "Paris"}}


def test_a_parser_without_a_probe_is_named_as_not_covered_never_a_crash():
    rx, why = tool_probe("openai")
    assert rx is None and why.startswith("not covered") and "'openai'" in why
    assert "harmony" in why
    rx, why = tool_probe("my_plugin_parser")
    assert rx is None and "not a parser the probe has a text for" in why
    rx, why = tool_probe("my_plugin_parser", facts_for("0.23.0"))
    assert rx is None and "not a tool parser vLLM 0.23.0 registers" in why


def test_message_text_reads_every_field():
    assert message_text({"content": None, "reasoning": "hmm"}) == "hmm"
    assert message_text({"content": "a", "reasoning_content": "b"}) == "ab"
    assert message_text({}) == ""


def test_stream_parsing():
    lines = ['data: {"choices":[{"delta":{"reasoning":"x"}}]}', "",
             'data: {"choices":[{"delta":{"content":"y"}}]}', "data: [DONE]"]
    events = sse_events(lines)
    assert events[-1] == "[DONE]" and stream_text(events) == "xy"


def test_png_is_a_valid_image():
    data = png(4, 3)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (4, 3)
    idat = data.index(b"IDAT")
    size = struct.unpack(">I", data[idat - 4:idat])[0]
    assert len(zlib.decompress(data[idat + 4:idat + 4 + size])) == 3 * (1 + 4 * 3)


def test_degenerate_answers():
    assert degenerate("!!!!!") and degenerate("  ") and not degenerate("red")


def test_quote_log_numbers_matching_lines():
    lines = ["ok", "Parameter visual.x not found in params_dict, skip loading", "end"]
    text = quote_log(lines, "params_dict")
    assert "2: Parameter visual.x" in text and "3: end" in text


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest"
errors="0" failures="1" skipped="1" tests="3" time="3.0">
<testcase classname="tests.smoke.test_serving" name="test_health" time="0.01">
<properties><property name="acceptance" value="0.48"/></properties></testcase>
<testcase classname="tests.smoke.test_serving" name="test_models" time="0.02">
<failure message="AssertionError: /v1/models lists [wrong]">long text</failure></testcase>
<testcase classname="tests.smoke.test_serving" name="test_image_request" time="0">
<skipped message="text-only" type="pytest.skip">skip</skipped></testcase>
</testsuite></testsuites>"""


def test_junit_round_trip_with_boot(tmp_path: Path):
    src = tmp_path / "checks.xml"
    src.write_text(JUNIT)
    checks = read_junit(src)
    assert [(c["name"], c["outcome"]) for c in checks] == [
        ("health", "passed"), ("models", "failed"), ("image_request", "skipped")]
    assert checks[0]["measured"] == {"acceptance": 0.48} and "measured" not in checks[1]
    assert checks[1]["message"] == "long text" and checks[2]["message"] == "text-only"
    boot = {"kind": "fatal", "message": "engine failed", "seconds": 4.0, "excerpt": "Trace"}
    write_junit(tmp_path / "junit.xml", "img", boot, src)
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "4" and suite.get("failures") == "2"
    assert [c["name"] for c in read_junit(tmp_path / "junit.xml")][0] == "boot"
    write_junit(tmp_path / "only-boot.xml", "img", boot, None)
    assert read_junit(tmp_path / "only-boot.xml") == [
        {"name": "boot", "outcome": "failed", "seconds": 4.0, "message": "Trace"}]


def test_summary_names_the_failures():
    v = {"image_ref": "img", "image_id": "sha256:1", "passed": False, "message": "1 failed",
         "boot": {"kind": "ready", "seconds": 30.0, "phase": "ready"},
         "timings": {"boot_s": 30.0, "checks_s": 9.0, "total_s": 41.0},
         "checks": {"test_models": {"name": "test_models", "outcome": "failed",
                                    "passed": False, "seconds": 0.1,
                                    "message": "AssertionError: lists [wrong]\nmore"}},
         "not_applicable": {"test_image_request": "text-only"},
         "files": {"log": "container.log"}}
    md = summary_markdown(v)
    assert "**FAILED**" in md and "test_models | ❌ failed — AssertionError: lists [wrong] |" in md
    assert "| test_image_request | ➖ not applicable — text-only | |" in md
