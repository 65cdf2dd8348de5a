"""The schema's `args` knows vLLM's serve flags (issue 38, item 12): it accepted any key
and value although the package ships every recorded flag. Now each flag of each shipped
vLLM version is a property editors complete, described with the versions that take it,
and a flag no version has, or a value every version refuses, is underlined where `check`
refuses it (the mutation test compares the two field by field)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from imagebuild.spec import argschema
from imagebuild.spec.reference import schema_text

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(schema_text()))


def _errors(validator, args: dict) -> list[str]:
    doc = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    doc["profiles"]["cpu-ngram"]["args"] = {**doc["profiles"]["cpu-ngram"]["args"], **args}
    return [e.message for e in validator.iter_errors(doc)]


def test_every_recorded_flag_is_there_with_its_versions() -> None:
    schema = json.loads(schema_text())["$defs"]["Profile"]["properties"]["args"]
    versions = argschema.recorded()
    assert set(versions) >= {"0.23.0", "0.32.0"}
    for version, cli in versions.items():
        for flag in cli["options"]:
            assert flag in schema["properties"], (version, flag)
            assert version in schema["properties"][flag]["description"]
    only_new = set(versions["0.32.0"]["options"]) - set(versions["0.23.0"]["options"])
    flag = sorted(only_new)[0]
    assert schema["properties"][flag]["description"].startswith(f"vLLM 0.32.0: --{flag}")
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize("args,said", [
    ({"max-num-seq": 8}, "max-num-seq"),  # misspelt (vLLM would take the prefix)
    ({"enable-prefix-caching": "yes"}, "'yes' is not of type 'boolean'"),
    ({"max-num-seqs": "eight"}, "'eight' is not valid"),
    ({"max-num-seqs": 0}, "0 is not valid"),
    ({"dtype": "bfloat17"}, "'bfloat17' is not one of"),
    ({"tool-call-parser": "hermess"}, "'hermess' is not valid"),
    ({"model": "/elsewhere"}, "should not be valid"),  # imagebuild writes it
    ({"compilation-config.modee": 3}, "compilation-config.modee"),
])
def test_a_flag_or_value_no_version_takes_is_refused(validator, args, said) -> None:
    errors = _errors(validator, args)
    assert errors and any(said in e for e in errors), errors


@pytest.mark.parametrize("args", [
    {"max-num-batched-tokens": "16k"}, {"cudagraph-capture-sizes": [1, 2, 4]},
    {"compilation-config": {"mode": 3}}, {"compilation-config.mode": 3},
    {"attention-backend": "FLASH_ATTN"}, {"no-enable-prefix-caching": True},
    {"tool-call-parser": "my_parser", "tool-parser-plugin": "/plugins/mine.py"},
])
def test_what_vllm_takes_is_taken(validator, args) -> None:
    assert _errors(validator, args) == []
