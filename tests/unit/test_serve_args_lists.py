"""Serve flags of several values (issue 38, item 4): vLLM 0.23's parser gives a list-typed
option nargs="+" (vllm/engine/arg_utils.py, _get_type_kwargs: `"nargs": "+"`, recorded per
option in preflight/vllm_cli/serve_args_0.23.0.json), so `--cudagraph-capture-sizes 1 2 4`
is three arguments. A profile writes it as a YAML list; the schema takes it, preflight
checks each value as the option's own, the serve command carries one argument per value.
(tests/e2e/test_serve_args_vs_vllm.py runs the same argv through vLLM's own parser.)"""

from __future__ import annotations

import pytest

from imagebuild.preflight.serve_args import args_problems, load_cli
from imagebuild.spec import matrix as mx
from imagebuild.spec.servecmd import args_argv, serve_command
from tests.support.matrices import check, edit

CLI = load_cli("0.23.0")


def _problems(args: dict) -> list[str]:
    assert CLI is not None
    return [p.message for p in args_problems(args, CLI)
            if p.rule in ("serve-flag-unknown", "serve-flag-value")]


def test_a_list_is_one_argument_per_value():
    assert args_argv({"cudagraph-capture-sizes": [1, 2, 4], "enforce-eager": True,
                      "max-num-seqs": 8}) == \
        ["--cudagraph-capture-sizes", "1", "2", "4", "--enforce-eager", "--max-num-seqs", "8"]


def test_a_list_is_checked_value_by_value():
    assert CLI is not None and CLI["options"]["cudagraph-capture-sizes"]["nargs"] == "+"
    assert _problems({"cudagraph-capture-sizes": [1, 2, 4]}) == []
    assert _problems({"served-model-name": ["a", "b"]}) == []
    [bad] = _problems({"cudagraph-capture-sizes": [1, "two", 4]})
    assert "two" in bad
    [empty] = _problems({"cudagraph-capture-sizes": []})
    assert "empty" in empty
    [single] = _problems({"max-num-seqs": [8, 16]})
    assert "one value, not a list" in single


def test_text_of_several_numbers_is_told_to_be_a_list():
    assert CLI is not None
    [p] = [p for p in args_problems({"cudagraph-capture-sizes": "1 2 4"}, CLI)]
    assert "[1, 2, 4]" in (p.fix or "")


@pytest.mark.parametrize("value,errors", [("[1, 2, 4]", 0), ("[1, two]", 1)])
def test_a_profile_may_write_a_list(matrix_dir, value, errors):
    edit(matrix_dir, "      max-num-seqs: 8\n",
         f"      max-num-seqs: 8\n      cudagraph-capture-sizes: {value}\n")
    lm = mx.load(matrix_dir / "matrix.yaml")
    [cell] = [c for c in mx.expand(lm) if c.target_name == "cpu" and c.engine_name == "dflashfix"]
    argv = serve_command(cell).argv
    i = argv.index("--cudagraph-capture-sizes")
    assert list(argv[i + 1:i + 3]) == ["1", "2" if errors == 0 else "two"]
    found = [f for f in check(matrix_dir, target="cpu", engine="dflashfix")
             if f.rule == "serve-flag-value"]
    assert len(found) == errors, [f.message for f in found]
