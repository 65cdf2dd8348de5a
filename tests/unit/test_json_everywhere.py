"""`--format json` is valid JSON on every exit path (issue 38): each command that offers
it prints one JSON document on stdout when it succeeds, when its input is bad (exit 2),
when its options are (a usage error) and when the registry refuses (exit 1); what the
command says as it works goes to stderr. The commands are read from the parser, so one
that gains `--format json` needs a case here, and a row in docs/commands.md's JSON
section (its shape)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from imagebuild import cli
from imagebuild.cliparser import parser
from imagebuild.release import verify
from tests.support.cliregistry import cli_registry
from tests.support.parsertree import commands

ROOT = Path(__file__).resolve().parents[2]
OLD, NEW = "2026-06-18-v0.23.0-dflashfix", "2026-07-01-v0.23.0-dflashfix"
REF = f"127.0.0.1:5000/vllm-spark/cpu-tiny-ngram:{NEW}"
# a run that succeeds, against the repository's matrix and the in-memory registry
OK = {
    "plan": ["plan", "--tag", "2026-07-01-dflashfix"],
    "check": ["check"],
    "render": ["render", "--check"],
    "lock": ["lock", "--check"],
    "releases": ["releases"],
    "history": ["history"],
    "table": ["table", "--tag", "2026-07-01-dflashfix"],
    "verify": ["verify", REF],
    "prune": ["prune", "--keep", "1", "--dry-run"],
    "rollback": ["rollback", "--tag", OLD, "--dry-run"],
    "promote": ["promote", "--tag", "2026-07-01-dflashfix", "--dry-run"],
    "resume": ["resume", "--tag", "2026-07-01-dflashfix"],
    "schema": ["schema"],
    "pins watch": None,  # asks the Hub: its JSON is pinwatch's own (tests/unit/test_pinwatch.py)
}


def _json_commands() -> list[str]:
    return sorted(name for name, sub in commands(parser()) for a in sub._actions
                  if "--format" in a.option_strings and "json" in (a.choices or ()))


@pytest.fixture
def registry(monkeypatch, tmp_path):
    reg = cli_registry(monkeypatch, tmp_path, (OLD, NEW))
    monkeypatch.setattr(verify, "RegistryClient", lambda host: reg.client())
    monkeypatch.chdir(ROOT)
    return reg


def _doc(capsys, argv: list[str]) -> tuple[int, dict]:
    code = cli.main(argv)
    out = capsys.readouterr().out
    return code, json.loads(out)  # one document, nothing else on stdout


def test_every_json_command_has_a_case() -> None:
    assert set(_json_commands()) == set(OK), set(_json_commands()) ^ set(OK)


@pytest.mark.parametrize("command", sorted(c for c, a in OK.items() if a))
def test_success_is_one_json_document(command, registry, capsys) -> None:
    code, doc = _doc(capsys, [*OK[command], "--format", "json"])
    assert code in (0, 1), (command, doc)  # verify: this release has no SBOM (exit 1)
    assert isinstance(doc, dict) and "error" not in doc


@pytest.mark.parametrize("command", sorted(c for c, a in OK.items() if a))
def test_every_failure_is_a_json_document_too(command, registry, capsys, tmp_path) -> None:
    broken = tmp_path / "matrix.yaml"
    broken.write_text((ROOT / "matrix.yaml").read_text().replace("  registry: 127.0.0.1",
                                                                 "  registry: [127.0.0.1", 1))
    argv = [*OK[command], "--format", "json"]
    # bad input: the matrix (a command without one, a reference it cannot read)
    bad = ([a if a != REF else "127.0.0.1:5000/x/y@sha256:nothex" for a in argv]
           if command == "verify" else [*argv, "--matrix", str(broken)])
    code, doc = _doc(capsys, bad)  # (schema reads no matrix: --matrix is a usage error)
    assert code == 2 and doc["ok"] is False, doc
    said = doc["error"]["message"] if "error" in doc else doc["findings"][0]["message"]
    assert said and "Traceback" not in said
    # a usage error: the option does not exist
    code, doc = _doc(capsys, [*argv, "--no-such-option"])
    assert code == 2 and doc["error"]["exit_code"] == 2 and "--no-such-option" in \
        doc["error"]["message"]


def test_a_registry_refusal_is_json_with_exit_1(registry, capsys) -> None:
    code, doc = _doc(capsys, ["promote", "--tag", "2026-06-18-dflashfix", "--format", "json"])
    assert code == 1 and doc["ok"] is False and doc["error"]["exit_code"] == 1, doc
    assert "newer" in doc["error"]["message"] or "latest" in doc["error"]["message"]


def test_docs_give_each_json_shape() -> None:
    text = (ROOT / "docs/commands.md").read_text()
    section = text.split("## JSON output", 1)[1].split("\n## ", 1)[0]
    documented = {m for m in re.findall(r"^\| `([a-z -]+?)(?: --[a-z-]+)*` \|", section, re.M)}
    assert documented == set(_json_commands()), documented ^ set(_json_commands())
