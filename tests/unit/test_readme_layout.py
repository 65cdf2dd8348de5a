"""docs/layout.md (linked from the README) and the repository say the same thing: every module and
subpackage of imagebuild/ and every top-level folder is listed, and nothing listed is gone."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _layout_block() -> list[str]:
    return (ROOT / "docs/layout.md").read_text().split("```\n", 2)[1].splitlines()


def _listed(indent: str) -> set[str]:
    pattern = re.compile(rf"^{indent}(\S+)\s")
    return {m.group(1) for line in _layout_block() if (m := pattern.match(line + " "))}


def test_every_module_and_subpackage_of_imagebuild_is_listed() -> None:
    pkg = ROOT / "imagebuild"
    actual = {p.name for p in pkg.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    actual |= {p.name + "/" for p in pkg.iterdir() if (p / "__init__.py").is_file()}
    assert _listed("  ") == actual


def test_every_top_level_folder_is_listed_and_nothing_listed_is_gone() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    folders = {f.split("/", 1)[0] + "/" for f in tracked
               if "/" in f and not f.startswith((".ci/", ".github/"))}
    listed = _listed("")
    assert folders <= listed, f"not in docs/layout.md: {sorted(folders - listed)}"
    for entry in listed:
        assert (ROOT / entry).exists(), f"docs/layout.md lists {entry}, which is gone"


def test_test_modules_have_one_basename_each() -> None:
    """pytest imports test modules by basename (rootdir-relative, no packages): two
    `test_x.py` in different folders stop the whole suite at collection."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py") if "data" not in p.parts]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
