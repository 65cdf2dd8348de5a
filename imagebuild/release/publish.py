"""The gate: push only what passed smoke, verify the push, then promote.

Order (DESIGN.md "push only what passed"):
1. the smoke verdict must say passed for exactly the local image id (nothing touches the
   registry before this, so a failed smoke leaves its tag list byte-for-byte unchanged);
2. dockerd pushes the image under a staging tag `staging-<image id 12>`;
3. the pushed manifest is read back and its config digest must equal the tested image id
   (the digest pushed is the digest tested, verified, not assumed);
4. under the lease: the release tag gets the annotated manifest (release.py), then,
   last, `latest`; the staging tag is removed.
A re-run resumes: a release tag already holding this image skips the push, and moving a
tag that is already in place is a no-op.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors

from imagebuild.errors import OperationFailed, UserError
from imagebuild.registry.client import (
    OCI_MANIFEST,
    Credentials,
    RegistryClient,
    Unsupported,
    resolve_credentials,
)
from imagebuild.release.records import (
    A_PUSHED,
    A_TAG,
    LATEST,
    STAGING_PREFIX,
    Log,
    Release,
    annotated_manifest,
    holding_lease,
    move_latest,
    read_release,
    release_record,
)
from imagebuild.spec.tags import ReleaseTag, parse_release_tag

INPUTS_LABEL = "io.imagebuild.inputs"
CELL_LABEL = "io.imagebuild.cell"


@dataclass
class PublishResult:
    repo: str
    release_tag: str
    image_id: str
    digest: str | None = None  # the release manifest's digest
    pushed: bool = False  # False: the release tag already held this image (a re-run)
    latest_moved: bool = False
    dry_run: bool = False
    steps: list[str] = field(default_factory=list)
    seconds: float = 0.0


def load_verdict(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise OperationFailed(f"cannot read smoke verdict {path}: {exc}",
                              fix="run the smoke step first (`build.py smoke`)") from None
    if not isinstance(data, dict):
        raise OperationFailed(f"smoke verdict {path} is not a JSON object")
    return data


def _docker_api() -> docker.APIClient:
    try:
        return docker.APIClient(version="auto")
    except docker.errors.DockerException as exc:
        raise OperationFailed(f"cannot reach the Docker engine: {exc}",
                              fix="start dockerd (scripts/setup.sh)") from None


def inspect_local(ref: str) -> dict[str, Any]:
    try:
        return _docker_api().inspect_image(ref)
    except docker.errors.ImageNotFound:
        raise UserError(f"no local image {ref}", fix="build it first (`build.py build`)") from None


def gate(verdict: dict[str, Any], image_id: str, ref: str) -> None:
    """Refuse anything but a passed verdict for exactly this image id."""
    if verdict.get("passed") is not True:
        failed = [k for k, v in (verdict.get("checks") or {}).items()
                  if (v.get("passed") if isinstance(v, dict) else v) is False]
        raise OperationFailed(
            f"{ref} did not pass smoke ({', '.join(failed) or 'verdict not passed'}): "
            "nothing pushed, no tag moved", fix="fix the failure, rebuild, smoke again")
    if verdict.get("image_id") != image_id:
        raise OperationFailed(
            f"the smoke verdict is for image {verdict.get('image_id')}, but {ref} is now "
            f"{image_id}: refusing to push an image that was not the one tested",
            fix="run smoke on this image, then publish")


def _auth(creds: Credentials | None, host: str) -> dict[str, str] | None:
    if creds is None:
        return None  # dockerd gets nothing; docker-py falls back to the Docker config
    if creds.identity_token:
        return {"identitytoken": creds.identity_token, "serveraddress": host}
    return {"username": creds.username or "", "password": creds.password or "",
            "serveraddress": host}


def docker_push(image_id: str, name: str, tag: str, creds: Credentials | None) -> str:
    """Tag image_id as name:tag and push it through dockerd; returns the pushed digest.

    Credentials go to dockerd in the X-Registry-Auth header, never to a file or a log.
    """
    api = _docker_api()
    api.tag(image_id, name, tag)
    digest = None
    try:
        for event in api.push(name, tag=tag, stream=True, decode=True,
                              auth_config=_auth(creds, name.split("/")[0])):
            if "error" in event:
                raise OperationFailed(f"docker push {name}:{tag} failed: {event['error']}",
                                      fix="check the registry; re-running resumes the push")
            digest = (event.get("aux") or {}).get("Digest") or digest
    except docker.errors.APIError as exc:
        raise OperationFailed(f"docker push {name}:{tag} failed: {exc.explanation or exc}",
                              fix="check the registry; re-running resumes the push") from None
    finally:
        try:
            api.remove_image(f"{name}:{tag}")  # only the local staging tag, not the image
        except docker.errors.APIError:
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


def _drop_staging(client: RegistryClient, repo: str, tag: str, image_id: str,
                  log: Log) -> None:
    """Delete the staging tag once the release exists (its manifest is unannotated, so no
    release tag shares its digest)."""
    rel = read_release(client, repo, tag)
    if rel is None or rel.image_id != image_id:
        return
    try:
        client.delete_tag(repo, tag)
    except Unsupported as exc:
        log(f"{repo}: left staging tag {tag} ({exc.message})")


def publish(client: RegistryClient, repo: str, *, local_ref: str, release_tag: str,
            verdict: dict[str, Any], pins: dict[str, Any] | None = None,
            move_to_latest: bool = True, dry_run: bool = False,
            credentials: Credentials | None = None, log: Log = print,
            settle: float | None = None, push_attempts: int = 3) -> PublishResult:
    """Push the smoke-passed local image to repo (a path in client's registry, e.g.
    'vllm-spark/qwen36-cpu-tiny') as release_tag (full DATE-vX.Y.Z-NAME), then latest."""
    start = time.monotonic()
    rtag = parse_release_tag(release_tag)
    if rtag is None:
        raise UserError(f"{release_tag!r} is not a full release tag DATE-vX.Y.Z-NAME",
                        fix="pass the release tag from `build.py plan`")
    info = inspect_local(local_ref)
    image_id = info["Id"]
    gate(verdict, image_id, local_ref)  # before any registry request
    labels = (info.get("Config") or {}).get("Labels") or {}
    res = PublishResult(repo, release_tag, image_id, dry_run=dry_run)

    def step(text: str) -> None:
        res.steps.append(text)
        log(f"{repo}: {text}")

    client.ping()
    existing = read_release(client, repo, release_tag)
    if existing and existing.image_id != image_id:
        raise UserError(
            f"{repo}:{release_tag} already exists for image {existing.image_id}; this run "
            f"tested {image_id}. Release tags are never overwritten",
            fix="publish under a new tag (another date or patch-set name)")
    staging = f"{STAGING_PREFIX}{image_id.removeprefix('sha256:')[:12]}"
    if existing and existing.passed:
        step(f"{release_tag} already holds {image_id[:19]}: nothing to push")
        manifest, pushed = json.loads(existing.body), existing.annotations.get(A_PUSHED, "")
    elif dry_run:
        step(f"would push {local_ref} as {staging}, verify its config is {image_id[:19]}, "
             f"then tag {release_tag}" + (" and move latest" if move_to_latest else ""))
        res.seconds = time.monotonic() - start
        return res
    else:
        creds = credentials or resolve_credentials(client.host)
        t0 = time.monotonic()
        pushed = push_with_retries(image_id, f"{client.host}/{repo}", staging, creds,
                                   attempts=push_attempts, log=log)
        manifest = verify_pushed(client, repo, staging, image_id, pushed)
        res.pushed = True
        step(f"pushed {staging} ({pushed[:19]}) in {time.monotonic() - t0:.1f} s; its config "
             f"is the tested image {image_id[:19]}")
    if dry_run:
        step(f"would {'move latest to' if move_to_latest else 'leave latest off'} {release_tag}")
        res.seconds = time.monotonic() - start
        return res
    with holding_lease(client, repo, manifest["config"], purpose=f"publish {release_tag}",
                       log=log, settle=settle) as lease:
        rel = read_release(client, repo, release_tag)
        if rel is None or not rel.passed:
            if rel is not None and rel.image_id != image_id:  # appeared since we looked
                raise UserError(f"{repo}:{release_tag} was just written by another run",
                                fix="check `build.py releases`")
            record = release_record(rtag, image_id, verdict, pins=pins,
                                    cell=labels.get(CELL_LABEL), inputs=labels.get(INPUTS_LABEL),
                                    pushed_digest=pushed)
            client.put_manifest(repo, release_tag, annotated_manifest(manifest, record),
                                OCI_MANIFEST)
            rel = read_release(client, repo, release_tag)
            if rel is None or not rel.passed or rel.image_id != image_id:
                raise OperationFailed(f"{repo}:{release_tag} did not read back as this release",
                                      fix="re-run; check the registry")
            step(f"tagged {release_tag} ({rel.digest[:19]})")
        res.digest = rel.digest
        before = read_release(client, repo, LATEST)
        if move_to_latest and _moves_forward(before, rtag, step):
            move_latest(client, lease, rel, before.digest if before else None)
            res.latest_moved = not (before and before.digest == rel.digest)
            step(f"latest -> {release_tag}" + ("" if res.latest_moved else " (already there)"))
    _drop_staging(client, repo, staging, image_id, log)
    res.seconds = time.monotonic() - start
    return res


def _moves_forward(before: Release | None, rtag: ReleaseTag, step: Log) -> bool:
    """latest only moves forward on publish; going back is `rollback`'s job."""
    cur = parse_release_tag(before.annotations.get(A_TAG, "")) if before else None
    if cur and rtag.sort_key() < cur.sort_key():
        step(f"latest stays at the newer {cur}; use `build.py rollback` to go back")
        return False
    return True
