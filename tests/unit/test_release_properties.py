"""The release-state invariants (docs/design.md, "Release state invariants"), as a
stateful property test: two clients on two hosts interleave publish, promote, rollback
and prune (and their dry runs) against the in-memory registry, with a crash injected at
any registry request of a command (the run is killed there; its re-run follows) and one
client's whole command run in the middle of the other's. After every step:

1. latest of every image names an existing release tag (same manifest) that passed
   smoke and was measured (every release here is benched or recorded unmeasured);
2. the images promoted together (both, always) have latest at the same release;
3. nothing prune deleted is latest, its rollback target, one of the newest N or a result
   of a kept release;
4. a rollback stays: publish and promote without --accept-rolled-back never move latest
   to a release that was rolled back;
5. a dry run writes nothing (an invariant on the registry's write log).
And what the fixes behind them promise: latest never vanishes once set, a rollback never
moves it forward, publish and promote never move it to a release dated in the future, a
failed command leaves latest of every image it moved where it was (a writer that ignores
the lease moves another image's latest mid-command), a lease is honoured until it expires
by the registry's clock (each host's own clock is an hour off) and then taken over, a
container's lease on the same host and one whose expiry cannot be read are honoured, a
prune whose DELETE answers get lost still finishes, a rollback target was measured in
every image unless accepted with a reason, a tag list that disagrees with a direct read
of latest (the registry loses the page that holds latest) stops the prune, and a client
paused past its lease TTL (another host takes the lease over meanwhile) stops at its
next write instead of splitting a set (every write is fenced by a lease check right
before it; a pause between that check and its write is beyond a registry without
conditional writes, so pauses fall before reads), also while recording a rollback (the
record keeps the entry of the run that took over), and a run whose lease lapsed on a
slow registry (nobody took it yet) does not renew it in place: another host may take it
over between the check and the write (found here as a split set); a set's move takes it
again and reads the set again under it instead. Releases are recorded in
publish order, some on the same day with names in reverse alphabetical order, some with a typo'd
future date; some are benched for one image only (one just before the last release of
the starting history, so a rollback can reach it); the registry may be slow (its clock
moves on per request, so a lease expires mid-command unless renewed) and its tag list
short. The run is derandomized: the same examples every time.
Commands may refuse (exit 1 or 2); none may end in anything but an ImagebuildError.
"""

from __future__ import annotations

import calendar
import datetime as dt
import os
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from types import SimpleNamespace

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from imagebuild.bench import store
from imagebuild.errors import ImagebuildError
from imagebuild.registry import referrers
from imagebuild.registry.client import OCI_INDEX, OCI_MANIFEST
from imagebuild.registry.records import (
    A_TAG,
    DATE_SKEW,
    LATEST,
    OCI_CONFIG,
    check_tag_date,
    compact,
    read_release,
)
from imagebuild.release import latest, lease
from imagebuild.release.prune import plan_prune, prune
from imagebuild.release.rollbacks import ROLLBACKS_TAG, rolled_back
from imagebuild.spec.tags import parse_release_tag
from tests.support.memregistry import Crash, MemRegistry

REPOS = ("ns/a", "ns/b")  # promoted together, always
T0 = 1_800_000_000.0
IDS = (("host-a", 4_000_001, "pid:[1]"), ("host-b", 4_000_002, "pid:[2]"))  # dead pids
CONTAINER = 4_000_003, "pid:[3]"  # a container on a host: its own pid namespace
SKEW = (3600.0, -3600.0)  # each host's wall clock against the registry's
DAY0 = dt.date(2026, 1, 1)
FUTURE = dt.date(2062, 6, 5)  # a typo'd year
NAMES = "zyxwvutsrqponmlkjihgfedcba"  # later releases get names earlier in the alphabet
quiet = lambda _: None  # noqa: E731

COMMANDS = st.one_of(
    # which images have bench results, the smoke verdict, the tag's date: the next
    # day, the same day as the one before, or a typo'd future date (pushed by hand)
    st.tuples(st.just("publish"), st.sampled_from(["both", "both", "a", "none"]),
              st.sampled_from(["passed", "passed", "passed", "failed"]),
              st.sampled_from(["next", "next", "same", "future"])),
    # which release: "newest", "previous" (the newest before latest), "rolled" (one that
    # was rolled back) or any by index: the states where the invariants bite; then
    # --accept-rolled-back and --accept-unmeasured
    st.tuples(st.just("promote"), st.one_of(st.sampled_from(["newest", "rolled"]),
                                            st.integers(0, 9)), st.booleans(),
              st.sampled_from([False, False, True])),
    st.tuples(st.just("rollback"), st.one_of(st.just("previous"), st.integers(0, 9))),
    # --keep N, and the registry's tag list cut short to this many tags (None: whole),
    # or without latest and the tags on its manifest (a lost page)
    st.tuples(st.just("prune"), st.integers(1, 3),
              st.sampled_from([None, None, "hide latest", 2, 4])),
)


