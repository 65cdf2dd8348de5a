"""The two ways the KV predictor stops short of a layout."""

from __future__ import annotations


class CannotPredict(Exception):
    """The predictor does not know this layout (unknown family, missing field, ...).

    Never a pass: callers report it as a warning that names `reason`.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class VllmRefuses(Exception):
    """vLLM 0.23 itself raises before or while laying out the KV cache.

    `kind` is the exception class vLLM raises (ValueError, AssertionError, ...), `message`
    what it prints, `cause` our explanation in plain words.
    """

    def __init__(self, kind: str, message: str, cause: str, fix: str | None = None) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.cause = cause
        self.fix = fix
