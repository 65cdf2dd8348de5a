"""The program's name as the user invoked it, for usage lines and every fix hint:
`python build.py` in a checkout, `python -m imagebuild`, or the installed `imagebuild`.

Messages are written with `python build.py ...` (what a checkout runs); as_invoked()
rewrites that wording where a message is shown, never where it is stored (the lock's
recorded fixes and the rendered files' headers stay as they are).
"""

from __future__ import annotations

import os
import re
import sys

DEFAULT = "python build.py"
# `python build.py`, or a bare `build.py` right after a backtick: a command to run
COMMAND = re.compile(r"\bpython3? build\.py\b|(?<=`)build\.py\b")


def prog(argv0: str | None = None) -> str:
    arg = sys.argv[0] if argv0 is None else argv0
    base = os.path.basename(arg)
    if base == "__main__.py" and os.path.basename(os.path.dirname(arg)) == "imagebuild":
        return "python -m imagebuild"
    if base == "-m":  # python -m while the module is being imported
        return "python -m imagebuild"
    if base == "build.py":
        return f"python {arg}"
    if base == "imagebuild":  # the console script
        return "imagebuild"
    return DEFAULT


def as_invoked(text: str) -> str:
    name = prog()
    return text if name == DEFAULT else COMMAND.sub(name, text)
