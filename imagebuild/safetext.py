"""Text from outside (a registry's tags, annotations, error bodies) made safe to print.

A registry can answer anything: an escape sequence that sets the terminal title or clears
the screen, a newline that forges an `error:` line, a 10 MB annotation. `safe()` is the
one function every such string goes through before it reaches the terminal, a log or the
release notes: control characters become visible escapes and the length is capped.
"""

from __future__ import annotations

import re

MAX_CHARS = 300  # a registry string longer than this is cut (the cut is said)

# C0 and C1 controls, DEL, and the Unicode bidi/line separators that reorder or break text
_ODD = "\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[\x00-\x1f{_ODD}]")
# the same, minus newline and tab: for text we wrote ourselves around registry strings
_UNSAFE_KEEP_LINES = re.compile(f"[\x00-\x08\x0b-\x1f{_ODD}]")


def _escape(m: re.Match[str]) -> str:
    ch = m.group(0)
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch, f"\\x{ord(ch):02x}" if ord(ch) < 256
                                                      else f"\\u{ord(ch):04x}")


def safe(value: object, limit: int = MAX_CHARS) -> str:
    """`value` as one printable line: controls escaped, at most `limit` characters kept."""
    text = value if isinstance(value, str) else str(value)
    cut = len(text) - limit if len(text) > limit else 0
    if cut:
        text = text[:limit]
    text = _UNSAFE.sub(_escape, text)
    return f"{text}... ({cut:,} more characters)" if cut else text


def safe_lines(text: str) -> str:
    """Our own multi-line message: newlines and tabs kept, every other control escaped
    (a second line of defence for messages that embed registry strings)."""
    return _UNSAFE_KEEP_LINES.sub(_escape, text)
