"""The command line's manners: --version, -v/-q, where the matrix is found, help with an
example and a sentence for every option, usage and hints naming the program as invoked,
a missing sub-command answered with its usage, an unreachable registry said in one line."""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from imagebuild import __version__
from imagebuild.cli import main
from imagebuild.cliparser import EXAMPLES, parser
from imagebuild.errors import UserError, as_invoked, prog
from tests.support.parsertree import commands

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/cpu-tiny-llama"


def test_version(capsys) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"imagebuild {__version__}"
    text = (ROOT / "pyproject.toml").read_text()
    assert 'version = {attr = "imagebuild.__version__"}' in text  # one place to bump


def test_every_command_has_an_example_and_every_option_says_what_it_does() -> None:
    subs = dict(commands(parser()))
    assert set(EXAMPLES) <= set(subs)
    for name, sub in subs.items():
        assert "example:" in (sub.epilog or ""), f"{name}: no example in its help"
        assert "%(prog)s" in (sub.epilog or ""), name
        for action in sub._actions:
            if action.option_strings and action.help in (None, "", argparse.SUPPRESS):
                pytest.fail(f"{name} {action.option_strings[0]} has no help text")


def test_pins_alone_prints_its_usage(capsys) -> None:
    assert main(["pins"]) == 2
    out = capsys.readouterr()
    assert "pins_command" not in out.out + out.err
    assert "usage:" in out.out and "watch" in out.out


def test_rollback_all_is_gone(capsys) -> None:
    """--all was parsed and never read: every image is what rollback does without --image."""
    assert main(["rollback", "--to", "2026-01-01-stock", "--all"]) == 2
    assert "rollback has no option --all" in capsys.readouterr().err


@pytest.mark.parametrize(("argv0", "name"), [
    ("build.py", "python build.py"),
    ("/work/x/build.py", "python /work/x/build.py"),
    ("/usr/lib/python3/site-packages/imagebuild/__main__.py", "python -m imagebuild"),
    ("/home/u/.local/bin/imagebuild", "imagebuild"),
])
def test_the_program_is_named_as_invoked(argv0: str, name: str, monkeypatch) -> None:
    assert prog(argv0) == name
    monkeypatch.setattr(sys, "argv", [argv0])
    err = UserError("no matrix.lock.json", fix="run `python build.py lock` and commit it")
    assert f"run `{name} lock` and commit it" in err.render()
    assert as_invoked("see `build.py plan --help`") == f"see `{name} plan --help`"
    assert parser().prog == name


