"""Regression tests of the release state under races, faults and odd registries (issue
25 items 1-8 and the minor ones; issue 19 item 3), against the in-memory registry. Each
test fails when its fix is reverted."""

from __future__ import annotations

import json
import time

import pytest

from imagebuild.bench import store
from imagebuild.errors import OperationFailed, UserError
from imagebuild.registry import referrers
from imagebuild.registry.client import OCI_INDEX, OCI_MANIFEST
from imagebuild.registry.deadline import Deadline
from imagebuild.registry.records import A_TAG, LATEST, list_releases, read_release
from imagebuild.release import latest, lease
from imagebuild.release.latest import Accept, advance, set_latest, set_latest_many
from imagebuild.release.lease import LEASE, LEASE_TAG, Lease
from imagebuild.release.prune import plan_prune, prune
from imagebuild.release.rollbacks import rolled_back
from imagebuild.release.runnerclean import protected_releases
from imagebuild.spec.tags import parse_release_tag
from tests.support.memregistry import MemRegistry

REPO, OTHER = "ns/img", "ns/other"
A, B, C = "2026-06-01-v0.23.0-a", "2026-06-02-v0.23.0-b", "2026-06-03-v0.23.0-c"


@pytest.fixture
def reg(monkeypatch, tmp_path):
    monkeypatch.setenv("IMAGEBUILD_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("IMAGEBUILD_LEASE_SETTLE", "0")
    return MemRegistry()


def _at(reg, repo=REPO):
    rel = read_release(reg.client(), repo, LATEST)
    return rel.annotations[A_TAG] if rel else None


def _releases(reg, repo, tags, latest_at=None, benched=True):
    for tag in tags:
        reg.add_release(repo, tag, benched=benched)
    if latest_at:
        reg.point_latest(repo, latest_at)


# 1: the target is read again under the lease --------------------------------------------


def test_a_rollback_racing_prune_does_not_recreate_the_deleted_release(reg):
    _releases(reg, REPO, [A, B, C], latest_at=C)
    victim = reg.tags[REPO][A]

    def prune_in_between(method, path):  # another host prunes A while we take the lease
        if method == "PUT" and path.endswith(f"/manifests/{LEASE_TAG}") and victim in \
                reg.manifests[REPO]:
            del reg.manifests[REPO][victim]
            del reg.tags[REPO][A]

    reg.before = prune_in_between
    with pytest.raises(OperationFailed, match="deleted or changed during this run"):
        set_latest(reg.client(), REPO, A, log=lambda _: None)
    assert _at(reg) == C and victim not in reg.manifests[REPO]


# 2: the lease renews, stops when lost, and expires by the registry's clock --------------


def test_long_work_renews_the_lease_and_stops_when_it_is_lost(reg):
    _releases(reg, REPO, [A])
    held = Lease(reg.client(), REPO, read_release(reg.client(), REPO, A).config_descriptor,
                 purpose="t", ttl=30, settle=0).acquire()
    first = held.digest
    held.written -= 11  # a third of the TTL passed: the next check writes a new generation
    held.check()
    ann = read_release(reg.client(), REPO, LEASE_TAG).annotations
    assert held.digest != first and ann[f"{LEASE}.generation"] == "2"
    reg.add_release(REPO, B)  # another run takes the tag over
    reg.tags[REPO][LEASE_TAG] = reg.tags[REPO][B]
    with pytest.raises(OperationFailed, match="lost the registry lease"):
        held.check()


def test_prune_stops_at_the_next_delete_once_the_lease_is_lost(reg):
    tags = [f"2026-05-{d:02d}-v0.23.0-x" for d in range(1, 7)]
    _releases(reg, REPO, tags, latest_at=tags[-1])
    deleted = []

    def steal_after_first_delete(method, path):
        if method == "DELETE" and "/manifests/sha256:" in path:
            deleted.append(path)
            if len(deleted) == 2:  # the first release and its results index are gone
                reg.tags[REPO][LEASE_TAG] = reg.tags[REPO][tags[-1]]

    reg.before = steal_after_first_delete
    with pytest.raises(OperationFailed, match="lost the registry lease"):
        prune(reg.client(), REPO, 1, log=lambda _: None)
    assert sum(t in reg.tags[REPO] for t in tags) == len(tags) - 1


def test_lease_expiry_uses_the_registrys_clock_not_the_writers(reg, monkeypatch):
    _releases(reg, REPO, [A])
    cfg = read_release(reg.client(), REPO, A).config_descriptor
    reg.now = 1_800_000_000.0
    real = time.time
    monkeypatch.setattr(lease.time, "time", lambda: real() + 3600)  # the writer runs an hour ahead
    Lease(reg.client(), REPO, cfg, purpose="killed", ttl=300, settle=0).acquire()
    monkeypatch.setattr(lease.time, "time", real)
    monkeypatch.setattr(lease, "identity", lambda: ("other-host", 7, "pid:[1]"))
    reg.now += 200  # not yet expired by the registry's clock
    with pytest.raises(OperationFailed, match="holds the registry lease for 100 s"):
        Lease(reg.client(), REPO, cfg, purpose="t", ttl=300, settle=0).acquire()
    reg.now += 101
    Lease(reg.client(), REPO, cfg, purpose="t", ttl=300, settle=0, log=lambda _: None).acquire()


def _prune_requests(n: int) -> int:
    reg = MemRegistry()
    tags = [f"2026-{1 + i // 28:02d}-{1 + i % 28:02d}-v0.23.0-x" for i in range(n)]
    _releases(reg, REPO, tags, latest_at=tags[-1])
    reg.calls.clear()
    prune(reg.client(), REPO, 1, log=lambda _: None, settle=0)
    assert sum(t in reg.tags[REPO] for t in tags) == 2  # newest (= latest) and rollback target
    return len(reg.calls)


def test_prune_requests_grow_linearly(reg):
    small, large = _prune_requests(20), _prune_requests(80)
    assert large < 4.5 * small, (small, large)  # quadratic was 1,215 -> 14,535 (12x)


# 3: a rollback stays until someone promotes on purpose ---------------------------------


def test_a_rerun_does_not_undo_a_rollback(reg):
    _releases(reg, REPO, [A, B], latest_at=B)
    set_latest(reg.client(), REPO, A, log=lambda _: None)
    assert _at(reg) == A and B in rolled_back(reg.client(), REPO)
    out: list[str] = []
    # a re-run of the publish of B
    assert advance(reg.client(), REPO, parse_release_tag(B), log=out.append) is None
    assert _at(reg) == A and "was rolled back" in out[0]
    with pytest.raises(OperationFailed, match="--accept-rolled-back"):
        set_latest(reg.client(), REPO, B, mode="promote", log=lambda _: None)
    assert _at(reg) == A
    set_latest(reg.client(), REPO, B, mode="promote", log=lambda _: None,
               accept=Accept(rolled_back="fixed by the config change"))
    assert _at(reg) == B and B not in rolled_back(reg.client(), REPO)


# 4 and issue 19 item 3: a set moves together; the older of two tags refuses first ------


def test_a_refusal_while_moving_puts_the_moved_images_back(reg):
    for repo in (REPO, OTHER):
        _releases(reg, repo, [A, B, C], latest_at=A)

    def other_run_moves_other(method, path):
        if method == "PUT" and path == f"/v2/{REPO}/manifests/latest" and _at(reg, OTHER) == A:
            reg.point_latest(OTHER, B)  # a writer that ignores the lease

    reg.before = other_run_moves_other
    rels = [read_release(reg.client(), r, C) for r in (REPO, OTHER)]
    with pytest.raises(OperationFailed, match="latest moved during this run"):
        latest.move_set(reg.client(), rels, mode="promote", log=lambda _: None)
    assert _at(reg, REPO) == A  # undone


def test_the_older_of_two_tags_in_flight_refuses_before_moving_anything(reg):
    for repo in (REPO, OTHER):
        _releases(reg, repo, [A, B, C], latest_at=A)
    reg.point_latest(OTHER, C)  # the newer tag's promote got there first for this image
    with pytest.raises(OperationFailed, match="older than latest"):
        set_latest_many(reg.client(), [REPO, OTHER], B, mode="promote", log=lambda _: None)
    assert (_at(reg, REPO), _at(reg, OTHER)) == (A, C)


# 5: order by when recorded; the tag date only a bound ----------------------------------


def test_same_day_releases_order_by_when_recorded_not_by_name(reg):
    zeta, alpha = "2026-06-05-v0.23.0-zeta", "2026-06-05-v0.23.0-alpha"
    reg.add_release(REPO, zeta, created=time.time() - 60, benched=True)
    reg.add_release(REPO, alpha, created=time.time(), benched=True)
    reg.point_latest(REPO, zeta)
    assert set_latest(reg.client(), REPO, alpha, mode="promote", log=lambda _: None).moved
    assert [r.tag for r in list_releases(reg.client(), REPO)] == [alpha, zeta]


def test_a_future_dated_release_neither_blocks_nor_holds_a_keep_slot(reg):
    today = time.strftime("%Y-%m-%d", time.gmtime())
    typo, later = "2062-06-05-v0.23.0-typo", f"{today}-v0.23.0-next"
    reg.add_release(REPO, typo, created=time.time() - 60, benched=True)  # recorded before
    reg.point_latest(REPO, typo)
    reg.add_release(REPO, later, benched=True)
    assert set_latest(reg.client(), REPO, later, mode="promote", log=lambda _: None).moved
    assert plan_prune(reg.client(), REPO, 1).keep == [(later, "latest"),
                                                      (typo, "rollback target")]


def test_a_tag_dated_in_the_future_is_refused_as_bad_input():
    from imagebuild.registry.records import check_tag_date

    with pytest.raises(UserError, match="in the future") as err:
        check_tag_date(parse_release_tag("2062-01-01-v0.23.0-x"))
    assert err.value.exit_code == 2 and "today" in (err.value.fix or "")


# 6: rollback is gated -------------------------------------------------------------------


def test_rollback_refuses_never_benched_targets_and_forward_moves(reg):
    reg.add_release(REPO, A)  # never benched
    _releases(reg, REPO, [B, C], latest_at=B)
    with pytest.raises(OperationFailed, match="never benched"):
        set_latest(reg.client(), REPO, A, log=lambda _: None)
    with pytest.raises(OperationFailed, match="newer than latest"):
        set_latest(reg.client(), REPO, C, log=lambda _: None)
    assert _at(reg) == B
    set_latest(reg.client(), REPO, A, log=lambda _: None, accept=Accept(unmeasured="3 a.m."))
    assert _at(reg) == A


# 7: a dry run reads only ----------------------------------------------------------------


def test_promote_dry_run_writes_nothing(reg, matrix_dir):
    from imagebuild.plan import load_plan

    job = load_plan(matrix_dir / "matrix.yaml", "2026-06-18-dflashfix", "gb10").jobs[0]
    repo = job.image.repository
    reg.add_release(repo, A)  # latest unmeasured: the gate would annotate the candidate
    reg.point_latest(repo, A)
    reg.add_release(repo, str(job.tag), benched=True)
    reg.calls.clear()
    latest.promote_jobs(reg.client(), (job,), default_threshold=0.05, accept_regression=None,
                        accept_unmeasured="first measured release", dry_run=True,
                        log=lambda _: None)
    assert reg.writes() == []


# 8: same-host takeover only inside the same pid namespace -------------------------------


def test_a_live_lease_of_a_container_on_this_host_is_not_taken(reg, monkeypatch):
    _releases(reg, REPO, [A])
    cfg = read_release(reg.client(), REPO, A).config_descriptor
    host, _, _ = lease.identity()
    monkeypatch.setattr(lease, "identity", lambda: (host, 4_000_000, "pid:[4026599999]"))
    Lease(reg.client(), REPO, cfg, purpose="container", ttl=300, settle=0).acquire()
    monkeypatch.undo()
    with pytest.raises(OperationFailed, match="holds the registry lease"):
        Lease(reg.client(), REPO, cfg, purpose="t", settle=0).acquire()


# minor ----------------------------------------------------------------------------------


@pytest.mark.parametrize("expires", ["inf", "garbage", "1e300", "tomorrow", "nan", ""])
def test_a_lease_of_another_host_whose_expiry_is_unreadable_holds_the_run_off(reg, expires):
    """Issue 39: a lease this run cannot read may be live; it is held, not taken (exit 1,
    nothing written), and the error names the command that clears it; `unlock` then
    clears it and the next run takes the lease."""
    _releases(reg, REPO, [A])
    rel = read_release(reg.client(), REPO, A)
    doc = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "layers": [],
           "config": rel.config_descriptor,
           "annotations": {f"{LEASE}.owner": "elsewhere:1:x", f"{LEASE}.host": "elsewhere",
                           f"{LEASE}.expires": expires}}
    reg.client().put_manifest(REPO, LEASE_TAG, json.dumps(doc).encode(), OCI_MANIFEST)
    before = reg.client().head_manifest(REPO, LEASE_TAG)
    with pytest.raises(OperationFailed) as exc:
        Lease(reg.client(), REPO, rel.config_descriptor, purpose="t", settle=0,
              log=lambda _: None).acquire()
    assert exc.value.exit_code == 1
    assert "cannot read" in exc.value.message and "writes nothing" in exc.value.message
    assert f"unlock --image {REPO.rsplit('/', 1)[-1]}" in exc.value.fix
    assert reg.client().head_manifest(REPO, LEASE_TAG) == before  # not written over
    said: list[str] = []
    assert lease.clear_lease(reg.client(), REPO, log=said.append)
    assert "unreadable expiry" in said[0]
    Lease(reg.client(), REPO, rel.config_descriptor, purpose="t", settle=0).acquire()


