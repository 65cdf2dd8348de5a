"""Shell completion generated from the parser (issue 38, item 12): `completion bash|zsh`
prints a script whose answers are the parser's own commands, options and choices. The
bash script runs in bash as bash's completion calls it; the zsh one is checked by zsh
and run with zsh's completion helpers recording what they are given."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from imagebuild import completion
from imagebuild.cli import main
from imagebuild.cliparser import parser


def _script(capsys, shell: str) -> str:
    assert main(["completion", shell]) == 0
    return capsys.readouterr().out


def _bash(script: str, *words: str) -> list[str]:
    """What bash offers after `words` (the last one being completed)."""
    quoted = " ".join(f"'{w}'" for w in words)
    code = (script + f"\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _imagebuild; "
            'printf "%s\\n" "${COMPREPLY[@]}"')
    proc = subprocess.run(["bash", "--norc", "-c", code], capture_output=True, text=True,
                          timeout=30, check=True)
    return proc.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_commands_options_and_choices(capsys) -> None:
    script = _script(capsys, "bash")
    assert _bash(script, "imagebuild", "pl") == ["plan"]
    assert _bash(script, "build.py", "plan", "--fo") == ["--format"]
    assert _bash(script, "imagebuild", "plan", "--format", "") == ["table", "json", "github",
                                                                   "targets"]
    assert _bash(script, "imagebuild", "pins", "") == ["--help", "--verbose", "--quiet",
                                                       "--version", "watch"]
    assert _bash(script, "imagebuild", "completion", "z") == ["zsh"]
    # current names only: the renamed spellings parse but are not offered
    offered = _bash(script, "imagebuild", "rollback", "--")
    assert "--tag" in offered and "--image" in offered and "--to" not in offered
    # every command of the parser completes from its first letters
    for cmd in completion.commands(parser()):
        if cmd.path and " " not in cmd.path:
            assert cmd.path in _bash(script, "imagebuild", cmd.path[:3]), cmd.path


def test_a_new_option_completes_without_editing_a_script() -> None:
    ap = parser()
    sub = next(a for a in ap._actions if a.dest == "command").choices["plan"]
    sub.add_argument("--colour", choices=("red", "blue"), help="a new option")
    script = completion.bash(ap)
    if shutil.which("bash"):
        assert _bash(script, "imagebuild", "plan", "--colour", "") == ["red", "blue"]
    assert "'--colour[a new option]:colour:(red blue)'" in completion.zsh(ap)


@pytest.mark.skipif(shutil.which("zsh") is None, reason="no zsh (scripts/setup-tests.sh)")
def test_zsh_script_parses_and_hands_zsh_the_parsers_answers(capsys, tmp_path) -> None:
    script = tmp_path / "_imagebuild"
    script.write_text(_script(capsys, "zsh"))
    assert subprocess.run(["zsh", "-n", str(script)], capture_output=True).returncode == 0
    # zsh's helpers recorded: the command menu, and the option specs after a command path
    code = f"""
_describe() {{ print -rl -- "describe $1" "${{cmds[@]}}" }}
_arguments() {{ print -rl -- "args ${{words[*]}} $CURRENT" "$@" }}
compdef() {{ print -r -- "compdef $*" }}
source {script}
words=(imagebuild pl); CURRENT=2; _imagebuild
words=(imagebuild facts record --py); CURRENT=4; _imagebuild
words=(imagebuild plan --fo); CURRENT=3; _imagebuild
"""
    out = subprocess.run(["zsh", "-f", "-c", code], capture_output=True, text=True,
                         timeout=30, check=True).stdout.splitlines()
    assert out[0] == "compdef _imagebuild imagebuild build.py"
    assert out[1] == "describe command" and "plan:the cells a tag builds, with refs, tags " \
        "and pins" in out
    record = out[out.index("args imagebuild --py 2"):out.index("args imagebuild --fo 2")]
    assert "--python[python of a venv with the vLLM to describe]:python:_files" in record
    plan = out[out.index("args imagebuild --fo 2"):]
    assert "--format[github\\: one strategy.matrix entry per cell with its runner labels]:" \
        "format:(table json github targets)" in plan
