"""Which registry repositories a registry command (releases, rollback, prune) acts on."""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING

from imagebuild.errors import OperationFailed, UserError
from imagebuild.registry.client import RegistryClient
from imagebuild.registry.errors import Unreachable

if TYPE_CHECKING:
    from imagebuild.plan import Destination


def match_repositories(repos: list[str], pattern: str | None) -> list[str]:
    """Repos whose path, or image name (last component), matches a glob or equals it."""
    if not pattern:
        return sorted(repos)
    return sorted(r for r in repos if fnmatch.fnmatchcase(r, pattern)
                  or fnmatch.fnmatchcase(r.rsplit("/", 1)[-1], pattern))


def catalog_repositories(client: RegistryClient, namespace: str) -> list[str]:
    """Repositories under namespace per the registry catalog (for `releases` on a machine
    without the matrix; ghcr.io and Docker Hub do not serve a catalog)."""
    prefix = namespace.strip("/") + "/"
    return sorted(r for r in client.catalog() if r.startswith(prefix))


def repositories(client: RegistryClient, dest: Destination, images: list[str],
                 pattern: str | None) -> list[str]:
    """The registry's catalog under our namespace where it serves one (so any machine can
    roll back), else the images the matrix knows; filtered by `pattern`."""
    try:
        repos = catalog_repositories(client, dest.namespace)
    except Unreachable:
        raise  # asking again per image would only repeat the wait
    except (UserError, OperationFailed):
        repos = sorted({dest.image(name).repository for name in images})
    chosen = match_repositories(repos, pattern)
    if not chosen:
        raise UserError(f"no repository under {dest.registry}/{dest.namespace} matches "
                        f"{pattern or '*'}", fix="check --image against `build.py releases`")
    return chosen
