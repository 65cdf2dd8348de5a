"""This machine's package indexes, exactly as its pip is configured.

Used for what the tool downloads itself (the vLLM sdist) and handed to engine builds as the
pip_conf BuildKit secret, so no index host is written in this repository: pip's
configuration files and PIP_* variables (`pip config list`) decide, and where they name no
index, pip's own built-in default is asked from pip itself (its `--isolated` help text).
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from dataclasses import dataclass

from imagebuild.errors import OperationFailed

# Where pip takes a setting from, strongest first: PIP_* variables, a command's own
# section of the configuration files, then their [global] section.
SCOPES = (":env:", "install", "download", "global")
_DEFAULT = re.compile(r"Base URL of the Python Package Index \(default (\S+?)\)")


@dataclass(frozen=True)
class PipIndexes:
    index_url: str
    extra_index_urls: tuple[str, ...] = ()
    source: str = "pip's built-in default"  # where index_url came from

    def urls(self) -> tuple[str, ...]:
        return (self.index_url, *self.extra_index_urls)

    def pip_conf(self) -> str:
        """A pip.conf holding only the index settings (no paths of this machine)."""
        lines = ["[global]", f"index-url = {self.index_url}"]
        if self.extra_index_urls:
            lines.append("extra-index-url = " + " ".join(self.extra_index_urls))
        return "\n".join(lines) + "\n"


def _pip(python: str, *args: str) -> str:
    try:
        proc = subprocess.run([python, "-m", "pip", *args], capture_output=True, text=True,
                              timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OperationFailed(f"cannot run pip ({python} -m pip): {exc}",
                              fix="install pip into that Python") from None
    if proc.returncode != 0:
        raise OperationFailed(f"`pip {' '.join(args)}` failed: {proc.stderr.strip()[-300:]}",
                              fix="check pip's configuration (`pip config debug`)")
    return proc.stdout


def parse_config_list(text: str) -> dict[str, str]:
    """`pip config list` output (`scope.name='value'` per line) as a dict."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        try:
            out[key.strip()] = str(ast.literal_eval(value.strip()))
        except (ValueError, SyntaxError):
            out[key.strip()] = value.strip().strip("'\"")
    return out


def builtin_index(python: str = sys.executable) -> str:
    """pip's default index, from pip itself with every configuration ignored."""
    text = " ".join(_pip(python, "--isolated", "download", "--help").split())
    m = _DEFAULT.search(text)
    if not m:
        raise OperationFailed("pip's help names no default index",
                              fix="set PIP_INDEX_URL (or `pip config set global.index-url`)")
    return m.group(1)


def indexes_from(config: dict[str, str], default: str) -> PipIndexes:
    def pick(name: str) -> tuple[str | None, str]:
        for scope in SCOPES:
            if f"{scope}.{name}" in config:
                where = "PIP_" + name.upper().replace("-", "_") if scope == ":env:" else (
                    f"pip config {scope}.{name}")
                return config[f"{scope}.{name}"], where
        return None, ""

    index, where = pick("index-url")
    extra, _ = pick("extra-index-url")
    return PipIndexes(index or default, tuple((extra or "").split()),
                      where or "pip's built-in default")


@functools.lru_cache(maxsize=4)
def pip_indexes(python: str = sys.executable) -> PipIndexes:
    """The index and extra indexes `python -m pip install` would use on this machine."""
    config = parse_config_list(_pip(python, "config", "list"))
    return indexes_from(config, builtin_index(python))
