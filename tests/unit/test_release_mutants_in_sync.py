"""tools/mutate_release_state.py reverts each release-state fix once and runs the property
and regression tests; this keeps the script in step with the code: every mutated text is
in its module exactly once and every test it runs exists."""

from __future__ import annotations

import ast
from pathlib import Path

from tools import mutate_release_state

ROOT = Path(__file__).resolve().parents[2]


def _test_names(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test")}


def test_every_mutant_still_finds_its_code_and_tests() -> None:
    tool = mutate_release_state
    assert (ROOT / tool.PROPERTY).is_file()
    assert len({m.name for m in tool.MUTANTS}) == len(tool.MUTANTS)
    for m in tool.MUTANTS:
        text = (ROOT / m.file).read_text()
        assert m.edits and m.tests, m.name
        for old, new in m.edits:
            assert text.count(old) == 1, (m.name, old)
            assert old != new, m.name
        for test in m.tests:
            path, _, name = test.partition("::")
            assert (ROOT / path).is_file(), (m.name, test)
            assert not name or name in _test_names(ROOT / path), (m.name, test)
