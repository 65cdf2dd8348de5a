"""A small Dockerfile tokenizer with BuildKit's rules, stricter where a parser could differ,
for the injection tests: which instructions a file holds and how each is shaped.

- Parser directives (`# escape=`, `# syntax=`) only at the very top.
- Lines: every line break Python knows (LF, CR, VT, FF, FS, GS, RS, NEL, U+2028, U+2029),
  not only LF as BuildKit splits: a value that smuggles any of them shows up as a line.
- A line ending in the escape character continues; comment and empty lines inside a
  continuation are dropped, as BuildKit drops them.
- Heredocs (`RUN <<EOF`, `COPY <<-EOF`): the lines up to the delimiter belong to the
  instruction (a word starting with a quote is not a heredoc, as with BuildKit's raw
  quotes).
- ENV/ARG/LABEL words are read as BuildKit's shell lexer reads them: double quotes with
  `\\`, `"` and `$` escapes, single quotes literal, and `$NAME`/`${NAME}` expansions noted.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from dataclasses import dataclass, field

DIRECTIVE = re.compile(r"^#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.+?)\s*$")
HEREDOC = re.compile(r"^\d*<<(-?)(.+)$")


@dataclass(frozen=True)
class Instruction:
    keyword: str
    body: str  # continuations joined, without the keyword
    line: int  # 1-based line of its first line
    heredocs: tuple[str, ...] = field(default=())


def _heredoc_words(body: str) -> list[tuple[bool, str]]:
    out = []
    for word in raw_words(body):
        m = HEREDOC.match(word)
        if m and not word.startswith(("'", '"')):
            out.append((m.group(1) == "-", m.group(2).strip("'\"")))
    return out


def instructions(text: str) -> list[Instruction]:
    lines = text.splitlines()
    i, escape = 0, "\\"
    while i < len(lines) and (m := DIRECTIVE.match(lines[i])):
        if m.group(1).lower() == "escape":
            escape = m.group(2)
        i += 1
    out: list[Instruction] = []
    while i < len(lines):
        first, line = i + 1, lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts, cur = [], line.lstrip()
        while True:
            body = cur.rstrip()
            if escape and body.endswith(escape):
                parts.append(body[:-len(escape)])
                while i < len(lines) and (not lines[i].strip()
                                          or lines[i].lstrip().startswith("#")):
                    i += 1
                if i >= len(lines):
                    break
                cur, i = lines[i], i + 1
                continue
            parts.append(body)
            break
        joined = "".join(parts)
        keyword, _, rest = joined.partition(" ")
        keyword = keyword.upper()
        docs = []
        if keyword in ("RUN", "COPY", "ADD"):
            for dash, word in _heredoc_words(rest):
                body_lines = []
                while i < len(lines):
                    candidate = lines[i].lstrip("\t") if dash else lines[i]
                    i += 1
                    if candidate == word:
                        break
                    body_lines.append(lines[i - 1])
                docs.append("\n".join(body_lines))
        out.append(Instruction(keyword, rest.strip(), first, tuple(docs)))
    return out


def raw_words(text: str) -> list[str]:
    """Words split at unquoted blanks, quotes kept (BuildKit's raw-quote lexing)."""
    words, cur, quote, esc = [], "", "", False
    for ch in text:
        if esc:
            cur, esc = cur + ch, False
        elif ch == "\\" and quote != "'":
            cur, esc = cur + ch, True
        elif quote:
            cur += ch
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            cur, quote = cur + ch, ch
        elif ch in " \t":
            if cur:
                words.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        words.append(cur)
    return words


VAR = re.compile(r"\{?([A-Za-z_][A-Za-z0-9_]*)")


def docker_word(word: str) -> tuple[str, tuple[str, ...]]:
    """(value, variables it expands) of one ENV/ARG/LABEL word, as BuildKit reads it."""
    value, expands, quote, i = "", [], "", 0
    while i < len(word):
        ch = word[i]
        if quote == "'":
            if ch == "'":
                quote = ""
            else:
                value += ch
        elif ch == "\\" and i + 1 < len(word) and (not quote or word[i + 1] in '"$\\'):
            value += word[i + 1]
            i += 1
        elif ch == '"':
            quote = "" if quote else '"'
        elif ch == "'" and not quote:
            quote = "'"
        elif ch == "$" and (m := VAR.match(word, i + 1)):
            expands.append(m.group(1))
            value += "<$" + m.group(1) + ">"
        else:
            value += ch
        i += 1
    return value, tuple(expands)


@functools.lru_cache(maxsize=4096)
def shell_shape(command: str) -> tuple[str, ...]:
    """A shell command's skeleton: 'W' per word, operators as themselves. A value that
    escaped its quoting adds words or operators."""
    lex = shlex.shlex(command, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        return tuple(t if t and set(t) <= set("();<>|&") else "W" for t in lex)
    except ValueError as exc:  # an unbalanced quote
        return ("UNBALANCED", str(exc))


def shape(ins: Instruction) -> tuple:
    """What must not change when only values change: the instruction, its flags, the
    shape of its command, the keys it sets and the variables it expands."""
    words = raw_words(ins.body)
    flags = tuple(w.split("=", 1)[0] for w in words if w.startswith("--"))
    rest = [w for w in words if not w.startswith("--")]
    kw = ins.keyword
    if kw == "RUN":
        command = ins.body
        while command.startswith("--"):
            command = command.split(" ", 1)[1] if " " in command else ""
        return (kw, flags, shell_shape(command), len(ins.heredocs))
    if kw in ("ENV", "ARG", "LABEL"):
        pairs = [docker_word(w) for w in rest]
        keys = tuple(v.split("=", 1)[0] for v, _ in pairs)
        expands = tuple(sorted({x for _, e in pairs for x in e}))
        return (kw, keys, expands)
    if kw in ("CMD", "ENTRYPOINT", "HEALTHCHECK"):
        body = ins.body
        if kw == "HEALTHCHECK":
            body = " ".join(rest[1:]) if rest[:1] == ["CMD"] else body
        try:
            parsed = json.loads(body)
        except ValueError:
            return (kw, flags, "shell form", shell_shape(body))
        ok = isinstance(parsed, list) and all(isinstance(x, str) for x in parsed)
        return (kw, flags, "exec form" if ok else "not a list of strings", len(parsed))
    if kw in ("COPY", "ADD"):
        return (kw, flags, len(rest), len(ins.heredocs))
    if kw == "FROM":
        return (kw, flags, len(rest), tuple(rest[1:]))
    return (kw, flags, len(rest))
