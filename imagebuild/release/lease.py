"""The registry lease every write of a release takes: one writer per repository.

A local flock keeps two runs on one machine apart; the lease tag in the registry keeps
runs on different machines apart (see `Lease` for what it can and cannot promise).
"""

from __future__ import annotations

import contextlib
import email.utils
import fcntl
import json
import math
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from imagebuild.errors import OperationFailed, UserError, prog
from imagebuild.registry.client import OCI_MANIFEST, RegistryClient, Unsupported
from imagebuild.registry.records import OCI_CONFIG, Log, compact, read_release
from imagebuild.safetext import safe

LEASE_TAG = "imagebuild-lease"
LEASE = "io.imagebuild.lease"
TTL_ENV, SETTLE_ENV = "IMAGEBUILD_LEASE_TTL", "IMAGEBUILD_LEASE_SETTLE"


def _seconds(var: str, default: float, low: float, high: float) -> float:
    """A number of seconds from the environment, checked (a typo must not become a lease
    that never expires, or a negative sleep)."""
    text = os.environ.get(var)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:  # nan fails too
        raise UserError(f"environment variable {var}={text[:40]!r} is not a number of "
                        f"seconds in {low:g}..{high:g}",
                        fix=f"unset {var} (default {default:g}) or give e.g. {var}={default:g}")
    return value


def lease_ttl() -> float:
    return _seconds(TTL_ENV, 300.0, 1.0, 86400.0)


def lease_settle() -> float:
    return _seconds(SETTLE_ENV, 0.5, 0.0, 60.0)


MAX_TTL = 86400.0  # an expiry further ahead than this is malformed, not a long lease


# the share of the TTL after which an unrenewed lease counts as lost (the margin covers
# the time between reading the registry's clock and the lease's PUT landing)
LAPSED = 0.9


def registry_time(client: RegistryClient) -> float:
    """Now, by the registry's own clock (the `Date` header of GET /v2/): every run
    compares lease expiries with the same clock, so a writer's skewed clock neither keeps
    a dead lease alive nor lets a live one be taken. Our clock only when it sends none."""
    try:
        resp = client._request("GET", "/v2/")  # noqa: SLF001 - the one header we need
        date = resp.headers.get("Date")
        if date:
            return email.utils.parsedate_to_datetime(date).timestamp()
    except (TypeError, ValueError, IndexError):
        pass
    return time.time()


def identity() -> tuple[str, int, str]:
    """(host name, pid, pid namespace) of this run: a pid means something only inside
    its own pid namespace (containers share a host name but not their pids)."""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    return socket.gethostname(), os.getpid(), pidns


def _lock_dir() -> Path:
    base = os.environ.get("IMAGEBUILD_LOCK_DIR") or Path.home() / ".cache" / "imagebuild" / "locks"
    return Path(base)


