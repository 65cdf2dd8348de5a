"""The suite's time per module (tests/support/timing.py), as `.ci/run` prints it."""

from __future__ import annotations

from tests.support.timing import summarize

REPORTS = [
    ("tests/e2e/test_a.py::test_one", "setup", 300.0),  # a module fixture
    ("tests/e2e/test_a.py::test_one", "call", 1.0),
    ("tests/e2e/test_a.py::test_two", "call", 2.0),
    ("tests/e2e/test_a.py::test_two", "teardown", 7.0),
    ("tests/unit/test_b.py::test_x[1]", "call", 40.0),
    ("tests/unit/test_b.py::test_x[2]", "call", 50.0),
    ("tests/e2e/test_c.py::test_y", "call", 100.0),
]


def test_modules_largest_first_with_their_fixtures_and_folders():
    lines = summarize(REPORTS)
    rows = [line.split() for line in lines[1:-1]]
    assert [r[-1] for r in rows] == ["tests/e2e/test_a.py", "tests/e2e/test_c.py",
                                     "tests/unit/test_b.py"]
    assert rows[0][:4] == ["310.0", "62.0%", "2", "300.0"]  # seconds, share, tests, set-up
    assert rows[2][:3] == ["90.0", "18.0%", "2"]  # parametrized cases are tests of it
    assert lines[-1].split()[:3] == ["500.0", "100.0%", "5"]
    assert lines[-1].endswith("all (tests/e2e 410 s, tests/unit 90 s)")


def test_modules_past_the_top_are_one_line():
    lines = summarize(REPORTS, top=1)
    assert lines[1].endswith("tests/e2e/test_a.py")
    assert lines[2].split()[:3] == ["190.0", "38.0%", "3"]
    assert lines[2].endswith("2 other modules")
