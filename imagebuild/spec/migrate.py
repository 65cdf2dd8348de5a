"""`build.py migrate`: rewrite an older matrix.yaml to the current schema in place,
line by line so comments and layout stay. It applies spec/renames.py (a renamed key and,
where the table says, its value) and sets `schema:` to the current version; what needs a
judgement (e.g. the compute capability of a former `gpu: true`) is left to the check that
follows, which names the line."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from imagebuild.errors import UserError
from imagebuild.spec.config import SCHEMA_VERSION
from imagebuild.spec.renames import RENAMES, Rename
from imagebuild.spec.yamlpos import load_located


def _paths(data: Any, pattern: tuple[str, ...], done: tuple[Any, ...] = ()) -> Iterator[
        tuple[Any, ...]]:
    """Every key path in `data` the rename's path pattern matches."""
    if not isinstance(data, dict) or not pattern:
        return
    head, rest = pattern[0], pattern[1:]
    for key, value in data.items():
        if head in ("*", key):
            if rest:
                yield from _paths(value, rest, (*done, key))
            elif head == key:
                yield (*done, key)


def _value(data: Any, loc: tuple[Any, ...]) -> Any:
    for part in loc:
        data = data[part]
    return data


def _rewrite(line: str, col: int, key: str, rename: Rename, value: Any) -> str | None:
    """`key: value  # comment` at column col becomes `new: value'` with the comment kept."""
    head, tail = line[:col - 1], line[col - 1:]
    m = re.match(rf"{re.escape(key)}(\s*:[ \t]*)([^#\r\n]*?)([ \t]*(?:#.*)?\r?\n?)\Z", tail)
    if m is None:
        return None
    new_value = rename.values.get(value, m.group(2)) if rename.values else m.group(2)
    if not isinstance(new_value, str):
        return None
    return f"{head}{rename.new}{m.group(1)}{new_value}{m.group(3)}"


def migrate(path: Path, *, dry_run: bool = False) -> list[str]:
    """The changes made (or, with dry_run, that would be made), one line each."""
    located = load_located(path)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    changes: list[str] = []
    for rename in RENAMES:
        for loc in _paths(located.data, rename.path):
            parent = _value(located.data, loc[:-1])
            where = located.where(loc)
            if rename.new in parent:
                raise UserError(f"{'.'.join(map(str, loc))} and its replacement "
                                f"`{rename.new}` are both set", where=where,
                                fix=f"keep `{rename.new}` and remove `{loc[-1]}`")
            line_no, col = located.marks[loc]
            new = _rewrite(lines[line_no - 1], col, str(loc[-1]), rename,
                           _value(located.data, loc))
            if new is None:
                raise UserError(f"{'.'.join(map(str, loc))}: {rename.hint}", where=where,
                                fix=f"rewrite it by hand as `{rename.new}`")
            changes.append(f"{where}: {lines[line_no - 1].strip()} -> {new.strip()}")
            lines[line_no - 1] = new
    version = located.data.get("schema") if isinstance(located.data, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version < SCHEMA_VERSION:
        line_no, col = located.marks[("schema",)]
        old = lines[line_no - 1]
        lines[line_no - 1] = re.sub(r"(schema\s*:\s*)\d+", rf"\g<1>{SCHEMA_VERSION}", old,
                                    count=1)
        changes.append(f"{located.where(('schema',))}: {old.strip()} -> "
                       f"{lines[line_no - 1].strip()}")
    if changes and not dry_run:
        path.write_text("".join(lines), encoding="utf-8")
    return changes
