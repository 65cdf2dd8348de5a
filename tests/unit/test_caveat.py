"""An engine's `caveat:` is said wherever the engine is named: the plan (table and JSON),
the labels of its engine and serve images, the release notes and a preflight warning.
The real matrix's pr41703 carries one (its patch set lacks PR 41703's diff)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from imagebuild.cli import main
from imagebuild.lock.lockfile import read_lock
from imagebuild.plan import load_plan
from imagebuild.release.notes import ImageFacts, release_notes
from imagebuild.render import CAVEAT_LABEL, render_all
from imagebuild.spec import matrix as mx
from tests.support.dockerfile_parse import docker_word, instructions, raw_words

OLD, NEW = "2026-06-11-pr41703", "2026-06-18-dflashfix"


def _caveat(root: Path) -> str:
    caveat = yaml.safe_load((root / "matrix.yaml").read_text())["engines"]["pr41703"]["caveat"]
    assert "PR 41703's diff" in caveat
    return caveat


def test_the_plan_says_it(matrix_dir: Path, capsys) -> None:
    caveat = _caveat(matrix_dir)
    args = ["plan", "--target", "cpu", "--matrix", str(matrix_dir / "matrix.yaml")]
    assert main([*args, "--tag", OLD]) == 0
    assert f"CAVEAT   engine pr41703 {caveat}" in capsys.readouterr().out
    assert main([*args, "--tag", OLD, "--format", "json"]) == 0
    (cell,) = json.loads(capsys.readouterr().out)["cells"]
    assert cell["caveat"] == caveat and cell["pins"]["engine"]["caveat"] == caveat
    assert main([*args, "--tag", NEW]) == 0
    assert "CAVEAT" not in capsys.readouterr().out  # dflashfix has none


def _labels(text: str) -> dict[str, str]:
    out = {}
    for ins in instructions(text):
        if ins.keyword == "LABEL":
            for word in raw_words(ins.body):
                key, _, value = docker_word(word)[0].partition("=")
                out[key] = value
    return out


def test_engine_and_serve_images_carry_it_as_a_label(matrix_dir: Path) -> None:
    caveat = _caveat(matrix_dir)
    lm = mx.load(matrix_dir / "matrix.yaml")
    rendered, _ = render_all(lm, [c for c in mx.expand(lm) if c.target_name == "cpu"],
                             read_lock(lm.root))
    by_path = {r.path: _labels(r.text) for r in rendered}
    assert by_path["cpu/pr41703/engine.Dockerfile"][CAVEAT_LABEL] == caveat
    assert by_path["cpu/pr41703/cpu-tiny-ngram.Dockerfile"][CAVEAT_LABEL] == caveat
    assert CAVEAT_LABEL not in by_path["cpu/dflashfix/engine.Dockerfile"]
    assert CAVEAT_LABEL not in by_path["cpu/dflashfix/cpu-tiny-ngram.Dockerfile"]


def test_the_release_notes_say_it(matrix_dir: Path) -> None:
    caveat = _caveat(matrix_dir)
    plan = load_plan(matrix_dir / "matrix.yaml", OLD, "cpu")
    (job,) = plan.jobs
    notes = release_notes(plan.lm, (job,), {job.id: ImageFacts(None, None, None)})
    assert f"> **Caveat (engine pr41703):** {caveat}" in notes
    (new,) = load_plan(matrix_dir / "matrix.yaml", NEW, "cpu").jobs
    assert "Caveat" not in release_notes(plan.lm, (new,), {new.id: ImageFacts(None, None, None)})


def test_preflight_warns_at_the_caveat_line(matrix_dir: Path, capsys) -> None:
    args = ["check", "--target", "cpu", "--matrix", str(matrix_dir / "matrix.yaml"),
            "--format", "json"]
    assert main([*args, "--tag", OLD]) == 0  # a warning, not an error
    findings = [f for f in json.loads(capsys.readouterr().out)["findings"]
                if f["rule"] == "engine-caveat"]
    assert len(findings) == 1 and findings[0]["severity"] == "warning"
    text = (matrix_dir / "matrix.yaml").read_text()
    line = text.count("\n", 0, text.index("    caveat: >-")) + 1
    assert findings[0]["where"].endswith(f"matrix.yaml:{line}:5")
    assert main([*args, "--tag", NEW]) == 0
    assert "engine-caveat" not in capsys.readouterr().out


def test_a_caveat_is_a_sentence(matrix_dir: Path, capsys) -> None:
    path = matrix_dir / "matrix.yaml"
    text = path.read_text()
    start = text.index("    caveat: >-")
    end = text.index("    realize:", start)
    path.write_text(text[:start] + "    caveat: wip\n" + text[end:])
    assert main(["plan", "--tag", OLD, "--target", "cpu", "--matrix", str(path)]) == 2
    err = capsys.readouterr().err
    assert "engines.pr41703.caveat" in err and "at least 10 characters" in err
