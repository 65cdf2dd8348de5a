"""dockerstore.py without Docker: a layer rebuilt from a diff folder and its tar-split
record is the exact tar (its hash the diff id), nothing outside the folder is ever read,
and the image export is read by layout (legacy and OCI). The real store and export of a
real dockerd are tests/e2e/test_push_pull.py's."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from imagebuild import dockerstore
from imagebuild.dockerstore import StoreUnreadable, assemble, chain_ids, from_export, from_store
from tests.support.localimage import sha, tar_of


def split_records(tar: bytes) -> bytes:
    """A tar-split record of `tar` (vbatts/tar-split's JSON lines, gzipped): the bytes
    between file payloads as segments, each payload as a file entry of its size."""
    lines, pos = [], 0
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        for member in t:
            head = tar[pos:member.offset_data]
            lines.append({"type": 2, "payload": base64.b64encode(head).decode()})
            lines.append({"type": 1, "name": member.name, "size": member.size,
                          "payload": None})
            pos = member.offset_data + member.size
    lines.append({"type": 2, "payload": base64.b64encode(tar[pos:]).decode()})
    return gzip.compress("".join(json.dumps(x) + "\n" for x in lines).encode())


def write_layer(root: Path, name: str, files: dict[str, bytes]) -> tuple[Path, Path, bytes]:
    """A diff folder holding `files` and the tar-split of their tar."""
    tar = tar_of(files)
    folder = root / name / "diff"
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    split = root / name / "tar-split.json.gz"
    split.write_bytes(split_records(tar))
    return split, folder, tar


def test_a_layer_is_rebuilt_byte_for_byte(tmp_path):
    files = {"etc/os-release": b"ID=debian\n", "usr/lib/big.so": os.urandom(3_500_000),
             "empty": b"", "usr/bin/tool": os.urandom(700)}
    split, folder, tar = write_layer(tmp_path, "l1", files)
    chunks = list(assemble(split, folder))
    assert b"".join(chunks) == tar
    assert max(len(c) for c in chunks) <= dockerstore.CHUNK


def test_a_non_utf8_name_is_read_from_its_raw_record(tmp_path):
    folder = tmp_path / "diff"
    folder.mkdir()
    (folder / os.fsdecode(b"caf\xe9")).write_bytes(b"x" * 10)
    records = [{"type": 1, "name": "caf?", "name_raw": base64.b64encode(b"caf\xe9").decode(),
                "size": 10}]
    split = tmp_path / "split.gz"
    split.write_bytes(gzip.compress(json.dumps(records[0]).encode() + b"\n"))
    assert b"".join(assemble(split, folder)) == b"x" * 10


@pytest.mark.parametrize("make, name, words", [
    (lambda f: (f / "etc").symlink_to("/etc"), "etc/hostname", "leaves the layer's folder"),
    (lambda f: (f / "etc").symlink_to("/etc/hostname"), "etc", "symbolic link"),
    (lambda f: os.mkfifo(f / "etc"), "etc", "not a regular file"),
    (lambda f: (f / "etc").write_bytes(b"short"), "etc", "shorter than"),
], ids=["folder-links-out", "file-links-out", "fifo", "short"])
def test_a_store_that_is_not_as_recorded_is_never_read_past(tmp_path, make, name, words):
    folder = tmp_path / "diff"
    folder.mkdir()
    make(folder)
    split = tmp_path / "split.gz"
    split.write_bytes(gzip.compress(json.dumps({"type": 1, "name": name,
                                                "size": 100}).encode() + b"\n"))
    with pytest.raises(StoreUnreadable, match=words):
        b"".join(assemble(split, folder))


def _fake_store(root: Path, layers: list[dict[str, bytes]]) -> tuple[str, tuple[str, ...]]:
    """dockerd's overlay2 layout: imagedb config, layerdb by chain id, diff folders."""
    tars = [tar_of(files) for files in layers]
    diff_ids = tuple(sha(t) for t in tars)
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": list(diff_ids)}}).encode()
    image_id = sha(config)
    content = root / "image/overlay2/imagedb/content/sha256"
    content.mkdir(parents=True)
    (content / image_id.split(":")[1]).write_bytes(config)
    for i, (files, diff, chain) in enumerate(zip(layers, diff_ids, chain_ids(diff_ids),
                                                 strict=True)):
        _, folder, _ = write_layer(root / "overlay2", f"cache{i}", files)
        db = root / "image/overlay2/layerdb/sha256" / chain.split(":")[1]
        db.mkdir(parents=True)
        (db / "diff").write_text(diff)
        (db / "cache-id").write_text(f"cache{i}")
        os.replace(folder.parent / "tar-split.json.gz", db / "tar-split.json.gz")
    return image_id, diff_ids


def test_chain_ids_follow_the_image_spec():
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    assert chain_ids((a, b)) == [a, "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest()]


def test_the_store_gives_the_config_and_only_the_layers_asked_for(tmp_path):
    image_id, diff_ids = _fake_store(tmp_path, [{"a": b"1" * 2000}, {"b": b"2" * 3000}])
    image = from_store(tmp_path, image_id, diff_ids)
    assert sha(image.config) == image_id and not image.sequential
    got = {layer.diff_id: b"".join(layer.chunks) for layer in image.layers({diff_ids[1]})}
    assert list(got) == [diff_ids[1]] and sha(got[diff_ids[1]]) == diff_ids[1]


def test_a_store_whose_records_disagree_is_refused_before_reading(tmp_path):
    image_id, diff_ids = _fake_store(tmp_path, [{"a": b"1"}])
    db = tmp_path / "image/overlay2/layerdb/sha256" / diff_ids[0].split(":")[1]
    (db / "diff").write_text("sha256:" + "0" * 64)
    with pytest.raises(StoreUnreadable, match="not that layer"):
        from_store(tmp_path, image_id, diff_ids)


class ExportEngine:
    """The Docker seam's double for an image export: the archive, in pieces."""

    def __init__(self, archive: bytes):
        self.archive = archive

    def export_image(self, ref: str):
        for i in range(0, len(self.archive), 7_000):
            yield self.archive[i:i + 7_000]


def _export(layout: str, tars: list[bytes], config: bytes) -> bytes:
    """A `docker save` archive: legacy (<v1 id>/layer.tar, <id>.json) or OCI (blobs by
    digest, Docker 25+), each with a manifest.json, members in name order as dockerd
    writes them."""
    files: dict[str, bytes] = {"manifest.json": b"[]"}
    if layout == "legacy":
        for i, tar in enumerate(tars):
            files[f"{i:064x}/layer.tar"] = tar
            files[f"{i:064x}/json"] = b"{}"
        files[sha(config).split(":")[1] + ".json"] = config
    else:
        for blob in [*tars, config, b'{"schemaVersion":2}']:
            files["blobs/sha256/" + sha(blob).split(":")[1]] = blob
        files["index.json"] = b"{}"
    return tar_of(dict(sorted(files.items())))


@pytest.mark.parametrize("layout", ["legacy", "oci"])
def test_the_export_gives_the_config_and_the_layers(monkeypatch, layout):
    tars = [tar_of({"small": b"s" * 100}), tar_of({"big": os.urandom(1_500_000)})]
    diff_ids = tuple(sha(t) for t in tars)
    config = json.dumps({"rootfs": {"diff_ids": list(diff_ids)}}).encode()
    monkeypatch.setattr(dockerstore, "engine", lambda: ExportEngine(_export(layout, tars,
                                                                            config)))
    image = from_export(sha(config), diff_ids)
    assert image.sequential and image.config is None
    got = [(layer.diff_id, b"".join(layer.chunks)) for layer in image.layers({diff_ids[1]})]
    assert image.config == config
    if layout == "oci":  # named: only the layer asked for is read
        assert got == [(diff_ids[1], tars[1])]
    else:  # a legacy export's big layer is known once hashed, the small one at once
        assert got == [(None, tars[1])]
