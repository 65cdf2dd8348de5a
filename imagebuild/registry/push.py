"""Pushing an image through dockerd, retried, and reading back that the registry holds
exactly the image pushed: publish pushes its releases this way, the engine handoff its
engines (builder/engineship.py)."""

from __future__ import annotations

import time
from typing import Any

from imagebuild import progress
from imagebuild.docker import engine
from imagebuild.errors import OperationFailed
from imagebuild.registry.client import Credentials, RegistryClient
from imagebuild.registry.credentials import docker_auth_config
from imagebuild.registry.records import Log


def docker_push(image_id: str, name: str, tag: str, creds: Credentials | None) -> str:
    """Tag image_id as name:tag and push it through dockerd; returns the pushed digest.

    Credentials go to dockerd in the X-Registry-Auth header, never to a file or a log.
    """
    seam = engine()
    seam.tag(image_id, name, tag)
    digest = None
    layers: dict[str, tuple[int, int]] = {}  # layer -> (bytes sent, size) for progress
    try:
        for event in seam.push(name, tag, docker_auth_config(creds, name.split("/")[0])):
            if event.total:
                layers[event.layer] = (event.current, event.total)
                progress.wait("push", f"{sum(c for c, _ in layers.values()) / 1e6:,.0f} of "
                                      f"{sum(t for _, t in layers.values()) / 1e6:,.0f} MB "
                                      f"in {len(layers)} layer(s) being sent")
            if event.error:
                raise OperationFailed(f"docker push {name}:{tag} failed: {event.error}",
                                      fix="check the registry; re-running resumes the push")
            digest = event.digest or digest
    finally:
        try:
            seam.remove_image(f"{name}:{tag}")  # only the local staging tag, not the image
        except OperationFailed:
            pass
    if not digest:
        raise OperationFailed(f"docker push {name}:{tag} reported no digest")
    return digest


def push_with_retries(image_id: str, name: str, tag: str, creds: Credentials | None, *,
                      attempts: int = 3, backoff: float = 1.0, log: Log = print) -> str:
    """docker push is idempotent (layers already there are skipped), but dockerd does not
    retry a failed manifest PUT: retry the whole push on transient failures."""
    for attempt in range(1, attempts + 1):
        try:
            return docker_push(image_id, name, tag, creds)
        except OperationFailed as exc:
            auth = any(w in exc.message.lower() for w in ("unauthorized", "denied",
                                                          "authentication required"))
            if auth or attempt == attempts:
                raise
            log(f"{name}: push attempt {attempt} failed ({exc.message}); retrying")
            time.sleep(backoff * attempt)
    raise AssertionError("unreachable")


def verify_pushed(client: RegistryClient, repo: str, tag: str, image_id: str,
                  pushed_digest: str) -> dict[str, Any]:
    """Read back what the registry holds under tag; it must be the tested image."""
    manifest, digest = client.image_manifest(repo, tag)
    config = (manifest.get("config") or {}).get("digest")
    if digest != pushed_digest or config != image_id:
        raise OperationFailed(
            f"{repo}:{tag} holds manifest {digest} with config {config}, but dockerd pushed "
            f"{pushed_digest} of tested image {image_id}: not promoting it",
            fix="someone else wrote this tag; re-run to push again")
    return manifest
