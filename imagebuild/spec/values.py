"""Checks of single values users get wrong, shared by the schema (config.py) and the
environment overrides (matrix.py): memory sizes and PEP 440 versions. Each failure is a
BadValue carrying the fix, which config.validate puts next to the file position."""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version


class BadValue(ValueError):
    """A value that fails a check; `fix` tells the user what to write instead."""

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.fix = fix


# Docker's own size syntax (go-units RAMInBytes): 120g, 120G, 120GiB, 512m, 8gb; binary units
MEMORY = re.compile(r"^(\d+(?:\.\d+)?) ?([kmgtp])?i?b?$", re.IGNORECASE)
UNITS = {None: 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
MIN_MEMORY = 1 << 30  # below 1 GiB not even the CPU engine starts
MAX_MEMORY = 16 << 40  # far above any single machine these images run on


def memory_bytes(text: str) -> int:
    """Bytes of a Docker memory size such as '120g', bounded to what a serving container
    can sensibly get."""
    m = MEMORY.match(text.strip())
    if not m:
        raise BadValue(f"{text!r} is not a memory size",
                       "write a number with a unit as Docker takes it, e.g. 8g or 120g")
    value = int(float(m.group(1)) * UNITS[m.group(2).lower() if m.group(2) else None])
    if not MIN_MEMORY <= value <= MAX_MEMORY:
        raise BadValue(f"memory size {text} is outside 1g..16t",
                       "give the container's memory limit, e.g. 8g (cpu) or 120g (gb10)")
    return value


def pep440(text: str) -> str:
    """A version pip understands (PEP 440), e.g. 0.23.0."""
    try:
        Version(text)
    except InvalidVersion:
        raise BadValue(f"{text!r} is not a PEP 440 version",
                       "write a release version such as 0.23.0 (quoted if YAML would read "
                       "it as a number)") from None
    return text
