"""docs/gb10.md's "First release on your Sparks" (linked from the README) is walked: every
`build.py` command parses with the real CLI parser, the lock command is the one
`check --tag` prints for the committed lock, the checks it names run, and the git steps
run against a real remote."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from imagebuild.cli import main
from imagebuild.cliparser import parser

ROOT = Path(__file__).resolve().parents[2]


def _section() -> str:
    text = (ROOT / "docs/gb10.md").read_text()
    part = text.split("\n## First release on your Sparks\n", 1)[1]
    return part.split("\n## ", 1)[0]


def _steps() -> list[str]:
    """The numbered items, each joined to one line."""
    body = "1. " + _section().split("\n1. ", 1)[1]
    items = re.split(r"\n(?=\d+\. )", body.split("\n\n", 1)[0])
    return [" ".join(i.split()) for i in items]


def _commands(step: str) -> list[list[str]]:
    return [shlex.split(c) for c in re.findall(r"`([^`]+)`", step)
            if c.startswith(("python build.py", "git "))]


def test_the_steps_are_lock_check_commit_tag_and_what_the_jobs_show():
    steps = _steps()
    assert [s.split(" ", 1)[0] for s in steps] == ["1.", "2.", "3.", "4.", "5."]
    firsts = [_commands(s)[0][:3] if _commands(s) else [] for s in steps]
    assert firsts[:4] == [["python", "build.py", "lock"], ["python", "build.py", "lock"],
                          ["python", "build.py", "render"],
                          ["git", "tag", "2026-06-18-dflashfix"]]
    for job in ("**plan**", "**engine gb10**", "**cell**", "**promote**"):
        assert job in steps[4]


def test_the_commit_step_renders_and_commits_the_rendered_files():
    """`lock --update` changes FROM digests and FetchContent commits, so the rendered
    Dockerfiles change: without render and `git add rendered/` the pushed commit fails
    `render --check` (the plan job)."""
    commands = _commands(_steps()[2])
    assert commands[0] == ["python", "build.py", "render"]
    (add,) = [c for c in commands if c[:2] == ["git", "add"]]
    assert {"matrix.lock.json", "locked/", "rendered/"} <= set(add[2:])
    assert parser().parse_args(commands[0][2:]).command == "render"


def test_every_build_py_command_is_one_the_cli_takes():
    for step in _steps():
        for argv in _commands(step):
            if argv[:2] == ["python", "build.py"]:
                parser().parse_args(argv[2:])  # SystemExit (a test failure) if not


def test_the_lock_command_is_the_one_check_tag_prints(matrix_dir: Path, capsys):
    (lock,) = _commands(_steps()[0])
    code = main(["check", "--matrix", str(matrix_dir / "matrix.yaml"), "--tag",
                 "2026-06-18-dflashfix", "--target", "gb10", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2  # the committed lock cannot release gb10: why step 1 exists
    fixes = {f["fix"] for f in doc["findings"] if f["rule"] == "pin-unresolved"}
    (printed,) = {fix.split("`")[1] for fix in fixes}
    assert shlex.split(printed) == lock


def test_step_two_runs_lock_check_and_check_tag(matrix_dir: Path, capsys):
    lock_check, check = _commands(_steps()[1])
    assert main([*lock_check[2:], "--matrix", str(matrix_dir / "matrix.yaml")]) == 0
    # on this machine the gb10 pins stay unresolved: the same command refuses, exit 2
    assert main([*check[2:], "--matrix", str(matrix_dir / "matrix.yaml")]) == 2
    assert "lock --update gb10" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_commit_and_tag_steps_run_against_a_remote(tmp_path: Path):
    remote, work = tmp_path / "remote.git", tmp_path / "work"
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
           "HOME": str(tmp_path), "PATH": "/usr/bin:/bin:/usr/local/bin"}

    def git(*args: str, cwd: Path = work) -> None:
        subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)

    git("init", "-q", "--bare", "-b", "main", str(remote), cwd=tmp_path)
    git("clone", "-q", str(remote), str(work), cwd=tmp_path)
    git("checkout", "-q", "-b", "main")
    (work / "matrix.lock.json").write_text("{}\n")
    (work / "locked").mkdir()
    (work / "locked" / "meta.json").write_text("{}\n")
    (work / "rendered").mkdir()
    (work / "rendered" / "engine.Dockerfile").write_text("FROM scratch\n")
    for step in _steps()[2:4]:
        for argv in _commands(step):
            if argv[:2] == ["python", "build.py"]:
                continue  # the CLI runs in the tests above; here only git
            subprocess.run(argv, cwd=work, env=env, check=True, capture_output=True)
    tags = subprocess.run(["git", "ls-remote", "--tags", str(remote)], env=env,
                          capture_output=True, text=True, check=True).stdout
    assert "refs/tags/2026-06-18-dflashfix" in tags
