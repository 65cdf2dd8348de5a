"""Publish under faults: the real registry behind FaultProxy (500s, 429s, a connection cut
mid-upload, a registry that dies mid-push), wrong credentials, and the registry process
killed during promote. After each: latest points at a release that passed, no tag points
at an untested image, and a re-run completes."""

from __future__ import annotations

import socket

import pytest
from test_publish import Publisher, assert_safe, raw_tags

from imagebuild.errors import ImagebuildError, OperationFailed
from imagebuild.registry.client import AuthError, Credentials, RegistryClient
from imagebuild.registry.records import LATEST, read_release
from imagebuild.release.lease import LEASE_TAG
from tests.support.registry import FaultProxy
from tests.support.registry.server import start_registry

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

OLD, NEW = "2026-06-11-v0.23.0-pr41703", "2026-06-18-v0.23.0-dflashfix"


def _hooked(proxy: FaultProxy, hook):
    """Run hook(handler) before FaultProxy handles each request; hook returns True when
    it has dealt with the request itself (e.g. cut the connection mid-upload). The
    proxy's own handler class is changed, so connections a client keeps alive from
    before get the hook too (the push reuses its session's connections)."""
    base = proxy._server.RequestHandlerClass
    handle = base._handle

    def hooked(self):
        if not hook(self):
            handle(self)

    base.do_GET = base.do_HEAD = base.do_PUT = base.do_POST = base.do_PATCH = \
        base.do_DELETE = hooked
    return proxy


@pytest.fixture
def proxy(registry):
    with FaultProxy(registry.url) as p:
        yield p


@pytest.fixture
def direct(registry):
    return registry.client(backoff=0.05)


@pytest.fixture
def pub(request, registry, proxy, direct):
    """A repository whose latest is the passed release OLD; the client goes via the proxy,
    and so does dockerd (the image name carries the proxy's host)."""
    via = registry.client(proxy.url, backoff=0.05)
    p = Publisher(registry, via, f"faults/{request.node.name.replace('_', '-')[:60]}")
    p.publish(OLD)
    proxy.clear()
    yield p
    p.cleanup()


def _latest_tag(client: RegistryClient, repo: str) -> str:
    rel = read_release(client, repo, LATEST)
    assert rel is not None
    return rel.annotations["io.imagebuild.release.tag"]


def _after_failure(pub: Publisher, direct: RegistryClient) -> None:
    assert _latest_tag(direct, pub.repo) == OLD
    assert_safe(direct, pub.repo, pub.tested())


def _rerun_completes(pub: Publisher, proxy: FaultProxy, direct: RegistryClient) -> None:
    proxy.clear()
    proxy.revive()
    res = pub.publish(NEW)
    assert res.digest == direct.digest(pub.repo, NEW) == direct.digest(pub.repo, LATEST)
    assert sorted(direct.tags(pub.repo)) == sorted([OLD, NEW, LATEST])
    assert_safe(direct, pub.repo, pub.tested())


def test_500s_and_429s_are_retried_and_the_run_completes(pub, proxy, direct):
    proxy.fail(500, times=2, method="PUT", path="/manifests/")
    proxy.fail(429, times=2, method="HEAD", path="/manifests/latest", retry_after="0.1")
    proxy.fail(503, times=1, method="GET", path="/tags/list")
    pub.publish(NEW)
    assert proxy.count(path="/manifests/") and not proxy._rules[0].times  # faults were hit
    assert all(r.times == 0 for r in proxy._rules)
    assert _latest_tag(direct, pub.repo) == NEW
    assert_safe(direct, pub.repo, pub.tested())


def test_persistent_500_on_moving_latest_leaves_it_and_a_rerun_finishes(pub, proxy, direct):
    proxy.fail(500, times=1000, method="PUT", path="/manifests/latest")
    with pytest.raises(OperationFailed, match="HTTP 500"):
        pub.publish(NEW)
    _after_failure(pub, direct)
    assert read_release(direct, pub.repo, NEW).passed  # the release itself is recorded
    _rerun_completes(pub, proxy, direct)


def test_429_on_the_release_tag_then_rerun(pub, proxy, direct):
    proxy.fail(429, times=1000, method="PUT", path=f"/manifests/{NEW}", retry_after="0")
    with pytest.raises(OperationFailed, match="HTTP 429"):
        pub.publish(NEW)
    _after_failure(pub, direct)
    assert NEW not in direct.tags(pub.repo)
    _rerun_completes(pub, proxy, direct)


