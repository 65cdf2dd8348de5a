"""What the smoke suite expects of a cell's image, from matrix.yaml, the lock and labels."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagebuild.expectations import SMALL_FILE, expectations_for, expectations_from_labels
from imagebuild.lock.lockfile import Lock
from imagebuild.spec import matrix as mx
from imagebuild.spec.names import LABEL_NS
from imagebuild.spec.servecmd import serve_command


@pytest.fixture(scope="module")
def cells() -> list[mx.Cell]:
    return mx.expand(mx.load())


def _cell(cells, image: str, engine: str = "dflashfix") -> mx.Cell:
    return next(c for c in cells if c.image == image and c.engine_name == engine)


def test_cpu_cell(cells):
    cell = _cell(cells, "cpu-tiny-ngram")
    lock = Lock({"models": {"tiny": {"files": [
        {"path": "config.json", "size": 700, "sha256": "a" * 64},
        {"path": "model.safetensors", "size": SMALL_FILE + 1, "sha256": "b" * 64}]}}},
        Path("matrix.lock.json"))
    exp = expectations_for(cell, lock)
    assert exp["served_names"] == ["tiny", "tiny-alias"]
    assert (exp["tools"], exp["tool_parser"]) == (True, "hermes")
    assert (exp["reasoning"], exp["reasoning_parser"]) == (True, "qwen3")
    assert (exp["speculative_method"], exp["acceptance_floor"]) == ("ngram", 0.15)
    assert (exp["concurrency"], exp["boot_timeout_s"], exp["memory_limit"]) == ([8], 300, "8g")
    assert exp["gpu"] is False and exp["multimodal"] is None
    assert exp["files"] == {"/model/config.json": {"size": 700, "sha256": "a" * 64},
                            "/model/model.safetensors": {"size": SMALL_FILE + 1}}


def test_gb10_cell_with_hub_files(cells):
    cell = _cell(cells, "spark-heretic-zlab")
    lock = Lock({
        "models": {"heretic": {"files": [
            {"path": "config.json", "size": 10, "lfs_sha256": None, "blob_id": "c" * 40},
            {"path": "tokenizer.json", "size": 11, "lfs_sha256": "d" * 64, "blob_id": "e" * 40},
            {"path": "model-00001.safetensors", "size": 5 * 10**9, "lfs_sha256": "f" * 64,
             "blob_id": "0" * 40}]}},
        "drafters": {"zlab": {"files": [
            {"path": "model.safetensors", "size": 9, "lfs_sha256": "1" * 64,
             "blob_id": "2" * 40}]}}}, Path("matrix.lock.json"))
    exp = expectations_for(cell, lock)
    assert exp["gpu"] is True and exp["concurrency"] == [1, 8, 32]
    assert exp["tool_parser"] == "qwen3_coder"
    assert exp["multimodal"] == {"image": 4, "video": 2}
    assert exp["speculative_method"] == "dflash" and exp["acceptance_floor"] == 0.2
    assert exp["files"] == {
        "/model/config.json": {"size": 10, "git_blob": "c" * 40},
        "/model/tokenizer.json": {"size": 11, "sha256": "d" * 64},
        "/model/model-00001.safetensors": {"size": 5 * 10**9},
        "/drafter/model.safetensors": {"size": 9, "sha256": "1" * 64}}


def test_unresolved_lock_means_no_file_list(cells):
    cell = _cell(cells, "spark-heretic-zlab")
    lock = Lock({"models": {"heretic": {"files": None}}}, Path("matrix.lock.json"))
    assert expectations_for(cell, lock)["files"] is None
    assert expectations_for(cell, None)["files"] is None


def _info(cell: mx.Cell, cell_label: str, cmd: list[str]) -> dict:
    return {"Id": "sha256:" + "9" * 64, "Config": {"Cmd": cmd, "Labels": {
        f"{LABEL_NS}.cell": cell_label, f"{LABEL_NS}.engine": cell.engine_name,
        f"{LABEL_NS}.served-names": ",".join(cell.model.served_names),
        f"{LABEL_NS}.speculative.method": cell.drafter.method}}}


def test_labels_find_the_cell(cells):
    cell = _cell(cells, "cpu-tiny-ngram", "pr41703")
    exp = expectations_from_labels("x", info=_info(cell, cell.id, []))
    assert exp["source"] == "cell" and exp["engine"] == "pr41703"
    assert exp["labels"] == {"served_names": ["tiny", "tiny-alias"],
                             "speculative_method": "ngram"}


def test_labels_without_a_known_cell_read_the_cmd(cells):
    cell = _cell(cells, "cpu-tiny-ngram")
    argv = list(serve_command(cell).argv)
    exp = expectations_from_labels("x", info=_info(cell, "cpu/gone-from-matrix", argv))
    assert exp["source"] == "labels" and exp["target"] == "cpu" and exp["gpu"] is False
    assert exp["served_names"] == ["tiny", "tiny-alias"]
    assert exp["tools"] is True and exp["speculative_method"] == "ngram"
    assert exp["files"] is None and exp["acceptance_floor"] == 0.0


def test_unlabelled_image_is_a_user_error():
    from imagebuild.errors import UserError

    with pytest.raises(UserError, match="io.imagebuild.cell"):
        expectations_from_labels("x", info={"Config": {"Labels": {}}})
