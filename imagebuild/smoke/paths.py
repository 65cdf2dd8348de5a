"""Where smoke results live, shared by the smoke runner and publish (its gate)."""

from __future__ import annotations

import re
from pathlib import Path

from imagebuild.spec.matrix import Cell


def cell_dir(build_dir: Path, cell: Cell) -> Path:
    """build/smoke/<target>/<engine>/<image>/"""
    return build_dir / "smoke" / cell.target_name / cell.engine_name / cell.image


def ref_dir(build_dir: Path, image_ref: str) -> Path:
    """build/smoke/ref/<ref with unsafe characters replaced>/ for `smoke IMAGE_REF`."""
    return build_dir / "smoke" / "ref" / re.sub(r"[^A-Za-z0-9_.-]+", "_", image_ref)


def verdict_path(build_dir: Path, cell: Cell) -> Path:
    return cell_dir(build_dir, cell) / "verdict.json"
