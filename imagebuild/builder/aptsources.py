"""Where this machine gets Debian packages: the mirror the cpu base is bootstrapped from.

Teams build behind mirrors and proxies, so no archive host is written into the project:
the mirror comes from an explicit setting (matrix.yaml `bootstrap.mirror`, or the
IMAGEBUILD_DEBIAN_MIRROR environment variable) or from the host's own apt sources, the
first `deb` entry that serves the wanted suite. Both apt formats are read: one-line
`*.list` files and deb822 `*.sources` files (apt ignores every other extension, so do we).
"""

from __future__ import annotations

import os
from pathlib import Path

from imagebuild.errors import UserError
from imagebuild.spec.values import MIRROR, BadValue, mirror_url

MIRROR_ENV = "IMAGEBUILD_DEBIAN_MIRROR"


def _one_line_entries(text: str) -> list[tuple[str, list[str]]]:
    out = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) >= 3 and words[0] == "deb":
            rest = words[1:]
            if rest[0].startswith("["):  # options: deb [arch=amd64 signed-by=...] URI ...
                while rest and not rest[0].endswith("]"):
                    rest = rest[1:]
                rest = rest[1:]
            if len(rest) >= 2:
                out.append((rest[0], [rest[1]]))
    return out


def _deb822_entries(text: str) -> list[tuple[str, list[str]]]:
    out = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        suites = fields.get("suites", "").split()
        out += [(uri, suites) for uri in fields.get("uris", "").split()]
    return out


def apt_entries(root: Path = Path("/")) -> list[tuple[str, list[str]]]:
    """(URI, suites) of every enabled `deb` source, in the order apt reads them."""
    etc = root / "etc" / "apt"
    files = [etc / "sources.list"] + sorted((etc / "sources.list.d").glob("*"))
    out: list[tuple[str, list[str]]] = []
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if path.name == "sources.list" or path.suffix == ".list":
            out += _one_line_entries(text)
        elif path.suffix == ".sources":
            out += _deb822_entries(text)
    return out


def debian_mirror(suite: str, explicit: str | None = None, *, root: Path = Path("/"),
                  env: dict[str, str] | None = None) -> str:
    """The mirror to bootstrap `suite` from: explicit setting, env, then apt's sources."""
    env = dict(os.environ) if env is None else env
    if explicit:
        return explicit
    if env.get(MIRROR_ENV):
        try:
            return mirror_url(env[MIRROR_ENV])
        except BadValue as exc:
            raise UserError(f"environment variable {MIRROR_ENV}: {exc}",
                            fix=f"{exc.fix} (in {MIRROR_ENV})") from None
    for uri, suites in apt_entries(root):
        if suite in suites and MIRROR.fullmatch(uri):
            return uri.rstrip("/")
    raise UserError(
        f"no Debian mirror for suite {suite!r}: this machine's apt sources list none and "
        "none is configured",
        fix=f"set targets.<name>.bootstrap.mirror in matrix.yaml or {MIRROR_ENV} to your "
            "Debian mirror (the URL apt uses)")
