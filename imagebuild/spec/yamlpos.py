"""Load YAML keeping where every value came from, so errors can name file:line:column.

PyYAML's composer already records marks on each node; we keep them in a side table keyed
by the value's path (a tuple of keys/indexes), which pydantic's error `loc` matches.
Duplicate keys are an error here (PyYAML would silently keep the last one).

The file is composed into a node graph (linear in its size: an alias is a reference to
an existing node) and expanded by our own walk, which counts what it expands: a
"billion laughs" file stops at MAX_VALUES in milliseconds instead of eating memory.
Merge keys (`<<: *base`, `<<: [*a, *b]`) are expanded here too, keeping the positions of
the merged values. Only plain data tags are accepted (no `!!python/...`, no local tags).
Plain scalars that YAML 1.1 turned into something other than a string are remembered
with their original text, so a schema error can say what YAML did (`explain`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from imagebuild.errors import UserError
from imagebuild.spec.yamlsyntax import syntax_error

Path_ = tuple[str | int, ...]

MAX_BYTES = 1 << 20  # the real matrix.yaml is ~10 KB
MAX_VALUES = 20_000  # values after alias/merge expansion; the real file has ~300
MAX_DEPTH = 40  # nesting; the real file is 6 deep
MAX_INT_DIGITS = 4000  # Python refuses to convert longer digit strings

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: faster
TAG = "tag:yaml.org,2002:"
MERGE_TAG = TAG + "merge"
# what a matrix may hold: plain data. Not binary, set, omap, pairs or python/*; and no
# timestamps: no field is a date, and a date object cannot even be passed on as JSON.
SAFE_TAGS = {TAG + t for t in ("str", "int", "float", "bool", "null", "map", "seq")}
# What no value or key may hold: C0/C1 control characters (line feed, carriage return,
# NUL, escape, YAML's next-line U+0085) and Unicode's line and paragraph separators. Every
# string of a matrix can end up in a generated Dockerfile, compose file or shell line,
# where a line break starts a new instruction; so values are single lines of text.
UNSAFE_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def unsafe_char(text: str) -> str | None:
    """How to name the first character `text` may not hold (e.g. 'a line feed (U+000A)
    at character 7'), None when it holds none."""
    m = UNSAFE_CHARS.search(text)
    if not m:
        return None
    ch = m.group()
    names = {"\n": "a line feed", "\r": "a carriage return", "\t": "a tab", "\x00": "a NUL",
             "\x85": "a next-line character", "\u2028": "a line separator",
             "\u2029": "a paragraph separator", "\x1b": "an escape character"}
    return f"{names.get(ch, 'a control character')} (U+{ord(ch):04X}) at character {m.start() + 1}"


@dataclass(frozen=True)
class Scalar:
    """A plain (unquoted) scalar that YAML resolved to something other than a string."""

    text: str  # as written in the file
    tag: str  # the resolved tag, e.g. tag:yaml.org,2002:int
    value: Any


@dataclass(frozen=True)
class Located:
    """Parsed YAML data plus the line/column (1-based) of every path in it."""

    data: Any
    file: str
    marks: dict[Path_, tuple[int, int]]
    # plain scalars YAML did not read as strings, by path (see `explain`)
    scalars: dict[Path_, Scalar] = field(default_factory=dict)

    def where(self, path: Path_) -> str:
        """file:line:col of the deepest known prefix of `path`."""
        for cut in range(len(path), -1, -1):
            mark = self.marks.get(tuple(path[:cut]))
            if mark:
                return f"{self.file}:{mark[0]}:{mark[1]}"
        return f"{self.file}:1:1"

    def surprise(self, path: Path_) -> Scalar | None:
        """The plain scalar at `path` when YAML read it as a non-string, else None."""
        return self.scalars.get(tuple(path))


def shorten(value: Any, limit: int = 60) -> str:
    """repr() of a value, cut for messages (a hostile file can hold megabyte values)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**limit:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 15]}...({len(text)} chars)"


def explain(s: Scalar) -> str:
    """What YAML 1.1 did to an unquoted value, in words: 'YAML read 0123456 as the
    integer 42798 (a leading 0 means octal)'."""
    kind = s.tag.removeprefix(TAG)
    text = s.text
    why = ""
    if kind == "int":
        what = f"the integer {shorten(s.value)}"
        body = text.lstrip("+-")
        if re.fullmatch(r"0[0-7_]+", body):
            why = "a leading 0 means octal"
        elif body.startswith(("0x", "0X")):
            why = "0x means hexadecimal"
        elif body.startswith(("0b", "0B")):
            why = "0b means binary"
        elif ":" in body:
            why = "digits separated by ':' are base 60"
        elif "_" in body:
            why = "YAML 1.1 drops '_' from numbers"
    elif kind == "float":
        what = f"the number {shorten(s.value)}"
        if ":" in text:
            why = "digits separated by ':' are base 60"
    elif kind == "bool":
        what = f"the boolean {str(s.value).lower()}"
        why = "YAML 1.1 reads yes/no/on/off/true/false as booleans"
    elif kind == "null":
        return ("the value is empty (YAML reads it as null)" if text in ("", "~")
                else f"YAML read {text} as null")
    elif kind == "timestamp":
        what = f"the date {s.value}"
    else:
        what = f"a {kind}"
    return f"YAML read {shorten(text, 50) if len(text) > 50 else text} as {what}" + (
        f" ({why})" if why else "")


def quote_fix(s: Scalar) -> str:
    if s.tag == TAG + "null" and s.text in ("", "~"):
        return "give a value there"
    quoted = s.text.replace("'", "''")
    return f"quote it to keep it a string: '{quoted}'"


class _Walk:
    """Expands the node graph into plain data, counting what it expands."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.marks: dict[Path_, tuple[int, int]] = {}
        self.scalars: dict[Path_, Scalar] = {}
        self.values = 0
        self.constructor = yaml.constructor.SafeConstructor()

    def at(self, node: yaml.Node) -> str:
        return f"{self.file}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"

    def _count(self, node: yaml.Node, path: Path_) -> None:
        self.values += 1
        if self.values > MAX_VALUES:
            raise UserError(
                f"expanding aliases yields more than {MAX_VALUES} values (a YAML "
                "\"billion laughs\" bomb, or aliases of aliases nested too far)",
                fix="use anchors and aliases only for small shared settings such as "
                    "`<<: *base` in profile args",
                where=self.at(node))
        if len(path) > MAX_DEPTH:
            raise UserError(f"values nested more than {MAX_DEPTH} levels deep (or an alias "
                            "that contains itself)",
                            fix="flatten the structure; matrix.yaml needs a few levels",
                            where=self.at(node))

    def scalar(self, node: yaml.Node) -> Any:
        if node.tag == TAG + "timestamp" and not getattr(node, "style", None):
            s = Scalar(node.value, node.tag, self.constructor.construct_object(node))
            raise UserError(f"{explain(s)}; matrix.yaml has no date fields",
                            fix=quote_fix(s), where=self.at(node))
        if node.tag not in SAFE_TAGS:
            raise UserError(
                f"tag {node.tag!r} is not allowed: matrix.yaml holds plain data (strings, "
                "numbers, booleans, lists, mappings)",
                fix="remove the tag; quote the value if it should stay a string",
                where=self.at(node))
        if node.tag == TAG + "int" and len(node.value) > MAX_INT_DIGITS:
            raise UserError(f"an integer of {len(node.value)} digits",
                            fix="use a sensible number (quote it if it is meant as text)",
                            where=self.at(node))
        try:
            value = self.constructor.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, OverflowError) as exc:
            raise UserError(f"YAML cannot read this {node.tag.removeprefix(TAG)} value: "
                            f"{str(exc).splitlines()[0][:200]}",
                            fix="correct the value, or quote it to keep it a string",
                            where=self.at(node)) from None
        bad = unsafe_char(value) if isinstance(value, str) else None
        if bad:
            raise UserError(
                f"{shorten(value)} holds {bad}: values are single lines of text (a line "
                "break or control character would reach generated Dockerfiles and shell "
                "lines)",
                fix="write it on one line (a long text may use a folded block `>-`, which "
                    "joins its lines with spaces) and drop the control character",
                where=self.at(node))
        return value

    def key(self, node: yaml.Node) -> str:
        if not isinstance(node, yaml.ScalarNode):
            raise UserError("a mapping key must be a plain name, not a list or mapping",
                            fix="use a plain name as the key", where=self.at(node))
        key = self.scalar(node)
        if not isinstance(key, str):
            s = Scalar(node.value, node.tag, key)
            raise UserError(f"key: {explain(s)}, but keys are names", fix=quote_fix(s),
                            where=self.at(node))
        return key

    def pairs(self, node: yaml.MappingNode, path: Path_,
              depth: int = 0) -> list[tuple[yaml.Node, yaml.Node, bool]]:
        """(key node, value node, merged?) of a mapping with its `<<` merges expanded:
        keys written in the mapping win over merged ones, and among merged mappings the
        earlier one wins (YAML merge-key semantics)."""
        if depth > MAX_DEPTH:
            raise UserError("merge keys (`<<`) nested too deep or merging themselves",
                            fix="merge plain mappings defined once (`base: &base {...}`)",
                            where=self.at(node))
        own: list[tuple[yaml.Node, yaml.Node, bool]] = []
        merged: list[tuple[yaml.Node, yaml.Node, bool]] = []
        for key_node, value_node in node.value:
            if key_node.tag != MERGE_TAG:
                own.append((key_node, value_node, False))
                continue
            sources = (value_node.value if isinstance(value_node, yaml.SequenceNode)
                       else [value_node])
            for src in sources:
                self._count(src, path)
                if not isinstance(src, yaml.MappingNode):
                    raise UserError("`<<` merges a mapping or a list of mappings",
                                    fix="write `<<: *name` or `<<: [*a, *b]` where each "
                                        "anchor names a mapping", where=self.at(src))
                for k, v, _ in self.pairs(src, path, depth + 1):
                    self._count(k, path)  # merges of merges multiply too
                    merged.append((k, v, True))
        return own + merged

    def walk(self, node: yaml.Node, path: Path_) -> Any:
        self._count(node, path)
        self.marks.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
        if isinstance(node, yaml.MappingNode):
            if node.tag != TAG + "map":
                self.scalar(node)  # raises: an unknown tag on a mapping
            return self.mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != TAG + "seq":
                self.scalar(node)
            return [self.walk(item, path + (i,)) for i, item in enumerate(node.value)]
        value = self.scalar(node)
        if not isinstance(value, str) and not getattr(node, "style", None):  # plain: None or ""
            self.scalars[path] = Scalar(node.value, node.tag, value)
        return value

    def mapping(self, node: yaml.MappingNode, path: Path_) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key_node, value_node, merged in self.pairs(node, path):
            key = self.key(key_node)
            sub = path + (key,)
            if key in out:
                if merged:
                    continue  # written in the mapping itself (first), or an earlier merge
                raise UserError(f"duplicate key {key!r} (first at line {self.marks[sub][0]})",
                                fix="remove one of the two entries", where=self.at(key_node))
            out[key] = self.walk(value_node, sub)
            # errors name the key's line (the value's own position may be a later line)
            self.marks[sub] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
        return out


def _read(path: Path, file: str) -> str:
    try:
        if path.is_dir():
            raise UserError(f"{file} is a directory, not a matrix file",
                            fix="pass the matrix.yaml file itself to --matrix",
                            where=f"{file}:1:1")
        if path.exists() and not path.is_file():  # a FIFO or /dev/zero would never end
            raise UserError(f"{file} is not a regular file", where=f"{file}:1:1",
                            fix="pass the matrix.yaml file itself to --matrix")
        with path.open("rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise UserError(f"{file} is larger than {MAX_BYTES} bytes; a matrix is a few "
                            "kilobytes", fix="pass the right file to --matrix",
                            where=f"{file}:1:1")
    except FileNotFoundError as exc:
        raise UserError(f"{file} not found", where=f"{file}:1:1",
                        fix="run from the repository root or pass --matrix") from exc
    except OSError as exc:
        raise UserError(f"cannot read {file}: {exc.strerror or exc}", where=f"{file}:1:1",
                        fix="check the path and its permissions") from exc
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = raw[:exc.start]
        line = before.count(b"\n") + 1
        col = len(before) - (before.rfind(b"\n") + 1) + 1
        raise UserError(f"not UTF-8: byte 0x{raw[exc.start]:02x} cannot be decoded",
                        fix="save the file as UTF-8", where=f"{file}:{line}:{col}") from None


def load_located(path: Path, display: str | None = None) -> Located:
    file = display or str(path)
    text = _read(path, file)
    try:
        root = yaml.compose(text, Loader=_LOADER)
    except RecursionError:  # the pure-Python composer (no libyaml) on deep nesting
        raise UserError("values nested too deep", fix="flatten the structure",
                        where=f"{file}:1:1") from None
    except yaml.YAMLError as exc:
        raise syntax_error(exc, text, file) from None
    if root is None:
        raise UserError(f"{file} is empty", fix="start from the repository's matrix.yaml",
                        where=f"{file}:1:1")
    walk = _Walk(file)
    data = walk.walk(root, ())
    return Located(data=data, file=file, marks=walk.marks, scalars=walk.scalars)
