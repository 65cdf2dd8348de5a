"""benchmarks/mutate_gates.py breaks each gate once and runs its unit tests; this keeps the
script in step with the code: every mutated text is in its module exactly once and every
test file it runs exists."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _mutants():
    spec = importlib.util.spec_from_file_location("mutate_gates",
                                                  ROOT / "benchmarks/mutate_gates.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.MUTANTS


def test_every_mutant_still_finds_its_code_and_tests() -> None:
    for m in _mutants():
        assert (ROOT / m.file).read_text().count(m.old) == 1, m.name
        assert m.old != m.new, m.name
        for test in m.tests:
            assert (ROOT / test).is_file(), (m.name, test)
