"""The docker CLI, as builder.py drives it (one client for build and smoke)."""

from __future__ import annotations

import os
import subprocess

from imagebuild.errors import OperationFailed

DOCKER = os.environ.get("IMAGEBUILD_DOCKER", "/usr/bin/docker")


def docker(*args: str, check: bool = True, timeout: float | None = 120,
           input: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run([DOCKER, *args], capture_output=True, text=True,
                              timeout=timeout, input=input)
    except FileNotFoundError:
        raise OperationFailed(f"no docker client at {DOCKER}",
                              fix="install docker.io (scripts/setup.sh)") from None
    except subprocess.TimeoutExpired:
        raise OperationFailed(f"docker {args[0]} did not answer in {timeout}s") from None
    if check and proc.returncode != 0:
        raise OperationFailed(f"docker {' '.join(args[:2])} failed: {proc.stderr.strip()[-500:]}")
    return proc
