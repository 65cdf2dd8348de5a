"""A source engine's lock entry: the sdist's commit (a pin it does not match is refused),
the FetchContent sources of its CMake, tags resolved to commits only on `--update`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imagebuild.cli import main
from imagebuild.errors import UserError
from imagebuild.lock.lockfile import read_lock
from imagebuild.lock.resolve import build_lock, check_whole_lock, write_lock
from imagebuild.spec import matrix as mx
from tests.support.hub.fake import FakeHub

PINNED = "91df0fad4dc98a67c7659d9dbd915245d5c43d96"
TAG_OBJECT = "0fc695fc6d1d82e9a5ac6835ac8e4e1c83703665"  # cited for the v0.23.0 tag


def _lock(root: Path, **kw) -> dict:
    lm = mx.load(root / "matrix.yaml")
    return build_lock(lm, FakeHub(), log=lambda _: None, **kw)


def test_lock_refuses_a_source_pin_the_sdist_was_not_built_from(matrix_dir: Path,
                                                                capsys) -> None:
    path = matrix_dir / "matrix.yaml"
    path.write_text(path.read_text().replace(PINNED, TAG_OBJECT))
    lock = matrix_dir / "matrix.lock.json"
    before = lock.read_bytes() if lock.exists() else None
    with pytest.raises(UserError) as err:
        _lock(matrix_dir)
    assert err.value.exit_code == 2
    assert "was built from commit 91df0fad4" in str(err.value)
    assert "starting 91df0fad4" in (err.value.fix or "")
    assert err.value.where and err.value.where.startswith(f"{path}:")
    assert main(["lock", "--matrix", str(path)]) == 2  # the command: exit 2, nothing written
    assert "pins vLLM commit 0fc695fc6d1d" in capsys.readouterr().err
    assert (lock.read_bytes() if lock.exists() else None) == before


def test_lock_records_the_sdist_commit_and_every_cmake_source(matrix_dir: Path) -> None:
    data = _lock(matrix_dir)
    gb10 = data["engines"]["dflashfix"]["gb10"]
    assert gb10["source"] == {"repository": "https://github.com/vllm-project/vllm",
                              "commit": PINNED, "sdist_commit": "91df0fad4"}
    deps = gb10["dependencies"]
    assert deps["deepgemm"]["submodules"] == ["third-party/cutlass", "third-party/fmt"]
    assert deps["vllm-flash-attn"]["commit"] == deps["vllm-flash-attn"]["ref"]
    # tags are not commits: unresolved until `lock --update gb10` where GitHub answers
    assert deps["cutlass"]["ref"] == "v4.4.2" and deps["cutlass"]["commit"] is None
    assert gb10["status"] == "unresolved" and "lock --update gb10" in gb10["fix"]


def test_update_resolves_tags_and_a_plain_lock_keeps_them(matrix_dir: Path) -> None:
    asked: list[tuple[str, str]] = []

    def tag(repo: str, ref: str) -> str:
        asked.append((repo, ref))
        return "ab" * 20

    data = _lock(matrix_dir, update={"gb10"}, resolve_image=lambda ref: "sha256:" + "1" * 64,
                 resolve_tag=tag)
    assert ("https://github.com/nvidia/cutlass.git", "v4.4.2") in asked
    gb10 = data["engines"]["dflashfix"]["gb10"]
    assert gb10["dependencies"]["cutlass"]["commit"] == "ab" * 20
    assert gb10["status"] == "resolved" and "fix" not in gb10
    lm = mx.load(matrix_dir / "matrix.yaml")
    write_lock(lm, data)
    again = build_lock(lm, FakeHub(), log=lambda _: None, sdist=_no_sdist)
    assert again["engines"] == data["engines"]  # kept, without the sdist or GitHub


def _no_sdist(version: str) -> Path:
    raise AssertionError("a plain lock of unchanged pins must not need the sdist")


def test_lock_check_names_an_older_lock_without_source_pins(matrix_dir: Path) -> None:
    lm = mx.load(matrix_dir / "matrix.yaml")
    data = _lock(matrix_dir)
    for name in ("dflashfix", "pr41703"):
        del data["engines"][name]["gb10"]["dependencies"]
    (matrix_dir / "matrix.lock.json").write_text(json.dumps(data))
    with pytest.raises(UserError) as err:
        check_whole_lock(lm, read_lock(matrix_dir))
    assert "engines.dflashfix.gb10.source records neither the commit" in str(err.value)
