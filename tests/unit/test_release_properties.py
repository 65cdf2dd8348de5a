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
5. a dry run writes nothing.
Commands may refuse (exit 1 or 2); none may end in anything but an ImagebuildError.
"""

from __future__ import annotations

import os
import tempfile
import time
from contextlib import contextmanager
from types import SimpleNamespace

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from imagebuild.bench import store
from imagebuild.errors import ImagebuildError
from imagebuild.release import latest, lease
from imagebuild.release.prune import prune
from imagebuild.release.records import A_TAG, LATEST, read_release
from imagebuild.spec.tags import parse_release_tag
from tests.support.memregistry import Crash, MemRegistry

REPOS = ("ns/a", "ns/b")  # promoted together, always
T0 = 1_800_000_000.0
IDS = (("host-a", 4_000_001, "pid:[1]"), ("host-b", 4_000_002, "pid:[2]"))  # dead pids
quiet = lambda _: None  # noqa: E731

COMMANDS = st.one_of(
    st.tuples(st.just("publish"), st.sampled_from([True, True, True, False]),  # benched
              st.sampled_from(["passed", "passed", "passed", "failed"])),
    # which release: "newest", "previous" (the newest before latest), "rolled" (one that
    # was rolled back) or any by index: the states where the invariants bite
    st.tuples(st.just("promote"), st.one_of(st.sampled_from(["newest", "rolled"]),
                                            st.integers(0, 9)), st.booleans()),
    st.tuples(st.just("rollback"), st.one_of(st.just("previous"), st.integers(0, 9))),
    st.tuples(st.just("prune"), st.integers(1, 3)),
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
        self.locks = tempfile.mkdtemp(prefix="release-props-")
        self.who = 0
        os.environ["IMAGEBUILD_LEASE_SETTLE"] = "0"

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
            older = [t for t in self.published if t < now and store.stored(c, self.repos[0], t)]
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
        bench = SimpleNamespace(target=SimpleNamespace(bench=None))
        return tuple(SimpleNamespace(image=SimpleNamespace(repository=r),
                                     tag=parse_release_tag(tag), cell=bench) for r in self.repos)

    def execute(self, cmd: tuple, *, dry_run: bool = False) -> None:
        """One command; refusals are fine, anything but an ImagebuildError is not."""
        c = self.reg.client()
        kind = cmd[0]
        try:
            if kind == "publish":
                tag = self._publish(cmd[1], cmd[2])
                latest.promote_jobs(c, self._jobs(tag), default_threshold=0.05,
                                    accept_regression=None, forward_only=True,
                                    dry_run=dry_run, log=quiet)
            elif kind == "promote" and (tag := self.tag(cmd[1])):
                latest.promote_jobs(c, self._jobs(tag), default_threshold=0.05,
                                    accept_regression=None, dry_run=dry_run, log=quiet,
                                    accept_rolled_back="on purpose" if cmd[2] else None)
            elif kind == "rollback" and (tag := self.tag(cmd[1])):
                latest.set_latest_many(c, list(self.repos), tag, dry_run=dry_run, log=quiet)
            elif kind == "prune":
                for repo in self.repos:
                    prune(c, repo, cmd[1], dry_run=dry_run, log=quiet)
        except ImagebuildError:
            pass

    def _publish(self, benched: bool, smoke: str) -> str:
        """Push and record a new release of every image (not crashed here: the registry
        is revived for it), newer than any before."""
        n = len(self.published)
        tag = f"2026-{1 + n // 28:02d}-{1 + n % 28:02d}-v0.23.0-r{n}"
        crash, self.reg.crash_at = self.reg.crash_at, None
        before, self.reg.before = self.reg.before, None
        for repo in self.repos:
            self.reg.add_release(repo, tag, smoke=smoke, benched=benched and smoke == "passed",
                                 created=T0 + 60 * n)
        self.reg.crash_at, self.reg.before = crash, before
        self.published.append(tag)
        return tag

    def observe(self, cmd: tuple, before: dict[str, str | None]) -> None:
        """Update the model of rollbacks from what the command did, and check (4)."""
        after = self.latest_tags()
        for repo in self.repos:
            if before[repo] == after[repo] or after[repo] is None:
                continue
            if cmd[0] == "rollback":
                if before[repo]:
                    self.rolled[repo].add(before[repo])  # type: ignore[arg-type]
                self.rolled[repo].discard(after[repo])
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
                older = [t for t in alive if t < lt[repo]  # type: ignore[operator]
                         and (r := read_release(c, repo, t)) and r.passed]
                measured = [t for t in older if store.stored(c, repo, t)]
                if measured or older:  # the one `rollback` takes without an override
                    keep_set.add((measured or older)[-1])
            out[repo] = keep_set
        return out

    # -- rules

    @rule(cmd=COMMANDS, who=st.integers(0, 1),
          crash_at=st.one_of(st.none(), st.integers(0, 50)))
    def command(self, cmd, who, crash_at):
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
                    cmd = ("promote", len(self.published) - 1, False)
                self.execute(cmd)  # the re-run of the killed command, same host
        self.observe(cmd, before)
        for repo, tags in (keep or {}).items():
            for t in tags:
                assert t in self.reg.tags[repo], f"prune deleted protected {repo}:{t}"
            for t in results[repo]:
                assert store.stored(self.reg.client(), repo, t), f"results of {repo}:{t} gone"

    @precondition(lambda self: self.published)
    @rule(a=COMMANDS, b=COMMANDS, at=st.integers(0, 40))
    def interleaved(self, a, b, at):
        """Client 1's whole command runs at client 0's request number `at`."""
        seen = [0]
        before = self.latest_tags()

        def hook(method, path):
            seen[0] += 1
            if seen[0] == at + 1:
                self.reg.before = None
                with self.as_client(1):
                    self.execute(b)
                self.reg.before = hook

        self.reg.before = hook
        try:
            with self.as_client(0):
                self.execute(a)
        finally:
            self.reg.before = None
        if not (a[0] == "rollback" or b[0] == "rollback" or
                (a[0] == "promote" and a[2]) or (b[0] == "promote" and b[2])):
            self.observe(a, before)

    @precondition(lambda self: self.published)
    @rule(cmd=st.sampled_from(["promote", "rollback", "prune", "publish"]), i=st.integers(0, 9))
    def dry_run(self, cmd, i):
        if cmd == "publish":
            return  # publish's dry run pushes nothing: its promote part is "promote"
        full = {"promote": ("promote", i, True), "rollback": ("rollback", "previous"),
                "prune": ("prune", 1 + i % 3)}[cmd]
        self.reg.calls.clear()
        with self.as_client(0):
            self.execute(full, dry_run=True)
        assert self.reg.writes() == [], f"dry run of {full} wrote {self.reg.writes()}"

    @rule()
    def time_passes(self):
        """Leases left by killed runs of the other host expire (by the registry's clock)."""
        if self.reg.now is not None:
            self.reg.now += 301
        else:  # a real registry's clock: the slice runs with a short lease TTL
            time.sleep(float(os.environ.get("IMAGEBUILD_LEASE_TTL", "300")) + 1.2)

    # -- invariants

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
            assert own.unmeasured or store.stored(c, repo, named), f"{repo}: {named} unmeasured"
            tags.add(named)
        # a set is the images that hold a release: when every image holds latest's
        # release of one of them, latest of all is at it (`rollback --all` leaves an
        # image that lacks the release alone: pruned, or never built for it)
        held = {t for t in tags if t and all(t in self.reg.tags.get(r, {}) for r in self.repos)}
        assert len(tags) == 1 or not held, f"the set is split: {self.latest_tags()}"


ReleaseState.TestCase.settings = settings(
    max_examples=int(os.environ.get("RELEASE_PROPERTY_EXAMPLES", "150")),
    stateful_step_count=20, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestReleaseState = ReleaseState.TestCase

