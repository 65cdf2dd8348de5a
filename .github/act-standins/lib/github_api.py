"""The GitHub API the attestation stand-in writes and `gh attestation verify` reads, as
files under $IMAGEBUILD_REHEARSAL_GH (one folder per rehearsal):

- attestations/<sha256-hex>/<id>.json: what POST /repos/{repo}/attestations stores
  (@actions/attest store.ts writeAttestation; read back by gh through
  GET /repos/{repo}/attestations/{digest} or /orgs/{owner}/attestations/{digest},
  cli/cli pkg/cmd/attestation/api/client.go), with the repository it belongs to;
- storage-records/<id>.json: @actions/attest createStorageRecord (artifact-metadata).

Refusals keep GitHub's words where upstream shows them: a private repository of a user
gets "Feature not available for user-owned private repositories" (the API's answer to
actions/attest, quoted by users of it), a token without `attestations: write` the 403."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class APIError(Exception):
    pass


def root() -> Path:
    return Path(os.environ["IMAGEBUILD_REHEARSAL_GH"])


def _next_id(folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    return 1 + max((int(p.stem) for p in folder.rglob("*.json") if p.stem.isdigit()),
                   default=0)


def write_attestation(bundle: dict[str, Any], repo: str, digest: str, repository: dict[str, Any],
                      can_write: bool) -> str:
    """POST /repos/{repo}/attestations; the attestation id."""
    if not can_write:
        raise APIError("Failed to persist attestation: Resource not accessible by "
                       "integration (the job's token lacks attestations: write)")
    private = repository.get("private") or repository.get("visibility") in ("private",
                                                                              "internal")
    if private and (repository.get("owner") or {}).get("type", "User") == "User":
        raise APIError("Failed to persist attestation: Feature not available for user-owned "
                       "private repositories. To enable this feature, please make this "
                       "repository public.")
    folder = root() / "attestations" / digest.replace(":", "-")
    ident = _next_id(root() / "attestations")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{ident}.json").write_text(json.dumps({"repository": repo, "bundle": bundle}))
    return str(ident)


def attestations(digest: str, *, repo: str = "", owner: str = "") -> list[dict[str, Any]]:
    """GET /repos/{repo}/attestations/{digest} (or /orgs/{owner}/...): the bundles."""
    folder = root() / "attestations" / digest.replace(":", "-")
    found = []
    for p in sorted(folder.glob("*.json"), key=lambda p: int(p.stem)):
        rec = json.loads(p.read_text())
        mine = (rec["repository"].lower() == repo.lower() if repo else
                rec["repository"].split("/")[0].lower() == owner.lower())
        if mine:
            found.append(rec["bundle"])
    return found


def write_storage_record(record: dict[str, Any]) -> int:
    ident = _next_id(root() / "storage-records")
    (root() / "storage-records" / f"{ident}.json").write_text(json.dumps(record))
    return ident