class ReleaseState(RuleBasedStateMachine):
    repos = REPOS  # promoted together

    def make_registry(self):  # the e2e slice runs the same against distribution
        reg = MemRegistry()
        reg.now = T0
        return reg

    def __init__(self) -> None:
        super().__init__()
        self.reg = self.make_registry()
        self.published: list[str] = []
        self.rolled: dict[str, set[str]] = {r: set() for r in self.repos}
        self.order: dict[str, int] = {}  # tag -> when recorded (publish order)
        self.day = DAY0 - dt.timedelta(days=1)
        self.had_latest: set[str] = set()
        self.dry_writes: list[tuple[str, str]] = []  # what any dry run sent that writes
        self.accepted: set[tuple[str, str]] = set()  # (repo, tag) rolled back to unmeasured
        self.locks = tempfile.mkdtemp(prefix="release-props-")
        self.who = 0
        os.environ["IMAGEBUILD_LEASE_SETTLE"] = "0"
        self.mem = self.reg.now is not None
        if self.mem:  # each host's clocks: wall clock skewed, monotonic with the registry
            lease.time = SimpleNamespace(  # type: ignore[assignment]
                time=lambda: self.reg.now + SKEW[self.who], monotonic=lambda: self.reg.now,
                sleep=lambda _s: None)

    def teardown(self) -> None:
        lease.time = time  # type: ignore[assignment]

    # -- running a command as one client

    @contextmanager
    def as_client(self, who: int):
        saved = (lease.identity, os.environ.get("IMAGEBUILD_LOCK_DIR"), self.who)
        lease.identity = lambda: IDS[who]
        os.environ["IMAGEBUILD_LOCK_DIR"] = os.path.join(self.locks, str(who))
        self.who = who
        try:
            yield
        finally:
            lease.identity, self.who = saved[0], saved[2]
            if saved[1] is None:
                os.environ.pop("IMAGEBUILD_LOCK_DIR", None)
            else:
                os.environ["IMAGEBUILD_LOCK_DIR"] = saved[1]

    def _pinned(self, cmd: tuple) -> tuple:
        """A promote or rollback names its release by its place in publish order (the
        other client may publish meanwhile: "newest" would then mean another one)."""
        if cmd[0] in ("promote", "rollback") and (tag := self.tag(cmd[1])):
            return (cmd[0], self.order[tag], *cmd[2:])
        return cmd

    def _past_the_lease(self) -> None:
        """The registry's clock moves past every lease written so far."""
        self.reg.now += lease.lease_ttl() + 1

    def _hooked(self, cmd: tuple, hook: Callable[[str, str], None]) -> None:
        """Client 0 runs `cmd` with `hook` called before each of its registry requests."""
        self.reg.before = hook
        try:
            with self.as_client(0):
                self.execute(cmd)
        finally:
            self.reg.before = None

    def _meanwhile(self, cmd: tuple, hook: Callable[[str, str], None]) -> None:
        """Inside client 0's `hook`: client 1 runs `cmd` whole, then client 0 goes on."""
        self.reg.before = None
        with self.as_client(1):
            self.execute(cmd)
        self.reg.before = hook

    def tag(self, i: int | str) -> str | None:
        if not self.published:
            return None
        if isinstance(i, int):
            return self.published[i % len(self.published)]
        now = self.latest_tags()[self.repos[0]]
        if i == "rolled" and self.rolled[self.repos[0]]:
            return sorted(self.rolled[self.repos[0]])[-1]
        if i == "previous" and now:
            c = self.reg.client()
            older = [t for t in self.published[:self.order[now]]
                     if store.stored(c, self.repos[0], t)]
            return older[-1] if older else now
        return self.published[-1]

    def latest_tags(self) -> dict[str, str | None]:
        c = self.reg.client()
        out = {}
        for repo in self.repos:
            rel = read_release(c, repo, LATEST)
            out[repo] = rel.annotations.get(A_TAG) if rel else None
        return out

    def _jobs(self, tag: str):
        bench = SimpleNamespace(target=SimpleNamespace(bench=None), method="none")
        return tuple(SimpleNamespace(image=SimpleNamespace(repository=r),
                                     tag=parse_release_tag(tag), cell=bench) for r in self.repos)

    def execute(self, cmd: tuple, *, dry_run: bool = False) -> bool:
        """One command; refusals are fine (False), anything but an ImagebuildError is not."""
        c = self.reg.client()
        kind = cmd[0]
        mark = len(self.reg.calls)
        try:
            if kind == "publish":
                tag = self._publish(*cmd[1:])
                latest.promote_jobs(c, self._jobs(tag), default_threshold=0.05,
                                    accept_regression=None, forward_only=True,
                                    dry_run=dry_run, log=quiet)
            elif kind == "promote" and (tag := self.tag(cmd[1])):
                latest.promote_jobs(c, self._jobs(tag), default_threshold=0.05,
                                    accept_regression=None, dry_run=dry_run, log=quiet,
                                    accept_rolled_back="on purpose" if cmd[2] else None,
                                    accept_unmeasured="on purpose" if cmd[3] else None)
            elif kind == "rerun" and (tag := self.tag(cmd[1])):  # publish's promote part
                latest.promote_jobs(c, self._jobs(tag), default_threshold=0.05,
                                    accept_regression=None, forward_only=True,
                                    dry_run=dry_run, log=quiet)
            elif kind == "rollback" and (tag := self.tag(cmd[1])):
                accept = latest.Accept(unmeasured="known good" if cmd[2:] and cmd[2] else None)
                latest.set_latest_many(c, list(self.repos), tag, dry_run=dry_run, log=quiet,
                                       accept=accept)
            elif kind == "prune":
                limit = getattr(self.reg, "tag_limit", None)
                if self.mem:
                    self.reg.tag_limit = cmd[2] if cmd[2] != "hide latest" else None
                    self.reg.hide_latest = cmd[2] == "hide latest"
                try:
                    for repo in self.repos:
                        prune(c, repo, cmd[1], dry_run=dry_run, log=quiet)
                finally:
                    if self.mem:
                        self.reg.tag_limit, self.reg.hide_latest = limit, False
        except ImagebuildError:
            return False
        finally:
            if dry_run:
                self.dry_writes += [w for w in self.reg.calls[mark:]
                                    if w[0] not in ("GET", "HEAD")]
        return True

    def _publish(self, benched: str, smoke: str, when: str) -> str:
        """Push and record a new release of every image (not crashed here: the registry
        is revived for it), recorded after any before. A future-dated one is pushed as by
        hand (publish itself refuses its tag before pushing)."""
        n = len(self.published)
        if when == "next" or not self.published:
            self.day += dt.timedelta(days=1)
        date = FUTURE if when == "future" else self.day
        tag = f"{date}-v0.23.0-{NAMES[n % len(NAMES)]}{n}"
        if when != "future":
            check_tag_date(parse_release_tag(tag))  # type: ignore[arg-type]
        created = calendar.timegm(self.day.timetuple()) + 60.0 * n
        crash, self.reg.crash_at = self.reg.crash_at, None
        before, self.reg.before = self.reg.before, None
        for repo in self.repos:
            has = benched == "both" or (benched == "a" and repo == self.repos[0])
            self.reg.add_release(repo, tag, smoke=smoke, benched=has and smoke == "passed",
                                 created=created)
        self.reg.crash_at, self.reg.before = crash, before
        self.order[tag] = n
        self.published.append(tag)
        return tag

    def observe(self, cmd: tuple, before: dict[str, str | None]) -> None:
        """Update the model of rollbacks from what the command did, and check (4), that a
        rollback never moves latest forward and that publish and promote never move it
        to a future-dated release."""
        after = self.latest_tags()
        for repo in self.repos:
            if before[repo] == after[repo] or after[repo] is None:
                continue
            if cmd[0] == "rollback":
                assert before[repo] is not None and (
                    self.order[after[repo]] < self.order[before[repo]]), (  # type: ignore[index]
                    f"{cmd} moved {repo} forward: {before[repo]} -> {after[repo]}")
            else:
                rt = parse_release_tag(after[repo])  # type: ignore[arg-type]
                assert rt and rt.date <= dt.datetime.now(dt.UTC).date() + DATE_SKEW, (
                    f"{cmd} moved {repo} to the future-dated {after[repo]}")
            if cmd[0] == "rollback":
                if before[repo]:
                    self.rolled[repo].add(before[repo])  # type: ignore[arg-type]
                self.rolled[repo].discard(after[repo])
                if cmd[2:] and cmd[2]:  # --accept-unmeasured
                    self.accepted.add((repo, after[repo]))  # type: ignore[arg-type]
            elif cmd[0] == "promote" and cmd[2]:
                self.rolled[repo].discard(after[repo])
            else:
                assert after[repo] not in self.rolled[repo], (
                    f"{cmd} moved {repo} to {after[repo]}, which was rolled back")

    def protected_now(self, keep: int) -> dict[str, set[str]]:
        """What prune must keep, from the model: publish order is release order."""
        out = {}
        c = self.reg.client()
        lt = self.latest_tags()
        for repo in self.repos:
            alive = [t for t in self.published if t in self.reg.tags.get(repo, {})]
            keep_set = set(alive[-keep:])
            if lt[repo]:
                keep_set.add(lt[repo])  # type: ignore[arg-type]
                now = self.order[lt[repo]]  # type: ignore[index]
                rels = [r for t in alive if self.order[t] < now
                        and (r := read_release(c, repo, t)) and r.passed]
                older = [r.tag for r in rels]
                measured = [r.tag for r in rels
                            if not r.unmeasured and store.stored(c, repo, r.tag)]
                if measured or older:  # the one `rollback` takes without an override
                    keep_set.add((measured or older)[-1])
            out[repo] = keep_set
        return out

    # -- rules

    @initialize(n=st.integers(0, 5), first=st.sampled_from(["both", "both", "none"]),
                middle=st.sampled_from(["a", "none", "both"]))
    def history(self, n, first, middle):
        """Start from a few releases, the last promoted (the first unbenched and promoted
        unmeasured when `first` is "none"; the one before the last benched as `middle`
        says): enough for prune to delete and rollback to go back, to a release
        measured in one image only too."""
        for i in range(n):
            benched = first if i == 0 else middle if i == n - 2 else "both"
            with self.as_client(0):
                self.execute(("publish", benched, "passed", "next"))
                if i == 0 and first == "none":
                    self.execute(("promote", 0, False, True))


    @rule(cmd=COMMANDS, who=st.integers(0, 1),
          crash_at=st.one_of(st.none(), st.integers(0, 50)))
    def command(self, cmd, who, crash_at):
        if cmd[0] in ("promote", "rollback") and (tag := self.tag(cmd[1])):
            cmd = (cmd[0], self.order[tag], *cmd[2:])  # its re-run names the same release
        keep = self.protected_now(cmd[1]) if cmd[0] == "prune" else None
        results = {repo: {t for t in ts if store.stored(self.reg.client(), repo, t)}
                   for repo, ts in keep.items()} if keep else {}
        before = self.latest_tags()
        with self.as_client(who):
            self.reg.crash_at = crash_at
            try:
                self.execute(cmd)
                self.reg.revive()
            except Crash:
                self.reg.revive()
                if cmd[0] == "publish":  # its re-run: the release exists now
                    cmd = ("promote", len(self.published) - 1, False, False)
                self.execute(cmd)  # the re-run of the killed command, same host
        self.observe(cmd, before)
        for repo, tags in (keep or {}).items():
            for t in tags:
                assert t in self.reg.tags[repo], f"prune deleted protected {repo}:{t}"
            for t in results[repo]:
                assert store.stored(self.reg.client(), repo, t), f"results of {repo}:{t} gone"

    @precondition(lambda self: self.published)
    @rule(a=COMMANDS, b=COMMANDS, at=st.integers(0, 40), writes=st.booleans(),
          tick=st.sampled_from([0.0, 0.0, 30.0]))
    def interleaved(self, a, b, at, writes, tick):
        """Client 1's whole command runs at client 0's request number `at` (`writes`:
        before its `at % 6`th write: between a read and the write it decides, e.g. a
        prune between a rollback's read of its target and its lease, or a rollback just
        before a prune's delete). `tick`: a slow registry, whose clock moves on 30 s per
        request (a check-to-write window stays under the TTL), so a lease not renewed
        expires mid-command and the other host takes it."""
        seen = [0]
        before = self.latest_tags()
        when = at % 6 if writes else at

        def hook(method, path):
            if writes and method in ("GET", "HEAD"):
                return
            seen[0] += 1
            if seen[0] == when + 1:
                # client 0 is paused for no time: a pause longer than the lease TTL
                # between a check and its write is beyond what a lease can promise
                self.reg.before, self.reg.tick = None, 0.0
                with self.as_client(1):
                    self.execute(b)
                self.reg.before, self.reg.tick = hook, tick

        self.reg.before = hook
        if self.mem:
            self.reg.tick = tick
        try:
            with self.as_client(0):
                self.execute(a)
        finally:
            self.reg.before = None
            if self.mem:
                self.reg.tick = 0.0
        if not (a[0] == "rollback" or b[0] == "rollback" or
                (a[0] == "promote" and a[2]) or (b[0] == "promote" and b[2])):
            self.observe(a, before)

    def race(self, a: tuple, b: tuple, *, before_write: str, tick: float = 0.0) -> None:
        """Client 1 runs `b` just before client 0's first write whose method is
        `before_write`, on a registry whose clock moves on `tick` s per request."""
        done = [False]
        before = self.latest_tags()

        def hook(method, path):
            if not done[0] and method == before_write:
                done[0] = True
                self.reg.before = None
                self.reg.tick = 0.0
                with self.as_client(1):
                    self.execute(b)

        self.reg.before, self.reg.tick = hook, tick
        try:
            with self.as_client(0):
                self.execute(a)
        finally:
            self.reg.before, self.reg.tick = None, 0.0
        self.observe(b if done[0] else a, before)

    def first_to_go(self, keep: int) -> str | None:
        """The first release a prune --keep `keep` would delete that a rollback could
        take (passed and measured in every image), if any."""
        c = self.reg.client()
        try:
            plan = plan_prune(c, self.repos[0], keep)
        except ImagebuildError:
            return None
        return next((t for t in plan.delete if all(
            (r := read_release(c, repo, t)) and r.passed and not r.unmeasured
            and store.stored(c, repo, t) for repo in self.repos)), None)

    @precondition(lambda self: len(self.published) >= 2)
    @rule(rerun=st.sampled_from(["rerun", "promote"]), who=st.integers(0, 1))
    def rerun_after_rollback(self, rerun, who):
        """A rollback, then a re-run of the release it left (the publish job re-run, or
        the workflow's promote job): latest stays rolled back (checked by `observe`)."""
        now = self.latest_tags()[self.repos[0]]
        if now is None:
            return
        before = self.latest_tags()
        with self.as_client(0):
            self.execute(("rollback", "previous"))
        self.observe(("rollback", "previous"), before)
        cmd = (rerun, self.order[now], False, False)
        before = self.latest_tags()
        with self.as_client(who):
            self.execute(cmd)
        self.observe(cmd, before)

    @precondition(lambda self: self.mem and len(self.published) >= 3)
    @rule(keep=st.integers(1, 2))
    def rollback_racing_prune(self, keep):
        """A rollback to a release prune deletes first; the other host's prune runs
        between the rollback's reads and its lease."""
        if (tag := self.first_to_go(keep)) is not None:
            self.race(("rollback", self.order[tag]), ("prune", keep, None), before_write="PUT")

    @precondition(lambda self: self.mem and len(self.published) >= 3)
    @rule(tick=st.sampled_from([20.0, 30.0]))
    def prune_racing_rollback(self, tick):
        """A prune on a slow registry (its lease expires unless renewed); the other host
        rolls back to the release it deletes first, just before its first delete."""
        if (tag := self.first_to_go(1)) is not None:
            self.race(("prune", 1, None), ("rollback", self.order[tag]), before_write="DELETE",
                      tick=tick)

    @precondition(lambda self: self.published)
    @rule(cmd=st.sampled_from(["promote", "rollback", "prune"]),
          which=st.one_of(st.sampled_from(["newest", "rolled", "previous"]), st.integers(0, 9)),
          accept=st.booleans())
    def dry_run(self, cmd, which, accept):
        """A dry run writes nothing (the invariant on the write log), with every --accept
        too (they widen what it reads: an accepted unmeasured side is where the gate would
        annotate stored results; publish's dry run pushes nothing, its promote part is
        "promote"), its release the newest first (the likeliest forward move)."""
        full = {"promote": ("promote", which, True, True),
                "rollback": ("rollback", which, accept),
                "prune": ("prune", 1 + (which if isinstance(which, int) else 0) % 3,
                          "hide latest" if accept else None)}[cmd]
        with self.as_client(0):
            self.execute(full, dry_run=True)

    @precondition(lambda self: self.mem and len(self.published) >= 2)
    @rule(accept=st.booleans(), who=st.integers(0, 1))
    def rollback_gates(self, accept, who):
        """A rollback to the newest release older than latest that lacks bench results in
        some image (not recorded unmeasured): refused and latest stays, unless accepted
        with a reason (then the invariant knows it was accepted). And a rollback to a
        passed, measured release newer than latest: refused (it would skip the regression
        gate), latest stays."""
        lt = self.latest_tags()
        now = lt[self.repos[0]]
        if now is None:
            return
        c = self.reg.client()

        def passed(t: str) -> bool:
            return all((r := read_release(c, repo, t)) is not None and r.passed
                       for repo in self.repos)

        def measured(t: str, repo: str) -> bool:
            r = read_release(c, repo, t)
            return bool(store.stored(c, repo, t)) or bool(r and r.unmeasured)

        newer = [t for t in self.published[self.order[now] + 1:] if passed(t)
                 and all(measured(t, r) for r in self.repos)]
        if newer:
            cmd = ("rollback", self.order[newer[-1]], False)
            with self.as_client(who):
                ok = self.execute(cmd)
            assert not ok and self.latest_tags() == lt, (
                f"rollback to the newer {newer[-1]} moved latest: {self.latest_tags()}")
        cands = [t for t in self.published[:self.order[now]]
                 if passed(t) and not all(measured(t, r) for r in self.repos)]
        if not cands:  # build the state: one benched for one image only, a newer one latest
            with self.as_client(who):
                self.execute(("publish", "a", "passed", "next"))
                self.execute(("publish", "both", "passed", "next"))
                self.execute(("promote", "newest", True, True))
            lt = self.latest_tags()
            if set(lt.values()) != {self.published[-1]}:
                return
            cands = [self.published[-2]]
        cmd = ("rollback", self.order[cands[-1]], accept)
        with self.as_client(who):
            ok = self.execute(cmd)
        if not accept:
            assert not ok and self.latest_tags() == lt, (
                f"rollback to the never-benched {cands[-1]} moved latest: {self.latest_tags()}")
        self.observe(cmd, lt)

    @precondition(lambda self: self.mem)
    @rule(who=st.integers(0, 1))
    def dry_run_over_an_unmeasured_latest(self, who):
        """The state where `promote --dry-run` would annotate stored results: latest
        promoted unmeasured (a release without results, accepted), a newer release with
        results; its dry-run promote with --accept-unmeasured writes nothing (the
        invariant on the write log)."""
        with self.as_client(who):
            self.execute(("publish", "none", "passed", "next"))
            self.execute(("promote", "newest", False, True))
            self.execute(("publish", "both", "passed", "next"))
            self.execute(("promote", "newest", True, True), dry_run=True)

    @precondition(lambda self: self.mem and self.published)
    @rule(a=COMMANDS, b=COMMANDS, at=st.integers(0, 40))
    def paused_past_the_lease(self, a, b, at):
        """Client 0 pauses longer than the lease TTL before its `at`th read (a GC pause, a
        stopped VM), while client 1 takes the expired leases over and runs `b`; then
        client 0 goes on. Its next write is fenced (the lease is another's): it stops,
        and whatever it moved is put back or left to the run that took over: no set is
        split (the invariants)."""
        a = self._pinned(a)
        seen = [0]

        def hook(method, path):
            if method not in ("GET", "HEAD"):
                return
            seen[0] += 1
            if seen[0] == at + 1:
                self._past_the_lease()
                self._meanwhile(b, hook)

        self._hooked(a, hook)

    @precondition(lambda self: self.mem and len(self.published) >= 2)
    @rule(cmd=st.one_of(
        st.tuples(st.just("promote"), st.one_of(st.just("newest"), st.integers(0, 9)),
                  st.booleans(), st.just(False)),
        st.tuples(st.just("rollback"), st.one_of(st.just("previous"), st.integers(0, 9)))))
    def a_writer_ignoring_the_lease(self, cmd):
        """While a promote or rollback of the set moves the first image, a writer that
        ignores the lease moves the other's latest (and back afterwards): the command
        refuses, and puts back the image it moved."""
        before = self.latest_tags()
        first, other = self.repos
        target = self.tag(cmd[1])
        alive = self.reg.tags.get(other, {})
        alt = [t for t in self.published if t in alive and t not in (before[other], target)]
        if before[other] is None or not alt:
            return
        hit = [False]

        def rogue(method, path):
            if not hit[0] and method == "PUT" and path == f"/v2/{first}/manifests/{LATEST}":
                hit[0] = True
                self.reg.point_latest(other, alt[-1])

        self.reg.before = rogue
        try:
            with self.as_client(0):
                ok = self.execute(cmd)
        finally:
            self.reg.before = None
        if not hit[0]:
            self.observe(cmd, before)
            return
        self.reg.point_latest(other, before[other])  # type: ignore[arg-type]
        assert not ok, f"{cmd} succeeded although {other}'s latest moved under it"
        assert self.latest_tags() == before, f"{cmd} refused but left {self.latest_tags()}"

    @precondition(lambda self: self.mem and self.published)
    @rule(who=st.integers(0, 1))
    def lease_takeover(self, who):
        """A lease left in the registry is taken over exactly when it is of this host's
        own killed run or expired by the registry's clock (the hosts' clocks are an hour
        off); a live one of another host or of a container on this host (own pid
        namespace), or one whose expiry cannot be read, is honoured. Every kind of holder
        and expiry, each time (cheap: no search needed to reach one)."""
        for holder in ("other host", "container", "itself, killed"):
            for expiry in ("live", "expired", "nan", "inf", "soon", "far"):
                self._lease_left_by(holder, expiry, who)

    def _lease_left_by(self, holder: str, expiry: str, who: int) -> None:
        c = self.reg.client()
        repo = self.repos[0]
        rel = next((r for t in reversed(self.published)
                    if (r := read_release(c, repo, t)) is not None), None)
        if rel is None:
            return
        host, pid, pidns = {"other host": IDS[1 - who], "itself, killed": IDS[who],
                            "container": (IDS[who][0], *CONTAINER)}[holder]
        now = self.reg.now
        expires = {"live": f"{now + 100:.3f}", "expired": f"{now - 1:.3f}", "nan": "nan",
                   "inf": "inf", "soon": "soon", "far": f"{now + 1e9:.3f}"}[expiry]
        note = {f"{lease.LEASE}.owner": f"{host}:{pid}:killed", f"{lease.LEASE}.host": host,
                f"{lease.LEASE}.pid": str(pid), f"{lease.LEASE}.pidns": pidns,
                f"{lease.LEASE}.purpose": "a killed run", f"{lease.LEASE}.expires": expires,
                f"{lease.LEASE}.generation": "1"}
        doc = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "layers": [],
               "config": {**rel.config_descriptor, "mediaType": OCI_CONFIG}, "annotations": note}
        c.put_manifest(repo, lease.LEASE_TAG, compact(doc).encode(), OCI_MANIFEST)
        with self.as_client(who):
            try:
                lease.Lease(c, repo, rel.config_descriptor, purpose="take over",
                            log=quiet).acquire().release()
                taken = True
            except ImagebuildError:
                taken = False
        # an unreadable expiry of another holder may be live: held (issue 39)
        expected = holder == "itself, killed" or expiry == "expired"
        assert taken == expected, f"a lease of {holder}, expiry {expiry}: taken {taken}"

    @precondition(lambda self: self.mem and len(self.published) >= 2)
    @rule(keep=st.integers(1, 3), who=st.integers(0, 1))
    def prune_on_a_list_without_latest(self, keep, who):
        """The registry's tag list loses the page that holds latest (and every tag on its
        manifest): the list disagrees with a direct read of latest, so the prune of
        every image that has a latest stops before deleting anything."""
        self.reg.calls.clear()
        with self.as_client(who):
            self.execute(("prune", keep, "hide latest"))
        with_latest = [r for r in self.repos if LATEST in self.reg.tags.get(r, {})]
        deleted = [c for c in self.reg.writes() if c[0] == "DELETE"
                   and any(c[1].startswith(f"/v2/{r}/") for r in with_latest)]
        assert not deleted, f"prune on a tag list without latest deleted {deleted}"

    @precondition(lambda self: self.mem and self.published)
    @rule(keep=st.integers(1, 2))
    def prune_loses_delete_answers(self, keep):
        """Once every killed run's lease expired, a prune whose DELETE answers are lost
        (done, but the retry sees 404) finishes, deleting all it planned and nothing
        protected."""
        self._past_the_lease()
        protect = self.protected_now(keep)
        self.reg.lost_delete = {d for repo in self.repos
                                for t, d in self.reg.tags.get(repo, {}).items() if t in self.order}
        try:
            with self.as_client(0):
                plans = [prune(self.reg.client(), repo, keep, log=quiet) for repo in self.repos]
        finally:
            self.reg.lost_delete = set()
        for plan in plans:
            for t in plan.delete:
                assert t not in self.reg.tags[plan.repo], f"prune left {t} it planned to delete"
            for t in protect[plan.repo]:
                assert t in self.reg.tags[plan.repo], f"prune deleted protected {plan.repo}:{t}"

    @precondition(lambda self: self.mem and len(self.published) >= 2)
    @rule()
    def a_corrupt_referrers_index(self):
        """The registry's referrers index of the oldest measured release also lists the
        results of the newest one (a corrupt or foreign fallback index): pruning the old
        one must not take the new one's results with it (checked by `command`)."""
        c = self.reg.client()
        repo = self.repos[0]
        measured = [r for t in self.published if t in self.reg.tags.get(repo, {})
                    and (r := read_release(c, repo, t)) and store.stored(c, repo, t)]
        if len(measured) < 2:
            return
        old, new = measured[0], measured[-1]
        theirs = referrers._fallback_index(c, repo, new.digest)  # noqa: SLF001
        ours = referrers._fallback_index(c, repo, old.digest)  # noqa: SLF001
        if not theirs or not ours:
            return
        doc = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": ours + [
            m for m in theirs if m not in ours]}
        c.put_manifest(repo, referrers.referrers_tag(old.digest), compact(doc).encode(),
                       OCI_INDEX)
        with self.as_client(0):  # a prune that deletes the old one keeps the new's results
            self.execute(("prune", 1, None))
        assert new.tag not in self.reg.tags[repo] or store.stored(c, repo, new.tag), (
            f"pruning {old.tag} took the results of {new.tag} with it")

    @precondition(lambda self: self.mem)
    @rule(who=st.integers(0, 1))
    def a_same_day_release_wins(self, who):
        """Two releases on one day, the later recorded with a name earlier in the
        alphabet: publish moves latest to the later one (age is when it was recorded)."""
        with self.as_client(who):
            self.execute(("publish", "both", "passed", "next"))
            self.execute(("promote", "newest", True, True))  # on purpose, whatever was
            self.execute(("publish", "both", "passed", "same"))
        assert set(self.latest_tags().values()) == {self.published[-1]}, (
            f"publish of the later same-day {self.published[-1]} left {self.latest_tags()}")

    @precondition(lambda self: self.mem and self.published)
    @rule(a=COMMANDS.filter(lambda c: c[0] != "prune"), b=COMMANDS)
    def slow_until_the_first_move(self, a, b):
        """Client 0's publish, promote or rollback is slow: by its first move (its read of
        latest right before the fence) its leases are older than the TTL, though nobody
        took them yet. Right before its next write client 1 runs `b` (taking the expired
        leases). No time passes between client 0's check and that write, yet renewing
        the expired lease would write over client 1's: client 0 takes it again as any
        run would and reads the set again, stopping when client 1 moved it, and no set
        is split (the invariants)."""
        a = self._pinned(a)
        phase = ["reading"]

        def hook(method, path):
            if phase[0] == "reading" and method == "HEAD" and path.endswith(
                    f"/manifests/{LATEST}"):
                phase[0] = "slow"
                self._past_the_lease()
            elif phase[0] == "slow" and method not in ("GET", "HEAD"):
                phase[0] = "done"
                self._meanwhile(b, hook)

        self._hooked(a, hook)

    @precondition(lambda self: self.mem and len(self.published) >= 3)
    @rule()
    def paused_while_recording_a_rollback(self):
        """Client 0 rolls back the set; after it read the second image's record of
        rollbacks, it pauses past its lease while client 1 rolls the set back further.
        The record must keep client 1's entry as written (client 0's write is fenced)."""
        c = self.reg.client()
        now = self.latest_tags()[self.repos[0]]
        if now is None:
            return
        ok = [t for t in self.published[:self.order[now]] if all(
            (r := read_release(c, repo, t)) and r.passed and store.stored(c, repo, t)
            for repo in self.repos)]
        if len(ok) < 2:
            return
        second = self.repos[1]
        seen: list[tuple[str, str]] = []
        paused: list[str | None] = []

        def hook(method, path):
            seen.append((method, path))
            if (not paused and method == "HEAD" and path.endswith(f"/{lease.LEASE_TAG}")
                    and path.startswith(f"/v2/{second}/") and len(seen) > 1
                    and seen[-2] == ("GET", f"/v2/{second}/manifests/{ROLLBACKS_TAG}")):
                self.reg.before = None  # its own reads are not client 0's requests
                paused.append(self.latest_tags()[second])
                self._past_the_lease()
                self._meanwhile(("rollback", self.order[ok[-2]]), hook)

        before = self.latest_tags()
        self._hooked(("rollback", self.order[ok[-1]]), hook)
        if not paused or paused[0] is None:
            return
        entry = rolled_back(c, second).get(paused[0], {})
        assert entry.get("to") == self.latest_tags()[second], (
            f"the record of rollbacks of {second} says {paused[0]} went to {entry}; "
            f"latest is {self.latest_tags()[second]}")
        for repo in self.repos:  # the model of rollbacks: what each image left
            if before[repo] and self.latest_tags()[repo] != before[repo]:
                self.rolled[repo].add(before[repo])  # type: ignore[arg-type]
        for t in ok[-2:]:
            for repo in self.repos:
                self.rolled[repo].discard(t)

    @rule()
    def time_passes(self):
        """Leases left by killed runs of the other host expire (by the registry's clock)."""
        if self.reg.now is not None:
            self.reg.now += 301
        else:  # a real registry's clock: the slice runs with a short lease TTL
            time.sleep(lease.lease_ttl() + 1.2)

    # -- invariants

    @invariant()
    def latest_never_vanishes(self):
        for repo, tag in self.latest_tags().items():
            assert tag is not None or repo not in self.had_latest, f"{repo}: latest is gone"
            if tag is not None:
                self.had_latest.add(repo)

    @invariant()
    def latest_is_a_passed_measured_release_and_the_set_is_together(self):
        c = self.reg.client()
        tags = set()
        for repo in self.repos:
            rel = read_release(c, repo, LATEST)
            if rel is None:
                tags.add(None)
                continue
            named = rel.annotations.get(A_TAG, "")
            own = read_release(c, repo, named)
            assert own is not None and own.digest == rel.digest, f"{repo}: latest names {named}"
            assert own.passed, f"{repo}: latest {named} never passed smoke"
            assert own.unmeasured or store.stored(c, repo, named) or (
                (repo, named) in self.accepted), f"{repo}: {named} unmeasured, not accepted"
            tags.add(named)
        # promote and `rollback --all` move every image or none (an image that lacks
        # the release refuses the set)
        assert len(tags) == 1, f"the set is split: {self.latest_tags()}"

    @invariant()
    def a_dry_run_wrote_nothing(self):
        assert self.dry_writes == [], f"a dry run wrote {self.dry_writes}"


ReleaseState.TestCase.settings = settings(
    max_examples=int(os.environ.get("RELEASE_PROPERTY_EXAMPLES", "150")),
    stateful_step_count=20, deadline=None, database=None, derandomize=True,
    # tools/mutate_release_state.py asks for no shrinking: it wants killed or not, fast
    phases=[p for p in Phase if p is not Phase.shrink or not os.environ.get("NO_SHRINK")],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestReleaseState = ReleaseState.TestCase

