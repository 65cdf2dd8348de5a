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


def test_the_lowest_free_disk_names_the_modules_running_then():
    """The summary's disk line: the least free space seen at any report, and which
    modules the lanes were in then (what filled the disk, when a CI run runs out)."""
    from types import SimpleNamespace

    from tests.support import timing

    frees = iter([50e9, 20e9, 30e9, 30e9])
    report = timing.TimingReport(free=lambda: int(next(frees)))

    def logreport(nodeid, lane):
        report.pytest_runtest_logreport(SimpleNamespace(
            nodeid=nodeid, when="call", duration=1.0,
            node=SimpleNamespace(gateway=SimpleNamespace(id=lane))))

    logreport("tests/e2e/test_a.py::t", "gw0")
    logreport("tests/e2e/test_b.py::t", "gw1")
    logreport("tests/e2e/test_c.py::t", "gw0")  # a's line is written: one more sample
    lines = []
    report.pytest_terminal_summary(SimpleNamespace(write_sep=lambda *a: None,
                                                   write_line=lines.append))
    assert lines[-1] == ("lowest free disk 20.0 GB, with tests/e2e/test_a.py, "
                         "tests/e2e/test_b.py running")
