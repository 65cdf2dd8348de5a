"""Errors that end a command with a clear message instead of a traceback.

Exit codes (docs/design.md): 0 ok, 1 a build/test/publish failed or a registry misbehaved,
2 bad input.
"""

from __future__ import annotations


class ImagebuildError(Exception):
    """A failure the user should see as one message, not a traceback."""

    exit_code = 1

    def __init__(self, message: str, *, fix: str | None = None, where: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.where = where  # "file:line:col" when the cause sits in a file

    def render(self) -> str:
        from imagebuild.progname import as_invoked
        from imagebuild.safetext import safe_lines

        head = f"{self.where}: {self.message}" if self.where else self.message
        # messages may embed outside text (a registry's answer): no control reaches the tty
        return as_invoked(safe_lines(f"{head}\n  fix: {self.fix}" if self.fix else head))


class UserError(ImagebuildError):
    """Bad input (matrix.yaml, lock, flags, tag): exit 2, nothing written."""

    exit_code = 2


class OperationFailed(ImagebuildError):
    """A build, test or publish step failed: exit 1."""

    exit_code = 1