def test_unlock_refuses_a_live_lease_unless_forced_and_a_dry_run_writes_nothing(reg):
    _releases(reg, REPO, [A])
    rel = read_release(reg.client(), REPO, A)
    held = Lease(reg.client(), REPO, rel.config_descriptor, purpose="t", settle=0).acquire()
    with pytest.raises(OperationFailed, match="is live for"):
        lease.clear_lease(reg.client(), REPO, log=lambda _: None)
    assert lease.clear_lease(reg.client(), REPO, force=True, dry_run=True, log=lambda _: None)
    assert reg.client().head_manifest(REPO, LEASE_TAG)[0] == held.digest
    assert lease.clear_lease(reg.client(), REPO, force=True, log=lambda _: None)
    assert reg.client().head_manifest(REPO, LEASE_TAG) is None
    assert not lease.clear_lease(reg.client(), REPO, log=lambda _: None)  # nothing left


def test_a_retried_delete_whose_first_attempt_succeeded_is_fine(reg):
    _releases(reg, REPO, [A, B, C], latest_at=C)
    reg.lost_delete = {reg.tags[REPO][A]}
    prune(reg.client(), REPO, 1, log=lambda _: None)
    assert sorted(t for t in reg.tags[REPO] if t[0] == "2") == [B, C]
    # A's results went with it: the only results indexes left are B's and C's
    c = reg.client()
    assert {t for t in reg.tags[REPO] if t.startswith("sha256-")} == {
        referrers.referrers_tag(read_release(c, REPO, t).digest) for t in (B, C)}


