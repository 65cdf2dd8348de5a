"""The gate: push only what passed smoke, verify the push, record the release.

Order (push only what passed):
1. the smoke verdict must say passed for exactly the local image id (nothing touches the
   registry before this, so a failed smoke leaves its tag list byte-for-byte unchanged);
2. the image is pushed under a staging tag `staging-<image id 12>` (registry/push.py:
   layers the registry holds are found or mounted, the rest sent from the local image);
3. the pushed manifest is read back and its config digest must equal the tested image id
   (the digest pushed is the digest tested, verified, not assumed);
4. under the lease: the release tag gets the annotated manifest (records.py); the
   staging tag is removed. `latest` is not touched here: release/latest.py moves it,
   after the regression gate.
A re-run resumes: a release tag already holding this image skips the push, and moving a
tag that is already in place is a no-op.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imagebuild.buildfolder import engine_ref_path
from imagebuild.docker import engine
from imagebuild.errors import OperationFailed, UserError
from imagebuild.gates.summary import failures
from imagebuild.registry.client import (
    OCI_MANIFEST,
    Credentials,
    RegistryClient,
    Unsupported,
)
from imagebuild.registry.push import push_with_retries, verify_pushed
from imagebuild.registry.records import (
    STAGING_PREFIX,
    Log,
    annotated_manifest,
    check_tag_date,
    read_release,
    release_record,
)
from imagebuild.release.lease import holding_lease
from imagebuild.spec.names import INPUTS_LABEL
from imagebuild.spec.tags import ReleaseTag

if TYPE_CHECKING:
    from imagebuild.plan import Job

CELL_LABEL = "io.imagebuild.cell"


@dataclass
class PublishResult:
    repo: str
    release_tag: str
    image_id: str
    digest: str | None = None  # the release manifest's digest
    pushed: bool = False  # False: the release tag already held this image (a re-run)
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


def inspect_local(ref: str) -> dict[str, Any]:
    info = engine().inspect_image(ref)
    if info is None:
        raise UserError(f"no local image {ref}", fix="build it first (`build.py build`)")
    return info


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


def gates_gate(gates: dict[str, Any] | None, ref: str) -> None:
    """Refuse a cell whose release gates failed or could not be trusted, as smoke's."""
    if gates is not None and (bad := failures(gates)):
        raise OperationFailed(f"{ref} did not pass the release gates ({'; '.join(bad)}): "
                              "nothing pushed, no tag moved",
                              fix="see gates.json in the cell's smoke dir; fix, rebuild, "
                                  "smoke and gate again")


def other_image(repo: str, tag: str, released: str, image_id: str) -> UserError:
    """The refusal when the release tag already holds another image (publish's, and the
    whole job's before smoke: release/resume.py decide)."""
    return UserError(f"{repo}:{tag} already exists for image {released}; this run "
                     f"tested {image_id}. Release tags are never overwritten",
                     fix="publish under a new tag (another date or patch-set name)")


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


def publish(client: RegistryClient, repo: str, *, local_ref: str, release_tag: ReleaseTag,
            verdict: dict[str, Any], pins: dict[str, Any] | None = None,
            gates: dict[str, Any] | None = None, dry_run: bool = False,
            credentials: Credentials | None = None, log: Log = print,
            settle: float | None = None, push_attempts: int = 3,
            known: tuple[str, ...] = ()) -> PublishResult:
    """Push the smoke-passed local image to repo (a path in client's registry, e.g.
    'vllm-spark/qwen36-cpu-tiny') and record it as release_tag. `gates`: the release
    gates' summary (gates/summary.py), refused unless it passed, recorded with it.
    `credentials`: the push's, when not the client's; `known`: images in the registry
    whose layers it may share (the engine it was built on)."""
    start = time.monotonic()
    info = inspect_local(local_ref)
    image_id = info["Id"]
    gate(verdict, image_id, local_ref)  # before any registry request
    gates_gate(gates, local_ref)
    check_tag_date(release_tag)
    labels = (info.get("Config") or {}).get("Labels") or {}
    tag = str(release_tag)
    res = PublishResult(repo, tag, image_id, dry_run=dry_run)

    def step(text: str) -> None:
        res.steps.append(text)
        log(f"{repo}: {text}")

    client.ping()
    existing = read_release(client, repo, tag)
    if existing and existing.image_id != image_id:
        raise other_image(repo, tag, existing.image_id, image_id)
    staging = f"{STAGING_PREFIX}{image_id.removeprefix('sha256:')[:12]}"
    if existing and existing.passed:
        step(f"{tag} already holds {image_id[:19]}: nothing to push")
        res.digest = existing.digest
        if not dry_run:  # an interrupted run may have left its staging tag
            _drop_staging(client, repo, staging, image_id, log)
        res.seconds = time.monotonic() - start
        return res
    if dry_run:
        step(f"would push {local_ref} as {staging}, verify its config is {image_id[:19]}, "
             f"then tag {tag}")
        res.seconds = time.monotonic() - start
        return res
    pusher = client.with_credentials(credentials) if credentials else client
    t0 = time.monotonic()
    pushed = push_with_retries(pusher, repo, staging, image_id, known=known,
                               attempts=push_attempts, log=log)
    manifest = verify_pushed(client, repo, staging, image_id, pushed)
    res.pushed = True
    step(f"pushed {staging} ({pushed[:19]}) in {time.monotonic() - t0:.1f} s; its config "
         f"is the tested image {image_id[:19]}")
    with holding_lease(client, repo, manifest["config"], purpose=f"publish {tag}",
                       log=log, settle=settle):
        rel = read_release(client, repo, tag)
        if rel is None or not rel.passed:
            if rel is not None and rel.image_id != image_id:  # appeared since we looked
                raise UserError(f"{repo}:{tag} was just written by another run",
                                fix="check `build.py releases`")
            record = release_record(release_tag, image_id, verdict, pins=pins,
                                    cell=labels.get(CELL_LABEL), inputs=labels.get(INPUTS_LABEL),
                                    pushed_digest=pushed, gates=gates)
            client.put_manifest(repo, tag, annotated_manifest(manifest, record), OCI_MANIFEST)
            rel = read_release(client, repo, tag)
            if rel is None or not rel.passed or rel.image_id != image_id:
                raise OperationFailed(f"{repo}:{tag} did not read back as this release",
                                      fix="re-run; check the registry")
            step(f"tagged {tag} ({rel.digest[:19]})")
        res.digest = rel.digest
    _drop_staging(client, repo, staging, image_id, log)
    res.seconds = time.monotonic() - start
    return res


def publish_job(client: RegistryClient, job: Job, verdict: dict[str, Any], *,
                gates: dict[str, Any] | None = None, dry_run: bool = False,
                log: Log = print, out: Path | None = None) -> PublishResult:
    """publish() for one planned job: its local image, repository, tag and pins; the
    engine its serve layers were built on, when the engine handoff brought it (`out`'s
    engines/<target>.ref), is where most of its layers are already."""
    handoff = engine_ref_path(out, job.cell.target_name) if out is not None else None
    known = (handoff.read_text().strip(),) if handoff is not None and handoff.is_file() else ()
    return publish(client, job.image.repository, local_ref=job.release_ref,
                   release_tag=job.tag, verdict=verdict, pins=dict(job.pins), gates=gates,
                   dry_run=dry_run, log=log, known=known)
