"""The one place that moves `latest`: publish's promotion, `promote`, `rollback`.

`latest` is re-pointed server-side by PUTting a release manifest's bytes under `latest`
(no blob moves), under the registry lease, and only to a release recorded as passed.
Promotion (the whole job, `publish`, `promote`) first runs the regression gate for every
job, so a refusal moves nothing; rollback goes back on purpose and skips the gate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from imagebuild.bench.gate import check_promotion
from imagebuild.errors import OperationFailed, UserError
from imagebuild.registry.client import RegistryClient
from imagebuild.release.lease import Lease, holding_lease
from imagebuild.release.records import (
    A_BENCH,
    A_TAG,
    A_UNMEASURED,
    LATEST,
    UNMEASURED,
    Log,
    Release,
    amended_manifest,
    read_release,
    resolve_tag,
    short_digest,
)
from imagebuild.spec.tags import ReleaseTag, parse_release_tag

if TYPE_CHECKING:
    from imagebuild.plan import Job


@dataclass
class Move:
    repo: str
    target: str
    target_digest: str
    before_tag: str | None
    before_digest: str | None
    moved: bool
    dry_run: bool
    seconds: float = 0.0
    bytes: int = 0

    def line(self) -> str:
        old = (f"{self.before_tag or 'untagged'} ({short_digest(self.before_digest)})"
               if self.before_digest else "nothing")
        new = f"{self.target} ({short_digest(self.target_digest)})"
        if not self.moved and not self.dry_run:
            return f"{self.repo}: latest already at {new}"
        verb = "would move" if self.dry_run else "moved"
        return (f"{self.repo}: {verb} latest {old} -> {new}"
                + ("" if self.dry_run else f" in {self.seconds:.2f} s, {self.bytes:,} bytes"))


def latest_release(client: RegistryClient, repo: str) -> tuple[str | None, str | None]:
    """(digest latest points at, the release tag its manifest records), or (None, None)."""
    rel = read_release(client, repo, LATEST)
    if rel is None:
        return None, None
    return rel.digest, rel.annotations.get(A_TAG)


def move_latest(client: RegistryClient, lease: Lease, rel: Release,
                expected: str | None) -> None:
    """Point latest at rel, only if latest is still `expected` and the lease still ours."""
    now = client.head_manifest(rel.repo, LATEST)
    now_digest = now[0] if now else None
    if now_digest not in (expected, rel.digest):
        raise OperationFailed(
            f"{rel.repo}: latest moved during this run ({short_digest(expected)} -> "
            f"{short_digest(now_digest)}); not moving it again", fix="check `build.py releases`")
    lease.check()
    if now_digest != rel.digest:
        client.put_manifest(rel.repo, LATEST, rel.body, rel.media_type)
    got = client.head_manifest(rel.repo, LATEST)
    if not got or got[0] != rel.digest:
        raise OperationFailed(f"{rel.repo}: latest does not point at {rel.tag} after the move",
                              fix="re-run; check the registry")


def _passing(client: RegistryClient, repo: str, tag: str) -> Release:
    rel = read_release(client, repo, tag)
    if rel is None:
        raise UserError(f"{repo}:{tag} does not exist", fix="list them with `build.py releases`")
    if not rel.passed:
        raise UserError(f"{repo}:{tag} never passed smoke (verdict: {rel.verdict})",
                        fix="only a release recorded as passed can become latest")
    return rel


def set_latest(client: RegistryClient, repo: str, to: str, *, mode: str = "rollback",
               dry_run: bool = False, log: Log = print, settle: float | None = None) -> Move:
    """Move latest to release `to` (full or DATE-NAME) server-side: manifests only.

    mode "promote" refuses to move latest backwards (that is what rollback is for).
    """
    start, sent0 = time.monotonic(), client.bytes.total
    tag = resolve_tag(client, repo, to)
    rel = _passing(client, repo, tag)
    before, before_tag = latest_release(client, repo)
    if mode == "promote" and before_tag and (cur := parse_release_tag(before_tag)):
        if rel.release_tag and rel.release_tag.sort_key() < cur.sort_key():
            raise UserError(f"{repo}: {tag} is older than latest ({before_tag})",
                            fix=f"use `build.py rollback --to {tag}` to go back on purpose")
    move = Move(repo, tag, rel.digest, before_tag, before, before != rel.digest, dry_run)
    if move.moved and not dry_run:
        with holding_lease(client, repo, rel.config_descriptor, purpose=f"{mode} {tag}",
                           log=log, settle=settle) as lease:
            move_latest(client, lease, rel, before)
    move.seconds = time.monotonic() - start
    move.bytes = client.bytes.total - sent0
    log(move.line())
    return move


def set_latest_many(client: RegistryClient, repos: list[str], to: str, *,
                    mode: str = "rollback", dry_run: bool = False, log: Log = print,
                    settle: float | None = None) -> list[Move]:
    """`rollback --all`: every repo that has a passed release `to` moves; repos without
    it are left alone (and said so); none having it is an error. All targets are checked
    before the first move, so a refusal moves nothing."""
    ready = []
    for repo in repos:
        try:
            tag = resolve_tag(client, repo, to)
            _passing(client, repo, tag)
        except UserError as exc:
            log(f"{repo}: left alone ({exc.message})")
            continue
        ready.append((repo, tag))
    if not ready:
        raise UserError(f"no repository has a passed release {to}",
                        fix="list them with `build.py releases`")
    return [set_latest(client, repo, tag, mode=mode, dry_run=dry_run, log=log, settle=settle)
            for repo, tag in ready]


def threshold_for(job: Job, default: float) -> float:
    """The target's own regression threshold, else publish.regression_threshold."""
    b = job.cell.target.bench
    if b is not None and b.regression_threshold is not None:
        return float(b.regression_threshold)
    return float(default)


