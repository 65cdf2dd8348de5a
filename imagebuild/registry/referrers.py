"""What is kept with a release in the registry: OCI 1.1 artifacts attached to it.

Each is an OCI 1.1 artifact (one file, one layer) whose `subject` is the release
manifest, so tools that list what belongs to an image find them (`oras discover`, the
registry's referrers API): the bench results (bench/store.py), the SBOM and provenance
(supplychain/), the compatibility table (release/compat.py) and the Sigstore bundles
GitHub's attestations attach. Registries with the referrers API index the subject
themselves (they answer the push with `OCI-Subject`); on the others (distribution 2.8,
the embedded registry) the pusher keeps the OCI fallback: an image index tagged
`sha256-<manifest digest hex>` listing the referrers. `latest` is the same manifest as its
release, so it carries the same artifacts.

One artifact per release and type: storing again replaces the previous one in the index,
and the replaced artifact is deleted where the registry allows deletes.
"""

from __future__ import annotations

import json
import time
from typing import Any

from imagebuild.errors import UserError
from imagebuild.registry.client import OCI_INDEX, OCI_MANIFEST, RegistryClient
from imagebuild.registry.errors import NotFound, Unsupported
from imagebuild.registry.records import A_IMAGE, Release
from imagebuild.registry.records import A_TAG as RELEASE_TAG

BENCH_TYPE = "application/vnd.imagebuild.bench.v1+json"  # bench/store.py's results
# the supply-chain documents publish stores the same way (imagebuild/supplychain/), with
# the media types registered for them (IANA: CycloneDX JSON; in-toto statements)
SBOM_TYPE = "application/vnd.cyclonedx+json"
PROVENANCE_TYPE = "application/vnd.in-toto+json"
COMPAT_TYPE = "application/vnd.imagebuild.compat.v1+json"  # the compatibility table
# GitHub's artifact attestations (push-to-registry) attach their signed Sigstore bundles
# beside the image the same way, one per predicate type (A_BUNDLE_PREDICATE)
SIGSTORE_BUNDLE_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
A_BUNDLE_PREDICATE = "dev.sigstore.bundle.predicateType"
# prune deletes them with their release
KEPT_WITH_RELEASE = (BENCH_TYPE, SBOM_TYPE, PROVENANCE_TYPE, COMPAT_TYPE,
                     SIGSTORE_BUNDLE_TYPE)
EMPTY = "application/vnd.oci.empty.v1+json"
ANN = "io.imagebuild.bench"  # the artifacts' annotation prefix (bench results came first)
A_IMAGE_ID, A_TAG = f"{ANN}.image-id", f"{ANN}.tag"
A_CREATED = "org.opencontainers.image.created"
A_TITLE = "org.opencontainers.image.title"  # the file name `oras pull` writes
DEFAULT_FILE = "bench.json"  # the name of a layer without a title


def referrers_tag(digest: str) -> str:
    """The OCI referrers tag schema: `<alg>-<hex>` of the subject's manifest digest."""
    algo, _, hexpart = digest.partition(":")
    if algo != "sha256" or len(hexpart) != 64:
        raise UserError(f"not a manifest digest: {digest!r}", fix="use sha256:<hex>")
    return f"sha256-{hexpart}"


def _descriptor(rel: Release) -> dict[str, Any]:
    return {"mediaType": rel.media_type, "digest": rel.digest, "size": len(rel.body)}


def _fallback_index(client: RegistryClient, repo: str, digest: str) -> list[dict[str, Any]]:
    try:
        raw, _media, _ = client.get_manifest(repo, referrers_tag(digest))
    except NotFound:
        return []
    return list(json.loads(raw).get("manifests") or [])


def put_artifact(client: RegistryClient, repo: str, rel: Release, body: bytes, *,
                 artifact_type: str, file_name: str,
                 annotations: dict[str, str] | None = None) -> str:
    """Attach one file of `artifact_type` to release `rel` as an OCI 1.1 referrer,
    replacing the earlier one of that type (one per release and type); its digest. Bench
    results and the supply-chain documents (SBOM, provenance) share this."""
    image_id = rel.annotations.get(A_IMAGE) or rel.image_id
    layer, config = client.put_blob(repo, body), client.put_blob(repo, b"{}")
    ann = {A_IMAGE_ID: image_id, A_TAG: rel.annotations.get(RELEASE_TAG, rel.tag),
           A_CREATED: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **(annotations or {})}
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type,
        "config": {"mediaType": EMPTY, "digest": config, "size": 2},
        "layers": [{"mediaType": artifact_type, "digest": layer, "size": len(body),
                    "annotations": {A_TITLE: file_name}}],
        "subject": _descriptor(rel),
        "annotations": ann,
    }
    raw = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    old = [m["digest"] for m in _ours(client, repo, rel.digest, artifact_type)[0]]
    digest, indexed = client.put_referrer(repo, raw, OCI_MANIFEST)
    if not indexed:
        others = [m for m in _fallback_index(client, repo, rel.digest)
                  if m.get("artifactType") != artifact_type]
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": others + [{
            "mediaType": OCI_MANIFEST, "digest": digest, "size": len(raw),
            "artifactType": artifact_type, "annotations": ann}]}
        client.put_manifest(repo, referrers_tag(rel.digest),
                            json.dumps(index, sort_keys=True, separators=(",", ":")).encode(),
                            OCI_INDEX)
    for stale in old:
        if stale != digest:
            try:
                client.delete_manifest(repo, stale)
            except (Unsupported, NotFound):
                pass  # unreferenced now; the registry's garbage collection has it
    return digest


