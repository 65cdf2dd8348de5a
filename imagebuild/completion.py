"""`build.py completion bash|zsh`: shell completion generated from the command line's own
parser (cliparser.py), so a new command or option completes without anyone editing a
script: commands and subcommands with their help, each command's options (current names
only: a renamed option's old spelling still parses but is not offered), the choices of an
option that has them, files or folders where an option takes a path.

Install: `eval "$(imagebuild completion bash)"` in ~/.bashrc, or for zsh
`imagebuild completion zsh > "${fpath[1]}/_imagebuild"` (see docs/commands.md).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

NAMES = ("imagebuild", "build.py")  # the console script, and a checkout's script


@dataclass(frozen=True)
class Option:
    name: str
    help: str
    takes: str | None  # None (a flag), "dir", "file", "choice" or "value"
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Command:
    path: str  # "" for the program itself, "pins watch" for a subcommand
    options: tuple[Option, ...]
    commands: tuple[tuple[str, str], ...]  # (name, help) of its subcommands
    positional: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (name, its choices)


def _short(text: str | None) -> str:
    """An option's or command's help, cut to its first clause for a completion menu."""
    text = re.sub(r"\s+", " ", (text or "").replace("%(prog)s", "build.py")).strip()
    text = re.split(r"[;(]| \(", text, maxsplit=1)[0].strip().rstrip(":,")
    return text[:70]


def _takes(action: argparse.Action) -> str | None:
    if action.nargs == 0:
        return None
    if action.choices:
        return "choice"
    kind = getattr(action.type, "__name__", "")
    if kind in ("_out_dir", "_run_dir"):
        return "dir"
    if action.type is Path or kind == "Path":
        return "file"
    return "value"


def _option(action: argparse.Action) -> Option | None:
    if action.help == argparse.SUPPRESS or not action.option_strings:
        return None
    old = set(getattr(action, "old", ()))
    names = [o for o in action.option_strings if o.startswith("--") and o not in old]
    if not names:
        return None
    return Option(names[0], _short(action.help), _takes(action),
                  tuple(str(c) for c in action.choices or ()))


def commands(ap: argparse.ArgumentParser, path: str = "") -> list[Command]:
    """Every command of the parser, the program first, depth first."""
    options: list[Option] = []
    subs: list[tuple[str, str]] = []
    positional: list[tuple[str, tuple[str, ...]]] = []
    below: list[Command] = []
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                subs.append((name, _short(helps.get(name))))
                below += commands(sub, f"{path} {name}".strip())
        elif (opt := _option(action)) is not None:
            options.append(opt)
        elif not action.option_strings and action.choices:
            positional.append((action.dest, tuple(str(c) for c in action.choices)))
    return [Command(path, tuple(options), tuple(subs), tuple(positional)), *below]


def _sh(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _path_cases(cmds: list[Command]) -> str:
    """The case patterns that recognise a (sub)command word after its parent's path."""
    return "|".join(f'"{c.path.rsplit(" ", 1)[0] if " " in c.path else ""}|'
                    f'{c.path.rsplit(" ", 1)[-1]}"' for c in cmds if c.path)


def bash(ap: argparse.ArgumentParser) -> str:
    cmds = commands(ap)
    values, words = [], []
    for c in cmds:
        for o in c.options:
            gen = {"choice": f"-W {_sh(' '.join(o.choices))}", "dir": "-d",
                   "file": "-f"}.get(o.takes or "")
            if o.takes is not None:
                values.append(f'        "{c.path}|{o.name}") '
                              + (f"COMPREPLY=($(compgen {gen} -- \"$cur\"))" if gen else
                                 "COMPREPLY=()") + "; return ;;")
        offered = [o.name for o in c.options] + [n for n, _ in c.commands] + [
            choice for _, choices in c.positional for choice in choices]
        words.append(f'        "{c.path}") opts={_sh(" ".join(offered))} ;;')
    return "\n".join([
        "# imagebuild completion for bash, generated from its parser by "
        "`imagebuild completion bash`",
        "_imagebuild() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    local cmdpath="" word i opts=""',
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        word="${COMP_WORDS[i]}"',
        '        case "$cmdpath|$word" in',
        f'            {_path_cases(cmds)}) cmdpath="${{cmdpath:+$cmdpath }}$word" ;;',
        "        esac",
        "    done",
        '    case "$cmdpath|$prev" in',
        *values,
        "    esac",
        '    case "$cmdpath" in',
        *words,
        "    esac",
        '    COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
        "}",
        f"complete -o default -F _imagebuild {' '.join(NAMES)}",
        ""])


def _zq(text: str) -> str:
    """Text inside a single-quoted _arguments spec: brackets and colons escaped."""
    return re.sub(r"([\[\]:\\])", r"\\\1", text).replace("'", "'\\''")


def _zsh_spec(o: Option) -> str:
    action = {"choice": f"({' '.join(o.choices)})", "dir": "_files -/", "file": "_files",
              "value": " "}.get(o.takes or "")
    return f"'{o.name}[{_zq(o.help)}]" + (f":{o.name.lstrip('-')}:{action}'" if action
                                           else "'")


def zsh(ap: argparse.ArgumentParser) -> str:
    cmds = commands(ap)
    cases = []
    for c in cmds:
        body = []
        if c.commands:
            items = " ".join(f"'{_zq(n)}:{_zq(h)}'" for n, h in c.commands)
            body += [f"            local -a cmds=({items})",
                     "            if [[ ${words[CURRENT]} != -* ]]; then",
                     "                _describe command cmds; return",
                     "            fi"]
        specs = " ".join([_zsh_spec(o) for o in c.options] + [
            f"'{n}:{_zq(name)}:({' '.join(choices)})'"
            for n, (name, choices) in enumerate(c.positional, 1)])
        body.append(f"            _arguments {specs}")
        cases.append(f'        "{c.path}")\n' + "\n".join(body) + " ;;")
    return "\n".join([
        f"#compdef {' '.join(NAMES)}",
        "# imagebuild completion for zsh, generated from its parser by "
        "`imagebuild completion zsh`",
        "_imagebuild() {",
        '    local cmdpath="" word i start=1',
        "    for ((i = 2; i < CURRENT; i++)); do",
        "        word=${words[i]}",
        '        case "$cmdpath|$word" in',
        f'            {_path_cases(cmds)}) cmdpath="${{cmdpath:+$cmdpath }}$word"; start=$i ;;',
        "        esac",
        "    done",
        "    # the words after the command path, as _arguments expects them",
        "    (( start > 1 )) && { words=(\"${words[1]}\" \"${(@)words[start+1,-1]}\"); "
        "(( CURRENT -= start - 1 )); }",
        '    case "$cmdpath" in',
        *cases,
        "    esac",
        "}",
        'if [[ "${funcstack[1]}" == _imagebuild ]]; then _imagebuild "$@"; '
        "else compdef _imagebuild " + " ".join(NAMES) + "; fi",
        ""])


def script(ap: argparse.ArgumentParser, shell: str) -> str:
    return bash(ap) if shell == "bash" else zsh(ap)
