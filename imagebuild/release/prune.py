"""`build.py prune --keep N`: delete old release tags, never latest or its rollback.

What is protected is decided from what was read under the lease and checked again before
every delete (the lease last, right before it: a fence): latest (by a direct read of
`latest`, not only by matching digests in the tag list), its rollback target, the newest
N, and whatever shares a manifest with them.
A tag list that disagrees with the direct read (it lacks `latest` or latest's release:
a truncated or inconsistent list) stops the prune before anything goes. The lease is
checked (and renewed) before each delete; losing it stops the prune.

Cost stays linear in the number of releases: one tag list, one GET per release tag, one
HEAD per other tag, then a fixed number of requests per deleted release (its manifest is
deleted by the digest the plan read, which no other tag shares, instead of distribution
2.x's per-delete scan of every tag).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from imagebuild.bench import store
from imagebuild.errors import OperationFailed, UserError
from imagebuild.registry import referrers
from imagebuild.registry.client import RegistryClient
from imagebuild.registry.errors import NotFound
from imagebuild.registry.records import (
    A_TAG,
    LATEST,
    Log,
    Release,
    read_release,
    short_digest,
)
from imagebuild.release.lease import Lease, holding_lease
from imagebuild.safetext import safe
from imagebuild.spec.tags import parse_release_tag


@dataclass
class PrunePlan:
    repo: str
    keep: list[tuple[str, str]]  # (tag, why)
    delete: list[str]
    skipped: list[tuple[str, str]]  # (tag, why it could not go)
    digests: dict[str, str] = field(default_factory=dict)  # every tag -> its manifest
    latest: str | None = None  # the digest latest pointed at when planned

    def as_json(self, dry_run: bool) -> dict[str, Any]:
        """`prune --format json`: what stays and why, what goes (or would), what cannot."""
        return {"repository": self.repo, "dry_run": dry_run,
                "keep": [{"tag": t, "why": why} for t, why in self.keep],
                "delete": list(self.delete),
                "skipped": [{"tag": t, "why": why} for t, why in self.skipped]}


@dataclass
class Releases:
    """A repository's releases (newest first) and tags as read at one time, checked
    against a direct read of `latest`."""
    rels: list[Release]
    digests: dict[str, str]  # every tag -> manifest digest
    latest: Release | None


def read_state(client: RegistryClient, repo: str) -> Releases:
    try:
        tags = client.tags(repo)
    except NotFound:
        tags = []
    latest = read_release(client, repo, LATEST)
    digests: dict[str, str] = {}
    rels = []
    for tag in tags:
        if parse_release_tag(tag) is not None:
            rel = read_release(client, repo, tag)
            if rel is not None:
                rels.append(rel)
                digests[tag] = rel.digest
        elif tag != LATEST:
            found = client.head_manifest(repo, tag)
            if found:
                digests[tag] = found[0]
    if latest is not None:
        named = latest.annotations.get(A_TAG, "")
        if LATEST not in tags or digests.get(named) != latest.digest:
            raise OperationFailed(
                f"{repo}: the registry's tag list disagrees with a direct read of latest "
                f"({safe(named or 'untagged')} {short_digest(latest.digest)}: the list "
                f"{'lacks latest' if LATEST not in tags else 'lacks that release'}); "
                "protecting releases from it is not safe, nothing deleted",
                fix="re-run; if it persists, the registry's tag listing is truncated or "
                    "inconsistent: check the registry")
        digests[LATEST] = latest.digest
        for rel in rels:
            rel.is_latest = rel.tag == named
    rels.sort(key=Release.order_key, reverse=True)
    return Releases(rels, digests, latest)


def protected(client: RegistryClient, state: Releases) -> dict[str, str]:
    """tag -> why: latest's release and its rollback target: the newest passed release
    recorded before it that `rollback` takes without an override (measured), else the
    newest passed one."""
    why: dict[str, str] = {}
    if state.latest is None:
        return why
    latest_i = next((i for i, r in enumerate(state.rels) if r.is_latest), None)
    if latest_i is None:
        return why
    why[state.rels[latest_i].tag] = "latest"
    older = [r for r in state.rels[latest_i + 1:] if r.passed]
    target = next((r for r in older if not r.unmeasured
                   and store.stored(client, r.repo, r.tag) is not None),
                  older[0] if older else None)
    if target:
        why[target.tag] = "rollback target"
    return why


def plan_prune(client: RegistryClient, repo: str, keep: int) -> PrunePlan:
    """Which release tags go: never the newest `keep`, never latest's, never the rollback
    target, never one sharing a manifest with any other tag (deleting a manifest deletes
    every tag on it in distribution 2.x)."""
    if keep < 1:
        raise UserError(f"--keep {keep}: must keep at least 1 release", fix="use --keep 1 or more")
    state = read_state(client, repo)
    why = {rel.tag: f"newest {keep}" for rel in state.rels[:keep]}
    why.update(protected(client, state))
    plan = PrunePlan(repo, [(r.tag, why[r.tag]) for r in state.rels if r.tag in why], [], [],
                     state.digests, state.latest.digest if state.latest else None)
    for rel in state.rels:
        if rel.tag in why:
            continue
        shared = [t for t, d in state.digests.items() if d == rel.digest and t != rel.tag]
        if shared:
            plan.skipped.append((rel.tag, f"its manifest is also tagged {', '.join(shared)}"))
        else:
            plan.delete.append(rel.tag)
    return plan


def _still_planned(client: RegistryClient, lease: Lease, plan: PrunePlan, tag: str) -> bool:
    """Before a delete: latest has not moved, the tag still points where the plan read it,
    and, last (the fence: nothing between it and the DELETE), the lease is ours (renewed
    when due). False: the tag is gone already."""
    now = client.head_manifest(plan.repo, LATEST)
    if (now[0] if now else None) != plan.latest:
        raise OperationFailed(f"{plan.repo}: latest moved during the prune; stopped before "
                              f"deleting {tag}", fix="re-run the prune")
    found = client.head_manifest(plan.repo, tag)
    if found is None:
        return False
    if found[0] != plan.digests[tag]:
        raise OperationFailed(f"{plan.repo}: {tag} changed during the prune; stopped",
                              fix="re-run the prune")
    lease.check()
    return True


def _delete(client: RegistryClient, repo: str, tag: str, digest: str) -> None:
    """Delete the release's manifest by digest; a retried DELETE whose first attempt
    went through answers 404, which is fine once the tag is really gone."""
    try:
        client.delete_manifest(repo, digest)
    except NotFound:
        if client.head_manifest(repo, tag) is not None:
            raise


def prune(client: RegistryClient, repo: str, keep: int, *, dry_run: bool = False,
          log: Log = print, settle: float | None = None) -> PrunePlan:
    plan = plan_prune(client, repo, keep)
    if not plan.delete or dry_run:
        _log_prune(plan, dry_run, log)
        return plan
    anchor = read_release(client, repo, plan.keep[0][0]) if plan.keep else None
    if anchor is None:
        raise OperationFailed(f"{repo}: the newest release vanished while planning the prune",
                              fix="re-run the prune")
    with holding_lease(client, repo, anchor.config_descriptor, purpose=f"prune --keep {keep}",
                       log=log, settle=settle) as lease:
        plan = plan_prune(client, repo, keep)  # again, under the lease: latest may have moved
        for tag in plan.delete:
            if not _still_planned(client, lease, plan, tag):
                continue
            digest = plan.digests[tag]
            # the release first, then its results: a failed DELETE leaves a release that
            # still has its bench results (rollback needs them), not one "never benched";
            # a failure after it leaves results a re-run no longer reaches (only storage)
            _delete(client, repo, tag, digest)
            lease.check()  # the fence before the results' deletes too
            referrers.forget(client, repo, digest)  # results, SBOM, provenance, table, bundles
    _log_prune(plan, False, log)
    return plan


def _log_prune(plan: PrunePlan, dry_run: bool, log: Log) -> None:
    verb = "would delete" if dry_run else "deleted"
    for tag, why in plan.keep:
        log(f"{plan.repo}: keep {tag} ({why})")
    for tag, why in plan.skipped:
        log(f"{plan.repo}: cannot delete {tag}: {why}")
    for tag in plan.delete:
        log(f"{plan.repo}: {verb} {tag}")
    if not plan.delete:
        log(f"{plan.repo}: nothing to prune")
