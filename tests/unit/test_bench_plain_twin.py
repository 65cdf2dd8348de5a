"""The plain twin of a speculating image (bench/command.py bench_image): the same image
served once more without --speculative-config, placed as the image was, measured at the
same levels right after it and kept under the results' `plain`; shown in the bench
table (a `vs plain` column and a table of its own), drawn in the plot, and read from the
registry under the same schema as the levels."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from imagebuild.bench import command, placement, results
from imagebuild.registry import documents
from imagebuild.registry.errors import RegistryFault
from imagebuild.serving.boot import Container
from imagebuild.serving.runspec import SPEC_FLAG, Limits

SPEC_CMD = ["--model", "/model", SPEC_FLAG, '{"method":"ngram"}']
FIGURES = {"": 300.0, "plain": 360.0}  # tok/s per run name


def _level(c: int, tok_s: float, spec: bool) -> dict[str, Any]:
    return {"concurrency": c, "requests": 16, "errors": 0, "output_tok_s": tok_s * c,
            "request_rate": 1.0, "ttft_ms": None, "tpot_ms": None, "itl_ms": None,
            "e2e_ms": None, "client_cpu_ms_per_request": 1.0, "flags": [],
            "spec_decode": {"drafts": 40.0, "draft_tokens": 120.0, "accepted_tokens": 60.0,
                            "acceptance": 0.5, "mean_accepted_length": 2.5} if spec else None}


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every server the bench starts (its arguments), each measured by a stand-in for the
    load generator that answers the run's figures."""
    seen: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def serving(image: str, info: dict[str, Any], limits: Limits, **kw: Any):
        seen.append({"image": image, **kw})
        yield Container(f"c{len(seen)}", 8000 + len(seen))

    def measure(base_url: str, *, levels: list[int], run: str = "", **kw: Any):
        return [_level(c, FIGURES[run], spec=not run) for c in levels], "tiny"

    monkeypatch.setattr(command.container, "serving", serving)
    monkeypatch.setattr(command, "measure", measure)
    return seen


def _bench(cmd: list[str], plain: bool) -> dict[str, Any]:
    return command.bench_image("img:1", {"Id": "sha256:1", "Config": {"Cmd": cmd}},
                               limits=Limits(None, False, 60.0), prompt_set=[],
                               levels=[1, 4], load_kw={}, settings={"prompts": "structured"},
                               place=placement.Placement("0", None, "test"), plain=plain,
                               log=lambda _: None)


def test_a_speculating_image_is_measured_again_without_its_drafter(served):
    doc = _bench(SPEC_CMD, plain=True)
    assert [s.get("drop_flags") for s in served] == [(), (SPEC_FLAG,)]
    assert all(s["cpuset"] == "0" for s in served)  # placed as the image was
    assert [lv["output_tok_s"] for lv in doc["levels"]] == [300.0, 1200.0]
    assert doc["plain"]["without"] == [SPEC_FLAG]
    assert [lv["output_tok_s"] for lv in doc["plain"]["levels"]] == [360.0, 1440.0]


@pytest.mark.parametrize("cmd,plain", [(SPEC_CMD, False), (["--model", "/model"], True)],
                         ids=["not-asked", "plain-image"])
def test_no_twin_unless_asked_and_speculating(served, cmd, plain):
    assert "plain" not in _bench(cmd, plain)
    assert len(served) == 1


def test_the_table_compares_with_the_twin_and_shows_it(served, tmp_path: Path):
    doc = _bench(SPEC_CMD, plain=True)
    doc.update(hardware={"model": "a test CPU"}, image={"tag": "t"})
    md = results.markdown(doc, {1: {"output_tok_s": 0.1}, 4: {"output_tok_s": -0.2}})
    head, twin = md.split("its plain twin), measured right after:")
    assert "| c | req | err | tok/s | vs baseline | vs plain | req/s |" in head
    assert "| 1 | 16 | 0 | 300.0 | +10.0% | -16.7% | 1.00 |" in head
    assert "| c | req | err | tok/s | req/s |" in twin and "| 4 | 16 | 0 | 1,440.0 |" in twin
    run = results.plain_run(doc)
    assert run is not None and run["image"]["label"] == "t without speculation"
    pytest.importorskip("matplotlib")
    from imagebuild.bench.plot import plot

    assert plot([doc], tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_the_registry_reads_the_twin_with_the_levels_schema(served):
    doc = _bench(SPEC_CMD, plain=True)
    doc.update(hardware={"model": "a test CPU"}, image={"tag": "t"})
    body = json.dumps(doc).encode()
    assert documents.bench_results(body, "h", "x")["plain"]["levels"][0]["output_tok_s"] == 360
    documents.bench_table(doc, "h", "x")  # the notes' whole table: the twin's too
    bad = {**doc, "plain": {"levels": [{"concurrency": 1, "output_tok_s": "fast"}]}}
    with pytest.raises(RegistryFault, match="plain.levels.0.output_tok_s"):
        documents.bench_results(json.dumps(bad).encode(), "h", "x")


@pytest.mark.parametrize("argv,setting,plain", [
    ([], None, True), (["--no-plain-baseline"], None, False), ([], False, False),
    (["--plain-baseline"], False, True)], ids=["target-default", "flag-off", "target-off",
                                                "flag-on"])
def test_bench_tag_follows_the_targets_plain_baseline(monkeypatch, matrix_dir, tmp_path,
                                                      argv, setting, plain):
    from imagebuild.cli import main

    matrix = matrix_dir / "matrix.yaml"
    if setting is not None:  # targets.cpu.bench.plain_baseline in the matrix
        text = matrix.read_text()
        matrix.write_text(text.replace("      acceptance_threshold: 0.05\n",
                                       "      acceptance_threshold: 0.05\n"
                                       f"      plain_baseline: {str(setting).lower()}\n", 1))
    seen: list[bool] = []

    def bench_image(ref: str, info: dict[str, Any], **kw: Any) -> dict[str, Any]:
        seen.append(kw["plain"])
        return {"image": {"tag": "t"}, "hardware": {"model": "cpu"}, "started": "s",
                "settings": {}, "levels": [_level(1, 1.0, spec=True)]}

    monkeypatch.setattr(command, "bench_image", bench_image)
    monkeypatch.setattr(command, "inspect_image", lambda ref: {"Id": "x", "Config": {}})
    monkeypatch.setattr("imagebuild.reaper.reap", lambda: None)
    assert main(["bench", "--tag", "2026-06-18-dflashfix", "--target", "cpu", "--matrix",
                 str(matrix), "--out", str(tmp_path), *argv]) == 0
    assert seen == [plain]


def test_a_plain_baseline_needs_a_server_this_command_starts(capsys):
    from imagebuild.cli import main

    assert main(["bench", "--url", "http://127.0.0.1:9", "--plain-baseline"]) == 2
    assert "--plain-baseline" in capsys.readouterr().err
