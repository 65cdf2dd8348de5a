"""What whole commands answer about the registry's state (issue 38, items 2 and 3): notes
of a release that is not there is bad input (exit 2, no notes printed); an empty
namespace is an answer (exit 0, "no releases", `{}` as JSON), except for a rollback,
which then has nothing to go back to (exit 1: the registry's state, not the input)."""

from __future__ import annotations

import json

import pytest

from imagebuild import cli
from tests.support.cliregistry import cli_registry

TAG = "2026-06-18-v0.23.0-dflashfix"


@pytest.fixture
def empty(monkeypatch, tmp_path):
    return cli_registry(monkeypatch, tmp_path)


def test_notes_of_a_release_that_is_not_in_the_registry_is_refused(monkeypatch, tmp_path,
                                                                    capsys):
    reg = cli_registry(monkeypatch, tmp_path, (TAG,))
    seeded = len(reg.writes())
    assert cli.main(["notes", "--tag", "2026-08-01-dflashfix",
                     "--asset-dir", str(tmp_path / "assets")]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert "2026-08-01-v0.23.0-dflashfix is not in the registry" in out.err
    assert "build.py releases" in out.err
    assert not (tmp_path / "assets").exists() and reg.writes()[seeded:] == []
    # the release that is there still gets its notes
    assert cli.main(["notes", "--tag", "2026-06-18-dflashfix"]) == 0
    assert "2026-06-18-v0.23.0-dflashfix" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["releases"], ["releases", "--image", "cpu-tiny-ngram"],
                                  ["history"], ["prune", "--keep", "1", "--dry-run"],
                                  ["prune", "--keep", "1"], ["unlock", "--dry-run"]])
def test_an_empty_namespace_is_an_answer(empty, argv, capsys):
    assert cli.main(argv) == 0
    out = capsys.readouterr()
    assert "no repository" not in out.err
    if argv[0] != "unlock":
        assert "no releases under 127.0.0.1:5999" in out.out
    assert empty.writes() == []


def test_releases_json_of_an_empty_namespace_is_an_empty_object(empty, capsys):
    assert cli.main(["releases", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {}
    assert cli.main(["releases", "--format", "json", "--image", "cpu-*"]) == 0
    assert json.loads(capsys.readouterr().out) == {}


def test_releases_json_has_the_documented_shape(monkeypatch, tmp_path, capsys):
    cli_registry(monkeypatch, tmp_path, (TAG,))
    assert cli.main(["releases", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["vllm-spark/cpu-tiny-ngram"]
    assert [r["tag"] for r in doc["vllm-spark/cpu-tiny-ngram"]] == [TAG]


def test_rollback_with_nothing_published_is_a_state_error(empty, capsys):
    assert cli.main(["rollback", "--to", "2026-06-18-dflashfix", "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "nothing to roll back" in err and "no releases under" in err


def test_an_image_name_nothing_knows_is_still_bad_input(empty, capsys):
    assert cli.main(["releases", "--image", "cpu-tiny-ngrm"]) == 2
    err = capsys.readouterr().err
    assert "did you mean cpu-tiny-ngram?" in err
