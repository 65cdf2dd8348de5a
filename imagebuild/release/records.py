"""Releases as the registry records them, and the moves of `latest`: promote, rollback, prune.

Why annotations, not labels: labels live in the image config, whose digest *is* the image
id, so writing the smoke verdict into a label after the smoke test would change the image
that was tested. Instead the release tag points at an OCI image manifest that references
the tested config and layers unchanged and carries the release record in its
`annotations` (tag, date, pins, smoke verdict, image id). Any machine reads a release with
one manifest GET; `docker pull` of the release tag yields the tested image id.

Every write happens under a lease (see `Lease`) and moves manifests only: `latest` is
re-pointed by PUTting the release manifest's bytes under `latest` (no blob moves).
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import json
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagebuild.errors import OperationFailed, UserError
from imagebuild.registry.client import (
    DOCKER_MANIFEST,
    IMAGE_MANIFESTS,
    OCI_MANIFEST,
    NotFound,
    RegistryClient,
    Unsupported,
)
from imagebuild.spec.tags import FULL, SHORT, ReleaseTag, parse_release_tag

Log = Callable[[str], None]

LATEST = "latest"
LEASE_TAG = "imagebuild-lease"
STAGING_PREFIX = "staging-"  # pushed and verified, not yet a release (see publish.py)
ANN = "io.imagebuild.release"
A_TAG, A_DATE, A_IMAGE, A_SMOKE = f"{ANN}.tag", f"{ANN}.date", f"{ANN}.image-id", f"{ANN}.smoke"
A_CHECKS, A_PINS, A_CELL = f"{ANN}.checks", f"{ANN}.pins", f"{ANN}.cell"
A_INPUTS, A_PUSHED = f"{ANN}.inputs", f"{ANN}.pushed-manifest"
A_CREATED = "org.opencontainers.image.created"
LEASE = "io.imagebuild.lease"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
# Docker v2 media types -> their OCI twins (same bytes, same digests)
_TO_OCI = {
    "application/vnd.docker.container.image.v1+json": OCI_CONFIG,
    "application/vnd.docker.image.rootfs.diff.tar.gzip":
        "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip":
        "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
}
LEASE_TTL = float(os.environ.get("IMAGEBUILD_LEASE_TTL", "300"))
LEASE_SETTLE = float(os.environ.get("IMAGEBUILD_LEASE_SETTLE", "0.5"))


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


# ------------------------------------------------------------------ the release record


def annotated_manifest(pushed: dict[str, Any], record: dict[str, str]) -> bytes:
    """An OCI image manifest of the pushed image (same config and layers) + the record."""
    if pushed.get("mediaType", DOCKER_MANIFEST) not in IMAGE_MANIFESTS:
        raise OperationFailed(f"cannot annotate a {pushed.get('mediaType')}: not one image")

    def oci(desc: dict[str, Any]) -> dict[str, Any]:
        return {**desc, "mediaType": _TO_OCI.get(desc["mediaType"], desc["mediaType"])}

    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": oci(pushed["config"]),
        "layers": [oci(layer) for layer in pushed["layers"]],
        "annotations": dict(sorted(record.items())),
    }
    return _compact(doc).encode()


def release_record(tag: ReleaseTag, image_id: str, verdict: dict[str, Any], *,
                   pins: dict[str, Any] | None, cell: str | None, inputs: str | None,
                   pushed_digest: str) -> dict[str, str]:
    checks = verdict.get("checks") or {}
    summary = {k: bool(v.get("passed", v.get("ok")) if isinstance(v, dict) else v)
               for k, v in checks.items()}
    record = {
        A_TAG: str(tag), A_DATE: tag.date.isoformat(), A_IMAGE: image_id,
        A_SMOKE: "passed" if verdict.get("passed") is True else "failed",
        A_CHECKS: _compact(summary), A_PINS: _compact(pins or {}), A_PUSHED: pushed_digest,
        A_CREATED: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if cell:
        record[A_CELL] = cell
    if inputs:
        record[A_INPUTS] = inputs
    return record


@dataclass
class Release:
    repo: str
    tag: str
    digest: str
    image_id: str  # the config digest = the local image id docker reports
    annotations: dict[str, str]
    body: bytes = field(repr=False)
    media_type: str = OCI_MANIFEST
    is_latest: bool = False

    @property
    def release_tag(self) -> ReleaseTag | None:
        return parse_release_tag(self.tag)

    @property
    def recorded(self) -> bool:
        """Carries a release record; under a release tag it must name that very tag."""
        named = self.annotations.get(A_TAG, "")
        if parse_release_tag(self.tag) is not None:
            return named == self.tag
        return parse_release_tag(named) is not None

    @property
    def passed(self) -> bool:
        """Recorded as this release and smoke-passed, for exactly this image."""
        a = self.annotations
        return self.recorded and a.get(A_SMOKE) == "passed" and a.get(A_IMAGE) == self.image_id

    @property
    def verdict(self) -> str:
        return self.annotations.get(A_SMOKE, "passed?") if self.recorded else "unrecorded"

    @property
    def pins(self) -> dict[str, Any]:
        try:
            return json.loads(self.annotations.get(A_PINS, "{}"))
        except ValueError:
            return {}

    @property
    def config_descriptor(self) -> dict[str, Any]:
        return json.loads(self.body)["config"]

    def as_json(self) -> dict[str, Any]:
        return {"tag": self.tag, "digest": self.digest, "image_id": self.image_id,
                "latest": self.is_latest, "verdict": self.verdict,
                "date": self.annotations.get(A_DATE), "cell": self.annotations.get(A_CELL),
                "created": self.annotations.get(A_CREATED), "pins": self.pins,
                "checks": json.loads(self.annotations.get(A_CHECKS, "{}") or "{}")}


def read_release(client: RegistryClient, repo: str, tag: str) -> Release | None:
    """The release behind repo:tag (one manifest GET), or None if the tag does not exist."""
    try:
        body, media, digest = client.get_manifest(repo, tag)
    except NotFound:
        return None
    doc = json.loads(body)
    image_id = (doc.get("config") or {}).get("digest", "") if media in IMAGE_MANIFESTS else ""
    return Release(repo, tag, digest, image_id, dict(doc.get("annotations") or {}), body, media)


def list_releases(client: RegistryClient, repo: str) -> list[Release]:
    """Every release-shaped tag of repo, newest first; `is_latest` marks latest's."""
    try:
        tags = client.tags(repo)
    except NotFound:
        return []
    latest = client.head_manifest(repo, LATEST) if LATEST in tags else None
    found = []
    for tag in tags:
        if parse_release_tag(tag) is None:
            continue
        rel = read_release(client, repo, tag)
        if rel is not None:
            rel.is_latest = bool(latest and latest[0] == rel.digest)
            found.append(rel)
    return sorted(found, key=lambda r: r.release_tag.sort_key(), reverse=True)  # type: ignore[union-attr]


