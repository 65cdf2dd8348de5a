"""The cpu base image made from the Debian archive really runs Python."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from imagebuild.builder import bootstrap

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def docker(docker_engine: str) -> str:
    if not (shutil.which("mmdebstrap") or shutil.which("debootstrap")):
        if os.environ.get("CI"):
            pytest.fail("neither mmdebstrap nor debootstrap is installed, and CI is set")
        pytest.skip("no bootstrapper installed")
    return docker_engine


@pytest.fixture(scope="module")
def fresh_ref(docker: str):
    # A name no one else uses, so the test really bootstraps instead of finding an image.
    ref = f"localhost/imagebuild-test/debian:bootstrap-{uuid.uuid4().hex[:8]}"
    yield ref
    subprocess.run([docker, "image", "rm", "-f", ref], capture_output=True, check=False)


def run(docker: str, ref: str, *cmd: str) -> str:
    res = subprocess.run(
        [docker, "run", "--rm", "--network", "host", ref, *cmd],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_bootstrap_makes_a_python_image_and_reuses_it(
    docker: str, fresh_ref: str, tmp_path: Path
) -> None:
    lines: list[str] = []
    image_id = bootstrap.ensure_base_image(fresh_ref, workdir=tmp_path, log=lines.append)
    assert image_id.startswith("sha256:")
    assert any("pull of" in line and "failed" in line for line in lines)
    assert any(line.startswith("bootstrapped") for line in lines)
    assert list(tmp_path.iterdir()) == []  # the rootfs folder is gone

    assert run(docker, fresh_ref, "python3", "-c", "print(1)").strip() == "1"
    # What the engine build relies on: a venv with pip, CA certificates, patch.
    out = run(docker, fresh_ref, "sh", "-c",
              "python3 -m venv /tmp/v && /tmp/v/bin/pip --version && patch --version"
              " && test -s /etc/ssl/certs/ca-certificates.crt && echo ok")
    assert out.strip().endswith("ok")
    # exactly the packages asked for and what they need, /usr merged: with mmdebstrap
    # that takes its merged-usr hook (else apt picks usrmerge, which pulls perl in)
    out = run(docker, fresh_ref, "sh", "-c",
              "for p in perl usrmerge; do [ \"$(dpkg-query -W -f '${db:Status-Status}' $p"
              " 2>/dev/null)\" = installed ] && echo has-$p; done; readlink /bin")
    assert out.split() == ["usr/bin"]
    # Apt lists and logs are scrubbed, so they do not bloat or perturb the layer.
    assert run(docker, fresh_ref, "sh", "-c", "ls -A /var/lib/apt/lists /var/log").split() \
        == ["/var/lib/apt/lists:", "partial", "/var/log:"]

    again: list[str] = []
    assert bootstrap.ensure_base_image(fresh_ref, workdir=tmp_path, log=again.append) == image_id
    assert again and "present" in again[0]
