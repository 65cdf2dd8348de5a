"""The repository stands alone: nothing in it points at notes outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from imagebuild import REPO_ROOT

OUTSIDE = re.compile(r"\.\./shared|/work/shared|\b(?:DOMAIN|DESIGN|CPU_ENGINE)\.md\b")


def test_no_tracked_file_points_outside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    hits = []
    for rel in files:
        path = REPO_ROOT / rel
        if not path.is_file() or path == Path(__file__).resolve():  # (this file names them)
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        hits += [f"{rel}:{n}" for n, line in enumerate(text.splitlines(), 1)
                 if OUTSIDE.search(line)]
    assert hits == [], "references to notes outside the repository:\n" + "\n".join(hits)


def test_the_docs_the_code_cites_exist():
    for name in ("design.md", "domain.md", "cpu-engine.md"):
        assert (REPO_ROOT / "docs" / name).is_file(), name
