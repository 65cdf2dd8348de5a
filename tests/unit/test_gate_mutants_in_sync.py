"""tools/mutate_gates.py breaks each gate once and runs its unit tests; this keeps the
script in step with the code: every mutated text is in its module exactly once and every
test file it runs exists."""

from __future__ import annotations

from pathlib import Path

from tools.mutate_gates import MUTANTS

ROOT = Path(__file__).resolve().parents[2]


def test_every_mutant_still_finds_its_code_and_tests() -> None:
    for m in MUTANTS:
        assert (ROOT / m.file).read_text().count(m.old) == 1, m.name
        assert m.old != m.new, m.name
        for test in m.tests:
            assert (ROOT / test).is_file(), (m.name, test)
