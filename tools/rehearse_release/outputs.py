"""`$GITHUB_OUTPUT` / `$GITHUB_ENV` files read by the runner's rules: every line is
`name=value` or a `name<<DELIMITER` block; anything else fails the step (GitHub's runner
and act both refuse it), which is how Make's echo of a recipe line breaks a job."""

from __future__ import annotations


class OutputFormatError(ValueError):
    pass


def parse(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip():
            continue
        eq, heredoc = line.find("="), line.find("<<")
        if heredoc > 0 and (eq < 0 or heredoc < eq):
            name, delim = line[:heredoc], line[heredoc + 2:]
            body: list[str] = []
            while i < len(lines) and lines[i] != delim:
                body.append(lines[i])
                i += 1
            if i >= len(lines):
                raise OutputFormatError(f"no closing {delim!r} for {name!r}")
            i += 1
            out[name] = "\n".join(body)
        elif eq > 0:
            out[line[:eq]] = line[eq + 1:]
        else:
            raise OutputFormatError(
                f"invalid format {line!r}, expected a line with '=' or '<<'")
    return out