def test_forget_leaves_artifacts_whose_subject_is_another_release(reg):
    _releases(reg, REPO, [A, B])
    c = reg.client()
    a_digest, b_digest = (read_release(c, REPO, t).digest for t in (A, B))
    a_results = store.stored(c, REPO, A).digest
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": a_results, "size": 1,
         "artifactType": store.ARTIFACT_TYPE}]}  # B's index lists A's results
    c.put_manifest(REPO, referrers.referrers_tag(b_digest), json.dumps(index).encode(), OCI_INDEX)
    referrers.forget(c, REPO, b_digest)
    assert store.stored(c, REPO, A) is not None and a_digest in reg.manifests[REPO]


def test_a_truncated_tag_list_stops_prune_and_runner_clean(reg):
    tags = [A, B, C, "2026-06-04-v0.23.0-d"]
    _releases(reg, REPO, tags, latest_at=B)
    reg.tag_limit = 3  # the list ends before latest and its release
    with pytest.raises(OperationFailed, match="disagrees with a direct read of latest"):
        prune(reg.client(), REPO, 1, log=lambda _: None)
    with pytest.raises(OperationFailed, match="disagrees"):
        protected_releases(reg.client(), [REPO])
    reg.tag_limit = None
    assert all(t in reg.tags[REPO] for t in tags)