@contextlib.contextmanager
def local_lock(host: str, repo: str) -> Iterator[Path]:
    """An flock per registry repository: two runs on one machine never overlap."""
    path = _lock_dir() / (re.sub(r"[^A-Za-z0-9_.-]", "_", f"{host}_{repo}") + ".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OperationFailed(
                f"another imagebuild run on this machine is writing {host}/{repo} "
                f"(lock {path})", fix="wait for it to finish, then re-run") from None
        try:
            yield path
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class Lease:
    """A registry-side lease: the tag `imagebuild-lease` points at a tiny manifest naming
    its owner and expiry. The registry offers no compare-and-swap, so we write, wait
    `settle` seconds, and read back (compare-after-write); the last writer wins and every
    other writer sees a foreign owner and backs off. Two runs could both win only if one
    stalled longer than `settle` between reading "free" and writing; before moving
    `latest` the holder checks the lease again and that `latest` is where it was.
    A lease of this host and pid namespace whose process is gone (or is us) is stale,
    since we hold the local flock, so a run killed mid-promote never blocks its own
    re-run; other leases (another host, or a container with its own pid namespace) are
    honoured until they expire after `ttl`, by the registry's clock (`registry_time`).
    Long work calls `check()` before each write: it stops when the lease was lost and
    renews it (a new generation, a later expiry) once a third of the TTL has passed.
    A lease that went unrenewed for most of its TTL is lost; a caller that can read again
    everything it decided on passes `retake` to take the lease again instead (see check).
    """

    def __init__(self, client: RegistryClient, repo: str, config: dict[str, Any], *,
                 purpose: str, ttl: float | None = None, settle: float | None = None,
                 log: Log = print):
        self.client, self.repo, self.log = client, repo, log
        ttl = lease_ttl() if ttl is None else ttl
        settle = lease_settle() if settle is None else settle
        self.host, pid, self.pidns = identity()
        self.owner = f"{self.host}:{pid}:{uuid.uuid4().hex[:12]}"
        self.ttl, self.settle = ttl, settle
        self.note = {f"{LEASE}.owner": self.owner, f"{LEASE}.host": self.host,
                     f"{LEASE}.pid": str(pid), f"{LEASE}.pidns": self.pidns,
                     f"{LEASE}.purpose": purpose}
        # config: an existing config blob of this repo (a manifest must reference one)
        self.config = {**config, "mediaType": OCI_CONFIG}
        self.generation = 0
        self.body = b""
        self.digest: str | None = None
        self.written = 0.0  # monotonic time of our last write of the lease

    def _holder(self) -> dict[str, str] | None:
        rel = read_release(self.client, self.repo, LEASE_TAG)
        return rel.annotations if rel else None

    def _write(self, now: float) -> None:
        """PUT the lease: expiry in the registry's time, the next generation."""
        self.generation += 1
        started = time.monotonic()  # before the PUT: the expiry counts from `now`, not after
        note = {**self.note, f"{LEASE}.expires": f"{now + self.ttl:.3f}",
                f"{LEASE}.generation": str(self.generation)}
        self.body = compact({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                             "config": self.config, "layers": [],
                             "annotations": note}).encode()
        self.digest = self.client.put_manifest(self.repo, LEASE_TAG, self.body, OCI_MANIFEST)
        self.written = started

    def acquire(self) -> Lease:
        held = self._holder()
        now = registry_time(self.client)
        if held and held.get(f"{LEASE}.owner") and held.get(f"{LEASE}.state") != "released":
            owner = held.get(f"{LEASE}.owner", "?")
            expires = _expiry(held, now)
            try:
                self.generation = max(0, int(held.get(f"{LEASE}.generation", "0")))
            except ValueError:
                self.generation = 0
            if (held.get(f"{LEASE}.host") == self.host
                    and held.get(f"{LEASE}.pidns", "") == self.pidns
                    and not _other_live_pid(held)):
                self.log(f"{self.repo}: taking over a stale lease of this host ({owner})")
            elif expires is None:
                # a lease we cannot read may still be live: holding off is the only safe
                # answer; a person who knows its run is gone clears it
                raise OperationFailed(
                    f"{self.repo}: a registry lease of {safe(owner, 100)} "
                    f"({safe(held.get(f'{LEASE}.purpose', '?'), 60)}) has an expiry this "
                    f"run cannot read ({safe(held.get(f'{LEASE}.expires', ''), 40)!r}): it "
                    "may belong to a live run, so this run writes nothing",
                    fix=f"if no run is writing {self.repo}, clear the lease: "
                    f"{unlock_command(self.repo)}")
            elif expires > now:
                raise OperationFailed(
                    f"{self.repo}: another run ({owner}, {held.get(f'{LEASE}.purpose')}) "
                    f"holds the registry lease for {expires - now:.0f} s more",
                    fix="wait for it to finish, then re-run (re-runs resume)")
            else:
                self.log(f"{self.repo}: taking over an expired lease of {owner}")
        self._write(now)
        time.sleep(self.settle)
        self.check()
        return self

    def check(self, retake: Callable[[], None] | None = None) -> None:
        """The fence every write of the release state passes right before it: raise
        unless the lease tag still points at our lease manifest (this owner, this
        generation), so a run paused past its TTL stops instead of writing over the run
        that took the lease over. Renews the lease when a third of its TTL has passed
        since we wrote it (long work keeps it alive); the renewal is fenced the same way.
        A lease not renewed for most of its TTL is lost whatever its tag says: by the
        registry's clock it may have expired, been taken over and been released again,
        and a renewal now would write over that run. Without `retake` the run stops
        there. With it, the lease is acquired again as any run would take an expired
        one (a live lease of another run refuses), then `retake()` reads again what the
        caller decided on and raises if any of it moved: a slow run whose lease nobody
        took goes on (a half-moved set that cannot be put back is finished), one that was
        overtaken stops."""
        elapsed = time.monotonic() - self.written
        if retake is not None and elapsed >= self.ttl * LAPSED:
            self.log(f"{self.repo}: this run's registry lease went {elapsed:.0f} s without "
                     "renewal; taking it again and reading again what this run decided on")
            self.acquire()
            retake()
            return
        self._fence()
        elapsed = time.monotonic() - self.written
        if elapsed >= self.ttl * LAPSED:
            raise OperationFailed(
                f"{self.repo}: this run's registry lease (generation {self.generation}) went "
                f"{elapsed:.0f} s without renewal, past {LAPSED:.0%} of its {self.ttl:.0f} s "
                "TTL: another run may have taken it over; this run stops here, before its "
                "next write", fix="check `build.py releases`, then re-run (re-runs resume)")
        if elapsed >= self.ttl / 3:
            now = registry_time(self.client)
            self._fence()  # nothing between the fence and the renewal's write
            self._write(now)
            time.sleep(self.settle)
            self._fence()

    def _fence(self) -> None:
        now = self.client.head_manifest(self.repo, LEASE_TAG)
        if not now or now[0] != self.digest:
            holder = self._holder() or {}
            raise OperationFailed(
                f"{self.repo}: lost the registry lease (generation {self.generation}) to "
                f"{safe(holder.get(f'{LEASE}.owner', 'another run'))} "
                f"(generation {safe(holder.get(f'{LEASE}.generation', '?'))}); "
                "this run stops here, before its next write",
                fix="another run is writing; check `build.py releases`, then re-run")

    def release(self) -> None:
        """Drop our lease if it is still ours; never raises (it runs in finally). With a
        small fresh registry budget: the command's may be what ran out."""
        try:
            with self.client.deadline.grace():
                self._release()
        except Exception as exc:  # noqa: BLE001 - a stale lease expires; report, go on
            self.log(f"{self.repo}: could not release the lease ({safe(exc)}); it expires in "
                     f"{self.ttl:.0f} s and this host's re-runs take it over")

    def _release(self) -> None:
        now = self.client.head_manifest(self.repo, LEASE_TAG)
        if now and now[0] == self.digest:
            try:
                self.client.delete_manifest(self.repo, self.digest)
            except Unsupported:  # deletes disabled: mark it released instead
                doc = json.loads(self.body)
                doc["annotations"][f"{LEASE}.state"] = "released"
                self.client.put_manifest(self.repo, LEASE_TAG, compact(doc).encode(),
                                         OCI_MANIFEST)


