"""Options are named the same way for the same thing (issue 38, item 12): `--image GLOB`
selects images in every command (the release commands said `--only`), `--tag T` names a
release (rollback said `--to`); the old spellings still work and say they were renamed."""

from __future__ import annotations

import json
import logging

import pytest

from imagebuild import cli
from imagebuild.cliparser import parser
from tests.support.cliregistry import cli_registry
from tests.support.parsertree import commands

TAGS = ("2026-06-18-v0.23.0-dflashfix", "2026-07-01-v0.23.0-dflashfix")


@pytest.fixture(autouse=True)
def _restore_logging():
    yield
    logging.getLogger("imagebuild").setLevel(logging.NOTSET)


def test_one_name_per_thing_in_every_command() -> None:
    for name, sub in commands(parser()):
        for action in sub._actions:
            if action.metavar == "GLOB":  # selects images by a glob
                assert action.option_strings[0] == "--image", (name, action.option_strings)
    rollback = next(s for n, s in commands(parser()) if n == "rollback")
    (tag,) = [a for a in rollback._actions if "--to" in a.option_strings]
    assert tag.option_strings[0] == "--tag"


def test_the_old_spellings_work_and_say_so(monkeypatch, tmp_path, capsys) -> None:
    cli_registry(monkeypatch, tmp_path, TAGS)
    assert cli.main(["plan", "--tag", "2026-07-01-dflashfix", "--only", "cpu-*",
                     "--format", "json"]) == 0
    out = capsys.readouterr()
    assert [c["image"] for c in json.loads(out.out)["cells"]] == ["cpu-tiny-ngram"]
    assert out.err.count("warning: --only is now --image") == 1, out.err
    assert cli.main(["rollback", "--to", TAGS[0], "--image", "cpu-*", "--dry-run"]) == 0
    assert capsys.readouterr().err.count("warning: --to is now --tag") == 1
    # the new names say nothing; -qq leaves the note out
    assert cli.main(["rollback", "--tag", TAGS[0], "--image", "cpu-*", "--dry-run"]) == 0
    assert cli.main(["-qq", "plan", "--tag", "2026-07-01-dflashfix", "--only", "cpu-*"]) == 0
    assert "is now" not in capsys.readouterr().err
