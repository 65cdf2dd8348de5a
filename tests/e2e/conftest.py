"""End-to-end fixtures: the real Docker engine (started by scripts/setup.sh / .ci/run)."""

from __future__ import annotations

import os
import subprocess

import pytest

DOCKER = "/usr/bin/docker"


def _require(ok: bool, why: str) -> None:
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"{why} (CI must provide it: scripts/setup.sh)")
        pytest.skip(why)


@pytest.fixture(scope="session")
def docker_engine() -> str:
    ok = subprocess.run([DOCKER, "info"], capture_output=True).returncode == 0
    _require(ok, "no Docker engine running")
    return DOCKER
