"""Regression tests of the release-state holes closed after issue 25's first round,
against the in-memory registry (each fails when its fix is reverted):

- a run paused longer than its lease TTL stops at its next write (every write is fenced
  by a lease check right before it) instead of writing over the run that took the lease
  over, and its undo leaves that run's move alone;
- the undo of a set puts back an image whose PUT landed but whose read-back failed;
- `rollback --all` moves every image or none (an image lacking the release, or without
  its bench results unless accepted, refuses the set);
- `--forward-only` is decided under the lease: a newer release promoted meanwhile leaves
  latest where it is, exit 0.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import requests

from imagebuild.errors import OperationFailed, UserError
from imagebuild.registry.records import A_TAG, LATEST, read_release
from imagebuild.release import latest, lease, rollbacks
from imagebuild.release.latest import Accept, set_latest_many
from imagebuild.release.lease import LEASE_TAG
from imagebuild.release.rollbacks import ROLLBACKS_TAG, rolled_back
from imagebuild.spec.tags import parse_release_tag
from tests.support.memregistry import MemRegistry

REPO, OTHER = "ns/img", "ns/other"
A, B, C = "2026-06-01-v0.23.0-a", "2026-06-02-v0.23.0-b", "2026-06-03-v0.23.0-c"
Z = "2026-05-31-v0.23.0-z"
THIRD = "ns/third"
T0 = 1_800_000_000.0
quiet = lambda _: None  # noqa: E731


@pytest.fixture
def reg(monkeypatch, tmp_path):
    monkeypatch.setenv("IMAGEBUILD_LOCK_DIR", str(tmp_path / "locks-0"))
    monkeypatch.setenv("IMAGEBUILD_LEASE_SETTLE", "0")
    monkeypatch.setattr(lease, "identity", lambda: ("host-a", 4_000_001, "pid:[1]"))
    r = MemRegistry()
    r.now = T0  # the registry's clock: lease expiry is judged by it
    return r


@contextmanager
def other_host(tmp_path):
    """Run as another machine: its own host name and local lock dir."""
    saved = lease.identity, os.environ["IMAGEBUILD_LOCK_DIR"]
    lease.identity = lambda: ("host-b", 4_000_002, "pid:[2]")
    os.environ["IMAGEBUILD_LOCK_DIR"] = str(tmp_path / "locks-1")
    try:
        yield
    finally:
        lease.identity, os.environ["IMAGEBUILD_LOCK_DIR"] = saved


def _at(reg, repo=REPO):
    rel = read_release(reg.client(), repo, LATEST)
    return rel.annotations[A_TAG] if rel else None


def _set(reg, tags, latest_at, benched=True):
    for repo in (REPO, OTHER):
        for tag in tags:
            reg.add_release(repo, tag, benched=benched)
        reg.point_latest(repo, latest_at)


def _pause_before(reg, when, then):
    """A hook: the first request `when(method, path)` matches finds this run paused past
    its lease TTL (the registry's clock jumps), while `then()` runs as another host."""
    done = [False]

    def hook(method, path):
        if not done[0] and when(method, path):
            done[0] = True
            reg.before = None
            reg.now += lease.lease_ttl() + 1
            then()
            reg.before = hook
    return hook, done


# fencing: a run paused past its lease ---------------------------------------------------


def test_a_run_paused_past_its_lease_stops_and_leaves_the_other_runs_set(reg, tmp_path):
    """Rollback --all to B pauses after moving REPO, before its next request for OTHER;
    another host takes the expired leases and rolls both back to A. The paused run stops
    at its next write (the lease is no longer its generation) and does not put REPO
    "back" over the other run's move: the set stays together at A."""
    _set(reg, [A, B, C], latest_at=C)

    def other_rolls_back():
        with other_host(tmp_path):
            set_latest_many(reg.client(), [REPO, OTHER], A, log=quiet)

    hook, done = _pause_before(
        reg, lambda m, p: m == "GET" and p == f"/v2/{OTHER}/manifests/{ROLLBACKS_TAG}"
        and _at(reg) == B, other_rolls_back)
    reg.before = hook
    with pytest.raises(OperationFailed, match="lost the registry lease"):
        set_latest_many(reg.client(), [REPO, OTHER], B, log=quiet)
    assert done[0]
    assert (_at(reg, REPO), _at(reg, OTHER)) == (A, A)


def test_a_run_paused_between_reading_and_writing_the_rollbacks_record_drops_nothing(
        reg, tmp_path):
    """The pause falls after the paused run read OTHER's record of rollbacks and before
    it writes it: without the fence its PUT replaces the record the other host wrote."""
    _set(reg, [A, B, C], latest_at=C)

    def other_rolls_back():
        with other_host(tmp_path):
            set_latest_many(reg.client(), [REPO, OTHER], A, log=quiet)

    seen = []

    def after_the_record_read(method, path):
        seen.append((method, path))
        return (method == "HEAD" and path == f"/v2/{OTHER}/manifests/{LEASE_TAG}"
                and seen[-2] == ("GET", f"/v2/{OTHER}/manifests/{ROLLBACKS_TAG}")
                and _at(reg) == B)

    hook, done = _pause_before(reg, after_the_record_read, other_rolls_back)
    reg.before = hook
    with pytest.raises(OperationFailed, match="lost the registry lease"):
        set_latest_many(reg.client(), [REPO, OTHER], B, log=quiet)
    assert done[0]
    assert rolled_back(reg.client(), OTHER)[C]["to"] == A  # the other host's entry
    assert (_at(reg, REPO), _at(reg, OTHER)) == (A, A)


def test_a_lease_renewal_is_fenced(reg, tmp_path, monkeypatch):
    """A renewal due while the run was paused past its TTL must not take the lease back
    from the run that took it over (a renewal PUT is a write like any other)."""
    _set(reg, [A, B], latest_at=B)
    cfg = read_release(reg.client(), REPO, A).config_descriptor
    clock = [0.0]
    monkeypatch.setattr(lease, "time", SimpleNamespace(
        time=lambda: reg.now, monotonic=lambda: clock[0], sleep=lambda _s: None))
    held = lease.Lease(reg.client(), REPO, cfg, purpose="long work", log=quiet).acquire()
    clock[0] += held.ttl / 2  # renewal due, not yet lapsed (the test below)

    def other_takes_it():
        with other_host(tmp_path):
            lease.Lease(reg.client(), REPO, cfg, purpose="other", log=quiet).acquire()

    hook, done = _pause_before(reg, lambda m, p: m == "GET" and p == "/v2/", other_takes_it)
    reg.before = hook
    with pytest.raises(OperationFailed, match="lost the registry lease"):
        held.check()
    assert done[0]
    now = read_release(reg.client(), REPO, LEASE_TAG)
    assert now is not None and now.annotations[f"{lease.LEASE}.host"] == "host-b"


def test_a_lease_not_renewed_for_most_of_its_ttl_is_lost_even_when_its_tag_is_back(
        reg, tmp_path, monkeypatch):
    """The split set the property test found: a run whose lease went unrenewed past its
    TTL (a slow registry, reads only) was taken over by another run, which moved the set
    and released the lease; the first run's renewal then re-created its lease and it
    wrote latest of one image over the newer release. A lease not renewed within most of
    its TTL is lost, whatever the tag says: check() stops before any write."""
    _set(reg, [A, B], latest_at=B)
    cfg = read_release(reg.client(), REPO, A).config_descriptor
    clock = [0.0]
    monkeypatch.setattr(lease, "time", SimpleNamespace(
        time=lambda: reg.now, monotonic=lambda: clock[0], sleep=lambda _s: None))
    held = lease.Lease(reg.client(), REPO, cfg, purpose="slow work", log=quiet).acquire()
    clock[0] += held.ttl * 0.95  # nothing renewed it
    writes = len(reg.writes())
    with pytest.raises(OperationFailed, match="without renewal"):
        held.check()
    assert len(reg.writes()) == writes  # no renewal PUT


def test_a_prune_paused_past_its_lease_before_a_delete_deletes_nothing(reg, tmp_path):
    """Prune --keep 1 plans to delete A; paused before its last read of A, another host
    takes the expired lease and rolls back to A. The prune's delete is fenced: it stops."""
    from imagebuild.release.prune import prune

    for tag in (A, B, C):
        reg.add_release(REPO, tag, benched=True)
    reg.point_latest(REPO, C)

    def other_rolls_back():
        with other_host(tmp_path):
            set_latest_many(reg.client(), [REPO], A, log=quiet)

    hook, done = _pause_before(
        reg, lambda m, p: m == "HEAD" and p == f"/v2/{REPO}/manifests/{A}"
        and f"/v2/{REPO}/manifests/{LEASE_TAG}" in [c[1] for c in reg.writes()],
        other_rolls_back)
    reg.before = hook
    with pytest.raises(OperationFailed, match="lost the registry lease"):
        prune(reg.client(), REPO, 1, log=quiet)
    assert done[0]
    assert A in reg.tags[REPO] and _at(reg) == A


def test_a_run_paused_while_another_host_prunes_puts_its_half_move_back(reg, tmp_path):
    """Paused past its leases after moving REPO, the other host's prune takes both leases
    (and lets them go): the paused run's next write stops, and its undo takes a fresh
    lease to put REPO back (leaving it would split the set)."""
    from imagebuild.release.prune import prune

    _set(reg, [Z, A, B, C], latest_at=C)

    def other_prunes():
        with other_host(tmp_path):
            for repo in (REPO, OTHER):
                prune(reg.client(), repo, 1, log=quiet)

    hook, done = _pause_before(
        reg, lambda m, p: m == "GET" and p == f"/v2/{OTHER}/manifests/{ROLLBACKS_TAG}"
        and _at(reg) == B, other_prunes)
    reg.before = hook
    with pytest.raises(OperationFailed, match="lost the registry lease"):
        set_latest_many(reg.client(), [REPO, OTHER], B, log=quiet)
    assert done[0] and Z not in reg.tags[REPO]  # the prune ran, under REPO's lease too
    assert (_at(reg, REPO), _at(reg, OTHER)) == (C, C)


def test_an_undo_does_not_write_under_another_runs_live_lease(reg, tmp_path):
    """Paused past its leases after moving REPO, another host's run takes both leases
    and is still at work: the paused run stops, and its undo does not write REPO under
    that run's live lease (it says where REPO is instead)."""
    _set(reg, [A, B, C], latest_at=C)
    cfg = read_release(reg.client(), REPO, A).config_descriptor

    def other_holds_the_leases():
        with other_host(tmp_path):
            for repo in (REPO, OTHER):
                lease.Lease(reg.client(), repo, cfg, purpose="at work", log=quiet).acquire()

    hook, done = _pause_before(
        reg, lambda m, p: m == "GET" and p == f"/v2/{OTHER}/manifests/{ROLLBACKS_TAG}"
        and _at(reg) == B, other_holds_the_leases)
    reg.before = hook
    out: list[str] = []
    with pytest.raises(OperationFailed, match="lost the registry lease"):
        set_latest_many(reg.client(), [REPO, OTHER], B, log=out.append)
    assert done[0]
    assert _at(reg, REPO) == B
    assert any("could not put latest back" in line and "holds the registry lease" in line
               for line in out)


def test_two_runs_rolling_back_to_the_same_release_leave_the_set_there(reg, tmp_path):
    """Two maintainers roll back to B at once; one pauses past its leases after moving
    REPO, the other finishes the whole set. The paused run's undo sees every image at B:
    putting REPO back would split a whole set."""
    _set(reg, [A, B, C], latest_at=C)

    def other_rolls_back_too():
        with other_host(tmp_path):
            set_latest_many(reg.client(), [REPO, OTHER], B, log=quiet)

    hook, done = _pause_before(
        reg, lambda m, p: m == "GET" and p == f"/v2/{OTHER}/manifests/{ROLLBACKS_TAG}"
        and _at(reg) == B, other_rolls_back_too)
    reg.before = hook
    with pytest.raises(OperationFailed, match="lost the registry lease"):
        set_latest_many(reg.client(), [REPO, OTHER], B, log=quiet)
    assert done[0]
    assert (_at(reg, REPO), _at(reg, OTHER)) == (B, B)


# undo: a PUT that landed but whose read-back failed -------------------------------------


def test_a_landed_put_whose_read_back_failed_is_put_back(reg):
    """Of a set of three, the second image's PUT lands but its read-back fails: the undo
    reads latest again and puts that image back too, not only the first."""
    _set(reg, [A, C], latest_at=A)
    for tag in (A, C):
        reg.add_release(THIRD, tag, benched=True)
    reg.point_latest(THIRD, A)
    puts = []

    def read_back_fails(method, path):
        if path == f"/v2/{OTHER}/manifests/{LATEST}":
            if method == "PUT":
                puts.append(path)
            elif method == "HEAD" and len(puts) == 1:
                puts.append("failed")
                raise requests.ConnectionError("connection reset")

    reg.before = read_back_fails
    rels = [read_release(reg.client(), r, C) for r in (REPO, OTHER, THIRD)]
    with pytest.raises(OperationFailed, match=r"cannot reach the registry.*1 attempt"):
        latest.move_set(reg.client(), rels, mode="promote", log=quiet)
    reg.before = None
    put = f"/v2/{OTHER}/manifests/{LATEST}"
    assert puts == [put, "failed", put]  # the move, its failed read-back, the undo
    assert (_at(reg, REPO), _at(reg, OTHER), _at(reg, THIRD)) == (A, A, A)


def test_the_undo_leaves_a_move_it_did_not_write(reg):
    """Promote of C moved REPO; a writer that ignores the lease (a hand-run `crane tag`)
    then moves the whole set to B, so the move of OTHER refuses. The undo reads REPO's
    latest again: B is not what this run wrote, so it stays (putting A back would split
    the set the other writer left together)."""
    _set(reg, [A, B, C], latest_at=A)

    def by_hand(method, path):
        if method == "HEAD" and path == f"/v2/{OTHER}/manifests/{LATEST}" and _at(reg) == C:
            for repo in (REPO, OTHER):
                reg.point_latest(repo, B)

    reg.before = by_hand
    rels = [read_release(reg.client(), r, C) for r in (REPO, OTHER)]
    with pytest.raises(OperationFailed, match="latest moved during this run"):
        latest.move_set(reg.client(), rels, mode="promote", log=quiet)
    assert (_at(reg, REPO), _at(reg, OTHER)) == (B, B)


# rollback --all: every image or none ----------------------------------------------------


def test_rollback_all_refuses_when_an_image_lacks_the_release(reg):
    _set(reg, [B, C], latest_at=C)
    reg.add_release(REPO, A, benched=True)  # OTHER never had A (or it was pruned)
    with pytest.raises(UserError, match="would split a set") as err:
        set_latest_many(reg.client(), [REPO, OTHER], A, log=quiet)
    assert "--image" in err.value.fix
    assert (_at(reg, REPO), _at(reg, OTHER)) == (C, C)


def test_rollback_all_to_a_release_benched_for_one_image_moves_none_unless_accepted(reg):
    for repo in (REPO, OTHER):
        reg.add_release(repo, A, benched=repo == REPO)
        reg.add_release(repo, C, benched=True)
        reg.point_latest(repo, C)
    with pytest.raises(OperationFailed, match="never benched"):
        set_latest_many(reg.client(), [REPO, OTHER], A, log=quiet)
    assert (_at(reg, REPO), _at(reg, OTHER)) == (C, C)
    set_latest_many(reg.client(), [REPO, OTHER], A, log=quiet,
                    accept=Accept(unmeasured="the old one is known good"))
    assert (_at(reg, REPO), _at(reg, OTHER)) == (A, A)


def test_rollback_all_leaves_an_image_on_its_own_release_line_alone(reg):
    """An image that lacks the release and whose latest is no release of the images that
    move (another target's image; one never released) is no part of their set."""
    _set(reg, [A, C], latest_at=C)
    reg.add_release(THIRD, B, benched=True)
    reg.point_latest(THIRD, B)
    out: list[str] = []
    set_latest_many(reg.client(), [REPO, OTHER, THIRD, "ns/never"], A, log=out.append)
    assert (_at(reg, REPO), _at(reg, OTHER), _at(reg, THIRD)) == (A, A, B)
    assert sum("left alone" in line for line in out) == 2


# --forward-only under the lease ---------------------------------------------------------


def _jobs(tag):
    bench = SimpleNamespace(target=SimpleNamespace(bench=None), method="none")
    return tuple(SimpleNamespace(image=SimpleNamespace(repository=r),
                                 tag=parse_release_tag(tag), cell=bench) for r in (REPO, OTHER))


def test_forward_only_is_decided_under_the_lease(reg):
    """Publish of B (forward only) reads latest at A; before it holds the lease, the
    release workflow of C promotes C. Under the lease B is older than latest: latest
    stays at C and publish's promote part is not an error."""
    _set(reg, [A, B, C], latest_at=A)

    def c_promoted_meanwhile(method, path):
        if method == "PUT" and path == f"/v2/{REPO}/manifests/{LEASE_TAG}" \
                and _at(reg) == A:
            for repo in (REPO, OTHER):
                reg.point_latest(repo, C)

    reg.before = c_promoted_meanwhile
    out: list[str] = []
    moves = latest.promote_jobs(reg.client(), _jobs(B), default_threshold=0.05,
                                accept_regression=None, forward_only=True, log=out.append)
    assert moves == []
    assert any("latest stays" in line and "older than latest" in line for line in out)
    assert (_at(reg, REPO), _at(reg, OTHER)) == (C, C)


# a lease that expired while its holder worked -------------------------------------------


def test_an_expired_lease_taken_again_finds_the_set_moved_and_stays_together(
        reg, tmp_path, monkeypatch):
    """The interleaving the release property test found (a publish on a slow registry
    while another host publishes the next release). The promote of the set A -> B is
    slow: its leases are older than the TTL when it reaches its first move, though
    nobody has taken them yet, so the fence (the lease tag still names our manifest)
    passes. Right after it, before the PUT that takes the lease again, the other host
    takes the expired leases over and promotes the set to C. Renewing the expired lease
    and moving on would put REPO at B over C, then OTHER refuses (latest moved) and the
    undo puts REPO back to A: the set split at (A, C). The lease is taken again like any
    expired lease, and the set is read again under it (`retake`): latest moved, the run
    stops before any move and the set stays together at C."""
    _set(reg, [A, B, C], latest_at=A)
    monkeypatch.setattr(lease, "time", SimpleNamespace(  # one clock: the slow registry's
        time=lambda: reg.now, monotonic=lambda: reg.now, sleep=lambda _s: None))
    phase = ["reading"]

    def hook(method, path):
        if phase[0] == "reading" and method == "HEAD" and path == f"/v2/{REPO}/manifests/{LATEST}":
            phase[0] = "slow"  # the first move's check: the leases expired by now
            reg.now += lease.lease_ttl() + 1
        elif phase[0] == "slow" and method not in ("GET", "HEAD"):  # its next write
            phase[0] = "done"
            reg.before = None
            with other_host(tmp_path):
                latest.promote_jobs(reg.client(), _jobs(C), default_threshold=0.05,
                                    accept_regression=None, log=quiet)
            reg.before = hook

    reg.before = hook
    with pytest.raises(OperationFailed, match="latest moved while this run's lease had lapsed"):
        latest.promote_jobs(reg.client(), _jobs(B), default_threshold=0.05,
                            accept_regression=None, log=quiet)
    assert phase[0] == "done"
    assert (_at(reg, REPO), _at(reg, OTHER)) == (C, C)


def _slow_after_first_move(reg, monkeypatch, then=lambda: None):
    """A registry slow enough that the leases lapse right after the set's first move
    (the e2e slice's 2 s TTL on a loaded host), `then()` run at that moment."""
    monkeypatch.setattr(lease, "time", SimpleNamespace(
        time=lambda: reg.now, monotonic=lambda: reg.now, sleep=lambda _s: None))
    hook, moved = _pause_before(
        reg, lambda method, path: method == "PUT" and path.endswith(f"/manifests/{LATEST}"),
        then)
    reg.before = hook
    return moved


@pytest.mark.parametrize("accept_rolled_back", [False, True])
def test_a_first_promotion_whose_leases_lapse_mid_set_is_finished(reg, monkeypatch,
                                                                 accept_rolled_back):
    """The split set the e2e slice found against distribution: the set had no latest, so
    the image moved first cannot be put back, and the leases lapsed before the second
    move (nobody took them). The run takes its lease again, finds the set where it left
    it and finishes the move. With A rolled back once and promoted on purpose, its
    record is forgiven after every move: the first image's lapsed lease stops the
    forgiving (a re-run finishes it), never the set half-moved."""
    for repo in (REPO, OTHER):
        reg.add_release(repo, A, benched=True)
        if accept_rolled_back:
            cfg = read_release(reg.client(), repo, A).config_descriptor
            rollbacks.record(reg.client(), repo, A, Z, cfg)
    moved = _slow_after_first_move(reg, monkeypatch)
    try:
        latest.promote_jobs(reg.client(), _jobs(A), default_threshold=0.05,
                            accept_regression=None, log=quiet,
                            accept_rolled_back="on purpose" if accept_rolled_back else None)
    except OperationFailed as exc:
        assert accept_rolled_back and "without renewal" in str(exc), exc
    assert moved[0]
    assert (_at(reg, REPO), _at(reg, OTHER)) == (A, A)


def test_a_lapsed_lease_taken_by_another_live_run_stops_the_set(reg, tmp_path, monkeypatch):
    """The same lapse, but another host took the expired lease and still holds it: the
    run does not write under it (its live lease refuses the retake)."""
    for repo in (REPO, OTHER):
        reg.add_release(repo, A, benched=True)

    def other_takes_the_lease():
        with other_host(tmp_path):
            for repo in (REPO, OTHER):
                cfg = read_release(reg.client(), repo, A).config_descriptor
                lease.Lease(reg.client(), repo, cfg, purpose="other", log=quiet).acquire()

    _slow_after_first_move(reg, monkeypatch, other_takes_the_lease)
    writes = len(reg.writes())
    with pytest.raises(OperationFailed, match="holds the registry lease"):
        latest.promote_jobs(reg.client(), _jobs(A), default_threshold=0.05,
                            accept_regression=None, log=quiet)
    assert _at(reg, OTHER) is None  # nothing written under the other run's lease
    assert not [w for w in reg.writes()[writes:] if f"/{OTHER}/manifests/{LATEST}" in w[1]]
