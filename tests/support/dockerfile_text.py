"""Reading Dockerfiles in tests: instructions, stages, and what their RUNs install.

Used on our rendered Dockerfiles and on the pinned vLLM's own docker/Dockerfile, so the
two can be compared package by package.
"""

from __future__ import annotations

import re
import shlex

_SPEC = re.compile(r"[<>=!~;\[ $]")
# pip/uv flags that take a value (the value is not a package)
_PIP_VALUE_FLAGS = {"-r", "--requirement", "-c", "--constraint", "-i", "--index-url",
                    "--extra-index-url", "--python", "-f", "--find-links", "--target",
                    "--prefix", "-e", "--editable"}


def logical_lines(text: str) -> list[str]:
    """Instructions with continuations joined; comment lines dropped, also those inside a
    continued instruction (Docker drops them there too)."""
    out, cur, cont = [], "", False
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.lstrip().startswith("#") or (not cont and not line.strip()):
            continue
        cont = line.endswith("\\")
        cur += (line[:-1] + " ") if cont else line
        if not cont:
            out.append(" ".join(cur.split()))
            cur = ""
    if cur:
        out.append(" ".join(cur.split()))
    return out


def stages(text: str) -> dict[str, list[str]]:
    """Instructions per stage name (`FROM x AS name`; unnamed stages: "(stage N)")."""
    found: dict[str, list[str]] = {}
    name = "(preamble)"
    for line in logical_lines(text):
        m = re.match(r"FROM\s+\S+(?:\s+AS\s+(\S+))?", line, re.I)
        if m:
            name = m.group(1) or f"(stage {len(found)})"
            found[name] = [line]
        else:
            found.setdefault(name, []).append(line)
    return found


def _tokens(command: str) -> list[str]:
    lex = shlex.shlex(command, posix=True, punctuation_chars=";&|()")
    lex.whitespace_split = True
    try:
        return list(lex)
    except ValueError:  # an unbalanced quote in an awk program: fall back to words
        return command.split()


def _is_break(token: str) -> bool:
    return bool(token) and set(token) <= set(";&|()")


def apt_packages(line: str) -> set[str]:
    """Package names every `apt-get install` of a RUN line names (versions dropped)."""
    toks, found = _tokens(line), set()
    for i in range(len(toks) - 1):
        if toks[i] == "apt-get" and toks[i + 1] == "install":
            for tok in toks[i + 2:]:
                if _is_break(tok):
                    break
                if not tok.startswith("-"):
                    found.add(tok.split("=", 1)[0])
    return found


def pip_installs(line: str) -> tuple[set[str], set[str]]:
    """(package names, requirement files) every `pip install` / `uv pip install` of a RUN
    names; wheel files, paths and shell expansions are not package names."""
    toks, names, files = _tokens(line), set(), set()
    for i in range(len(toks) - 1):
        if toks[i] == "pip" and toks[i + 1] == "install":
            skip = False
            for j, tok in enumerate(toks[i + 2:], start=i + 2):
                if _is_break(tok):
                    break
                if skip:
                    skip = False
                    if toks[j - 1] in ("-r", "--requirement"):
                        files.add(tok)
                    continue
                if tok in _PIP_VALUE_FLAGS:
                    skip = True
                elif tok.startswith("-") or tok.startswith("$") or "/" in tok or "*" in tok:
                    continue
                else:
                    names.add(_SPEC.split(tok, 1)[0].lower().replace("_", "-"))
    return names, files


def env_names(lines: list[str]) -> set[str]:
    names = set()
    for line in lines:
        if line.startswith("ENV "):
            body = line[4:]
            if "=" not in body.split()[0]:  # legacy `ENV KEY value`
                names.add(body.split()[0])
            else:
                names.update(m.group(1) for m in re.finditer(r"(?:^|\s)([A-Za-z_]\w*)=", body))
    return names


def copied_sources(lines: list[str]) -> dict[str, str]:
    """Where each COPY destination file came from: {dest path: source path}. A
    destination directory (ending in /) receives each source under its base name."""
    out = {}
    for line in lines:
        if not line.startswith("COPY "):
            continue
        args = [a for a in line.split()[1:] if not a.startswith("--")]
        *sources, dest = args
        for src in sources:
            out[dest + src.rsplit("/", 1)[-1] if dest.endswith("/") else dest] = src
    return out
