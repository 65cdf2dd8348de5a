"""Schema errors of matrix.yaml in our words (issue 38, item 12): an unknown key gets the
nearest key of its section, a key misspelt in a profile that others extend is one error
(it came back once per extending profile, all at the same line), a misspelt required key
is not also reported missing, and no pydantic phrase reaches the user."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagebuild.cli import main

ROOT = Path(__file__).resolve().parents[2]
MATRIX = (ROOT / "matrix.yaml").read_text()
PYDANTIC = ("Extra inputs are not permitted", "Field required", "Input should be",
            "String should match")


def _check(tmp_path: Path, capsys, old: str, new: str) -> tuple[str, str]:
    assert old in MATRIX, old
    text = MATRIX.replace(old, new, 1)
    (tmp_path / "matrix.yaml").write_text(text)
    assert main(["check", "--matrix", str(tmp_path / "matrix.yaml")]) == 2
    err = capsys.readouterr().err
    assert not any(p in err for p in PYDANTIC), err
    return text, err


def _mistake_lines(err: str) -> list[str]:
    """The lines that each name one mistake (file:line:column first)."""
    return [line for line in err.splitlines()
            if line.startswith("error: ") or ".yaml:" in line.split(" ", 1)[0]]


def test_a_key_misspelt_in_an_extended_profile_is_one_error(tmp_path, capsys) -> None:
    text, err = _check(tmp_path, capsys, "    extends: spark\n    methods: [dflash]",
                       "    extends: spark\n    methodz: [dflash]")
    line = text[:text.index("methodz")].count("\n") + 1
    assert len(_mistake_lines(err)) == 1, err
    assert f"matrix.yaml:{line}:5: profiles.spark-dflash.methodz: unknown key; did you mean " \
           "`methods`?" in err
    assert "inherited by profiles.spark-dflash-aeon, profiles.spark-w4a16-dflash" in err
    assert "  fix: write `methods`" in err


@pytest.mark.parametrize("old,new,said,fix", [
    ("publish:\n", "publsh:\n", "publsh: unknown key; did you mean `publish`?",
     "write `publish`"),
    ("  namespace: vllm-spark\n", "  namspace: vllm-spark\n",
     "publish.namspace: unknown key; did you mean `namespace`?", "write `namespace`"),
    ("    served_names: [tiny, tiny-alias]", "    servednames: [tiny, tiny-alias]",
     "models.tiny.servednames: unknown key; did you mean `served_names`?",
     "write `served_names`"),
    ("  namespace: vllm-spark\n", "  namespace: vllm-spark\n  colour: red\n",
     "publish.colour: unknown key\n", "remove the key or correct its spelling (this "
     "section's keys: registry, namespace, regression_threshold, acceptance_threshold)"),
    ("    acceptance_floor: 0.15\n", "    acceptance_floor: high\n",
     "acceptance_floor: must be a number; found 'high'", "write a number, e.g. 0.3"),
])
def test_unknown_keys_get_the_nearest_one(old, new, said, fix, tmp_path, capsys) -> None:
    _, err = _check(tmp_path, capsys, old, new)
    assert said in err, err
    assert f"  fix: {fix}" in err, err
    # the misspelt required key is not also "missing"
    assert len(_mistake_lines(err)) == 1, err