def test_a_failed_release_delete_keeps_its_bench_results(reg):
    """prune deletes the release before its results: when the DELETE of the release fails,
    the release stays with its results (not a release that reads as never benched)."""
    _releases(reg, REPO, [A, B, C], latest_at=C)
    a_digest = reg.tags[REPO][A]

    def refuse_the_release_delete(method, path):
        if method == "DELETE" and path.endswith(f"/manifests/{a_digest}"):
            raise OSError("the registry went away")

    reg.before = refuse_the_release_delete
    with pytest.raises(Exception, match="went away"):
        prune(reg.client(), REPO, 2, log=lambda _: None)
    reg.before = None
    assert A in reg.tags[REPO] and store.stored(reg.client(), REPO, A) is not None


@pytest.mark.parametrize("damaged", ["{not json", '["a list"]', '{"' + C + '": "no object"}',
                                     '{"' + C + '": {"to": 3}}'])
def test_a_damaged_rollbacks_record_is_a_registry_fault_and_is_not_overwritten(reg, damaged):
    """A damaged record of rollbacks stops promote and rollback with exit 1: read as "no
    rollbacks", a re-run would promote the rolled-back release and the next rollback
    would overwrite the record."""
    from imagebuild.registry.errors import RegistryFault
    from imagebuild.release import rollbacks

    _releases(reg, REPO, [A, B, C], latest_at=B)
    c = reg.client()
    doc = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
           "config": {**read_release(c, REPO, B).config_descriptor,
                      "mediaType": "application/vnd.oci.image.config.v1+json"},
           "layers": [], "annotations": {rollbacks.A_ROLLED: damaged}}
    c.put_manifest(REPO, rollbacks.ROLLBACKS_TAG, json.dumps(doc).encode(), OCI_MANIFEST)
    stored = reg.tags[REPO][rollbacks.ROLLBACKS_TAG]
    with pytest.raises(RegistryFault) as err:
        rolled_back(c, REPO)
    assert err.value.exit_code == 1
    with pytest.raises(RegistryFault):
        advance(c, REPO, parse_release_tag(C), log=lambda _: None)
    with pytest.raises(RegistryFault):
        set_latest(c, REPO, A, log=lambda _: None)
    assert reg.tags[REPO][rollbacks.ROLLBACKS_TAG] == stored and _at(reg) == B


