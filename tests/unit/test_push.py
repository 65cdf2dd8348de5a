"""The push (registry/push.py) against the in-memory registry: what is sent, found, mounted
or refused, for an image in memory (tests/support/localimage.py). The real dockerd store,
export and `docker pull` are tests/e2e/test_push_pull.py's."""

from __future__ import annotations

import gzip
import json

import pytest

from imagebuild.dockerstore import StoreUnreadable
from imagebuild.errors import OperationFailed, UserError
from imagebuild.registry import push as push_mod
from imagebuild.registry.errors import MissingBlob, RegistryFault
from imagebuild.registry.push import push_image, push_with_retries, verify_pushed
from imagebuild.registry.pushrecords import recall
from imagebuild.registry.streams import OCI_GZIP, OCI_TAR, encoding_for
from tests.support.localimage import MemImage, random_layer, sha
from tests.support.memregistry import MemRegistry

REPO, OTHER, ENGINE = "vllm-spark/cell-a", "vllm-spark/cell-b", "vllm-spark/engine-cpu"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEBUILD_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def image(monkeypatch) -> MemImage:
    img = MemImage([random_layer(300_000), random_layer(9_000_000), random_layer(2_000)])
    monkeypatch.setattr(push_mod, "local_image", img.local_image)
    return img


def _patches(reg: MemRegistry) -> int:
    return sum(1 for m, _ in reg.calls if m == "PATCH")


def _manifest(reg: MemRegistry, repo: str, tag: str) -> dict:
    body, _ = reg.manifests[repo][reg.tags[repo][tag]]
    return json.loads(body)


@pytest.mark.parametrize("enc, media", [("none", OCI_TAR), ("gzip", OCI_GZIP)])
def test_a_fresh_push_sends_every_layer_and_an_oci_manifest_of_the_image(image, enc, media):
    reg = MemRegistry()
    digest = push_image(reg.client(), REPO, "t1", image.image_id, encoding=enc,
                        log=lambda _: None)
    doc = _manifest(reg, REPO, "t1")
    assert sha(reg.manifests[REPO][reg.tags[REPO]["t1"]][0]) == digest
    assert doc["config"]["digest"] == image.image_id
    assert reg.blobs[REPO][image.image_id] == image.config  # the exact bytes: the image id
    assert [d["mediaType"] for d in doc["layers"]] == [media] * 3
    for desc, tar in zip(doc["layers"], image.tars, strict=True):
        blob = reg.blobs[REPO][desc["digest"]]
        assert desc["size"] == len(blob)
        assert (gzip.decompress(blob) if enc == "gzip" else blob) == tar
    assert _patches(reg) == 3
    verify_pushed(reg.client(), REPO, "t1", image.image_id, digest)


def test_gzip_is_several_members_one_per_piece(image):
    reg = MemRegistry()
    push_image(reg.client(), REPO, "t1", image.image_id, encoding="gzip", log=lambda _: None)
    big = reg.blobs[REPO][_manifest(reg, REPO, "t1")["layers"][1]["digest"]]
    assert big.count(b"\x1f\x8b\x08") >= 3  # 9 MB in 4 MiB pieces: three gzip members
    assert gzip.decompress(big) == image.tars[1]


def test_a_rerun_to_the_same_repository_sends_nothing(image):
    reg = MemRegistry()
    first = push_image(reg.client(), REPO, "t1", image.image_id, log=lambda _: None)
    reg.calls.clear()
    image.read.clear()
    assert push_image(reg.client(), REPO, "t1", image.image_id, log=lambda _: None) == first
    assert _patches(reg) == 0 and image.read == []


@pytest.mark.parametrize("enc", ["none", "gzip"])
def test_another_repository_of_the_registry_gets_mounts(image, enc):
    reg = MemRegistry()
    push_image(reg.client(), REPO, "t1", image.image_id, encoding=enc, log=lambda _: None)
    reg.calls.clear()
    image.read.clear()
    push_image(reg.client(), OTHER, "t1", image.image_id, encoding=enc, log=lambda _: None)
    closes = [p for m, p in reg.calls if m == "PUT" and "/blobs/uploads/" in p]
    assert len(closes) == 1 and _patches(reg) == 0 and image.read == []  # the config only
    assert _manifest(reg, OTHER, "t1")["layers"] == _manifest(reg, REPO, "t1")["layers"]
    blob, repos = recall(reg.client().host, image.diff_ids[0], enc)
    assert repos[:2] == (OTHER, REPO)


