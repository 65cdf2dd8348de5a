"""`check --format json` is JSON a script can trust on every exit path (issue 38, item
7): `tag` null without --tag, and a matrix that does not load (YAML, schema, a bad tag)
is one error finding on stdout, exit 2."""

from __future__ import annotations

import json

import pytest

from imagebuild import cli
from tests.support.matrices import edit

TAG = "2026-07-01-dflashfix"


def _check_json(capsys, *argv: str) -> tuple[int, dict]:
    code = cli.main(["check", "--format", "json", *argv])
    return code, json.loads(capsys.readouterr().out)


def test_without_a_tag_the_tag_is_null(capsys):
    code, doc = _check_json(capsys, "--target", "cpu")
    assert code == 0 and doc["tag"] is None and doc["target"] == "cpu"
    code, doc = _check_json(capsys, "--target", "cpu", "--tag", TAG)
    assert doc["tag"] == "2026-07-01-v0.23.0-dflashfix"


@pytest.mark.parametrize("old,new,where", [
    ("engines:\n", "engines:\n  - [oops\n", "matrix.yaml:"),  # YAML syntax
    ("    vllm_version: 0.23.0\n", "    vllm_version: 0.23.0\n    colour: red\n",
     "matrix.yaml:"),  # schema: an unknown key
])
def test_a_broken_matrix_is_still_json_on_stdout(matrix_dir, capsys, old, new, where):
    edit(matrix_dir, old, new)
    code, doc = _check_json(capsys, "--matrix", str(matrix_dir / "matrix.yaml"))
    assert code == 2
    assert doc["ok"] is False and doc["tag"] is None
    assert doc["counts"]["error"] == 1
    [finding] = doc["findings"]
    assert finding["severity"] == "error" and finding["rule"] == "matrix-invalid"
    assert finding["message"] and finding["fix"]
    assert where in (finding["where"] or "") + finding["message"]


def test_a_bad_tag_is_json_too(capsys):
    code, doc = _check_json(capsys, "--tag", "2026-07-01-nosuchengine")
    assert code == 2 and doc["ok"] is False and doc["tag"] == "2026-07-01-nosuchengine"