def unlock_command(repo: str) -> str:
    return f"{prog()} unlock --image {repo.rsplit('/', 1)[-1]}"


def clear_lease(client: RegistryClient, repo: str, *, force: bool = False,
                dry_run: bool = False, log: Log = print) -> bool:
    """`build.py unlock`: remove the lease of `repo` that a gone run left behind. A lease
    that is readable and not expired is refused unless `force` (another run may be
    writing); one whose expiry is unreadable or past is removed. True when one was (or,
    dry, would be) removed."""
    head = client.head_manifest(repo, LEASE_TAG)
    held = read_release(client, repo, LEASE_TAG) if head else None
    if not head or held is None or held.annotations.get(f"{LEASE}.state") == "released":
        log(f"{repo}: no registry lease is held")
        return False
    note = held.annotations
    owner = safe(note.get(f"{LEASE}.owner", "?"), 100)
    now = registry_time(client)
    expires = _expiry(note, now)
    if expires is not None and expires > now and not force:
        raise OperationFailed(
            f"{repo}: the registry lease of {owner} "
            f"({safe(note.get(f'{LEASE}.purpose', '?'), 60)}) is live for "
            f"{expires - now:.0f} s more: another run may be writing",
            fix="wait for it to expire, or, if you know that run is gone, add --force")
    state = ("unreadable expiry" if expires is None
             else "expired" if expires <= now else "live, forced")
    if dry_run:
        log(f"{repo}: would remove the registry lease of {owner} ({state})")
        return True
    try:
        client.delete_manifest(repo, head[0])
    except Unsupported:  # deletes disabled: mark it released, as a holder does
        doc = json.loads(client.get_manifest(repo, head[0])[0])
        doc["annotations"][f"{LEASE}.state"] = "released"
        client.put_manifest(repo, LEASE_TAG, compact(doc).encode(), OCI_MANIFEST)
    log(f"{repo}: removed the registry lease of {owner} ({state})")
    return True


def _expiry(held: dict[str, str], now: float) -> float | None:
    """The lease's expiry (registry time), None when malformed: not a number, not
    finite, or further ahead than any TTL could make it (it would never expire)."""
    try:
        value = float(held.get(f"{LEASE}.expires", ""))
    except ValueError:
        return None
    if not math.isfinite(value) or value > now + MAX_TTL:
        return None
    return value


def _other_live_pid(held: dict[str, str]) -> bool:
    """A lease of this host whose process still runs and is not us: a run that uses
    another lock dir (the flock cannot see it), so its lease is honoured, not taken."""
    try:
        pid = int(held.get(f"{LEASE}.pid", "0"))
    except ValueError:
        return False
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def holding_lease(client: RegistryClient, repo: str, config: dict[str, Any], *, purpose: str,
                  log: Log = print, settle: float | None = None) -> Iterator[Lease]:
    with local_lock(client.host, repo):
        lease = Lease(client, repo, config, purpose=purpose, log=log, settle=settle)
        lease.acquire()
        try:
            yield lease
        finally:
            lease.release()
