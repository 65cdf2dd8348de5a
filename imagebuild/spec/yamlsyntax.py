"""A YAML syntax error in our words, at the line that holds the mistake.

PyYAML (and libyaml, which it uses when present) reports where its scanner gave up, which
for an unclosed bracket or quote, or a key without its colon, is the next token: a line
late, or at the end of the file. Each construct it was reading is also in the error
(`context_mark`), so the mistake's own line is known; the wording is PyYAML's parser
vocabulary ("did not find expected key"), which says nothing about what to change. This
module names the construct, the line where it starts, and the edit that fixes it; an
error it does not know keeps PyYAML's words with the position it gave.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from imagebuild.errors import UserError

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # as spec/yamlpos.py reads it


BACKSLASH = "\\"


@dataclass(frozen=True)
class _Said:
    message: str
    fix: str
    at_context: bool = False  # the mistake is where the unfinished construct started
    mark: yaml.Mark | None = None  # ... or here, found by scanning the text again


def _char(text: str, mark: yaml.Mark | None) -> str:
    """The character at `mark` (libyaml's marks carry no buffer of their own)."""
    if mark is None:
        return ""
    lines = text.splitlines()
    if mark.line >= len(lines):
        return ""
    line = lines[mark.line]
    return line[mark.column] if mark.column < len(line) else ""


def _before_on_line(text: str, mark: yaml.Mark) -> str:
    lines = text.splitlines()
    return lines[mark.line][:mark.column] if mark.line < len(lines) else ""


def _quote_spanning_to(text: str, line: int) -> yaml.Mark | None:
    """Where a quoted value that runs over several lines and ends on `line` starts: YAML
    lets a quote span lines, so one left open ends at the next quote character anywhere
    below (in a comment, say) and the error comes from there."""
    start = None
    try:
        for token in yaml.scan(text, Loader=_LOADER):
            if token.start_mark.line > line:
                break
            if isinstance(token, yaml.ScalarToken) and token.style in ('"', "'") and \
                    token.start_mark.line < token.end_mark.line == line:
                start = token.start_mark
    except yaml.YAMLError:
        pass
    return start


def _explain(exc: yaml.MarkedYAMLError, text: str) -> _Said | None:
    context, problem = exc.context or "", exc.problem or ""
    found = _char(text, exc.problem_mark)
    if "flow sequence" in context and "expected ','" in problem:
        return _Said("the list opened with '[' here is not closed, or two of its items have "
                     "no ',' between them", "close it with ']' on the same line and separate "
                     "its items with ', ' (or write one '- item' per line)", at_context=True)
    if "flow mapping" in context and "expected ','" in problem:
        return _Said("the mapping opened with '{' here is not closed, or two of its entries "
                     "have no ',' between them", "close it with '}' on the same line and "
                     "separate its entries with ', '", at_context=True)
    if "quoted scalar" in context and "end of stream" in problem:
        return _Said("the quote opened here is never closed", "close the quote at the end "
                     "of the value, on the same line", at_context=True)
    if "simple key" in context and "expected ':'" in problem:
        return _Said("this line is neither `key: value` nor a list item: the ':' after its "
                     "key is missing", "write `key: value` (with a space after the colon), "
                     "or start a list item with '- '", at_context=True)
    if "unknown escape" in problem:
        mark = exc.problem_mark
        after = _char(text, mark and yaml.Mark("", 0, mark.line, mark.column + 1, "", 0))
        escaped = after if found == BACKSLASH else found  # libyaml marks the backslash
        return _Said(f"'{BACKSLASH}{escaped}' is no escape YAML knows inside double quotes",
                     "double the backslash (\\\\), or use single quotes, in which a "
                     "backslash is plain text")
    if found == "\t" or "tab character" in problem:
        return _Said("a tab indents this line: YAML indents with spaces only",
                     "replace the tab with spaces, aligned with the keys of the same mapping")
    if "cannot start any token" in problem:
        return _Said(f"an unquoted value cannot start with {found!r} (YAML reserves it)",
                     f"quote the value: '{found}...'")
    if "mapping values are not allowed" in problem:
        return _Said("': ' here starts a key inside a value: this line is indented deeper "
                     "than the keys beside it, or a value holding ': ' is not quoted",
                     "indent the key like its siblings, or quote the whole value")
    # libyaml's words first, then the pure-Python parser's for the same mistakes
    block_end = "<block end>" in problem
    if ("expected key" in problem or block_end and "mapping" in context) and \
            exc.problem_mark is not None:
        opened = _quote_spanning_to(text, exc.problem_mark.line)
        if opened is not None:  # a quote left open swallowed the lines up to a later quote
            return _Said(f"the quote opened here is closed only on line "
                         f"{exc.problem_mark.line + 1}", "close the quote at the end of the "
                         "value, on the same line", mark=opened)
        if _before_on_line(text, exc.problem_mark).strip():
            return _Said(f"unexpected {found!r} after the value on this line",
                         "remove it, or quote the whole value if it belongs to it")
        if found == "-":
            return _Said("a list item where the mapping expects a key", "make the list the "
                         "value of a key (`key:` on the line above, the items indented under "
                         "it), or indent the item under the key it belongs to")
        return _Said("this line's indentation matches no mapping above it",
                     "indent it exactly like the other keys of the mapping it belongs to "
                     "(spaces)")
    if "'-' indicator" in problem or block_end and "collection" in context:
        return _Said("a list's items each start with '- ' at the same indentation; this "
                     "line is neither an item nor back at the level of the list's key",
                     "start it with '- ' aligned with the items above, or indent it like "
                     "the key the list belongs to")
    if "undefined alias" in problem:
        return _Said("'*' refers to an anchor ('&name') defined nowhere above",
                     "define the anchor before it is used, or quote the value if the '*' "
                     "is meant literally")
    if "anchor" in context or "alias" in context:
        return _Said("an anchor ('&') or alias ('*') needs a name right after it",
                     "name it (`&base`, `*base`), or quote the value")
    if "document" in problem or "document" in context:
        return _Said("a second YAML document starts here ('---' or '...'): matrix.yaml is "
                     "one document", "remove the separator (and merge what follows into "
                     "the one document)")
    return None


def syntax_error(exc: yaml.YAMLError, text: str, file: str) -> UserError:
    """`exc` of composing `text` (the file `file`) as a UserError at the mistake's line."""
    said = _explain(exc, text) if isinstance(exc, yaml.MarkedYAMLError) else None
    mark = getattr(exc, "problem_mark", None)
    if said is not None and said.mark is not None:
        mark = said.mark
    elif said is not None and said.at_context and getattr(exc, "context_mark", None):
        mark = exc.context_mark  # type: ignore[attr-defined]
    where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark else f"{file}:1:1"
    if said is None:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        return UserError(f"not valid YAML: {problem}", fix="fix the YAML syntax at that "
                         "position", where=where)
    return UserError(f"not valid YAML: {said.message}", fix=said.fix, where=where)
