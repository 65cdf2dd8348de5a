"""Cut statements and if()-blocks out of a CMakeLists.txt, verbatim.

The rehearsal runs vLLM's own arch-selection code rather than a re-implementation of it:
the pieces of the pinned CMakeLists.txt that pick the CUDA arches are copied, unchanged,
into a small probe project. An anchor is a regex over the whole file; a piece is the
statement or the if()-block the match starts in. When a vLLM bump moves or renames
code, an anchor stops matching and the rehearsal fails naming it (never a silent guess).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_IF = re.compile(r"^\s*if\s*\(", re.I)
_ENDIF = re.compile(r"^\s*endif\s*\(", re.I)


class AnchorError(Exception):
    """An anchor matched nothing, or more than once."""


@dataclass(frozen=True)
class Piece:
    """One cut: `kind` is "statement" (the command the anchor starts in), "block" (the
    innermost if()...endif() holding the anchor, or starting at it), "block+next" (that
    block and the one right after it) or "until" (from the anchor's line up to, not
    including, the line where `until` matches)."""

    name: str
    anchor: str
    kind: str = "statement"
    until: str | None = None


def _line_of(text: str, pattern: str, start_line: int = 0) -> int:
    offset = sum(len(line) + 1 for line in text.split("\n")[:start_line])
    hits = list(re.finditer(pattern, text[offset:], re.M))
    if len(hits) != 1:
        raise AnchorError(f"{pattern!r} matches {len(hits)} times (want exactly 1)")
    return text.count("\n", 0, offset + hits[0].start())


def _code(line: str) -> str:
    """The line without its comment (CMake comments start at an unquoted #)."""
    out, quoted = [], False
    for ch in line:
        if ch == '"':
            quoted = not quoted
        if ch == "#" and not quoted:
            break
        out.append(ch)
    return "".join(out)


def statement_end(lines: list[str], start: int) -> int:
    """Index of the line that closes the command starting on `start` (balanced parens)."""
    depth, seen = 0, False
    for i in range(start, len(lines)):
        code, quoted = _code(lines[i]), False
        for ch in code:
            if ch == '"':
                quoted = not quoted
            elif not quoted and ch == "(":
                depth, seen = depth + 1, True
            elif not quoted and ch == ")":
                depth -= 1
        if seen and depth == 0:
            return i
    raise AnchorError(f"unbalanced parentheses from line {start + 1}")


def block_start(lines: list[str], at: int) -> int:
    """The if() line opening the innermost block holding line `at` (or `at` itself)."""
    if _IF.match(_code(lines[at])):
        return at
    depth = 0
    for i in range(at - 1, -1, -1):
        code = _code(lines[i])
        if _ENDIF.match(code):
            depth += 1
        elif _IF.match(code):
            if depth == 0:
                return i
            depth -= 1
    raise AnchorError(f"line {at + 1} is not inside an if() block")


def block_end(lines: list[str], start: int) -> int:
    """Index of the endif() that closes the if() on line `start`."""
    depth = 0
    for i in range(start, len(lines)):
        code = _code(lines[i])
        if _IF.match(code):
            depth += 1
        elif _ENDIF.match(code):
            depth -= 1
            if depth == 0:
                return i
    raise AnchorError(f"if() on line {start + 1} has no endif()")


def _next_code_line(lines: list[str], after: int) -> int:
    for i in range(after + 1, len(lines)):
        if _code(lines[i]).strip():
            return i
    raise AnchorError(f"nothing follows line {after + 1}")


def cut(text: str, piece: Piece) -> tuple[int, int, str]:
    """(first line, last line, text) of `piece` in `text`; lines are 1-based."""
    lines = text.split("\n")
    try:
        at = _line_of(text, piece.anchor)
        if piece.kind == "statement":
            first, last = at, statement_end(lines, at)
        elif piece.kind in ("block", "block+next"):
            first = block_start(lines, at)
            last = block_end(lines, first)
            if piece.kind == "block+next":
                nxt = _next_code_line(lines, last)
                if not _IF.match(_code(lines[nxt])):
                    raise AnchorError(f"line {nxt + 1} after the block is not an if()")
                last = block_end(lines, nxt)
        elif piece.kind == "until" and piece.until:
            first = at
            last = _line_of(text, piece.until, at + 1) - 1
        else:
            raise AnchorError(f"unknown kind {piece.kind!r}")
    except AnchorError as exc:
        raise AnchorError(f"{piece.name}: {exc}") from None
    return first + 1, last + 1, "\n".join(lines[first:last + 1])


def extract(text: str, pieces: list[Piece], source: str) -> str:
    """The pieces in order, each headed by where it came from."""
    parts = []
    for piece in pieces:
        first, last, body = cut(text, piece)
        parts.append(f"# --- {piece.name}: {source} lines {first}-{last}, verbatim ---\n{body}\n")
    return "\n".join(parts)
