"""Where the suite's time goes: after the run, seconds per test module (its tests' set-up,
call and teardown, module-scoped fixtures included) and per top folder, largest first.
`--durations` names single tests; a module's session fixture or twenty 40 s cases show
only here. Loaded by tests/conftest.py; `.ci/run` prints it at the end of every CI run.
Each module also gets one line on stderr as it ends (seconds, and since the session began),
written unbuffered: a run cut off by CI's time limit still shows where its time went."""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

TOP = 20  # modules listed by name; the rest are one line


@dataclass
class Spent:
    seconds: float = 0.0
    tests: set[str] = field(default_factory=set)
    setup: float = 0.0  # of which set-up (module and session fixtures are paid here)


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def summarize(durations: list[tuple[str, str, float]], top: int = TOP) -> list[str]:
    """(nodeid, phase, seconds) of every report -> the lines of the table."""
    mods: dict[str, Spent] = defaultdict(Spent)
    for nodeid, phase, seconds in durations:
        spent = mods[module_of(nodeid)]
        spent.seconds += seconds
        spent.tests.add(nodeid)
        if phase == "setup":
            spent.setup += seconds
    total = sum(s.seconds for s in mods.values()) or 1e-9
    folders: dict[str, float] = defaultdict(float)
    for mod, spent in mods.items():
        folders["/".join(mod.split("/")[:2]) if "/" in mod else mod] += spent.seconds
    ranked = sorted(mods.items(), key=lambda kv: -kv[1].seconds)
    lines = [f"{'seconds':>8} {'share':>6} {'tests':>5} {'set-up':>7}  module"]
    for mod, spent in ranked[:top]:
        lines.append(f"{spent.seconds:8.1f} {spent.seconds / total:6.1%} {len(spent.tests):5d} "
                     f"{spent.setup:7.1f}  {mod}")
    rest = ranked[top:]
    if rest:
        secs = sum(s.seconds for _, s in rest)
        lines.append(f"{secs:8.1f} {secs / total:6.1%} {sum(len(s.tests) for _, s in rest):5d}"
                     f" {'':7}  {len(rest)} other modules")
    by_folder = ", ".join(f"{f} {s:.0f} s" for f, s in sorted(folders.items(),
                                                             key=lambda kv: -kv[1]))
    lines.append(f"{total:8.1f} {1:6.1%} {sum(len(s.tests) for s in mods.values()):5d}"
                 f" {'':7}  all ({by_folder})")
    return lines


class TimingReport:
    def __init__(self) -> None:
        self.durations: list[tuple[str, str, float]] = []
        self.began = time.monotonic()
        self.module_began: float | None = None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.durations.append((report.nodeid, report.when, report.duration))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item,
                                nextitem: pytest.Item | None) -> Iterator[None]:
        if self.module_began is None:
            self.module_began = time.monotonic()
        yield
        mod = module_of(item.nodeid)
        if nextitem is None or module_of(nextitem.nodeid) != mod:
            now = time.monotonic()
            sys.stderr.write(f"\n[timing] {mod} {now - self.module_began:.0f} s "
                             f"(suite at {now - self.began:.0f} s)\n")
            sys.stderr.flush()
            self.module_began = now

    @pytest.hookimpl(trylast=True)  # after --durations: the last thing CI's log shows
    def pytest_terminal_summary(self, terminalreporter) -> None:  # type: ignore[no-untyped-def]
        if not self.durations:
            return
        terminalreporter.write_sep("=", "where the time goes (per module: set-up + call + "
                                        "teardown)")
        for line in summarize(self.durations):
            terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TimingReport(), "imagebuild-timing-report")