def advance(client: RegistryClient, repo: str, tag: ReleaseTag, *, dry_run: bool = False,
            log: Log = print, settle: float | None = None) -> Move | None:
    """Forward only: latest moves to `tag` unless it already holds a newer release (going
    back is `rollback`'s job). None when latest stays."""
    _, current = latest_release(client, repo)
    cur = parse_release_tag(current or "")
    if cur and tag.sort_key() < cur.sort_key():
        log(f"{repo}: latest stays at the newer {current}; use `build.py rollback` to go back")
        return None
    return set_latest(client, repo, str(tag), mode="promote", dry_run=dry_run, log=log,
                      settle=settle)


def record_unmeasured(client: RegistryClient, repo: str, tag: str, reason: str, *,
                      log: Log = print, settle: float | None = None) -> Release:
    """Mark release `tag` as promoted without a measurement, in its release record (the
    annotations of its manifest; config and layers stay, so the image is the tested one)."""
    rel = _passing(client, repo, tag)
    if rel.unmeasured == reason:
        return rel
    body = amended_manifest(rel, {A_BENCH: UNMEASURED, A_UNMEASURED: reason})
    with holding_lease(client, repo, rel.config_descriptor, purpose=f"record {tag} unmeasured",
                       log=log, settle=settle):
        client.put_manifest(repo, tag, body, rel.media_type)
    done = read_release(client, repo, tag)
    if done is None or not done.passed or done.image_id != rel.image_id or not done.unmeasured:
        raise OperationFailed(f"{repo}:{tag} did not read back as an unmeasured release",
                              fix="re-run; check the registry")
    log(f"{repo}: {tag} recorded as unmeasured ({reason})")
    return done


def promote_jobs(client: RegistryClient, jobs: tuple[Job, ...], *, default_threshold: float,
                 accept_regression: str | None, accept_untrusted: str | None = None,
                 accept_unmeasured: str | None = None, forward_only: bool = False,
                 dry_run: bool = False, log: Log = print) -> list[Move]:
    """Regression gate for every job first (a refusal moves nothing), then latest.
    `forward_only` (the whole job, publish): a release older than latest leaves it alone.
    `accept_untrusted`: promote although flagged bench figures could not be compared.
    `accept_unmeasured`: promote although a side has no bench results; a release without
    results is recorded as unmeasured before latest moves to it."""
    ready = []
    unmeasured = []
    for job in jobs:
        repo = job.image.repository
        if forward_only:
            _, current = latest_release(client, repo)
            cur = parse_release_tag(current or "")
            if cur and job.tag.sort_key() < cur.sort_key():
                log(f"{repo}: latest stays at the newer {current}; "
                    "use `build.py rollback` to go back")
                continue
        result = check_promotion(client, repo, str(job.tag),
                                 threshold=threshold_for(job, default_threshold),
                                 accept_regression=accept_regression,
                                 accept_untrusted=accept_untrusted,
                                 accept_unmeasured=accept_unmeasured, log=log)
        ready.append(job)
        if not result.measured and result.accepted_unmeasured:
            unmeasured.append((repo, str(job.tag), result.accepted_unmeasured))
    for repo, tag, reason in unmeasured:
        if dry_run:
            log(f"{repo}: would record {tag} as unmeasured ({reason})")
        else:
            record_unmeasured(client, repo, tag, reason, log=log)
    return [set_latest(client, j.image.repository, str(j.tag), mode="promote", dry_run=dry_run,
                       log=log) for j in ready]
