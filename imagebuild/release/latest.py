"""The one place that moves `latest`: publish's promotion, `promote`, `rollback`.

`latest` is re-pointed server-side by PUTting a release manifest's bytes under `latest`
(no blob moves), under the registry lease, and only to a release recorded as passed.
A set of images (a promote of several jobs, `rollback --all`) moves together or not at
all: every image's checks pass before the first moves, every lease is held, the target
and latest are read again under the leases, and a refusal while moving puts the images
already moved back where they were (images that had a latest move first: those can be
undone; the undo reads latest again and puts back only what this run wrote, under its
lease or a fresh one, never under another run's live lease). Every write is fenced:
the lease is checked right before it, so a run paused past its lease stops instead of
writing over the run that took the lease over. Promotion is forward only (publish and
`promote` alike: a release recorded before latest's refuses, so of two tags in flight
the newer wins) and never to a release
that was rolled back (rollbacks.py) unless asked on purpose. Rollback goes back on
purpose and skips the regression gate, but not the others: its target must have been
measured, and a rollback that would move latest forward is refused.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from imagebuild.bench import store
from imagebuild.bench.gate import DEFAULT_ACCEPTANCE_THRESHOLD, check_promotion
from imagebuild.errors import OperationFailed, UserError
from imagebuild.registry import referrers
from imagebuild.registry.client import RegistryClient
from imagebuild.registry.records import (
    A_BENCH,
    A_TAG,
    A_UNMEASURED,
    LATEST,
    UNMEASURED,
    Log,
    Release,
    amended_manifest,
    check_tag_date,
    read_release,
    resolve_tag,
    short_digest,
)
from imagebuild.release import rollbacks
from imagebuild.release.lease import Lease, holding_lease
from imagebuild.safetext import safe
from imagebuild.spec.config import NO_SPECULATION
from imagebuild.spec.tags import ReleaseTag

if TYPE_CHECKING:
    from imagebuild.plan import Job, Plan


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

    def as_json(self) -> dict[str, Any]:
        """One image's move as `rollback`/`promote --format json` print it."""
        return {"repository": self.repo, "from": self.before_tag, "to": self.target,
                "digest": self.target_digest, "moved": self.moved, "dry_run": self.dry_run,
                "seconds": round(self.seconds, 3)}

    def line(self) -> str:
        # before_tag is latest's annotation: registry text, printed only through safe()
        old = (f"{safe(self.before_tag or 'untagged')} ({short_digest(self.before_digest)})"
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


def _passing(client: RegistryClient, repo: str, tag: str) -> Release:
    rel = read_release(client, repo, tag)
    if rel is None:
        raise UserError(f"{repo}:{tag} does not exist", fix="list them with `build.py releases`")
    if not rel.passed:
        raise UserError(f"{repo}:{tag} never passed smoke (verdict: {safe(rel.verdict)})",
                        fix="only a release recorded as passed can become latest")
    return rel


@dataclass
class Accept:
    """Reasons a user gave to pass a check of moving latest (None: not accepted)."""
    rolled_back: str | None = None  # promote a release that was rolled back
    forward: str | None = None  # rollback that moves latest forward, past the gates
    unmeasured: str | None = None  # rollback to a release without bench results


def _newer(a: Release, b: Release) -> bool:
    return a.order_key() > b.order_key()


def _named(rel: Release | None, none: str = "untagged") -> str:
    """The release tag a record names (registry text: made safe to print)."""
    return safe(rel.annotations.get(A_TAG) or none) if rel is not None else none


def refusal(mode: str, rel: Release, before: Release | None, rolled: dict[str, dict],
            accept: Accept) -> str | None:
    """Why latest must not move from `before` to `rel`, or None. Everything here is read
    again under the lease, so a decision never rests on a read another run outdated."""
    if before is not None and before.digest == rel.digest:
        return None
    if mode == "promote":
        if before is not None and _newer(before, rel):
            return (f"{rel.tag} is older than latest "
                    f"({_named(before)}); nothing moved. Use "
                    f"`build.py rollback --tag {rel.tag}` to go back on purpose")
        if rel.tag in rolled and not accept.rolled_back:
            return (f"{rel.tag} was rolled back (to {safe(rolled[rel.tag].get('to', '?'))} "
                    f"at {safe(rolled[rel.tag].get('at', '?'))}); a re-run does not undo a "
                    "rollback. "
                    f"Promote it on purpose with --accept-rolled-back \"why\"")
    elif not accept.forward and (before is None or _newer(rel, before)):
        return (f"{rel.tag} is newer than latest ({_named(before, 'none')}): a rollback does not "
                f"move latest forward past the regression gate. Use `build.py promote`, "
                f"or pass --accept-forward \"why\"")
    return None


def _measured(client: RegistryClient, rel: Release, accept: Accept) -> str | None:
    """Why a rollback target is not a measured release, or None."""
    if accept.unmeasured:
        return None
    if rel.unmeasured:
        return f"{rel.tag} was promoted unmeasured ({safe(rel.unmeasured)})"
    if store.stored(client, rel.repo, rel.tag) is None:
        return f"{rel.tag} was never benched (no stored bench results)"
    return None


def move_latest(client: RegistryClient, lease: Lease, rel: Release,
                expected: str | None, retake: Callable[[], None] | None = None) -> None:
    """Point latest at rel, only if latest is still `expected` and the lease still ours
    (`retake`: see Lease.check)."""
    now = client.head_manifest(rel.repo, LATEST)
    now_digest = now[0] if now else None
    if now_digest not in (expected, rel.digest):
        raise OperationFailed(
            f"{rel.repo}: latest moved during this run ({short_digest(expected)} -> "
            f"{short_digest(now_digest)}); not moving it again", fix="check `build.py releases`")
    lease.check(retake)
    if now_digest != rel.digest:
        client.put_manifest(rel.repo, LATEST, rel.body, rel.media_type)
    got = client.head_manifest(rel.repo, LATEST)
    if not got or got[0] != rel.digest:
        raise OperationFailed(f"{rel.repo}: latest does not point at {rel.tag} after the move",
                              fix="re-run; check the registry")


def _reread(client: RegistryClient, rel: Release) -> Release:
    """The target again, under the lease: it must still exist as the same passed release
    (a prune between our first read and the lease would otherwise be undone by our PUT)."""
    now = read_release(client, rel.repo, rel.tag)
    if now is None or now.digest != rel.digest or not now.passed:
        raise OperationFailed(f"{rel.repo}: {rel.tag} was deleted or changed during this run; "
                              "nothing moved", fix="check `build.py releases`, then re-run")
    return now


_SET_STAYS = "latest of every image of this release stays (a set moves together)"


def move_set(client: RegistryClient, targets: list[Release], *, mode: str,
             accept: Accept | None = None, dry_run: bool = False, log: Log = print,
             settle: float | None = None, forward_only: bool = False) -> list[Move]:
    """Move latest of every target's repository to it, all or none (see the module).
    `forward_only`: a refusal found under the lease (another run promoted a newer release
    or rolled this one back meanwhile) leaves latest and returns [] instead of raising."""
    accept = accept or Accept()
    start, sent0 = time.monotonic(), client.bytes.total
    plans = []
    for rel in targets:
        before = read_release(client, rel.repo, LATEST)
        why = refusal(mode, rel, before, rollbacks.rolled_back(client, rel.repo), accept)
        if why is None and mode == "rollback" and (before is None or before.digest != rel.digest):
            why = _measured(client, rel, accept)
            why = why and f"{why}; rollback refuses it without --accept-unmeasured \"why\""
        if why and forward_only:
            log(f"{rel.repo}: latest stays: {why}")
            log(_SET_STAYS)
            return []
        if why:
            raise OperationFailed(f"{rel.repo}: {why}",
                                  fix="nothing moved; see `build.py releases`")
        plans.append((rel, before))
    moves = [Move(rel.repo, rel.tag, rel.digest, b.annotations.get(A_TAG) if b else None,
                  b.digest if b else None, b is None or b.digest != rel.digest, dry_run)
             for rel, b in plans]
    if not dry_run and any(m.moved for m in moves):  # every image of the set: leased and
        # read again, those already there too (another run may move them meanwhile)
        stays = _move_all(client, plans, mode=mode, accept=accept, log=log, settle=settle,
                          forward_only=forward_only)
        if stays:
            log(stays)
            log(_SET_STAYS)
            return []
    for m in moves:
        m.seconds = time.monotonic() - start
        m.bytes = client.bytes.total - sent0
        log(m.line())
    return moves


def _move_all(client: RegistryClient, plans: list[tuple[Release, Release | None]], *,
              mode: str, accept: Accept, log: Log, settle: float | None,
              forward_only: bool = False) -> str | None:
    """Move the set under every lease; with `forward_only`, a refusal decided under the
    leases is returned ("latest stays: why"), nothing moved."""
    purpose = f"{mode} {' '.join(sorted({rel.tag for rel, _ in plans}))}"
    with contextlib.ExitStack() as stack:
        leases = {rel.repo: stack.enter_context(holding_lease(
            client, rel.repo, rel.config_descriptor, purpose=purpose, log=log, settle=settle))
            for rel, _ in sorted(plans, key=lambda p: p[0].repo)}
        checked = []
        for rel, before in plans:  # everything again, under every lease, before any move
            rel = _reread(client, rel)
            now = read_release(client, rel.repo, LATEST)
            why = refusal(mode, rel, now, rollbacks.rolled_back(client, rel.repo), accept)
            if forward_only:  # decided here, under the lease: from latest as it is now
                if why:
                    return f"{rel.repo}: latest stays: {why}"
                before = now
            elif (now.digest if now else None) != (before.digest if before else None):
                raise OperationFailed(f"{rel.repo}: latest moved during this run; nothing moved",
                                      fix="check `build.py releases`, then re-run")
            if why:
                raise OperationFailed(f"{rel.repo}: {why}", fix="nothing moved")
            checked.append((rel, before))
        # images that had a latest first: their move can be undone by PUTting it back
        checked.sort(key=lambda p: p[1] is None)
        # every image whose latest this run may have written, from just before its PUT
        # (a PUT that landed but whose read-back failed is one of them)
        done: list[tuple[Release, Release | None]] = []
        moving = [0]  # the index in `checked` of the image being moved

        def as_left() -> None:
            """A lapsed lease taken again (Lease.check): the set must be where this run
            left it (moved before `moving`, not yet after it, either at it) and every
            target still there, else another run took over meanwhile."""
            for i, (rel, before) in enumerate(checked):
                _reread(client, rel)
                now = client.head_manifest(rel.repo, LATEST)
                was = before.digest if before else None
                left = {rel.digest} if i < moving[0] else {was} if i > moving[0] else {
                    was, rel.digest}
                if (now[0] if now else None) not in left:
                    raise OperationFailed(
                        f"{rel.repo}: latest moved while this run's lease had lapsed; "
                        "this run stops here", fix="check `build.py releases`, then re-run")

        try:
            for moving[0], (rel, before) in enumerate(checked):
                lease = leases[rel.repo]
                if mode == "rollback" and before is not None and before.digest != rel.digest:
                    rollbacks.record(client, rel.repo, str(before.annotations.get(A_TAG)),
                                     rel.tag, rel.config_descriptor, fence=lease.check)
                if before is None or before.digest != rel.digest:
                    done.append((rel, before))
                move_latest(client, lease, rel, before.digest if before else None, as_left)
            # after every move: an image without a latest before cannot be put back, so
            # nothing that may stop the run comes between its move and the set's last
            for rel, _ in checked if mode == "promote" and accept.rolled_back else ():
                rollbacks.forgive(client, rel.repo, rel.tag, rel.config_descriptor,
                                  fence=leases[rel.repo].check)
        except BaseException:
            _undo(client, done, [rel for rel, _ in checked], leases, log)
            raise
    return None


def _undo(client: RegistryClient, done: list[tuple[Release, Release | None]],
          targets: list[Release], leases: dict[str, Lease], log: Log) -> None:
    """Put latest back where it was for the images this run may have moved (best effort:
    this runs while another error is on its way out). Latest is read again first: only
    what this run wrote goes back (another writer's move stays), and when every image
    of the set is at its target (another run finished the same move, or only a step
    after the last move failed) the set is whole and stays.
    The put-back is fenced like every write: by our lease, else by a fresh one (the run
    that took ours over has finished and released it); a live lease of another run
    owns latest now, and this says where each image is."""
    if not done:
        return
    try:
        with client.deadline.grace():  # a fresh small budget: the error on its way out
            at = {rel.repo: client.head_manifest(rel.repo, LATEST) for rel in targets}
    except Exception as exc:  # noqa: BLE001 - report, leave it
        log(f"could not read latest again to put the set back ({safe(exc)}): check "
            "`build.py releases`")
        return
    ours = [(rel, before) for rel, before in done
            if (now := at[rel.repo]) is not None and now[0] == rel.digest]
    if all((now := at[rel.repo]) is not None and now[0] == rel.digest for rel in targets):
        log("every image of the set is at its target: the set is whole, nothing to put back")
        return
    for rel, before in reversed(ours):
        if before is None:
            log(f"{rel.repo}: latest stays at {rel.tag} (it had no latest to go back to)")
            continue
        try:
            with client.deadline.grace(), _fence_for_undo(client, leases[rel.repo], rel, log):
                client.put_manifest(rel.repo, LATEST, before.body, before.media_type)
            log(f"{rel.repo}: latest put back to {_named(before)}")
        except Exception as exc:  # noqa: BLE001 - report, keep undoing the others
            log(f"{rel.repo}: could not put latest back ({safe(exc)}); it is at {rel.tag}: "
                "check `build.py releases`")


@contextlib.contextmanager
def _fence_for_undo(client: RegistryClient, lease: Lease, rel: Release,
                    log: Log) -> Iterator[None]:
    """The fence of a put-back: our lease; once lost, a fresh one (the run that took ours
    over has finished), with latest read again under it; a live lease of another run
    raises (it owns latest now)."""
    try:
        lease.check()
    except OperationFailed:
        fresh = Lease(client, rel.repo, rel.config_descriptor, purpose="undo", log=log)
        fresh.acquire()
        try:
            now = client.head_manifest(rel.repo, LATEST)
            if now is None or now[0] != rel.digest:
                raise OperationFailed(f"{rel.repo}: latest moved while the lease was lost",
                                      fix="check `build.py releases`") from None
            fresh.check()
            yield
        finally:
            fresh.release()
        return
    yield


def set_latest(client: RegistryClient, repo: str, to: str, *, mode: str = "rollback",
               dry_run: bool = False, log: Log = print, settle: float | None = None,
               accept: Accept | None = None) -> Move:
    """Move latest to release `to` (full or DATE-NAME) server-side: manifests only.

    mode "promote" refuses to move latest backwards (that is what rollback is for);
    mode "rollback" refuses to move it forward and to an unmeasured release."""
    tag = resolve_tag(client, repo, to)
    return move_set(client, [_passing(client, repo, tag)], mode=mode, accept=accept,
                    dry_run=dry_run, log=log, settle=settle)[0]


def set_latest_many(client: RegistryClient, repos: list[str], to: str, *,
                    mode: str = "rollback", dry_run: bool = False, log: Log = print,
                    settle: float | None = None, accept: Accept | None = None) -> list[Move]:
    """`rollback --all`: every repo that has a passed release `to` moves, together
    (move_set: each one measured unless accepted), or none does. A repo without it
    (pruned, or never built for it) whose latest is at the release latest of a repo that
    would move is part of that set: moving the others would split it, so the rollback
    refuses (rolling back only some images is said on purpose with --image). A repo
    without it on a release line of its own (another target's image, one never
    released) is left alone, and said so."""
    ready, lacking = [], []
    for repo in repos:
        try:
            ready.append(_passing(client, repo, resolve_tag(client, repo, to)))
        except UserError as exc:
            lacking.append((repo, exc.message))
    if not ready:
        raise UserError(f"no repository has a passed release {to}",
                        fix="list them with `build.py releases`")
    sets = {_named(now, "") for rel in ready if (now := read_release(client, rel.repo, LATEST))}
    split = []
    for repo, why in lacking:
        now = read_release(client, repo, LATEST)
        if now is not None and _named(now, "") in sets - {""}:
            split.append(f"{repo} ({why}; its latest {_named(now)} moves with the others)")
        else:
            log(f"{repo}: left alone ({why}; not in a set with the images that move)")
    if split:
        have = ", ".join(r.repo for r in ready)
        raise UserError(f"rollback --tag {to} would split a set promoted together: "
                        f"{'; '.join(split)}; nothing moved",
                        fix=f"roll back only the images that have it on purpose with --image "
                            f"(have it: {have}), or pick a release every image of the set has "
                            "(`build.py releases`)")
    return move_set(client, ready, mode=mode, accept=accept, dry_run=dry_run, log=log,
                    settle=settle)


def threshold_for(job: Job, default: float) -> float:
    """The target's own regression threshold, else publish.regression_threshold."""
    b = job.cell.target.bench
    if b is not None and b.regression_threshold is not None:
        return float(b.regression_threshold)
    return float(default)


def acceptance_threshold_for(job: Job, default: float) -> float:
    """The target's own acceptance threshold, else publish.acceptance_threshold."""
    b = job.cell.target.bench
    if b is not None and b.acceptance_threshold is not None:
        return float(b.acceptance_threshold)
    return float(default)


def advance(client: RegistryClient, repo: str, tag: ReleaseTag, *, dry_run: bool = False,
            log: Log = print, settle: float | None = None) -> Move | None:
    """Forward only: latest moves to `tag` unless it already holds a newer release, or
    `tag` was rolled back (going back, and forward again, are on purpose). None when
    latest stays."""
    rel = _passing(client, repo, str(tag))
    why = refusal("promote", rel, read_release(client, repo, LATEST),
                  rollbacks.rolled_back(client, repo), Accept())
    if why:
        log(f"{repo}: latest stays: {why}")
        return None
    moves = move_set(client, [rel], mode="promote", dry_run=dry_run, log=log, settle=settle,
                     forward_only=True)  # decided again under the lease
    return moves[0] if moves else None


def record_unmeasured(client: RegistryClient, repo: str, tag: str, reason: str, *,
                      log: Log = print, settle: float | None = None) -> Release:
    """Mark release `tag` as promoted without a measurement, in its release record (the
    annotations of its manifest; config and layers stay, so the image is the tested one)."""
    rel = _passing(client, repo, tag)
    if rel.unmeasured == reason:
        return rel
    body = amended_manifest(rel, {A_BENCH: UNMEASURED, A_UNMEASURED: reason})
    with holding_lease(client, repo, rel.config_descriptor, purpose=f"record {tag} unmeasured",
                       log=log, settle=settle) as lease:
        lease.check()  # the fence: nothing between it and the write
        client.put_manifest(repo, tag, body, rel.media_type)
    done = read_release(client, repo, tag)
    if done is None or not done.passed or done.image_id != rel.image_id or not done.unmeasured:
        raise OperationFailed(f"{repo}:{tag} did not read back as an unmeasured release",
                              fix="re-run; check the registry")
    # a new manifest digest: what publish attached to the old one (SBOM, provenance) moves
    moved = referrers.carry_over(client, repo, rel.digest, done)
    log(f"{repo}: {tag} recorded as unmeasured ({reason})"
        + (f"; {moved} stored document(s) moved to its new record" if moved else ""))
    return done


def promote_jobs(client: RegistryClient, jobs: tuple[Job, ...], *, default_threshold: float,
                 accept_regression: str | None, accept_untrusted: str | None = None,
                 accept_unmeasured: str | None = None, accept_rolled_back: str | None = None,
                 forward_only: bool = False, dry_run: bool = False,
                 default_acceptance_threshold: float = DEFAULT_ACCEPTANCE_THRESHOLD,
                 accept_acceptance_drop: str | None = None,
                 log: Log = print) -> list[Move]:
    """Every job's checks first (forward only, not rolled back, the regression gate), so
    a refusal moves nothing; then latest of every job's image moves, all or none.
    `forward_only` (the whole job, publish): when a job's release is older than latest or
    was rolled back, latest of every image stays and this says why (not an error: the
    release itself was published); `promote` refuses instead (exit 1).
    `accept_untrusted`: promote although flagged bench figures could not be compared.
    `accept_unmeasured`: promote although a side has no bench results; a release without
    results is recorded as unmeasured before latest moves to it.
    `accept_rolled_back`: promote a release that was rolled back, on purpose.
    `accept_acceptance_drop`: promote although a cell with a drafter accepts fewer
    drafted tokens than latest beyond its target's acceptance threshold."""
    accept = Accept(rolled_back=accept_rolled_back)
    rels = []
    for job in jobs:
        check_tag_date(job.tag)
        repo = job.image.repository
        rel = _passing(client, repo, str(job.tag))
        why = refusal("promote", rel, read_release(client, repo, LATEST),
                      rollbacks.rolled_back(client, repo), accept)
        if why and forward_only:
            log(f"{repo}: latest stays: {why}")
            log("latest of every image of this release stays (a set moves together)")
            return []
        if why:
            raise OperationFailed(f"{repo}: {why}", fix="nothing moved")
        rels.append(rel)
    unmeasured = []
    for job in jobs:
        repo = job.image.repository
        result = check_promotion(client, repo, str(job.tag),
                                 threshold=threshold_for(job, default_threshold),
                                 accept_regression=accept_regression,
                                 accept_untrusted=accept_untrusted,
                                 accept_unmeasured=accept_unmeasured, dry_run=dry_run,
                                 acceptance_threshold=acceptance_threshold_for(
                                     job, default_acceptance_threshold),
                                 drafter=job.cell.method != NO_SPECULATION,
                                 accept_acceptance_drop=accept_acceptance_drop, log=log)
        if not result.measured and result.accepted_unmeasured:
            unmeasured.append((repo, str(job.tag), result.accepted_unmeasured))
    for repo, tag, reason in unmeasured:
        if dry_run:
            log(f"{repo}: would record {tag} as unmeasured ({reason})")
        else:
            rel = record_unmeasured(client, repo, tag, reason, log=log)
            rels = [rel if r.repo == repo else r for r in rels]
    return move_set(client, rels, mode="promote", accept=accept, dry_run=dry_run, log=log,
                    forward_only=forward_only)


def promote_plan(plan: Plan, client: RegistryClient, *, accept_regression: str | None,
                 accept_untrusted: str | None = None, accept_unmeasured: str | None = None,
                 accept_rolled_back: str | None = None, forward_only: bool = False,
                 dry_run: bool = False, accept_acceptance_drop: str | None = None
                 ) -> list[Any]:
    """The moves of latest (Move), one per image of the plan, with its matrix's
    thresholds."""
    publish = plan.lm.matrix.publish
    return promote_jobs(client, plan.jobs, default_threshold=publish.regression_threshold,
                        default_acceptance_threshold=publish.acceptance_threshold,
                        accept_acceptance_drop=accept_acceptance_drop,
                        accept_regression=accept_regression, accept_untrusted=accept_untrusted,
                        accept_unmeasured=accept_unmeasured,
                        accept_rolled_back=accept_rolled_back, forward_only=forward_only,
                        dry_run=dry_run)