def _ours(client: RegistryClient, repo: str, digest: str,
          artifact_type: str | tuple[str, ...] = BENCH_TYPE,
          ) -> tuple[list[dict[str, Any]], str]:
    """Our artifacts of `artifact_type` (one, or any of several) attached to manifest
    `digest`, newest first, and how they were found (one request either way)."""
    kinds = (artifact_type,) if isinstance(artifact_type, str) else artifact_type
    found = client.referrers(repo, digest, kinds[0] if len(kinds) == 1 else None)
    how = "referrers-api"
    if found is None:
        found, how = _fallback_index(client, repo, digest), "referrers-tag"
    ours = [m for m in found if m.get("artifactType") in kinds]
    ours.sort(key=lambda m: (m.get("annotations") or {}).get(A_CREATED, ""), reverse=True)
    return ours, how


def listed(client: RegistryClient, repo: str, digest: str,
           artifact_type: str) -> list[dict[str, Any]]:
    """Descriptors of the artifacts of `artifact_type` kept with manifest `digest`,
    newest first (the referrers API, else the tag schema)."""
    return _ours(client, repo, digest, artifact_type)[0]


def listed_kinds(client: RegistryClient, repo: str, digest: str,
                 kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    """The same for any of several types, in one request."""
    return _ours(client, repo, digest, kinds)[0]


def _subject_of(client: RegistryClient, repo: str, digest: str) -> str | None:
    """The subject digest artifact `digest` is attached to (None: gone or not one)."""
    try:
        raw, _media, _ = client.get_manifest(repo, digest)
        subject = json.loads(raw).get("subject") or {}
    except (UserError, ValueError, AttributeError):
        return None
    return subject.get("digest") if isinstance(subject, dict) else None


def forget(client: RegistryClient, repo: str, digest: str) -> int:
    """Delete what is kept with manifest `digest` (a release being pruned: its bench
    results, SBOM and provenance) and its referrers tag when nothing else is listed
    there; how many artifacts went. Only artifacts whose own `subject` is `digest` go:
    an index entry naming anything else (a corrupt or foreign fallback index) is not ours
    to delete."""
    ours, how = _ours(client, repo, digest, KEPT_WITH_RELEASE)
    gone = 0
    for desc in ours:
        if _subject_of(client, repo, str(desc.get("digest"))) != digest:
            continue
        try:
            client.delete_manifest(repo, desc["digest"])
            gone += 1
        except (Unsupported, NotFound):
            pass
    if how != "referrers-tag":
        return gone
    try:
        index = client.head_manifest(repo, referrers_tag(digest))
        others = [m for m in _fallback_index(client, repo, digest)
                  if m.get("artifactType") not in KEPT_WITH_RELEASE] if index else []
        if others:
            doc = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": others}
            client.put_manifest(repo, referrers_tag(digest), json.dumps(
                doc, sort_keys=True, separators=(",", ":")).encode(), OCI_INDEX)
        elif index:  # by digest: no scan of every tag (the index is this subject's alone)
            client.delete_manifest(repo, index[0])
    except (Unsupported, NotFound):
        pass
    return gone


def carry_over(client: RegistryClient, repo: str, old_digest: str, rel: Release) -> int:
    """Attach what is kept with manifest `old_digest` to release `rel` again, then forget
    the old copies; how many moved. For a release whose record was amended after publish
    (recorded as unmeasured at promote): its manifest has a new digest, and its SBOM,
    provenance and any results would otherwise stay with the old one, which prune never
    reaches. New copies first: a failure in between leaves both, never neither. Signed
    bundles do not move (their statement names the old digest; a copy would not verify)."""
    if old_digest == rel.digest:
        return 0
    ours, _how = _ours(client, repo, old_digest, KEPT_WITH_RELEASE)
    moved, seen = 0, set()
    for desc in ours:  # newest first: one of each type
        kind = desc.get("artifactType")
        if kind in seen or kind == SIGSTORE_BUNDLE_TYPE or \
                _subject_of(client, repo, str(desc.get("digest"))) != old_digest:
            continue
        seen.add(kind)
        raw, _media, _digest = client.get_manifest(repo, desc["digest"])
        manifest = json.loads(raw)
        layer = manifest["layers"][0]
        body = client.get_blob(repo, layer["digest"])
        name = (layer.get("annotations") or {}).get(A_TITLE, DEFAULT_FILE)
        put_artifact(client, repo, rel, body, artifact_type=str(kind), file_name=name,
                     annotations=manifest.get("annotations") or {})
        moved += 1
    forget(client, repo, old_digest)
    return moved
