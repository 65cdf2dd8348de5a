"""A release's state reads the same in every output (issue 38 item 11): after a real
`rollback`, `releases` (table and JSON), `history` and the notes all say the newer
release was rolled back, and where `latest` is; the notes offer no rollback to the
release `latest` is already at, and take the smoke verdict from the registry's record
when this checkout has no report of that image."""

from __future__ import annotations

import json

from imagebuild.cli import main
from tests.support.cliregistry import cli_registry

OLD, NEW = "2026-06-11-v0.23.0-pr41703", "2026-06-18-v0.23.0-dflashfix"
IMAGE = "cpu-tiny-ngram"


def test_a_rolled_back_release_reads_alike_everywhere(monkeypatch, tmp_path, capsys) -> None:
    cli_registry(monkeypatch, tmp_path, (OLD, NEW))
    assert main(["rollback", "--to", OLD, "--image", IMAGE]) == 0
    capsys.readouterr()

    assert main(["releases", "--image", IMAGE]) == 0
    table = capsys.readouterr().out
    lines = table.splitlines()
    row = next(i for i, ln in enumerate(lines) if ln[2:].startswith(NEW))
    detail = " ".join(ln.strip() for ln in lines[row + 1:row + 3] if ln.startswith("    "))
    assert f"rolled back to {OLD} at " in detail, table
    assert f"(latest -> {OLD})" in table

    assert main(["releases", "--image", IMAGE, "--format", "json"]) == 0
    rows = {r["tag"]: r for rels in json.loads(capsys.readouterr().out).values() for r in rels}
    assert rows[NEW]["rolled_back"]["to"] == OLD and rows[OLD]["rolled_back"] is None

    assert main(["history", "--image", IMAGE, "--out", str(tmp_path / "h")]) == 0
    history = capsys.readouterr().out
    assert f"{NEW} (rolled back) |" in history and f"{OLD}** (latest)" in history, history

    assert main(["notes", "--tag", "2026-06-18-dflashfix", "--only", IMAGE]) == 0
    notes = capsys.readouterr().out
    assert "`latest` is not at this release" in notes
    assert f"`latest` is at `{OLD}`: this release was rolled back to it" in notes, notes
    assert f"rollback --tag {OLD}" not in notes  # latest is there already
    assert "nothing of it to roll back" in notes
    assert "no smoke report was found" not in notes and "**PASSED**" in notes
    assert "as recorded with release" in notes
