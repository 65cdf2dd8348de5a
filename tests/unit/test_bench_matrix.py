"""bench and smoke serve an image with the expectations of the matrix they were given
(--matrix, else $IMAGEBUILD_MATRIX), never the repository's matrix.yaml (issue 34, 5d).

OTHER is the repository's matrix with the cpu target's memory_limit changed to 6g; the
repository's says 8g. The engine double records what `docker run` would get and stops
before the boot, so no Docker is needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from imagebuild import cli
from imagebuild.errors import OperationFailed
from imagebuild.plan import Job, load_plan
from imagebuild.smoke import runner
from tests.support.matrices import edit
from tests.support.memengine import MemoryEngine, image_doc

TAG = "2026-06-18-dflashfix"


@pytest.fixture
def other(locked: Path) -> tuple[Path, Job]:
    """OTHER's matrix.yaml and its cpu job (memory_limit 6g, the repository's is 8g)."""
    edit(locked, "    memory_limit: 8g", "    memory_limit: 6g")
    path = locked / "matrix.yaml"
    (job,) = load_plan(path, TAG, "cpu", None).jobs
    assert job.expect["memory_limit"] == "6g"
    return path, job


@pytest.fixture
def engine(other: tuple[Path, Job], memory_engine: MemoryEngine) -> MemoryEngine:
    """The Docker seam's double: the job's image; `run` is recorded, then stops."""
    job = other[1]
    memory_engine.add_image(image_doc("sha256:" + "a" * 64, {
        "io.imagebuild.cell": job.id, "io.imagebuild.engine": job.cell.engine_name},
        cmd=list(job.serve.argv), user="1000", RepoDigests=[]), job.release_ref)
    memory_engine.run_error = OperationFailed("stopped by the double before the boot")
    return memory_engine


def _bench(argv: list[str], out: Path) -> int:
    return cli.main(["bench", *argv, "--requests", "1", "--concurrency", "1",
                     "--out", str(out)])


def test_bench_tag_serves_with_the_matrix_it_was_given(other, engine, tmp_path):
    path, _ = other
    assert _bench(["--tag", TAG, "--target", "cpu", "--matrix", str(path)], tmp_path) == 1
    assert engine.called_with("run")[0]["mem_limit"] == "6g"  # OTHER's, not the repository's 8g


def test_bench_tag_serves_with_the_matrix_of_the_environment(other, engine, tmp_path,
                                                              monkeypatch):
    path, _ = other
    monkeypatch.setenv("IMAGEBUILD_MATRIX", str(path))
    assert _bench(["--tag", TAG, "--target", "cpu"], tmp_path) == 1
    assert engine.called_with("run")[0]["mem_limit"] == "6g"


def test_bench_image_ref_takes_its_cell_from_the_matrix_it_was_given(other, engine,
                                                                     tmp_path):
    path, job = other
    assert _bench([job.release_ref, "--matrix", str(path)], tmp_path) == 1
    assert engine.called_with("run")[0]["mem_limit"] == "6g"


def test_smoke_image_ref_takes_its_cell_from_the_matrix_it_was_given(other, engine,
                                                                     tmp_path, monkeypatch):
    path, job = other
    seen: list[dict[str, Any]] = []

    def judged(image_ref: str, expect: dict[str, Any], out_dir: Path, **kw: Any):
        seen.append(expect)
        return {"passed": True, "image_ref": image_ref, "message": "recorded"}

    monkeypatch.setattr(runner, "smoke_image", judged)
    assert cli.main(["smoke", job.release_ref, "--matrix", str(path),
                     "--out", str(tmp_path)]) == 0
    assert seen[0]["memory_limit"] == "6g" and seen[0]["source"] == "cell"
