"""`build.py prune --keep N`: delete old release tags, never latest or its rollback."""

from __future__ import annotations

from dataclasses import dataclass

from imagebuild.errors import UserError
from imagebuild.registry.client import RegistryClient
from imagebuild.release.lease import LEASE_TAG, holding_lease
from imagebuild.release.records import LATEST, Log, list_releases, read_release


@dataclass
class PrunePlan:
    repo: str
    keep: list[tuple[str, str]]  # (tag, why)
    delete: list[str]
    skipped: list[tuple[str, str]]  # (tag, why it could not go)


def plan_prune(client: RegistryClient, repo: str, keep: int) -> PrunePlan:
    """Which release tags go: never the newest `keep`, never latest's, never the rollback
    target (the newest passing release older than latest), never one sharing a manifest
    with a kept tag (deleting a manifest deletes every tag on it in distribution 2.x)."""
    if keep < 1:
        raise UserError(f"--keep {keep}: must keep at least 1 release", fix="use --keep 1 or more")
    rels = list_releases(client, repo)
    why: dict[str, str] = {}
    for rel in rels[:keep]:
        why[rel.tag] = f"newest {keep}"
    latest_i = next((i for i, r in enumerate(rels) if r.is_latest), None)
    if latest_i is not None:
        why[rels[latest_i].tag] = "latest"
        target = next((r for r in rels[latest_i + 1:] if r.passed), None)
        if target:
            why[target.tag] = "rollback target"
    digests = dict(client.iter_tag_digests(repo))
    kept_digests = {digests.get(t) for t in why} | {digests.get(LATEST), digests.get(LEASE_TAG)}
    plan = PrunePlan(repo, [(r.tag, why[r.tag]) for r in rels if r.tag in why], [], [])
    for rel in rels:
        if rel.tag in why:
            continue
        shared = [t for t, d in digests.items() if d == rel.digest and t != rel.tag]
        if rel.digest in kept_digests or shared:
            plan.skipped.append((rel.tag, f"its manifest is also tagged {', '.join(shared)}"))
        else:
            plan.delete.append(rel.tag)
    return plan


def prune(client: RegistryClient, repo: str, keep: int, *, dry_run: bool = False,
          log: Log = print, settle: float | None = None) -> PrunePlan:
    plan = plan_prune(client, repo, keep)
    if not plan.delete or dry_run:
        _log_prune(plan, dry_run, log)
        return plan
    latest = read_release(client, repo, LATEST) or read_release(client, repo, plan.keep[0][0])
    assert latest is not None  # keep >= 1 and there is something to delete
    with holding_lease(client, repo, latest.config_descriptor, purpose=f"prune --keep {keep}",
                       log=log, settle=settle):
        plan = plan_prune(client, repo, keep)  # again, under the lease: latest may have moved
        for tag in plan.delete:
            client.delete_tag(repo, tag)
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
