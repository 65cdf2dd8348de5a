"""The engine's wheels stage downloads its pins with several pips at once
(images/engine/files/download-wheels.py): every pin goes to exactly one pip, neighbours to
different ones, an option line is refused rather than applied to one pip only, and one
failing pip fails the whole download with its own output. The download itself runs in
every cpu engine build (tests/e2e/test_cpu_build.py)."""

from __future__ import annotations

import runpy

import pytest

from imagebuild import REPO_ROOT

SCRIPT = REPO_ROOT / "images" / "engine" / "files" / "download-wheels.py"
mod = runpy.run_path(str(SCRIPT), run_name="download_wheels")


def test_requirement_lines_drop_comments_and_blank_lines():
    text = "# header\n\naiohttp==3.14.5  # why\ntorch==2.11.0\n   \nzstandard==0.25.0\n"
    assert mod["requirement_lines"](text) == ["aiohttp==3.14.5", "torch==2.11.0",
                                              "zstandard==0.25.0"]


def test_an_option_line_is_refused():
    with pytest.raises(SystemExit, match="option line '--index-url"):
        mod["requirement_lines"]("a==1\n--index-url https://example.invalid/simple\n")


def test_every_pin_goes_to_one_pip_and_neighbours_apart():
    lines = [f"p{i:03d}==1" for i in range(10)]
    chunks = mod["deal"](lines, 4)
    assert sorted(sum(chunks, [])) == lines
    assert len(chunks) == 4 and max(map(len, chunks)) - min(map(len, chunks)) <= 1
    assert not any("p000==1" in c and "p001==1" in c for c in chunks)
    assert mod["deal"](lines[:2], 4) == [["p000==1"], ["p001==1"]]  # no idle pips


def test_one_failing_pip_fails_the_download_with_its_output(tmp_path, capsys):
    req = tmp_path / "requirements.txt"
    req.write_text("imagebuild-no-such-package-a==1.0\nimagebuild-no-such-package-b==1.0\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    code = mod["main"]([str(req), str(tmp_path / "out"), "--jobs", "2",
                        "--no-index", "--find-links", str(empty)])
    assert code == 1
    err = capsys.readouterr().err
    assert "pip failed" in err and "imagebuild-no-such-package-a" in err
    assert "No matching distribution" in err  # pip's own words reach the build log
