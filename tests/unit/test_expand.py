"""Cell expansion: GitHub Actions matrix semantics, real matrix contents, serve commands."""

from __future__ import annotations

import json
from pathlib import Path

from imagebuild.cli import main
from imagebuild.spec import matrix as mx
from imagebuild.spec.servecmd import serve_command


def _cells(matrix_dir: Path, text_edit=None):
    path = matrix_dir / "matrix.yaml"
    if text_edit:
        path.write_text(text_edit(path.read_text()))
    lm = mx.load(path)
    return lm, mx.expand(lm)


def test_real_matrix_cells(matrix_dir):
    _, cells = _cells(matrix_dir)
    gb10 = sorted(c.image for c in mx.select(cells, engine="dflashfix", target="gb10"))
    # 3 models x {zlab, mtp} minus the excluded profile pairings, plus the AEON include
    assert gb10 == sorted([
        "spark-heretic-zlab", "spark-heretic-mtp", "spark-nvfp4-zlab", "spark-nvfp4-mtp",
        "spark-ornith-zlab", "spark-ornith-mtp", "spark-heretic-aeon"])
    cpu = mx.select(cells, engine="dflashfix", target="cpu")
    assert [c.id for c in cpu] == ["cpu/cpu-tiny-ngram"]


def test_exclude_then_include_adds_back(matrix_dir):
    def edit(text):
        return text.replace(
            "      include:\n        - {engine: dflashfix, model: heretic, drafter: aeon,",
            "      include:\n        - {engine: dflashfix, model: nvfp4, drafter: zlab, "
            "profile: spark-mtp}\n        - {engine: dflashfix, model: heretic, drafter: aeon,")
    # zlab is not a method spark-mtp serves: the re-added combination is refused by name
    import pytest

    from imagebuild.errors import UserError
    with pytest.raises(UserError, match="serves mtp, not dflash"):
        _cells(matrix_dir, edit)


def test_include_matching_existing_combination_adds_nothing(matrix_dir):
    _, before = _cells(matrix_dir)
    _, after = _cells(matrix_dir, lambda t: t.replace(
        "      include:\n", "      include:\n        - {model: nvfp4, drafter: mtp}\n", 1))
    assert [c.id for c in before] == [c.id for c in after]


def test_canonical_dflash_serve_command(matrix_dir):
    _, cells = _cells(matrix_dir)
    cell = next(c for c in cells if c.image == "spark-heretic-zlab")
    cmd = serve_command(cell)
    assert cmd.argv[:3] == ("vllm", "serve", "/model")
    assert cmd.flag("quantization") == "compressed-tensors"
    assert cmd.flag("max-num-batched-tokens") == "16384"
    assert cmd.flag("gpu-memory-utilization") == "0.85"
    assert cmd.flag("attention-backend") == "flash_attn"
    assert cmd.flag("enable-prefix-caching") is True
    assert json.loads(cmd.flag("limit-mm-per-prompt")) == {"image": 4, "video": 2}
    assert json.loads(cmd.flag("speculative-config")) == {
        "method": "dflash", "model": "/drafter", "num_speculative_tokens": 11}
    assert cmd.flag("kv-cache-dtype") is None


def test_plan_github_format_is_strategy_matrix(matrix_dir, capsys):
    code = main(["plan", "--matrix", str(matrix_dir / "matrix.yaml"),
                 "--tag", "2026-06-18-dflashfix", "--target", "gb10", "--format", "github"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["include"]) == 7
    for row in data["include"]:
        assert row["runner"] == ["self-hosted", "linux", "ARM64", "gb10"]
        assert row["release_tag"] == "2026-06-18-v0.23.0-dflashfix"


def test_plan_without_target_says_which_and_why(matrix_dir, capsys, monkeypatch):
    monkeypatch.delenv("IMAGEBUILD_TARGET", raising=False)
    assert main(["plan", "--matrix", str(matrix_dir / "matrix.yaml"),
                 "--tag", "2026-06-18-dflashfix"]) == 0
    out = capsys.readouterr().out
    assert "target cpu (this host is" in out
    assert "cpu/cpu-tiny-ngram" in out


def test_check_command_blocks_a_trap_with_its_rule_id(matrix_dir, capsys):
    path = matrix_dir / "matrix.yaml"
    text = path.read_text()
    assert text.count("max-num-batched-tokens: 16384") == 1  # stated once, in `spark`
    path.write_text(text.replace("max-num-batched-tokens: 16384",
                                 "max-num-batched-tokens: 65536"))
    args = ["--matrix", str(path), "--tag", "2026-06-18-dflashfix", "--target", "gb10"]
    assert main(["check", *args]) == 2
    assert "max-batched-tokens-ceiling" in capsys.readouterr().out
    assert main(["plan", *args]) == 2  # plan runs preflight too: errors block
    assert "preflight found errors" in capsys.readouterr().err