def test_a_known_image_lends_its_layers_without_records(image, tmp_path, monkeypatch):
    """The engine a cell was built on: its manifest and config map diff ids to blobs of
    its repository, mounted without reading a byte (no records on this machine)."""
    reg = MemRegistry()
    engine = MemImage(image.tars[:2])
    monkeypatch.setattr(push_mod, "local_image", engine.local_image)
    engine_digest = push_image(reg.client(), ENGINE, "inputs-x", engine.image_id,
                               encoding="gzip", log=lambda _: None)
    monkeypatch.setenv("IMAGEBUILD_CACHE_DIR", str(tmp_path / "another-machine"))
    monkeypatch.setattr(push_mod, "local_image", image.local_image)
    reg.calls.clear()
    known = (f"{reg.client().host}/{ENGINE}@{engine_digest}",)
    push_image(reg.client(), REPO, "t1", image.image_id, encoding="gzip", known=known,
               log=lambda _: None)
    assert image.read == [image.diff_ids[2]] and _patches(reg) == 1
    layers = _manifest(reg, REPO, "t1")["layers"]
    assert layers[:2] == _manifest(reg, ENGINE, "inputs-x")["layers"]


def test_a_registry_that_says_it_holds_a_blob_it_lacks_is_a_registry_fault(image):
    reg = MemRegistry()
    reg.check_blobs = True
    reg.phantom[image.diff_ids[1]] = len(image.tars[1])  # HEAD 200, nothing stored
    with pytest.raises(MissingBlob) as err:
        push_image(reg.client(), REPO, "t1", image.image_id, log=lambda _: None)
    assert "127.0.0.1:5999" in err.value.message and "MANIFEST_BLOB_UNKNOWN" in err.value.message
    assert "t1" not in reg.tags.get(REPO, {})


def test_a_blob_of_the_wrong_size_is_a_registry_fault(image):
    reg = MemRegistry()
    push_image(reg.client(), REPO, "t1", image.image_id, encoding="gzip", log=lambda _: None)
    gz = _manifest(reg, REPO, "t1")["layers"][0]["digest"]
    reg.blobs[REPO][gz] += b"tail"  # the registry now says another size for that digest
    with pytest.raises(RegistryFault, match="127.0.0.1:5999.*size"):
        push_image(reg.client(), REPO, "t2", image.image_id, encoding="gzip",
                   log=lambda _: None)


def test_read_back_refuses_a_manifest_whose_blob_is_gone(image):
    reg = MemRegistry()
    digest = push_image(reg.client(), REPO, "t1", image.image_id, log=lambda _: None)
    del reg.blobs[REPO][image.diff_ids[0]]
    with pytest.raises(MissingBlob, match="127.0.0.1:5999"):
        verify_pushed(reg.client(), REPO, "t1", image.image_id, digest)


def test_bytes_that_are_not_the_layer_are_never_closed_into_a_blob(image, monkeypatch):
    reg = MemRegistry()
    image.tars[1] = image.tars[1][:-1] + b"!"  # the store gives other bytes than the id
    with pytest.raises(OperationFailed, match="hashes to"):
        push_image(reg.client(), REPO, "t1", image.image_id, log=lambda _: None)
    assert image.diff_ids[1] not in reg.blobs.get(REPO, {})
    assert "t1" not in reg.tags.get(REPO, {})


def test_an_export_that_names_no_layer_sends_only_what_is_wanted(monkeypatch):
    """A legacy export: every layer is read (known only once hashed); one the registry
    holds already is sent on speculation but never closed, and the config arrives with
    the stream."""
    img = MemImage([random_layer(50_000), random_layer(60_000)], source="export",
                   unnamed=True)
    monkeypatch.setattr(push_mod, "local_image", img.local_image)
    reg = MemRegistry()
    client = reg.client()
    client.put_blob(REPO, img.tars[0])  # the first layer is there already
    reg.calls.clear()
    push_image(client, REPO, "t1", img.image_id, log=lambda _: None)
    assert _patches(reg) == 2  # both streamed ...
    closes = [p for m, p in reg.calls if m == "PUT" and "/blobs/uploads/" in p]
    assert len(closes) == 2  # ... the second layer and the config closed, not the first
    assert reg.blobs[REPO][img.image_id] == img.config
    assert len(reg.uploads) == 1  # the speculative one, left open


def test_an_unreadable_store_falls_back_to_the_export(image, monkeypatch):
    reg = MemRegistry()
    export = MemImage(image.tars, source="export")
    calls = []

    def broken(_image, _wanted):
        raise StoreUnreadable("a tar-split record is gone")
        yield  # pragma: no cover - a generator

    def from_export(image_id, diff_ids):
        calls.append(image_id)
        return export.local_image(image_id)

    monkeypatch.setattr(push_mod, "local_image",
                        lambda i: image.local_image(i).__class__(
                            i, image.diff_ids, "store", image.config, _reader=broken))
    monkeypatch.setattr(push_mod, "from_export", from_export)
    lines: list[str] = []
    push_image(reg.client(), REPO, "t1", image.image_id, log=lines.append)
    assert calls == [image.image_id] and export.read == list(image.diff_ids)
    assert any("reading the image export instead" in line for line in lines)


