"""RegistryClient against a real distribution registry (htpasswd auth) on loopback,
with images pushed by the real Docker CLI, and a fault-injecting proxy in front."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from imagebuild.errors import OperationFailed, UserError
from imagebuild.registry.client import (
    DOCKER_LIST,
    DOCKER_MANIFEST,
    OCI_INDEX,
    PASSWORD_ENV,
    USER_ENV,
    AuthError,
    NotFound,
    RegistryClient,
    Unsupported,
)
from tests.support.registry import (
    FaultProxy,
    docker_login,
    push_tiny_image,
    running_registry,
)
from tests.support.registry.proxy import BearerRealm
from tests.support.registry.server import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

LABELS = {
    "org.opencontainers.image.version": "2026-06-18-v0.23.0-dflashfix",
    "imagebuild.cell": "cpu",
}
LAYER = 256 * 1024  # random bytes: the layer cannot compress below this


def _need(tool: str) -> None:
    if shutil.which(tool) is None and not os.path.exists(tool):
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is required in CI")
        pytest.skip(f"{tool} not installed")


@pytest.fixture(scope="module")
def image(registry):
    return push_tiny_image(registry, "test/tiny", ("v1", "v2", "v3", "v4"), labels=LABELS,
                           size=LAYER)


@pytest.fixture
def client(registry):
    return registry.client(backoff=0.05)


@pytest.fixture
def proxy(registry):
    with FaultProxy(registry.url) as p:
        yield p


@pytest.fixture
def pclient(registry, proxy):
    c = registry.client(proxy.url, backoff=0.05)
    c.ping()  # learn the auth scheme now, so the proxy's log below holds only the test
    proxy.clear()
    return c


# --- ping and auth


def test_ping_with_the_right_credentials(client):
    client.ping()


def test_wrong_password_is_a_401_message_naming_the_env_vars(registry):
    bad = RegistryClient(registry.url, username=registry.user, password="definitely-wrong-pw")
    with pytest.raises(AuthError) as err:
        bad.ping()
    text = err.value.render()
    assert err.value.exit_code == 2
    assert "rejected the credentials" in text and registry.user in text
    assert USER_ENV in text and PASSWORD_ENV in text
    assert "definitely-wrong-pw" not in text and registry.password not in text


def test_credentials_come_from_env_then_docker_config(registry, image, monkeypatch, tmp_path):
    monkeypatch.setenv(USER_ENV, registry.user)
    monkeypatch.setenv(PASSWORD_ENV, registry.password)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))  # empty: env must be what works
    RegistryClient(registry.url).ping()
    monkeypatch.delenv(USER_ENV)
    monkeypatch.delenv(PASSWORD_ENV)
    with pytest.raises(AuthError, match="needs credentials"):
        RegistryClient(registry.url).ping()
    # `docker login` wrote config.json with a base64 auth entry: the client reads it
    monkeypatch.setenv("DOCKER_CONFIG", str(docker_login(registry)))
    c = RegistryClient(registry.url)
    assert "docker config" in repr(c)
    assert c.head_manifest("test/tiny", "v1")[0] == image.digest


class _NotARegistry(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server API)
        body = b"<html><body>welcome</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_server_that_is_not_a_v2_registry_is_named_so():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotARegistry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(UserError, match="not an OCI/Docker v2 registry"):
            RegistryClient(f"127.0.0.1:{server.server_address[1]}").ping()
    finally:
        server.shutdown()
        server.server_close()


def test_403_is_a_permission_message(registry, proxy, pclient, image):
    proxy.fail(403, path="/manifests/")
    with pytest.raises(AuthError, match="no permission for repository:test/tiny:pull"):
        pclient.get_manifest("test/tiny", "v1")


# --- reading


def test_head_and_get_manifest_match_what_docker_pushed(client, image):
    digest, media, size = client.head_manifest("test/tiny", "v1")
    assert digest == image.digest and media == DOCKER_MANIFEST and size == image.manifest_size
    body, media2, digest2 = client.get_manifest("test/tiny", "v1")
    assert media2 == DOCKER_MANIFEST and digest2 == image.digest
    assert "sha256:" + hashlib.sha256(body).hexdigest() == image.digest
    assert client.get_manifest("test/tiny", image.digest)[0] == body
    assert client.head_manifest("test/tiny", "no-such-tag") is None
    with pytest.raises(NotFound, match="test/tiny:no-such-tag"):
        client.get_manifest("test/tiny", "no-such-tag")
    with pytest.raises(NotFound):
        client.tags("test/no-such-repo")


def test_image_labels_come_from_the_config_blob(client, image):
    assert client.image_labels("test/tiny", "v1") == LABELS


def test_tag_pagination_follows_link_headers(registry, image, proxy, pclient, client):
    # distribution 2.8 ignores ?n= on tags/list; the proxy pages like OCI 1.1 registries
    assert set(client.tags("test/tiny", page_size=1)) >= set(image.tags)  # no Link: 1 page
    proxy.paginate_tags = True
    got = pclient.tags("test/tiny", page_size=1)
    assert got == sorted(client.tags("test/tiny"))
    assert proxy.count("GET", r"/tags/list\?n=1") == len(got)  # one page per tag


def test_catalog_pagination_against_the_real_registry(registry, client, image):
    push_tiny_image(registry, "test/other", ("x",), size=1024)
    assert client.catalog(page_size=1) == ["test/other", "test/tiny"]


def test_indexes_and_manifest_lists_are_read_and_resolved_per_platform(client, image):
    for media in (OCI_INDEX, DOCKER_LIST):
        entry = {"mediaType": DOCKER_MANIFEST, "size": image.manifest_size, "digest": image.digest}
        index = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": media,
                "manifests": [
                    {**entry, "platform": {"os": "linux", "architecture": "amd64"}},
                    {**entry, "platform": {"os": "linux", "architecture": "arm64"}},
                    {**entry, "platform": {"os": "unknown", "architecture": "unknown"}},
                ],
            }
        ).encode()
        tag = "multi-oci" if media == OCI_INDEX else "multi-docker"
        digest = client.put_manifest("test/tiny", tag, index, media)
        body, got_media, got_digest = client.get_manifest("test/tiny", tag)
        assert (body, got_media, got_digest) == (index, media, digest)
        assert client.image_labels("test/tiny", tag, platform="linux/arm64") == LABELS
        with pytest.raises(UserError, match="linux/amd64, linux/arm64"):
            client.image_labels("test/tiny", tag)  # two platforms: caller must choose


# --- server-side retag


def test_copy_tag_moves_manifest_bytes_only(registry, image, proxy, pclient, client):
    pclient.bytes.reset()
    t0 = time.perf_counter()
    digest = pclient.copy_tag("test/tiny", "v1", "latest")
    elapsed = time.perf_counter() - t0
    assert digest == image.digest
    assert client.head_manifest("test/tiny", "latest")[0] == image.digest
    # GET + PUT of the manifest (plus a body-less HEAD): nothing else crosses the wire
    assert set(pclient.bytes.by_kind) == {"manifest"}
    assert pclient.bytes.total == 2 * image.manifest_size
    assert pclient.bytes.total < image.layer_size / 100
    assert proxy.count(path="/blobs/") == 0
    print(f"\ncopy_tag over loopback: {elapsed * 1000:.1f} ms, {pclient.bytes.summary()}")
    # re-running is a no-op: GET + HEAD, no PUT
    proxy.clear()
    pclient.bytes.reset()
    assert pclient.copy_tag("test/tiny", "v1", "latest") == image.digest
    assert proxy.count("PUT") == 0 and pclient.bytes.total == image.manifest_size


def test_copy_tag_by_digest(client, image):
    assert client.copy_tag("test/tiny", image.digest, "rollback-target") == image.digest
    assert client.head_manifest("test/tiny", "rollback-target")[0] == image.digest


def test_put_manifest_rejects_bytes_that_do_not_match_a_digest_ref(client, image):
    body, media, _ = client.get_manifest("test/tiny", "v1")
    wrong = "sha256:" + "0" * 64
    with pytest.raises(UserError, match="do not hash to"):
        client.put_manifest("test/tiny", wrong, body, media)


# --- deleting


def test_delete_tag_refuses_when_another_tag_shares_the_manifest(client, image):
    with pytest.raises(Unsupported, match="also tagged .*v1"):
        client.delete_tag("test/tiny", "v2")
    assert client.head_manifest("test/tiny", "v2") is not None


def test_delete_tag_of_a_sole_tag_deletes_its_manifest(registry, client):
    pushed = push_tiny_image(registry, "test/doomed", ("only",), size=1024)
    assert client.delete_tag("test/doomed", "only") == pushed.digest
    assert client.head_manifest("test/doomed", "only") is None
    assert "only" not in client.tags("test/doomed")
    with pytest.raises(NotFound):
        client.delete_manifest("test/doomed", pushed.digest)


def test_delete_on_a_registry_with_deletes_disabled_is_a_clear_error():
    with running_registry(delete_enabled=False) as r:
        pushed = push_tiny_image(r, "test/keep", ("v1",), size=1024)
        c = r.client()
        with pytest.raises(Unsupported, match="does not allow") as err:
            c.delete_manifest("test/keep", pushed.digest)
        assert "storage.delete.enabled" in err.value.fix


# --- retries through the fault proxy


def test_retries_500_then_succeeds(proxy, pclient, image):
    proxy.fail(500, times=2, method="GET", path="/manifests/v1")
    assert pclient.get_manifest("test/tiny", "v1")[2] == image.digest
    outcomes = [s.outcome for s in proxy.seen if "/manifests/v1" in s.path]
    assert outcomes[:2] == ["fail 500", "fail 500"] and outcomes[-1] == "forwarded 200"


def test_429_honours_retry_after(proxy, pclient, image):
    proxy.fail(429, times=1, method="HEAD", path="/manifests/v1", retry_after=1)
    t0 = time.monotonic()
    assert pclient.head_manifest("test/tiny", "v1")[0] == image.digest
    assert time.monotonic() - t0 >= 0.95  # backoff alone would be 0.05 s
    assert proxy.count("HEAD", "/manifests/v1") == 2


def test_gives_up_after_retries_are_exhausted(registry, proxy, image):
    c = registry.client(proxy.url, retries=2, backoff=0.01)
    proxy.fail(503, times=10, path="/manifests/v1")
    with pytest.raises(OperationFailed, match="HTTP 503 after 3 attempts"):
        c.get_manifest("test/tiny", "v1")
    assert proxy.count(path="/manifests/v1") == 3


def test_a_connection_cut_mid_body_is_retried(proxy, pclient, image):
    proxy.cut(method="GET", path="/manifests/v1")
    assert pclient.get_manifest("test/tiny", "v1")[2] == image.digest
    assert [s.outcome for s in proxy.seen if "/manifests/v1" in s.path] == ["cut", "forwarded 200"]


def test_a_dead_registry_fails_cleanly_after_retries(registry, proxy, image):
    c = registry.client(proxy.url, retries=3, backoff=0.01)
    proxy.die()
    with pytest.raises(OperationFailed, match=r"cannot reach the registry .*4 attempt") as err:
        c.get_manifest("test/tiny", "v1")
    assert "scripts/start-registry.sh" in err.value.fix
    assert proxy.count("GET") == 4
    proxy.revive()
    assert c.get_manifest("test/tiny", "v1")[2] == image.digest


# --- bearer-token auth (the proxy serves the realm, the registry stays basic-auth)


def test_bearer_token_flow_with_per_scope_cache(registry, image):
    realm = BearerRealm("tokenuser", "tokenpw", registry.user, registry.password)
    with FaultProxy(registry.url, bearer=realm) as p:
        c = RegistryClient(p.url, username="tokenuser", password="tokenpw")
        c.ping()
        assert c.head_manifest("test/tiny", "v1")[0] == image.digest
        assert c.image_labels("test/tiny", "v1") == LABELS
        assert c.copy_tag("test/tiny", "v1", "via-bearer") == image.digest
        # a token per scope, fetched once: pull, then pull,push for the PUT
        assert realm.issued.count("repository:test/tiny:pull") == 1
        assert realm.issued.count("repository:test/tiny:pull,push") == 1
        bad = RegistryClient(p.url, username="tokenuser", password="nope-pw")
        with pytest.raises(AuthError, match="refused a token") as err:
            bad.head_manifest("test/tiny", "v1")
        assert "nope-pw" not in err.value.render()


# --- scripts/start-registry.sh (what .ci/run and the README use)


def test_start_registry_script_is_idempotent_and_checks_credentials(tmp_path):
    for tool in ("docker-registry", "htpasswd", "curl"):
        _need(tool)
    script = Path(__file__).resolve().parents[2] / "scripts" / "start-registry.sh"
    port = str(free_port())
    env = {**os.environ, USER_ENV: "ciuser", PASSWORD_ENV: "ci-password"}

    def run(*args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(script), "--port", port, "--dir", str(tmp_path), *args],
            capture_output=True,
            text=True,
            timeout=30,
            **kw,
        )

    try:
        first = run(env=env)
        assert first.returncode == 0, first.stderr
        assert first.stdout.strip() == f"http://127.0.0.1:{port}"
        pid = (tmp_path / "registry.pid").read_text()
        again = run(env=env)
        assert again.returncode == 0 and again.stdout == first.stdout
        assert (tmp_path / "registry.pid").read_text() == pid  # nothing new was started
        wrong = run("--password", "other", env=env)
        assert wrong.returncode == 1 and "rejects these credentials" in wrong.stderr
        assert "ci-password" not in (tmp_path / "config.yml").read_text()
        RegistryClient(first.stdout.strip(), username="ciuser", password="ci-password").ping()
    finally:
        run("--stop")
