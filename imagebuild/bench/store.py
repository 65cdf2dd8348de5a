"""Bench results kept with their release in the registry, attached to the release they
measured (through registry/referrers.py: an OCI 1.1 referrer of the release manifest, so
`latest`, the same manifest, carries the same results).

One result set per release: a re-run or an annotation (an accepted regression) replaces
the previous one in the index, and the replaced artifact is deleted where the registry
allows deletes. Releases benched before this layout keep their results under the old tag
`sha256-<image id hex>.bench` (no subject); they are read from there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from imagebuild.errors import UserError
from imagebuild.registry import referrers
from imagebuild.registry.client import RegistryClient
from imagebuild.registry.errors import NotFound
from imagebuild.registry.records import A_IMAGE, Release, read_release, resolve_tag

ARTIFACT_TYPE = referrers.BENCH_TYPE  # prune knows it: referrers.KEPT_WITH_RELEASE
A_ACCEPTED = f"{referrers.ANN}.accepted-regression"
A_UNTRUSTED = f"{referrers.ANN}.accepted-untrusted"  # why flagged figures passed the gate
A_UNCOMPARED = f"{referrers.ANN}.accepted-uncompared"  # promoted over an unmeasured latest
A_ACCEPTED_DROP = f"{referrers.ANN}.accepted-acceptance-drop"  # lower acceptance let through
FILE_NAME = referrers.DEFAULT_FILE


@dataclass(frozen=True)
class Stored:
    doc: dict[str, Any]
    annotations: dict[str, str]
    digest: str  # the artifact manifest
    found_by: str  # referrers-api | referrers-tag | legacy-tag


def legacy_tag(image_id: str) -> str:
    """Where results were stored before they became referrers (by image id)."""
    return referrers.referrers_tag(image_id) + ".bench"


def _release(client: RegistryClient, repo: str, tag: str) -> Release | None:
    return read_release(client, repo, tag if tag == "latest" else resolve_tag(client, repo, tag))


def put_results(client: RegistryClient, repo: str, tag: str, doc: dict[str, Any], *,
                annotations: dict[str, str] | None = None) -> str:
    """Attach `doc` to release `tag` (replacing earlier results); the artifact's digest."""
    rel = _release(client, repo, tag)
    if rel is None:
        raise UserError(f"{repo}:{tag} is not in the registry",
                        fix="publish the release first; results are stored with it")
    image_id = rel.annotations.get(A_IMAGE) or rel.image_id
    measured = (doc.get("image") or {}).get("id")
    if measured and measured != image_id:
        raise UserError(f"these results measured {measured[:19]}, but {repo}:{tag} is "
                        f"{image_id[:19]}", fix="bench the image the release holds")
    body = json.dumps(doc, sort_keys=True, indent=1).encode()
    return referrers.put_artifact(client, repo, rel, body, artifact_type=ARTIFACT_TYPE,
                                  file_name=FILE_NAME, annotations=annotations)


def _read(client: RegistryClient, repo: str, ref: str, how: str) -> Stored | None:
    try:
        raw, _media, digest = client.get_manifest(repo, ref)
    except NotFound:
        return None
    manifest = json.loads(raw)
    if manifest.get("artifactType") != ARTIFACT_TYPE or not manifest.get("layers"):
        return None
    doc = client.get_bench_results(repo, manifest["layers"][0]["digest"])
    return Stored(doc, dict(manifest.get("annotations") or {}), digest, how)


def stored(client: RegistryClient, repo: str, tag: str) -> Stored | None:
    """The results stored with release `tag` (or `latest`), None when there are none."""
    rel = _release(client, repo, tag)
    if rel is None:
        return None
    ours, how = referrers._ours(client, repo, rel.digest, ARTIFACT_TYPE)
    for desc in ours:
        found = _read(client, repo, desc["digest"], how)
        if found is not None:
            return found
    image_id = rel.annotations.get(A_IMAGE) or rel.image_id
    return _read(client, repo, legacy_tag(image_id), "legacy-tag") if image_id else None


def release_results(client: RegistryClient, repo: str, tag: str) -> dict[str, Any] | None:
    found = stored(client, repo, tag)
    return found.doc if found else None


def release_stored(client: RegistryClient, repo: str,
                   tag: str) -> tuple[dict[str, Any], dict[str, str]] | None:
    """(results, annotations) stored with release `tag`, or None."""
    found = stored(client, repo, tag)
    return (found.doc, found.annotations) if found else None


def annotate(client: RegistryClient, repo: str, tag: str, extra: dict[str, str]) -> None:
    """Add annotations to a release's results (an accepted regression's reason): the same
    results stored again with them, replacing the previous artifact."""
    found = stored(client, repo, tag)
    if found is None:
        raise UserError(f"{repo}:{tag} has no bench results", fix="run `build.py bench`")
    keep = {k: v for k, v in found.annotations.items()
            if k not in (referrers.A_IMAGE_ID, referrers.A_TAG, referrers.A_CREATED)}
    put_results(client, repo, tag, found.doc, annotations={**keep, **extra})
