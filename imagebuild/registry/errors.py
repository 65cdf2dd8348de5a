"""What a registry answer can mean for the user (raised by auth and client)."""

from __future__ import annotations

from imagebuild.errors import OperationFailed, UserError
from imagebuild.safetext import safe


class AuthError(UserError):
    """401 after authenticating, or 403: the credentials are wrong or lack permission."""


class NotFound(UserError):
    """404: the repository, tag, manifest or blob does not exist."""


class Unsupported(OperationFailed):
    """The registry refuses an operation it does not allow (e.g. deletes disabled)."""


class Unreachable(OperationFailed):
    """No connection to the registry after every retry: exit 1, said in one line."""


class RegistryFault(OperationFailed):
    """The registry answered something no healthy registry sends (a body that is not the
    document asked for, a blob its own manifest names but it lacks, no answer in time):
    exit 1 with what the registry did, never exit 2 blaming the user's input."""

    def __init__(self, host: str, answered: str, what: str, *, fix: str | None = None):
        super().__init__(
            f"the registry at {safe(host, 100)} answered {answered} for {safe(what, 200)}",
            fix=fix or "the registry (or a proxy in front of it) is misbehaving: check its "
            "logs and storage, then re-run; nothing was changed on the strength of that answer")
        self.host, self.answered, self.what = host, answered, what


class MissingBlob(RegistryFault):
    """A blob a stored manifest references is gone: the registry lost data, the user
    named nothing wrong."""