def test_python_dash_m_names_itself_in_usage_and_hints() -> None:
    proc = subprocess.run([sys.executable, "-m", "imagebuild", "plan", "--tga", "2026-13-01-x"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert "usage: python -m imagebuild plan" in proc.stderr
    assert "see `python -m imagebuild plan --help`" in proc.stderr
    assert "build.py" not in proc.stderr, proc.stderr


def _cells(out: str) -> set[str]:
    return {f["cell"] for f in json.loads(out)["findings"]}


def test_the_matrix_is_found_in_the_current_directory(monkeypatch, capsys) -> None:
    monkeypatch.delenv("IMAGEBUILD_MATRIX", raising=False)
    monkeypatch.chdir(EXAMPLE)
    assert main(["check", "--format", "json"]) == 0
    assert _cells(capsys.readouterr().out) == {"cpu/llama-tiny-llama-none",
                                               "cpu/llama-tiny-llama-ngram"}


def test_imagebuild_matrix_then_matrix_option(monkeypatch, capsys, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no matrix.yaml here
    monkeypatch.setenv("IMAGEBUILD_MATRIX", str(EXAMPLE / "matrix.yaml"))
    assert main(["check", "--format", "json"]) == 0
    assert all("llama" in c for c in _cells(capsys.readouterr().out))
    # --matrix wins over the variable
    assert main(["check", "--format", "json", "--matrix", str(ROOT / "matrix.yaml")]) == 0
    assert not any("llama" in c for c in _cells(capsys.readouterr().out))
    monkeypatch.setenv("IMAGEBUILD_MATRIX", str(tmp_path / "nope.yaml"))
    assert main(["check"]) == 2
    err = capsys.readouterr().err
    assert "IMAGEBUILD_MATRIX=" in err and "is not a file" in err


def test_without_anything_the_repository_matrix(monkeypatch, capsys, tmp_path: Path) -> None:
    monkeypatch.delenv("IMAGEBUILD_MATRIX", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--format", "json"]) == 0
    assert any(c.startswith("cpu/cpu-tiny-ngram") for c in _cells(capsys.readouterr().out))


def test_installed_without_a_matrix_it_says_what_to_do(monkeypatch, capsys,
                                                       tmp_path: Path) -> None:
    """Issue 38, item 9: an installed package read the example bundled in site-packages
    when the current directory had no matrix.yaml. Now: exit 2, what to do, nothing
    written; `init` starts a project, after which every check agrees with it."""
    import imagebuild

    monkeypatch.delenv("IMAGEBUILD_MATRIX", raising=False)
    monkeypatch.setattr(imagebuild, "installed", lambda: True)  # no checkout around it
    monkeypatch.chdir(tmp_path)
    for argv in (["check"], ["render", "--check"], ["lock", "--check"],
                 ["plan", "--tag", "2026-06-18-dflashfix"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"no matrix.yaml in {tmp_path}" in err and "--matrix FILE" in err, err
        assert " init DIR`" in err
    assert list(tmp_path.iterdir()) == []


def test_init_starts_a_project_and_never_overwrites(monkeypatch, capsys, tmp_path: Path) -> None:
    monkeypatch.delenv("IMAGEBUILD_MATRIX", raising=False)
    assert main(["init", str(tmp_path / "p")]) == 0
    monkeypatch.chdir(tmp_path / "p")
    assert (tmp_path / "p/scripts/make_tiny_model.py").is_file()
    for argv in (["render", "--check"], ["lock", "--check"], ["check"]):
        assert main(argv) == 0, (argv, capsys.readouterr())
    # one file of the project already there: refused whole, that file untouched
    (tmp_path / "q/patches").mkdir(parents=True)
    (tmp_path / "q/patches/cpu-ngram-fp64-gumbel.patch").write_text("mine")
    capsys.readouterr()
    assert main(["init", str(tmp_path / "q")]) == 2
    assert "already holds patches/cpu-ngram-fp64-gumbel.patch" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "q").rglob("*")] == ["patches",
                                                            "cpu-ngram-fp64-gumbel.patch"]
    assert (tmp_path / "q/patches/cpu-ngram-fp64-gumbel.patch").read_text() == "mine"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("quiet", [False, True])
def test_an_unreachable_registry_is_one_line_with_retries_said(quiet: bool, monkeypatch,
                                                               capsys) -> None:
    """`releases` with no registry: each retry one line (none with -q), then what failed
    and what to do; no library internals, no traceback, in seconds."""
    monkeypatch.setenv("IMAGEBUILD_REGISTRY", f"127.0.0.1:{_closed_port()}")
    start = time.monotonic()
    assert main(["releases", *(["-q"] if quiet else [])]) == 1
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    retries = [line for line in lines if "; retry " in line]
    assert len(retries) == (0 if quiet else 4), err
    assert all("connection refused" in line for line in retries)
    assert lines[-2].startswith("error: cannot reach the registry at http://127.0.0.1:"), err
    assert lines[-1].startswith("  fix: start the registry"), err
    for internal in ("urllib3", "HTTPConnectionPool", "Traceback", "Max retries", "NewConnection"):
        assert internal not in err, err
    assert elapsed < 6, f"{elapsed:.1f} s"


def test_every_environment_variable_is_documented() -> None:
    """Each IMAGEBUILD_* variable the code, the workflows or the Makefile read is in
    docs/environment.md (the README links it)."""
    page = (ROOT / "docs/environment.md").read_text()
    sources = [*(ROOT / "imagebuild").rglob("*.py"), *(ROOT / ".github/workflows").glob("*.yml"),
               ROOT / "Makefile"]
    used = {v for p in sources for v in re.findall(r"\bIMAGEBUILD_[A-Z0-9_]*[A-Z0-9]\b",
                                                    p.read_text())}
    assert used, "no variable found: the scan is broken"
    missing = sorted(v for v in used if f"`{v}`" not in page and f"vars.{v}" not in page)
    assert not missing, f"not in docs/environment.md: {missing}"


def test_the_lock_hint_for_a_base_names_its_own_target() -> None:
    """An rtx5090 base was told to go to "a GB10 runner"."""
    from imagebuild.lock.resolve import _base_entry
    from imagebuild.spec import matrix as mx

    lm = mx.load(ROOT / "examples/rtx5090-llama/matrix.yaml")
    entry = _base_entry(lm, "rtx5090", None)
    assert entry["status"] == "unresolved"
    assert "GB10" not in entry["fix"] and "a runner of target rtx5090" in entry["fix"]
