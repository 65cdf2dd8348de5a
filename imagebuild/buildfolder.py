"""The build folder's layout: where each stage writes what a later stage (or a workflow
step) reads. Every path under build/ is made here; the Makefile and the workflows read
the same paths (build/smoke/*/*/*/verdict.json, build/engines/$TARGET.ref,
build/supply-chain/$CELL/subject.txt), so a change here is a change of their contract.

    build/                          beside the matrix (work_root), or --out
      smoke/<target>/<engine>/<image>/  one cell's smoke outputs, verdict.json, gates.json
      smoke/ref/<ref>/              `smoke IMAGE_REF`
      records/<target>/<engine>/    build records: base.json, engine.json, <image>.json
      supply-chain/<target>/<image>/  the SBOM and provenance attached to the release
      engines/<target>.ref          the engine the target's engine job pushed
      bench/                        bench results, <started>.json/.md/.png
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from imagebuild import work_root

if TYPE_CHECKING:
    from imagebuild.spec.matrix import Cell

BUILD = "build"
SUPPLY_CHAIN = "supply-chain"
VERDICT_FILE = "verdict.json"
GATES_FILE = "gates.json"
CAPTURE_FILE = "gates-speculative.json"  # the gates' speculative run, recorded by smoke
# what one smoke run writes into its cell dir, cleared before the next; the gates' files
# follow smoke (a new smoke run makes the gates' old answers stale)
SMOKE_OUTPUTS = ("junit.xml", "summary.md", VERDICT_FILE, "container.log", "boot.json",
                 "container-attempt1.log", "checks.log", "config.json", "checks-junit.xml",
                 "compose.yaml", CAPTURE_FILE, GATES_FILE)


def default(matrix_root: Path) -> Path:
    """The build folder of a matrix: build/ beside it (work_root says where)."""
    return work_root(matrix_root) / BUILD


def cell_dir(build_dir: Path, cell: Cell) -> Path:
    """build/smoke/<target>/<engine>/<image>/"""
    return build_dir / "smoke" / cell.target_name / cell.engine_name / cell.image


def ref_dir(build_dir: Path, image_ref: str) -> Path:
    """build/smoke/ref/<ref with unsafe characters replaced>/ for `smoke IMAGE_REF`."""
    return build_dir / "smoke" / "ref" / re.sub(r"[^A-Za-z0-9_.-]+", "_", image_ref)


def verdict_path(build_dir: Path, cell: Cell) -> Path:
    return cell_dir(build_dir, cell) / VERDICT_FILE


def gates_path(build_dir: Path, cell: Cell) -> Path:
    """The cell's release-gates document, beside its smoke verdict."""
    return cell_dir(build_dir, cell) / GATES_FILE


def records_dir(build_dir: Path, cell: Cell) -> Path:
    """build/records/<target>/<engine>/: the build records of a cell's images."""
    return build_dir / "records" / cell.target_name / cell.engine_name


def record_path(build_dir: Path, cell: Cell, kind: str) -> Path:
    """One build record: base.json and engine.json are shared by the cells of an engine,
    the serve image's is named after the image."""
    name = cell.image if kind == "serve" else kind
    return records_dir(build_dir, cell) / f"{name}.json"


def supply_chain_dir(build_dir: Path, cell: Cell) -> Path:
    """build/supply-chain/<target>/<image>/: the documents stored with the release."""
    return build_dir / SUPPLY_CHAIN / cell.target_name / cell.image


def engines_dir(build_dir: Path) -> Path:
    """build/engines/: one <target>.ref per engine shipped (the engine handoff)."""
    return build_dir / "engines"


def engine_ref_path(build_dir: Path, target: str) -> Path:
    return engines_dir(build_dir) / f"{target}.ref"


def bench_dir(build_dir: Path) -> Path:
    return build_dir / "bench"


def bench_files(out_dir: Path, image: str) -> dict[str, Path]:
    """One image's bench files, bench-<image>.json/.md/.png (the names the release notes'
    assets have; unsafe characters replaced): the latest run of an image replaces its
    last one, and each image of a run has its own."""
    stem = "bench-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", image)
    return {kind: out_dir / f"{stem}.{kind}" for kind in ("json", "md", "png")}