def resolve_tag(client: RegistryClient, repo: str, wanted: str) -> str:
    """A full release tag for `wanted` (full, or short DATE-NAME) in repo; UserError if none."""
    if FULL.match(wanted):
        return wanted
    m = SHORT.match(wanted)
    if not m:
        raise UserError(f"{wanted!r} is neither DATE-vX.Y.Z-NAME nor DATE-NAME",
                        fix="e.g. 2026-06-11-pr41703 or 2026-06-11-v0.23.0-pr41703")
    try:
        tags = client.tags(repo)
    except NotFound:
        tags = []
    hits = [t for t in tags if (rt := parse_release_tag(t)) and rt.short == wanted]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise UserError(f"{repo}: no release {wanted}",
                        fix="list them with `build.py releases`")
    raise UserError(f"{repo}: {wanted} is ambiguous ({', '.join(sorted(hits))})",
                    fix="give the full tag")


# --------------------------------------------------------------------------- the lease


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
    A lease of this host whose process is gone (or is us) is stale, since we hold the
    local flock, so a run killed mid-promote never blocks its own re-run; other leases
    are honoured until they expire after `ttl`.
    """

    def __init__(self, client: RegistryClient, repo: str, config: dict[str, Any], *,
                 purpose: str, ttl: float = LEASE_TTL, settle: float = LEASE_SETTLE,
                 log: Log = print):
        self.client, self.repo, self.log = client, repo, log
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self.host = socket.gethostname()
        self.ttl, self.settle = ttl, settle
        note = {f"{LEASE}.owner": self.owner, f"{LEASE}.host": self.host,
                f"{LEASE}.pid": str(os.getpid()),
                f"{LEASE}.purpose": purpose, f"{LEASE}.expires": f"{time.time() + ttl:.3f}"}
        # config: an existing config blob of this repo (a manifest must reference one)
        self.body = _compact({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                              "config": {**config, "mediaType": OCI_CONFIG}, "layers": [],
                              "annotations": note}).encode()
        self.digest: str | None = None

    def _holder(self) -> dict[str, str] | None:
        rel = read_release(self.client, self.repo, LEASE_TAG)
        return rel.annotations if rel else None

    def acquire(self) -> Lease:
        held = self._holder()
        if held and held.get(f"{LEASE}.owner") and held.get(f"{LEASE}.state") != "released":
            owner = held.get(f"{LEASE}.owner", "?")
            expires = float(held.get(f"{LEASE}.expires", "0") or 0)
            if held.get(f"{LEASE}.host") == self.host and not _other_live_pid(held):
                self.log(f"{self.repo}: taking over a stale lease of this host ({owner})")
            elif expires > time.time():
                raise OperationFailed(
                    f"{self.repo}: another run ({owner}, {held.get(f'{LEASE}.purpose')}) "
                    f"holds the registry lease for {expires - time.time():.0f} s more",
                    fix="wait for it to finish, then re-run (re-runs resume)")
            else:
                self.log(f"{self.repo}: taking over an expired lease of {owner}")
        self.digest = self.client.put_manifest(self.repo, LEASE_TAG, self.body, OCI_MANIFEST)
        time.sleep(self.settle)
        self.check()
        return self

    def check(self) -> None:
        """Raise unless the lease tag still points at our lease manifest."""
        now = self.client.head_manifest(self.repo, LEASE_TAG)
        if not now or now[0] != self.digest:
            holder = self._holder() or {}
            raise OperationFailed(
                f"{self.repo}: lost the registry lease to "
                f"{holder.get(f'{LEASE}.owner', 'another run')}; nothing moved by this run",
                fix="another run is promoting; wait for it, then re-run")

    def release(self) -> None:
        """Drop our lease if it is still ours; never raises (it runs in finally)."""
        try:
            now = self.client.head_manifest(self.repo, LEASE_TAG)
            if now and now[0] == self.digest:
                try:
                    self.client.delete_manifest(self.repo, self.digest)
                except Unsupported:  # deletes disabled: mark it released instead
                    doc = json.loads(self.body)
                    doc["annotations"][f"{LEASE}.state"] = "released"
                    self.client.put_manifest(self.repo, LEASE_TAG, _compact(doc).encode(),
                                             OCI_MANIFEST)
        except Exception as exc:  # noqa: BLE001 - a stale lease expires; report, go on
            self.log(f"{self.repo}: could not release the lease ({exc}); it expires in "
                     f"{self.ttl:.0f} s and this host's re-runs take it over")


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
        lease = Lease(client, repo, config, purpose=purpose, log=log,
                      settle=LEASE_SETTLE if settle is None else settle)
        lease.acquire()
        try:
            yield lease
        finally:
            lease.release()


# -------------------------------------------------------------------- moving `latest`


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
        old = (f"{self.before_tag or 'untagged'} ({_short(self.before_digest)})"
               if self.before_digest else "nothing")
        new = f"{self.target} ({_short(self.target_digest)})"
        if not self.moved and not self.dry_run:
            return f"{self.repo}: latest already at {new}"
        verb = "would move" if self.dry_run else "moved"
        return (f"{self.repo}: {verb} latest {old} -> {new}"
                + ("" if self.dry_run else f" in {self.seconds:.2f} s, {self.bytes:,} bytes"))


def _short(digest: str | None) -> str:
    return (digest or "-").removeprefix("sha256:")[:12]


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
            f"{rel.repo}: latest moved during this run ({_short(expected)} -> "
            f"{_short(now_digest)}); not moving it again", fix="check `build.py releases`")
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


def split_repository(ref: str) -> tuple[str, str]:
    """'127.0.0.1:5000/vllm-spark/img' (plan's `repository`) -> ('127.0.0.1:5000',
    'vllm-spark/img')."""
    host, _, path = ref.partition("/")
    if not path or not ("." in host or ":" in host or host == "localhost"):
        raise UserError(f"{ref!r} does not start with a registry host",
                        fix="use host[:port]/namespace/image")
    return host, path


def match_repositories(repos: list[str], pattern: str | None) -> list[str]:
    """Repos whose path, or image name (last component), matches a glob or equals it."""
    if not pattern:
        return sorted(repos)
    return sorted(r for r in repos if fnmatch.fnmatchcase(r, pattern)
                  or fnmatch.fnmatchcase(r.rsplit("/", 1)[-1], pattern))


def catalog_repositories(client: RegistryClient, namespace: str) -> list[str]:
    """Repositories under namespace per the registry catalog (for `releases` on a machine
    without the matrix; ghcr.io and Docker Hub do not serve a catalog)."""
    prefix = namespace.strip("/") + "/"
    return sorted(r for r in client.catalog() if r.startswith(prefix))


# ----------------------------------------------------------------------------- prune


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


# --------------------------------------------------------------------------- listing


def pins_text(pins: dict[str, Any]) -> str:
    parts = []
    eng = pins.get("engine") or {}
    if eng:
        parts.append(f"engine {eng.get('name', '?')} vLLM {eng.get('vllm', '?')}")
    for kind in ("model", "drafter"):
        pin = pins.get(kind) or {}
        if "repository" in pin:
            parts.append(f"{kind} {pin['repository']}@{str(pin.get('revision', '?'))[:12]}")
        elif "generated" in pin:
            parts.append(f"{kind} generated seed {pin.get('seed')}")
        elif "method" in pin:
            parts.append(f"{kind} {pin['method']}")
    return "; ".join(parts) or "-"


def format_releases(repo: str, rels: list[Release]) -> str:
    latest = next((r.tag for r in rels if r.is_latest), None)
    out = [f"{repo}  (latest -> {latest or 'no release'})"]
    for r in rels:
        mark = "*" if r.is_latest else " "
        out.append(f"  {mark} {r.tag:<34} {_short(r.digest)}  image {_short(r.image_id)}  "
                   f"smoke {r.verdict}")
        out.append(f"      pins: {pins_text(r.pins)}")
    if not rels:
        out.append("  (no releases)")
    return "\n".join(out)