def test_a_failed_push_is_retried_whole_and_finds_what_arrived(image, monkeypatch):
    reg = MemRegistry()
    real = push_mod.push_image
    runs = []

    def flaky(*a, **kw):
        runs.append(1)
        if len(runs) == 1:
            real(*a, **kw)  # everything arrives, then the answer is lost
            raise OperationFailed("connection reset")
        return real(*a, **kw)

    monkeypatch.setattr(push_mod, "push_image", flaky)
    push_with_retries(reg.client(), REPO, "t1", image.image_id, backoff=0, log=lambda _: None)
    assert len(runs) == 2 and image.read == list(image.diff_ids)  # read once, not twice


def test_a_gzip_push_killed_midway_resumes_without_compressing_what_arrived(image,
                                                                            monkeypatch):
    """A gzipped layer's digest is known only by compressing it: the record of each
    layer is written when it lands, so a re-run after a push killed on the third layer
    finds the first one instead of reading and sending it again."""
    reg = MemRegistry()
    chunks = image._chunks

    def killed_on_the_last(data: bytes):
        if data is image.tars[2]:
            raise OperationFailed("killed")
        return chunks(data)

    monkeypatch.setattr(image, "_chunks", killed_on_the_last)
    with pytest.raises(OperationFailed, match="killed"):
        push_image(reg.client(), REPO, "t1", image.image_id, encoding="gzip",
                   log=lambda _: None)
    assert "t1" not in reg.tags.get(REPO, {})
    monkeypatch.setattr(image, "_chunks", chunks)
    image.read.clear()
    push_image(reg.client(), REPO, "t1", image.image_id, encoding="gzip", log=lambda _: None)
    assert image.diff_ids[0] not in image.read and image.diff_ids[2] in image.read
    assert gzip.decompress(reg.blobs[REPO][_manifest(reg, REPO, "t1")["layers"][0]["digest"]]
                           ) == image.tars[0]


def test_wrong_credentials_are_not_retried(image, monkeypatch):
    from imagebuild.registry.errors import AuthError

    runs = []

    def denied(*a, **kw):
        runs.append(1)
        raise AuthError("registry 127.0.0.1:5999 rejected the credentials")

    monkeypatch.setattr(push_mod, "push_image", denied)
    with pytest.raises(AuthError):
        push_with_retries(MemRegistry().client(), REPO, "t1", image.image_id, backoff=0)
    assert runs == [1]


@pytest.mark.parametrize("host, env, want", [
    ("127.0.0.1:5000", {}, "none"), ("localhost:5000", {}, "none"), ("[::1]:5000", {}, "none"),
    ("ghcr.io", {}, "gzip"), ("10.0.0.5:5000", {}, "gzip"),
    ("ghcr.io", {"IMAGEBUILD_PUSH_COMPRESSION": "none"}, "none"),
    ("127.0.0.1:5000", {"IMAGEBUILD_PUSH_COMPRESSION": "GZIP"}, "gzip"),
    ("127.0.0.1:5000", {"IMAGEBUILD_PUSH_COMPRESSION": "auto"}, "none"),
])
def test_the_encoding_follows_where_the_registry_is(host, env, want):
    assert encoding_for(host, env) == want


def test_an_unknown_encoding_is_bad_input():
    with pytest.raises(UserError, match="IMAGEBUILD_PUSH_COMPRESSION='zstd'"):
        encoding_for("ghcr.io", {"IMAGEBUILD_PUSH_COMPRESSION": "zstd"})


def test_a_bad_encoding_is_refused_before_the_whole_job_builds(matrix_dir, monkeypatch,
                                                              capsys):
    from imagebuild import docker
    from imagebuild.cli import main

    class NoDocker:
        def __getattr__(self, name: str):
            raise AssertionError(f"Docker was asked for {name} before the refusal")

    monkeypatch.setattr(docker, "_engine", NoDocker())
    monkeypatch.setenv("IMAGEBUILD_PUSH_COMPRESSION", "zstd")
    argv = ["--tag", "2026-06-18-dflashfix", "--target", "cpu", "--matrix",
            str(matrix_dir / "matrix.yaml"), "--out", str(matrix_dir / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "IMAGEBUILD_PUSH_COMPRESSION='zstd'" in err and "Traceback" not in err
    assert not (matrix_dir / "out").exists()