def test_a_deadline_spent_mid_move_still_puts_the_set_back_and_drops_the_leases(reg):
    """The registry deadline runs out after the first image of a set moved: undoing that
    move and releasing the leases get a small fresh budget (deadline.grace), so the set
    is not left half-moved and no lease is left to expire."""
    from imagebuild.registry.errors import RegistryFault

    for repo in (REPO, OTHER):
        _releases(reg, repo, [A, B, C], latest_at=A)
    now = [0.0]
    c = reg.client()
    c.deadline = Deadline(100, clock=lambda: now[0])

    def the_registry_stalls(method, path):  # once REPO moved: OTHER's move spends it all
        if method == "HEAD" and path == f"/v2/{OTHER}/manifests/latest" and _at(reg) == C:
            now[0] += 1000

    reg.before = the_registry_stalls
    rels = [read_release(reg.client(), r, C) for r in (REPO, OTHER)]
    with pytest.raises(RegistryFault, match="deadline"):
        latest.move_set(c, rels, mode="promote", log=lambda _: None)
    reg.before = None
    assert _at(reg, REPO) == A and _at(reg, OTHER) == A
    assert all(LEASE_TAG not in reg.tags[r] for r in (REPO, OTHER))
    assert c.deadline.expired()  # the grace ended with the clean-up
