"""Every example the tool shows runs (issue 38, item 1): each `example:` of every command's
--help (read from the parser, so a new example is covered) and every command line of
docs/commands.md's examples, against the repository's matrix and an in-memory registry
holding the releases they name. Read-only examples (and --dry-run ones, the registry
being in memory) run to exit 0; the rest (builds, boots, the Hub) are parsed and their
--tag/--target/--only must select cells, their names exist."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from imagebuild import cli
from imagebuild.cliparser import parser
from tests.support.cliregistry import cli_registry
from tests.support.memregistry import MemRegistry

ROOT = Path(__file__).resolve().parents[2]
# commands run to the end here: they read (or write only the in-memory registry)
RUN = {"plan", "check", "render", "schema", "migrate", "releases", "history", "notes",
       "table", "prune", "rollback", "unlock", "resume", "promote", "lock", "completion"}


def _commands(ap: argparse.ArgumentParser, prefix: str = ""):
    yield prefix.strip(), ap
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{prefix}{name} ")


def _split_examples(text: str) -> list[str]:
    """`build.py plan --tag T     (or: build.py plan ...)` -> both command lines, without
    a shell redirection (`> notes.md`)."""
    out = []
    for line in text.splitlines():
        for part in re.split(r"\s{2,}\(", line):
            part = re.sub(r"^or[^:]*:", "", part.strip()).strip().rstrip(")").strip()
            if part.startswith("build.py"):
                out.append(part.split(" > ")[0].strip())
    return out


def help_examples() -> list[str]:
    found = []
    for _, sub in _commands(parser(prog="build.py")):
        epilog = (sub.epilog or "") % {"prog": sub.prog}
        found += _split_examples(epilog.split("example:", 1)[-1])
    return found


def doc_examples() -> list[str]:
    """The command lines of docs/commands.md's `## Examples` code block."""
    text = (ROOT / "docs/commands.md").read_text()
    section = text.split("## Examples", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    return [line.removeprefix("python ").split("  #")[0].split(" > ")[0].strip()
            for line in block.splitlines() if line.startswith("python build.py")]


EXAMPLES = sorted(set(help_examples()) | set(doc_examples()))
TAGS = ("2026-06-18-v0.23.0-dflashfix", "2026-07-01-v0.23.0-dflashfix")


def test_examples_are_found_for_every_command() -> None:
    named = {shlex.split(e)[1] for e in EXAMPLES}
    commands = {n.split()[0] for n, _ in _commands(parser()) if n}
    assert commands <= named | {"pins"}, commands - named
    assert any(e.startswith("build.py pins watch") for e in EXAMPLES)
    assert len(doc_examples()) >= 8


@pytest.fixture
def registry(monkeypatch, tmp_path) -> MemRegistry:
    return cli_registry(monkeypatch, tmp_path, TAGS)


def _resolves(argv: list[str], tmp_path: Path) -> None:
    """A command not run here: it parses, its cells exist, the names it gives exist."""
    from imagebuild.lock.resolve import check_update_names
    from imagebuild.plan import load_plan
    from imagebuild.spec import matrix as mx

    args = parser().parse_args(cli._default_command(argv))
    if getattr(args, "tag", None) or getattr(args, "only", None):
        plan = load_plan(args.matrix, args.tag, args.target, args.only)
        assert plan.cells, f"{argv}: selects no cell"
    if getattr(args, "update", None):
        check_update_names(mx.load(args.matrix), set(args.update))
    for path in getattr(args, "files", None) or []:
        # files render writes: rendered from the example's matrix they are under
        example, _, inside = str(path).partition("/rendered/")
        assert cli.main(["render", "--matrix", f"{example}/matrix.yaml",
                         "--out", str(tmp_path / "r")]) == 0
        assert len(list((tmp_path / "r").glob(inside))) >= 2, f"{argv}: {path} names no file"


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_runs(example: str, registry: MemRegistry, monkeypatch, capsys,
                            tmp_path) -> None:
    monkeypatch.chdir(ROOT)
    argv = [a.replace("@sha256:<digest>", "") for a in shlex.split(example)[1:]]
    command = cli._default_command(argv)[0]
    if command in RUN and "--update" not in argv:
        before = len(registry.writes())
        code = cli.main(argv)
        out = capsys.readouterr()
        assert code == 0, f"{example}: exit {code}\n{out.err[-2000:]}"
        if "--dry-run" in argv or command in ("releases", "history", "notes", "plan"):
            assert registry.writes()[before:] == [], f"{example} wrote to the registry"
    else:
        _resolves(argv, tmp_path)


def _documented_commands() -> set[str]:
    """The commands docs/commands.md's `## Every command` table has a row for."""
    text = (ROOT / "docs/commands.md").read_text()
    table = text.split("## Every command", 1)[1].split("\n## ", 1)[0]
    found = set()
    for row in table.splitlines():
        if not row.startswith("| `"):
            continue
        for span in re.findall(r"`([^`]+)`", row.split(" | ")[0]):
            word = span.removeprefix("build.py ").split()[0]
            found.add("release" if word.startswith("--") else word)
    return found


def test_docs_have_a_row_for_every_command() -> None:
    """Issue 38, item 10: "every command" means every command of the parser."""
    commands = {n.split()[0] for n, _ in _commands(parser()) if n}
    assert commands - _documented_commands() == set()
    assert _documented_commands() - commands == set()


def test_version_works_after_every_command(capsys) -> None:
    from imagebuild import __version__

    for name, _ in _commands(parser()):
        assert cli.main([*name.split(), "--version"]) == 0, name
        assert capsys.readouterr().out.strip() == f"imagebuild {__version__}", name
