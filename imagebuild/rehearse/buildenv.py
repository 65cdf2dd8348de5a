"""A Python that builds vLLM the way the engine's build stage does: vLLM's own build
requirements (requirements/build/cuda.txt) installed through this machine's pip
configuration, except torch, which is taken from the torch Python's environment by a
.pth file (the torch 2.11 CUDA build is gigabytes and already here; pip never sees that
environment, so it cannot change it). Cached under .cache/, keyed by the requirements.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

from imagebuild import REPO_ROOT

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class BuildEnvFailed(Exception):
    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


def _ask(python: str, code: str) -> str:
    return subprocess.run([python, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


def without_torch(requirements: str) -> list[str]:
    """The requirement lines minus torch (and minus pip options such as index URLs,
    which come from this machine's pip configuration instead)."""
    keep = []
    for line in requirements.splitlines():
        text = line.split("#", 1)[0].strip()
        name = _NAME.match(text)
        if not text or text.startswith("-") or not name:
            continue
        if name.group(1).lower() == "torch":
            continue
        keep.append(text)
    return keep


def build_python(torch_python: str, requirements: Path, cache: Path | None = None) -> str:
    base = _ask(torch_python, "import sys; print(sys._base_executable)")
    torch_site = _ask(torch_python, "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    wanted = without_torch(requirements.read_text())
    key = hashlib.sha256("\n".join([base, torch_site, *wanted]).encode()).hexdigest()[:12]
    env = (cache or REPO_ROOT / ".cache" / "rehearse") / f"buildenv-{key}"
    python = env / "bin" / "python"
    if (env / ".complete").is_file() and python.exists():
        return str(python)
    if env.exists():
        shutil.rmtree(env)
    env.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([base, "-m", "venv", str(env)], check=True, capture_output=True)
    reqs = env / "build-requirements.txt"
    reqs.write_text("\n".join(wanted) + "\n")
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(reqs)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildEnvFailed(f"pip could not install vLLM's build requirements "
                             f"({', '.join(wanted)})", proc.stdout + proc.stderr)
    site = Path(_ask(str(python), "import sysconfig; print(sysconfig.get_paths()['purelib'])"))
    # After the env's own packages on sys.path: torch (and only what they lack) from there
    (site / "zz-torch-from-elsewhere.pth").write_text(torch_site + "\n")
    version = _ask(str(python), "import torch; print(torch.__version__)")
    (env / ".complete").write_text(f"torch {version}\n")
    return str(python)
