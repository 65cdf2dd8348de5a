"""Where every value of a JSON document sits (line and column, 1-based), by its path, so a
hand-edited matrix.lock.json can be refused at `file:line:column` like matrix.yaml.

The document has already been parsed by `json` (which reports syntax errors with their
position); this walk only records marks, using the json module's own string scanner.
"""

from __future__ import annotations

import re
from json.decoder import scanstring  # type: ignore[attr-defined]

Path_ = tuple[str | int, ...]

_WS = re.compile(r"[ \t\n\r]*")
_SCALAR = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null")


class _Walk:
    def __init__(self, text: str) -> None:
        self.text = text
        self.marks: dict[Path_, tuple[int, int]] = {}
        self.lines = [0]  # offsets of line starts
        for i, ch in enumerate(text):
            if ch == "\n":
                self.lines.append(i + 1)

    def mark(self, pos: int) -> tuple[int, int]:
        lo, hi = 0, len(self.lines) - 1
        while lo < hi:  # the last line start <= pos
            mid = (lo + hi + 1) // 2
            if self.lines[mid] <= pos:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1, pos - self.lines[lo] + 1

    def ws(self, pos: int) -> int:
        m = _WS.match(self.text, pos)
        return m.end() if m else pos

    def value(self, pos: int, path: Path_, depth: int = 0) -> int:
        pos = self.ws(pos)
        self.marks.setdefault(path, self.mark(pos))
        ch = self.text[pos:pos + 1]
        if depth > 200:  # json.loads would have refused deeper documents already
            raise ValueError("nested too deep")
        if ch == "{":
            pos = self.ws(pos + 1)
            if self.text[pos] == "}":
                return pos + 1
            while True:
                key_at = self.ws(pos)
                key, pos = scanstring(self.text, key_at + 1)
                self.marks[path + (key,)] = self.mark(key_at)  # errors name the key's line
                pos = self.ws(pos) + 1  # the ':'
                pos = self.ws(self.value(pos, path + (key,), depth + 1))
                if self.text[pos] == "}":
                    return pos + 1
                pos += 1  # the ','
        if ch == "[":
            pos = self.ws(pos + 1)
            if self.text[pos] == "]":
                return pos + 1
            index = 0
            while True:
                pos = self.ws(self.value(pos, path + (index,), depth + 1))
                index += 1
                if self.text[pos] == "]":
                    return pos + 1
                pos += 1
        if ch == '"':
            return scanstring(self.text, pos + 1)[1]
        m = _SCALAR.match(self.text, pos)
        if not m:
            raise ValueError(f"unexpected {ch!r} at {pos}")
        return m.end()


def json_marks(text: str) -> dict[Path_, tuple[int, int]]:
    """(line, column) of every path in a JSON text `json.loads` accepted; {} if the walk
    meets something it does not expect (then errors fall back to line 1)."""
    walk = _Walk(text)
    try:
        walk.value(0, ())
    except (ValueError, IndexError):
        return walk.marks
    return walk.marks
