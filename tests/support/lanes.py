"""The suite in two lanes (pytest-xdist, `-n 2 --dist loadfile` in pyproject.toml): a
module runs whole in one lane, so its module fixtures are made once; the two lanes share
the machine's two cores, its Docker engine and its disk.

Most of an e2e test's wall time is one core busy (vLLM's three processes import torch one
after the other at each boot; dockerd compresses a layer on one thread; pip unpacks on
one) or none (waiting for a container), so two lanes finish the suite in a little over
half the time. What each lane needs of its own:
- the session fixtures (a registry, the cpu serve image) are made per lane; the cpu image
  is built under a lock shared by the lanes (`shared_lock`), so the second lane's build
  finds every layer in BuildKit's cache instead of building the engine a second time;
- modules run heaviest first (ORDER: seconds each took in CI, `.ci/run` prints them), so
  no heavy module is left to start when the other lane has nothing more to do;
- a test whose assertions read timing figures (the bench's trust flags, which a busy second
  core makes the load generator raise) is marked `alone`: it waits for the other lane's
  test to end, and the other lane waits for it (a readers-writer lock, `lane_lock`).
Tests that look at the engine's containers count only their own (tests/support/leftovers.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# seconds per module in a CI run (the heaviest first; modules not listed follow, in
# collection order): refresh from the "where the time goes" table when the order drifts
ORDER = {
    # the release flow builds and releases the 0.32 engine too (~325 s more, measured alone)
    "tests/e2e/test_release_flow.py": 600,
    "tests/e2e/test_act_release.py": 434,
    "tests/e2e/test_killed_run_sweep.py": 362,
    "tests/e2e/test_multinode_cpu.py": 159,
    "tests/e2e/test_interrupts_e2e.py": 151,
    "tests/e2e/test_smoke_negative.py": 133,
    "tests/e2e/test_gb10_rehearsal_runs.py": 106,
    "tests/e2e/test_bench.py": 89,
    "tests/e2e/test_package.py": 84,
    "tests/e2e/test_facts_vs_vllm.py": 79,
    "tests/e2e/test_release_gates_e2e.py": 78,
    "tests/e2e/test_registry_faults.py": 74,
    "tests/e2e/test_release_state_e2e.py": 73,
    "tests/e2e/test_kernel_select_vs_vllm.py": 50,
    "tests/e2e/test_kvcache_vs_vllm.py": 40,
    "tests/e2e/test_kvcache_families_vs_vllm.py": 37,
    "tests/e2e/test_plain_cell_builds_and_smokes.py": 30,
    "tests/e2e/test_cpu_build.py": 28,
    "tests/e2e/test_publish.py": 26,
    "tests/e2e/test_publish_faults.py": 26,
    "tests/e2e/test_bootstrap.py": 26,
}


def lane_dir() -> Path | None:
    """A folder the lanes of this run share (None outside xdist: one lane, no locks)."""
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not uid:
        return None
    path = Path(tempfile.gettempdir()) / f"imagebuild-test-lanes-{uid}"
    path.mkdir(exist_ok=True)
    return path


@contextlib.contextmanager
def shared_lock(name: str) -> Iterator[None]:
    """One lane at a time in the block (nothing to share outside xdist)."""
    where = lane_dir()
    if where is None:
        yield
        return
    with open(where / f"{name}.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def lane_lock(alone: bool) -> Iterator[None]:
    """Every test holds the lanes' lock shared, an `alone` test exclusively. The turnstile
    keeps an `alone` test from waiting forever behind the other lane's stream of tests:
    while it waits for the exclusive lock it holds the turnstile, which every test passes
    before it takes its share."""
    where = lane_dir()
    if where is None:
        yield
        return
    with open(where / "turnstile.lock", "a+") as gate, open(where / "lanes.lock", "a+") as rw:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(rw, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(rw, fcntl.LOCK_UN)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "alone: reads timing figures; no test of the other lane runs beside it")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Heaviest modules first, each module's tests in their own order (a stable sort: every
    lane collects the same order, as xdist requires)."""
    items.sort(key=lambda item: -ORDER.get(item.nodeid.split("::", 1)[0], 0))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    with lane_lock(item.get_closest_marker("alone") is not None):
        yield
