"""imagebuild: one matrix.yaml -> tested, tagged, rollback-able vLLM serving images."""

import os
from pathlib import Path

__version__ = "0.1.0"  # pyproject.toml reads it (one place to bump)

PACKAGE_DIR = Path(__file__).resolve().parent
BUNDLE_DIR = PACKAGE_DIR / "_bundle"  # what an installed package carries (setup.py)
_CHECKOUT = PACKAGE_DIR.parent
# Templates, tool files and the default matrix: beside the package in a checkout, inside
# it (imagebuild/_bundle) once installed.
REPO_ROOT = (_CHECKOUT if (_CHECKOUT / "images").is_dir()
             and (_CHECKOUT / "matrix.yaml").is_file() else BUNDLE_DIR)


def installed() -> bool:
    """An installed package (no checkout around it): its bundle is an example, no project."""
    return REPO_ROOT == BUNDLE_DIR


def machine_cache() -> Path:
    """What this machine downloads or derives once for every checkout and project (pinned
    vLLM wheels and sdists, GPU-code tables): IMAGEBUILD_CACHE_DIR, else the XDG cache."""
    if os.environ.get("IMAGEBUILD_CACHE_DIR"):
        return Path(os.environ["IMAGEBUILD_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "imagebuild"


def work_root(matrix_root: Path) -> Path:
    """Where build/ and .cache/ go: beside the matrix, or the current directory when the
    matrix is the installed package's own default (site-packages is no place for them)."""
    return Path.cwd() if matrix_root.resolve() == BUNDLE_DIR else matrix_root


def cache_dir(kind: str) -> Path:
    """This machine's cache of one kind (GPU-code tables, pushed blobs, pinned vLLM
    sources)."""
    return machine_cache() / kind
