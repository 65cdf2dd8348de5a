"""The push (registry/push.py) with the real dockerd and distribution registry: what it
sends, Docker 20.10 pulls back as the same image (its id, the config digest), either way
a layer travels (uncompressed, parallel gzip of several members) and wherever it is read
from (dockerd's store, its image export); a registry that says it holds a blob it lacks
ends the push naming it. A two-layer image of ~9 MB: seconds per test."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile

import pytest
from test_publish import DOCKER, remove_local

from imagebuild import dockerstore
from imagebuild.registry import push as push_mod
from imagebuild.registry.errors import MissingBlob
from imagebuild.registry.push import push_image, verify_pushed
from tests.support.registry import FaultProxy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _docker(*args: str, data: bytes | None = None) -> str:
    return subprocess.run([DOCKER, *args], input=data, capture_output=True, check=True
                          ).stdout.decode().strip()


@pytest.fixture(scope="module")
def two_layers(docker_engine) -> str:
    """A local image of two layers: 9 MB of random bytes (three gzip members) imported,
    then a file added by `docker commit` (no container ever runs)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("payload.bin")
        info.size = 9_000_000
        tar.addfile(info, io.BytesIO(os.urandom(info.size)))
    base = _docker("import", "-", "imagebuild-test/push-base:1", data=buf.getvalue())
    box = _docker("create", base, "/none")
    try:
        _docker("cp", "-", f"{box}:/", data=_tar_of("added.txt", b"second layer\n"))
        image = _docker("commit", box, "imagebuild-test/push-two:1")
    finally:
        _docker("rm", box)
    yield image
    remove_local("imagebuild-test/push-two:1", "imagebuild-test/push-base:1")


def _tar_of(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _pull_fresh(registry, ref: str, image_id: str) -> str:
    """`docker pull` with the image gone locally (else dockerd skips the download), its
    id, and the image put back as it was."""
    cfg = registry.root / "docker-config"
    _docker("--config", str(cfg), "login", "-u", registry.user, "--password-stdin",
            registry.host, data=registry.password.encode())
    tags = _docker("image", "inspect", "-f", "{{join .RepoTags \" \"}}", image_id).split()
    remove_local(*tags)
    try:
        _docker("--config", str(cfg), "pull", ref)
        return _docker("image", "inspect", "-f", "{{.Id}}", ref)
    finally:
        for tag in tags:
            _docker("tag", ref, tag)
        remove_local(ref)


@pytest.mark.parametrize("enc", ["none", "gzip"])
def test_docker_pulls_back_the_same_image(registry, two_layers, enc, tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEBUILD_CACHE_DIR", str(tmp_path))
    client = registry.client()
    repo = f"push/{enc}"
    digest = push_image(client, repo, "t1", two_layers, encoding=enc, log=lambda _: None)
    manifest = verify_pushed(client, repo, "t1", two_layers, digest)
    diff_ids = json.loads(_docker("image", "inspect", "-f", "{{json .RootFS.Layers}}",
                                  two_layers))
    if enc == "gzip":  # the 9 MB layer is three gzip members, one per 4 MiB piece
        assert all(d["mediaType"].endswith("tar+gzip") for d in manifest["layers"])
        assert client.get_blob(repo, manifest["layers"][0]["digest"]).count(b"\x1f\x8b\x08") >= 3
    else:  # an uncompressed layer's digest is its diff id
        assert [d["digest"] for d in manifest["layers"]] == diff_ids
    assert _pull_fresh(registry, f"{registry.host}/{repo}:t1", two_layers) == two_layers


def test_the_store_and_the_export_give_the_same_blobs(registry, two_layers, tmp_path,
                                                       monkeypatch):
    monkeypatch.setenv("IMAGEBUILD_CACHE_DIR", str(tmp_path))
    client = registry.client()
    store = dockerstore.local_image(two_layers)
    assert store.source == "store"  # this suite runs as root: dockerd's files are readable
    push_image(client, "push/store", "t1", two_layers, encoding="none", log=lambda _: None)
    monkeypatch.setattr(push_mod, "local_image",
                        lambda i: dockerstore.from_export(i, store.diff_ids))
    monkeypatch.setenv("IMAGEBUILD_CACHE_DIR", str(tmp_path / "no-records"))
    push_image(client, "push/export", "t1", two_layers, encoding="none", log=lambda _: None)
    a, _ = client.image_manifest("push/store", "t1")
    b, _ = client.image_manifest("push/export", "t1")
    assert a == b


def test_a_registry_that_says_it_holds_a_blob_it_lacks_ends_the_push(registry, two_layers,
                                                                     tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEBUILD_CACHE_DIR", str(tmp_path))
    with FaultProxy(registry.url) as proxy:
        base = proxy._server.RequestHandlerClass

        class Lies(base):  # type: ignore[misc,valid-type]
            def do_HEAD(self):  # noqa: N802 - every blob is "there"
                if "/blobs/" in self.path:
                    self._send(200, [("Docker-Content-Digest", self.path.rsplit("/", 1)[1])],
                               b"", length=1234)
                    return
                super().do_HEAD()

        proxy._server.RequestHandlerClass = Lies
        client = registry.client(proxy.url)
        with pytest.raises(MissingBlob) as err:
            push_image(client, "push/lies", "t1", two_layers, encoding="gzip",
                       log=lambda _: None)
    assert proxy.host in err.value.message and "MANIFEST_BLOB_UNKNOWN" in err.value.message
    assert "push/lies" not in registry.client().catalog()  # no manifest, no tag
