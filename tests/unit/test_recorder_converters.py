"""The serve-options recorder (facts/recorder/serve_args.py, the successor of
preflight/vllm_cli/generate.py) classifies a converter its name does not explain by calling
it: 0.32's --device-ids is a lambda (vllm/engine/arg_utils.py 1164, vLLM 0.32.0), which the
old generator stopped on ("teach classify()"). One it cannot tell is recorded as opaque
with a finding, never dropped and never guessed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from imagebuild.facts import facts_for
from imagebuild.preflight.serve_args import value_problem

RECORDER = Path(__file__).resolve().parents[2] / "imagebuild" / "facts" / "recorder"


@pytest.fixture(scope="module")
def recorder():
    """recorder/serve_args.py as run.py imports it (its folder first on sys.path)."""
    sys.path.insert(0, str(RECORDER))
    try:
        import common
        import serve_args
        yield serve_args, common
    finally:
        sys.path.remove(str(RECORDER))
        for name in ("serve_args", "common"):
            sys.modules.pop(name, None)


# vLLM 0.32.0's --device-ids converter, as arg_utils.py writes it
def device_ids(s):  # noqa: ANN001, ANN201
    return [int(device_id) if device_id.isdigit() else device_id
            for device_id in (part.strip() for part in s.split(","))]


def test_a_lambda_converter_is_classified_by_what_it_returns(recorder):
    serve_args, common = recorder
    ctx = common.Context()
    assert serve_args.classify(device_ids, "--device-ids", ctx) == {
        "kind": "list", "separator": ",", "item": "int_or_str"}
    assert serve_args.classify(lambda s: s.lower().replace("-", "_"), "--moe-backend",
                               ctx) == {"kind": "str", "normalize": "lower_underscore"}
    assert ctx.findings == []


def test_an_unknown_converter_is_opaque_and_said(recorder):
    serve_args, common = recorder
    ctx = common.Context()
    entry = serve_args.classify(len, "--odd", ctx)
    assert entry["kind"] == "opaque" and entry["probes"]["2,3"] == "3"
    assert len(ctx.findings) == 1 and "--odd" in ctx.findings[0]


def test_032s_recorded_parser_has_device_ids_and_no_opaque_option():
    cli = facts_for("0.32.0").serve_args
    assert cli["options"]["device-ids"] == {"dest": "device_ids", "item": "int_or_str",
                                            "kind": "list", "separator": ","}
    assert not [o for o, e in cli["options"].items() if e["kind"] == "opaque"]
    spec = cli["options"]["device-ids"]
    assert value_problem("device-ids", spec, "2,3,GPU-1a2b", cli, {}) is None
    assert value_problem("device-ids", spec, True, cli, {}) is not None
