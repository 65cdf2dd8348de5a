"""Which registry repositories a registry command (releases, rollback, prune) acts on."""

from __future__ import annotations

import difflib
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
    roll back), else the images the matrix knows; filtered by `pattern`. None (an empty
    namespace) is an answer; a pattern matching no image the matrix or registry knows is
    bad input (exit 2)."""
    try:
        repos = catalog_repositories(client, dest.namespace)
    except Unreachable:
        raise  # asking again per image would only repeat the wait
    except (UserError, OperationFailed):
        repos = sorted({dest.image(name).repository for name in images})
    chosen = match_repositories(repos, pattern)
    known = sorted(set(repos) | {dest.image(name).repository for name in images})
    if pattern and not chosen and not match_repositories(known, pattern):
        # a name neither the registry nor the matrix knows: a typo, not an empty answer
        names = [r.rsplit("/", 1)[-1] for r in known]
        near = difflib.get_close_matches(pattern, names, n=1)
        raise UserError(f"--image {pattern}: no image of matrix.yaml or repository under "
                        f"{dest.registry}/{dest.namespace} matches it"
                        + (f" (did you mean {near[0]}?)" if near else ""),
                        fix=f"use an image name or glob, one of: {', '.join(names)}")
    # an empty namespace (nothing published yet) is an answer: no repositories
    return chosen
