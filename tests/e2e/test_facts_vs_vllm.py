"""The shipped facts of each recorded vLLM version are what that version's own code says
today: `record_facts` (what `build.py facts record` runs) in its oracle venv writes every
part again, and each must equal the shipped imagebuild/facts/recorded/<version>/ file (a
recorder change or a vLLM upgrade without re-recording fails here, naming the command).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

from imagebuild.facts import SHIPPED, record_command, record_facts
from imagebuild.facts.store import META
from tests.support.vllm_oracle.pythons import need, recorded

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.mark.parametrize("version", recorded("meta"))
def test_shipped_facts_are_what_the_version_records(version: str, tmp_path: Path) -> None:
    python = need(version)
    shipped = SHIPPED / version
    meta = json.loads((shipped / META).read_text())
    parts = sorted(p for p, entry in meta["parts"].items() if "error" not in entry)
    record_facts(python, tmp_path, parts=parts, say=lambda _: None)
    fresh = tmp_path / version
    bad = []
    for part in parts:
        name = meta["parts"][part]["file"]
        old = (shipped / name).read_text().splitlines()
        new_file = fresh / name
        assert new_file.is_file(), f"{part} was not recorded again"
        diff = list(difflib.unified_diff(old, new_file.read_text().splitlines(),
                                         str(shipped / name), "recorded now", lineterm="",
                                         n=0))
        if diff:
            bad.append("\n".join(diff[:20]))
    assert not bad, ("\n".join(bad) + f"\nre-record: {record_command(version)}")
