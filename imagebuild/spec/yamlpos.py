"""Load YAML keeping where every value came from, so errors can name file:line:column.

PyYAML's composer already records marks on each node; we keep them in a side table keyed
by the value's path (a tuple of keys/indexes), which pydantic's error `loc` matches.
Duplicate keys are an error here (PyYAML would silently keep the last one).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from imagebuild.errors import UserError

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Located:
    """Parsed YAML data plus the line/column (1-based) of every path in it."""

    data: Any
    file: str
    marks: dict[Path_, tuple[int, int]]

    def where(self, path: Path_) -> str:
        """file:line:col of the deepest known prefix of `path`."""
        for cut in range(len(path), -1, -1):
            mark = self.marks.get(tuple(path[:cut]))
            if mark:
                return f"{self.file}:{mark[0]}:{mark[1]}"
        return self.file


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: faster


def _scalar(node: yaml.Node) -> Any:
    return yaml.constructor.SafeConstructor().construct_object(node, deep=True)


def _walk(node: yaml.Node, path: Path_, marks: dict, file: str) -> Any:
    marks[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(key_node)
            if not isinstance(key, str):
                key = str(key)
            if key in out:
                line = key_node.start_mark.line + 1
                col = key_node.start_mark.column + 1
                raise UserError(
                    f"duplicate key {key!r} (first at line {marks[path + (key,)][0]})",
                    fix="remove one of the two entries",
                    where=f"{file}:{line}:{col}",
                )
            marks[path + (key,)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            out[key] = _walk(value_node, path + (key,), marks, file)
            # keep the value's own position when it sits on a later line (block values)
            marks[path + (key,)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, path + (i,), marks, file) for i, item in enumerate(node.value)]
    return _scalar(node)


def load_located(path: Path, display: str | None = None) -> Located:
    file = display or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise UserError(f"{file} not found",
                        fix="run from the repository root or pass --matrix") from exc
    try:
        root = yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark else file
        raise UserError(f"not valid YAML: {getattr(exc, 'problem', exc)}",
                        fix="fix the YAML syntax at that position", where=where) from exc
    marks: dict[Path_, tuple[int, int]] = {}
    data = _walk(root, (), marks, file) if root is not None else {}
    return Located(data=data, file=file, marks=marks)
