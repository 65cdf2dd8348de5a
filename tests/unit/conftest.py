"""Fixtures shared by the preflight tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.preflight.fixture_hub import copy_lock, copy_matrix, lock_matrix


@pytest.fixture(scope="session")
def locked_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real matrix locked once per session against the recorded Hub (read-only)."""
    root = copy_matrix(tmp_path_factory.mktemp("locked"))
    lock_matrix(root)
    return root


@pytest.fixture
def locked(matrix_dir: Path, locked_template: Path) -> Path:
    """An editable copy of the matrix with that lock and its metadata."""
    copy_lock(locked_template, matrix_dir)
    return matrix_dir
