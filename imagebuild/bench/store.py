"""Bench results kept in the registry, next to the release they measured.

An OCI artifact (one JSON layer) tagged `sha256-<image id hex>.bench`: the tag-schema
fallback signing tools use where a registry has no referrers API, so any registry works
and any machine finds the results of a release from its manifest alone. Keyed by the
image id (config digest) because that is what the local image and the pushed release
share: a run on the local image before publish and the release after it name the same id.
"""

from __future__ import annotations

import json
from typing import Any

from imagebuild.errors import UserError
from imagebuild.registry.client import OCI_MANIFEST, NotFound, RegistryClient, sha256_digest
from imagebuild.release.records import A_IMAGE, read_release, resolve_tag

ARTIFACT_TYPE = "application/vnd.imagebuild.bench.v1+json"
EMPTY = "application/vnd.oci.empty.v1+json"
ANN = "io.imagebuild.bench"
A_IMAGE_ID, A_TAG, A_ACCEPTED = f"{ANN}.image-id", f"{ANN}.tag", f"{ANN}.accepted-regression"


def bench_tag(image_id: str) -> str:
    algo, _, hexpart = image_id.partition(":")
    if algo != "sha256" or len(hexpart) != 64:
        raise UserError(f"not an image id: {image_id!r}", fix="use the sha256:<hex> image id")
    return f"sha256-{hexpart}.bench"


def put_results(client: RegistryClient, repo: str, doc: dict[str, Any], *,
                annotations: dict[str, str] | None = None) -> str:
    """Store (or replace) the run of doc["image"]["id"]; returns the artifact's digest."""
    image_id = doc["image"]["id"]
    body = json.dumps(doc, sort_keys=True, indent=1).encode()
    empty = b"{}"
    layer = client.put_blob(repo, body)
    config = client.put_blob(repo, empty)
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": EMPTY, "digest": config, "size": len(empty)},
        "layers": [{"mediaType": ARTIFACT_TYPE, "digest": layer, "size": len(body)}],
        "annotations": {A_IMAGE_ID: image_id, A_TAG: str(doc["image"].get("tag") or ""),
                        **(annotations or {})},
    }
    raw = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    assert sha256_digest(body) == layer
    return client.put_manifest(repo, bench_tag(image_id), raw, OCI_MANIFEST)


def get_results(client: RegistryClient, repo: str,
                image_id: str) -> tuple[dict[str, Any], dict[str, str]] | None:
    """(results, artifact annotations) stored for an image id, or None."""
    try:
        raw, _media, _digest = client.get_manifest(repo, bench_tag(image_id))
    except NotFound:
        return None
    manifest = json.loads(raw)
    if manifest.get("artifactType") != ARTIFACT_TYPE or not manifest.get("layers"):
        return None
    doc = json.loads(client.get_blob(repo, manifest["layers"][0]["digest"]))
    return doc, manifest.get("annotations") or {}


def annotate(client: RegistryClient, repo: str, image_id: str, extra: dict[str, str]) -> None:
    """Add annotations to a stored run (the accepted-regression reason): a new manifest,
    same tag, same blobs."""
    found = get_results(client, repo, image_id)
    if found is None:
        raise UserError(f"{repo}: no bench results for {image_id}", fix="run `build.py bench`")
    doc, ann = found
    keep = {k: v for k, v in ann.items() if k not in (A_IMAGE_ID, A_TAG)}
    put_results(client, repo, doc, annotations={**keep, **extra})


def release_image_id(client: RegistryClient, repo: str, tag: str) -> str | None:
    """The image id a release tag (or `latest`) records, None when the tag does not exist."""
    rel = read_release(client, repo, tag if tag == "latest" else resolve_tag(client, repo, tag))
    if rel is None:
        return None
    return rel.annotations.get(A_IMAGE) or rel.image_id


def release_stored(client: RegistryClient, repo: str,
                   tag: str) -> tuple[dict[str, Any], dict[str, str]] | None:
    """(results, annotations) stored with release `tag`, or None."""
    image_id = release_image_id(client, repo, tag)
    return get_results(client, repo, image_id) if image_id else None


def release_results(client: RegistryClient, repo: str, tag: str) -> dict[str, Any] | None:
    found = release_stored(client, repo, tag)
    return found[0] if found else None
