"""Where the suite's time goes: after the run, seconds per test module (its tests' set-up,
call and teardown, module-scoped fixtures included) and per top folder, largest first.
`--durations` names single tests; a module's session fixture or twenty 40 s cases show
only here. Loaded by tests/conftest.py; `.ci/run` prints it at the end of every CI run.
Each module also gets one line on stderr as it ends (its seconds, its lane, and the time
since the session began, and the disk left free), flushed: a run cut off by CI's time
limit still shows where its time went. The summary names the lowest free disk seen and the
modules running then: a CI machine's disk is not ours to choose (docs/design.md, "The test
suite's disk is budgeted")."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

TOP = 20  # modules listed by name; the rest are one line
# where the suite writes its GBs: the checkout (venvs, build/), /tmp and Docker's store,
# on one file system on CI's machines; where they are apart, the least free one counts
DISK_PATHS = ("/var/lib/docker", "/tmp")


def free_bytes(paths: tuple[str, ...] = DISK_PATHS) -> int:
    """The least free space among the file systems of `paths` (those that exist)."""
    free = [shutil.disk_usage(p).free for p in paths if os.path.exists(p)]
    return min(free) if free else 0


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
    """In the process that reports (xdist's controller, or the only one): the durations,
    and a line per module once it is done. With xdist, a lane's module is done when that
    lane reports a test of another module (a module runs whole in one lane: --dist
    loadfile), or when the session ends."""

    def __init__(self, free: Callable[[], int] = free_bytes) -> None:
        self.free = free
        self.durations: list[tuple[str, str, float]] = []
        self.began = time.monotonic()
        self.current: dict[str, tuple[str, float]] = {}  # lane -> (module, its seconds)
        self.lowest: tuple[int, list[str]] | None = None  # least free disk, modules then

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.durations.append((report.nodeid, report.when, report.duration))
        lane = getattr(getattr(report, "node", None), "gateway", None)
        lane_id = getattr(lane, "id", "main")
        mod = module_of(report.nodeid)
        was, seconds = self.current.get(lane_id, (mod, 0.0))
        if was != mod:
            self._done(lane_id, was, seconds)
            seconds = 0.0
        self.current[lane_id] = (mod, seconds + report.duration)
        free = self.free()
        if self.lowest is None or free < self.lowest[0]:
            self.lowest = (free, sorted(m for m, _ in self.current.values()))

    def _done(self, lane: str, mod: str, seconds: float) -> None:
        sys.stderr.write(f"\n[timing] {mod} {seconds:.0f} s in lane {lane} "
                         f"(suite at {time.monotonic() - self.began:.0f} s, "
                         f"{self.free() / 1e9:.1f} GB free)\n")
        sys.stderr.flush()

    def pytest_sessionfinish(self) -> None:
        for lane, (mod, seconds) in sorted(self.current.items()):
            self._done(lane, mod, seconds)
        self.current.clear()

    @pytest.hookimpl(trylast=True)  # after --durations: the last thing CI's log shows
    def pytest_terminal_summary(self, terminalreporter) -> None:  # type: ignore[no-untyped-def]
        if not self.durations:
            return
        terminalreporter.write_sep("=", "where the time goes (per module: set-up + call + "
                                        "teardown)")
        for line in summarize(self.durations):
            terminalreporter.write_line(line)
        if self.lowest:
            free, mods = self.lowest
            terminalreporter.write_line(f"lowest free disk {free / 1e9:.1f} GB, with "
                                        f"{', '.join(mods)} running")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # xdist's workers send their reports up
        config.pluginmanager.register(TimingReport(), "imagebuild-timing-report")