def test_a_connection_cut_mid_upload(pub, proxy, direct):
    cuts = {"left": 3}

    def cut(handler) -> bool:
        if handler.command not in ("PATCH", "PUT") or "/blobs/uploads/" not in handler.path:
            return False
        if cuts["left"] <= 0:
            return False
        cuts["left"] -= 1
        length = int(handler.headers.get("Content-Length") or 0)
        handler.rfile.read(max(1, length // 2) if length else 1024)  # half the upload...
        proxy._record(handler.command, handler.path, "cut")
        handler.close_connection = True
        handler.connection.shutdown(socket.SHUT_RDWR)  # ...then the connection goes
        return True

    _hooked(proxy, cut)
    try:
        pub.publish(NEW)  # the push is tried again whole; if every try is cut, it fails
    except OperationFailed as exc:
        assert proxy.host in exc.message  # cleanly, naming the registry
        _after_failure(pub, direct)
    assert proxy.count(path="/blobs/uploads/") and cuts["left"] < 3
    assert_safe(direct, pub.repo, pub.tested())
    _rerun_completes(pub, proxy, direct)


def test_registry_dies_mid_push(pub, proxy, direct):
    once = {"armed": True}

    def die_on_upload(handler) -> bool:
        if once["armed"] and handler.command == "POST" and "/blobs/uploads/" in handler.path:
            once["armed"] = False
            proxy.die()
        return False

    _hooked(proxy, die_on_upload)
    with pytest.raises(OperationFailed, match=f"cannot reach the registry at .*{proxy.host}"):
        pub.publish(NEW, push_attempts=1)
    assert proxy.dead
    _after_failure(pub, direct)
    _rerun_completes(pub, proxy, direct)


def test_wrong_credentials(registry, pub, proxy, direct):
    before = raw_tags(registry.url, pub.repo, registry.user, registry.password)
    good = pub.client
    pub.client = RegistryClient(proxy.url, username=registry.user, password="wrong-pw-123")
    with pytest.raises(AuthError) as err:
        pub.publish(NEW)
    assert "wrong-pw-123" not in err.value.render() and registry.password not in err.value.render()
    assert [s.method for s in proxy.seen] == ["GET"] * len(proxy.seen)  # only the ping
    # the client's credentials work but the push's do not: the push fails, nothing moves
    pub.client, good_creds = good, pub.creds
    pub.creds = Credentials(registry.user, "wrong-pw-456")
    with pytest.raises(AuthError, match="rejected the credentials") as err:
        pub.publish(NEW)
    assert "wrong-pw-456" not in err.value.render()
    assert raw_tags(registry.url, pub.repo, registry.user, registry.password) == before
    _after_failure(pub, direct)
    pub.creds = good_creds
    _rerun_completes(pub, proxy, direct)


def test_registry_killed_during_promote(registry, tmp_path):
    """SIGKILL the registry process right after the release tag is written; restart it on
    the same storage; latest is still the old release; the re-run finishes the job."""
    first = start_registry(tmp_path / "registry")
    second = None
    try:
        client = first.client(backoff=0.02, retries=1)
        pub = Publisher(first, client, "faults/killed")
        pub.publish(OLD)
        put = client.put_manifest

        def put_then_die(repo, ref, body, media):
            digest = put(repo, ref, body, media)
            if ref == NEW:
                first.process.kill()
                first.process.wait()
            return digest

        client.put_manifest = put_then_die  # type: ignore[method-assign]
        with pytest.raises(ImagebuildError):
            pub.publish(NEW)
        second = start_registry(tmp_path / "registry", user=first.user, password=first.password)
        direct = first.client(second.url)
        _after_failure(pub, direct)
        assert LEASE_TAG in direct.tags(pub.repo)  # the killed run's lease is left behind
        pub.client = first.client(second.url)
        res = pub.publish(NEW)  # this host's stale lease is taken over
        assert not res.pushed and res.latest_moved
        assert sorted(direct.tags(pub.repo)) == sorted([OLD, NEW, LATEST])
        assert _latest_tag(direct, pub.repo) == NEW
        assert_safe(direct, pub.repo, pub.tested())
        pub.cleanup()
    finally:
        for r in (second, first):
            if r is not None:
                r.stop()
