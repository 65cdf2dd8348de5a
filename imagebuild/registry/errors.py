"""What a registry answer can mean for the user (raised by auth and client)."""

from __future__ import annotations

from imagebuild.errors import OperationFailed, UserError


class AuthError(UserError):
    """401 after authenticating, or 403: the credentials are wrong or lack permission."""


class NotFound(UserError):
    """404: the repository, tag, manifest or blob does not exist."""


class Unsupported(OperationFailed):
    """The registry refuses an operation it does not allow (e.g. deletes disabled)."""
