"""The README's "Adding a model" steps, walked literally on a copy of the repository's
matrix: each step's YAML is pasted under the section it names, and each command it shows
runs as written (the Hub answered by the recorded replay on 127.0.0.1; `--matrix` points
at the copy so the checkout's own matrix is never touched)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from imagebuild.cli import main
from imagebuild.lock.resolve import METADATA_FILES
from tests.support.hub.fake import FakeHub

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = [".venv/bin/python", "build.py"]


def _steps() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Adding a model\n", 1)[1].split("\n## ", 1)[0]
    body = "1. " + section.split("\n1. ", 1)[1]
    return re.split(r"\n(?=\d+\. )", body.split("\n\n", 1)[0])


def _yaml(step: str) -> str | None:
    """The step's YAML block as it goes into the file: without the list item's indent
    (the fence's), keeping the entry's own under its section."""
    m = re.search(r"\n( *)```yaml\n(.*?)\n *```", step, re.S)
    if not m:
        return None
    fence = len(m.group(1))
    return "".join(line[fence:] + "\n" for line in m.group(2).splitlines())


def _commands(step: str) -> list[list[str]]:
    prose = " ".join(re.sub(r"```.*?```", "", step, flags=re.S).split())
    return [shlex.split(c) for c in re.findall(r"`([^`]+)`", prose)
            if c.startswith((" ".join(PROGRAM) + " ", "git "))]


def _paste(matrix: Path, section: str, snippet: str) -> None:
    """Put the snippet at the top of the top-level `section:` mapping, as an editor would."""
    text = matrix.read_text()
    assert f"\n{section}:\n" in text, section
    matrix.write_text(text.replace(f"\n{section}:\n", f"\n{section}:\n{snippet}", 1))


@pytest.fixture
def hub():
    """The recorded Hub on 127.0.0.1. The README's model was recorded without the bytes of
    two small metadata files (generation_config.json, tokenizer_config.json); here its
    listing leaves out what was not recorded, as the in-process FakeHub skips it, instead
    of the replay's 501 for bytes it does not have."""
    fake = FakeHub()
    for repo in fake.repos.values():
        for rev in repo.revisions.values():
            for name in [n for n, f in rev.files.items()
                         if n in METADATA_FILES and f.content is None]:
                del rev.files[name]
    with fake.serve() as replay:
        yield replay


def _run(args: list[str], matrix: Path) -> int:
    return main([*args, "--matrix", str(matrix)])


def test_the_steps_are_yaml_then_lock_check_render_release():
    steps = _steps()
    assert [s.split(" ", 1)[0] for s in steps] == [f"{i}." for i in range(1, 8)]
    assert [bool(_yaml(s)) for s in steps] == [True, True, True, False, False, False, False]
    firsts = [c[2] for s in steps[3:6] for c in _commands(s)[:1]]
    assert firsts == ["lock", "check", "render"]


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_walk_the_steps(matrix_dir: Path, hub, hub_online_loopback, monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.chdir(matrix_dir)
    matrix = matrix_dir / "matrix.yaml"
    steps = _steps()
    for step in steps[:3]:  # the YAML steps: "under `models:`" etc.
        (section,) = re.findall(r"under `(\w+):`", step.split("```", 1)[0])
        _paste(matrix, section, _yaml(step) or "")
    doc = yaml.safe_load(matrix.read_text())
    assert "nemotron-nano" in doc["models"] and "nemotron" in doc["images"]

    # before step 4 the new model has no pin: check refuses the release of its cell
    (check, plan) = _commands(steps[4])
    assert _run(check[2:], matrix) == 2
    capsys.readouterr()

    (lock,) = _commands(steps[3])
    assert _run(lock[2:], matrix) == 0, capsys.readouterr()
    entry = json.loads((matrix_dir / "matrix.lock.json").read_text())["models"]["nemotron-nano"]
    assert re.fullmatch(r"[0-9a-f]{40}", entry["sha"]), entry

    capsys.readouterr()
    assert _run(check[2:], matrix) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "\n0 error(s)" in "\n" + out
    # a finding: its header line (severity, rule, cells), then its indented text
    blocks = re.split(r"\n(?=\S)", out)
    mine = [" ".join(b.split()) for b in blocks if "gb10/nemotron-nemotron-nano-none" in
            b.splitlines()[0]]
    assert mine and not [b for b in mine if "metadata-missing" in b or "model nemotron" in b
                         and "pin-unresolved" in b]  # the checkpoint rules read its config
    assert _run(plan[2:], matrix) == 0
    out = capsys.readouterr().out
    assert "1 cell(s)" in out and "gb10/nemotron-nemotron-nano-none" in out

    render, add = _commands(steps[5])
    assert _run(render[2:], matrix) == 0
    dockerfile = matrix_dir / "rendered/gb10/dflashfix/nemotron-nemotron-nano-none.Dockerfile"
    assert "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8" in dockerfile.read_text()
    assert _run(["render", "--check"], matrix) == 0

    env = {"HOME": str(matrix_dir), "PATH": "/usr/bin:/bin:/usr/local/bin"}
    subprocess.run(["git", "init", "-q"], cwd=matrix_dir, env=env, check=True)
    subprocess.run(add, cwd=matrix_dir, env=env, check=True)
    staged = subprocess.run(["git", "diff", "--cached", "--name-only"], cwd=matrix_dir,
                            env=env, check=True, capture_output=True, text=True).stdout
    assert {"matrix.yaml", "matrix.lock.json",
            "rendered/gb10/dflashfix/nemotron-nemotron-nano-none.Dockerfile"} <= set(
        staged.split())
