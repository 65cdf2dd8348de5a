"""End-to-end fixtures: the real Docker engine (started by scripts/setup.sh / .ci/run)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.cpu_build import (
    CA_MARKER,
    CPU_SERVE_REF,
    HF_TOKEN_MARKER,
    CpuBuild,
    run_cpu_build,
)

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


@pytest.fixture(scope="session")
def cpu_serve_image(docker_engine, tmp_path_factory) -> CpuBuild:
    """The cpu cell built by the real command, once per session and first with canary
    secrets (so on a fresh machine the real build is the one the leak test inspects)."""
    out = tmp_path_factory.mktemp("build")
    bundle = out / "ca-bundle.pem"  # the host bundle plus a canary line PEM readers skip
    bundle.write_text(Path("/etc/ssl/certs/ca-certificates.crt").read_text()
                      + f"\n# {CA_MARKER}\n")
    proc = run_cpu_build(out, {"HF_TOKEN": HF_TOKEN_MARKER, "IMAGEBUILD_CA_BUNDLE": str(bundle)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return CpuBuild(out, CPU_SERVE_REF, proc.stdout + proc.stderr)
