"""Errors that end a command with a clear message instead of a traceback.

Exit codes (docs/design.md): 0 ok, 1 a build/test/publish failed or a registry misbehaved,
2 bad input.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from imagebuild.safetext import safe_lines

# The program's name as the user invoked it, for usage lines and every fix hint: `python
# build.py` in a checkout, `python -m imagebuild`, or the installed `imagebuild`. Messages
# are written with `python build.py ...`; as_invoked() rewrites that wording where a message
# is shown, never where it is stored (the lock's recorded fixes, rendered file headers).
PROG_DEFAULT = "python build.py"
# `python build.py`, or a bare `build.py` right after a backtick: a command to run
PROG_COMMAND = re.compile(r"\bpython3? build\.py\b|(?<=`)build\.py\b")


def prog(argv0: str | None = None) -> str:
    arg = sys.argv[0] if argv0 is None else argv0
    base = os.path.basename(arg)
    if base == "__main__.py" and os.path.basename(os.path.dirname(arg)) == "imagebuild":
        return "python -m imagebuild"
    if base == "build.py":
        return f"python {arg}"
    if base == "imagebuild":  # the console script
        return "imagebuild"
    return PROG_DEFAULT


def as_invoked(text: str) -> str:
    return PROG_COMMAND.sub(prog(), text)


class ImagebuildError(Exception):
    """A failure the user should see as one message, not a traceback."""

    exit_code = 1

    def __init__(self, message: str, *, fix: str | None = None, where: str | None = None,
                 details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.where = where  # "file:line:col" when the cause sits in a file
        self.details = details  # what `--format json`'s error document adds (e.g. stale files)

    def render(self) -> str:
        head = f"{self.where}: {self.message}" if self.where else self.message
        # messages may embed outside text (a registry's answer): no control reaches the tty
        return as_invoked(safe_lines(f"{head}\n  fix: {self.fix}" if self.fix else head))


class UserError(ImagebuildError):
    """Bad input (matrix.yaml, lock, flags, tag): exit 2, nothing written."""

    exit_code = 2


class OperationFailed(ImagebuildError):
    """A build, test or publish step failed: exit 1."""

    exit_code = 1


def validation_text(err: Any) -> str:
    """What one pydantic error says, in our words: a check that raised ValueError is shown
    by its own text, without pydantic's 'Value error, ' prefix."""
    cause = (err.get("ctx") or {}).get("error")
    if err.get("type") in ("value_error", "assertion_error") and cause is not None:
        return str(cause)
    text = str(err.get("msg", ""))
    for theirs, ours in PYDANTIC_WORDS:
        text = text.replace(theirs, ours)
    return text


# pydantic's phrases, as the rest of our messages say the same things
PYDANTIC_WORDS = (("Extra inputs are not permitted", "unknown key"),
                  ("Field required", "missing (it is required)"),
                  ("Input should be a valid dictionary", "must be a mapping (key: value)"),
                  ("Input should be a valid list", "must be a list"),
                  ("Input should be a valid integer", "must be a whole number"),
                  ("Input should be a valid number", "must be a number"),
                  ("Input should be a valid string", "must be text"),
                  ("Input should be a valid boolean", "must be true or false"),
                  ("String should match pattern", "must match the pattern"),
                  ("Input should be", "must be"))
