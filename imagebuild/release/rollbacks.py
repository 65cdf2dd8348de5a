"""The record of rollbacks: which releases of a repository were rolled back, so that no
re-run (publish of the same tag, the workflow's promote job) moves `latest` forward to
one of them again. Only a promote that says so on purpose (`--accept-rolled-back
REASON`) does, and that takes the release off the record.

Kept in the registry beside the lease, as the tag `imagebuild-rollbacks` of each
repository: a tiny manifest (no layers; a config blob the repository already has) whose
annotation `io.imagebuild.rolled-back` is a JSON object {release tag: {"to", "at"}}.
Written only under the repository's lease.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from imagebuild.registry.client import OCI_MANIFEST, RegistryClient
from imagebuild.registry.errors import RegistryFault
from imagebuild.registry.records import OCI_CONFIG, compact, read_release

ROLLBACKS_TAG = "imagebuild-rollbacks"
A_ROLLED = "io.imagebuild.rolled-back"


def rolled_back(client: RegistryClient, repo: str) -> dict[str, dict[str, str]]:
    """{release tag: {"to": where latest went, "at": when}} for repo ({} when none).

    A damaged record is a registry fault (exit 1), never "no rollbacks": that would let
    a re-run undo every rollback, and the next record() overwrite what is left."""
    rel = read_release(client, repo, ROLLBACKS_TAG)
    if rel is None:
        return {}
    try:
        found = json.loads(rel.annotations.get(A_ROLLED, "{}"))
    except ValueError:
        found = None
    if not isinstance(found, dict) or not all(
            isinstance(v, dict) and all(isinstance(x, str) for x in v.values())
            for v in found.values()):
        raise RegistryFault(
            client.host, f"a record of rollbacks whose {A_ROLLED} is not a JSON object of "
            '{release tag: {"to", "at"}}', f"{repo}:{ROLLBACKS_TAG}",
            fix=f"nothing was changed; restore the tag {ROLLBACKS_TAG} of {repo} (or delete "
            "it, knowing a re-run may then promote a rolled-back release again), then re-run")
    return {str(k): v for k, v in found.items()}


def _write(client: RegistryClient, repo: str, entries: dict[str, Any],
           config: dict[str, Any], fence: Callable[[], None] | None = None) -> None:
    """PUT the record; `fence` (the lease's check) runs right before it: a run paused
    past its lease after reading the record stops instead of dropping the entries the
    run that took the lease over wrote meanwhile."""
    doc = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
           "config": {**config, "mediaType": OCI_CONFIG}, "layers": [],
           "annotations": {A_ROLLED: compact(entries)}}
    if fence is not None:
        fence()
    client.put_manifest(repo, ROLLBACKS_TAG, compact(doc).encode(), OCI_MANIFEST)


def record(client: RegistryClient, repo: str, rolled: str, to: str,
           config: dict[str, Any], fence: Callable[[], None] | None = None) -> None:
    """Note that latest went back from `rolled` to `to` (and `to` is wanted again)."""
    entries: dict[str, Any] = {t: e for t, e in rolled_back(client, repo).items() if t != to}
    entries[rolled] = {"to": to, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _write(client, repo, entries, config, fence)


def forgive(client: RegistryClient, repo: str, tag: str, config: dict[str, Any],
            fence: Callable[[], None] | None = None) -> None:
    """Take `tag` off the record (it was promoted again on purpose)."""
    entries = rolled_back(client, repo)
    if tag in entries:
        del entries[tag]
        _write(client, repo, entries, config, fence)
