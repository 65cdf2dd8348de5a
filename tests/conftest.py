"""Shared fixtures. Tests needing Docker/registry/vLLM are marked `slow`/`vllm` and run in CI."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT

# files matrix.yaml refers to; copied so a test can edit its own matrix in isolation
MATRIX_FILES = ("matrix.yaml", "patches", "images/engine/cpu", "scripts/make_tiny_model.py")


@pytest.fixture
def matrix_dir(tmp_path: Path) -> Path:
    """A copy of the real matrix.yaml with everything it references, editable per test."""
    for rel in MATRIX_FILES:
        src, dst = REPO_ROOT / rel, tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
    return tmp_path
