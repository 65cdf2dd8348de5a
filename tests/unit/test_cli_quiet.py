"""-qq is what every command's help says it is (issue 38, item 6): accepted after any
command as before it, and honoured: warnings (preflight's, render's skipped files) are
left out, errors still print and block."""

from __future__ import annotations

import logging
import re

import pytest

from imagebuild import cli
from imagebuild.cliparser import parser
from tests.support.parsertree import commands

TAG = "2026-07-01-dflashfix"


@pytest.fixture(autouse=True)
def _restore_logging():
    yield
    logging.getLogger("imagebuild").setLevel(logging.NOTSET)


@pytest.mark.parametrize("flag", ["-qq", "-vv", "-qqq"])
def test_every_command_that_advertises_it_accepts_it(flag, capsys):
    for name, sub in commands(parser()):
        if "-qq" not in sub.format_help():
            continue
        assert cli.main([*name.split(), flag, "--help"]) == 0, name
        out = capsys.readouterr()
        assert "has no option" not in out.err, (name, out.err)


def test_qq_leaves_out_warnings_but_not_errors(matrix_dir, capsys):
    """matrix_dir has no lock: its gb10 pins are unresolved."""
    matrix = ["--matrix", str(matrix_dir / "matrix.yaml")]
    argv = ["plan", "--tag", TAG, "--target", "gb10", *matrix]
    assert cli.main(argv) == 0
    loud = capsys.readouterr().err
    assert re.search(r"^warning ", loud, re.M)  # unresolved gb10 pins: warnings for a plan
    for quiet in (["-qq", *argv], [*argv, "-qq"]):
        assert cli.main(quiet) == 0
        out = capsys.readouterr()
        # no warning row; the errors' summary (plan says what check --tag says) counts none
        assert not re.search(r"^warning ", out.err, re.M) and not re.search(
            r"[1-9]\d* warning\(s\)", out.err), out.err
        assert out.out  # the plan itself is the answer
    # an error still prints under -qq
    assert cli.main(["-qq", "check", "--tag", TAG, "--target", "gb10", *matrix]) == 2
    assert re.search(r"^error ", capsys.readouterr().out, re.M)


def test_qq_leaves_out_renders_skipped_files_warning(matrix_dir, tmp_path, capsys):
    argv = ["render", "--matrix", str(matrix_dir / "matrix.yaml"), "--out", str(tmp_path / "r")]
    assert cli.main(argv) == 0
    assert "skipped" in capsys.readouterr().err
    assert cli.main([*argv, "-qq"]) == 0
    assert "skipped" not in capsys.readouterr().err
