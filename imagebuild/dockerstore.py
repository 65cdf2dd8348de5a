"""A local image's config and layer tars, for a push that is not `docker push`
(registry/push.py): dockerd 20.10 gzips every layer on one thread (~37 MB/s), so the push
reads the layers itself and sends them as the registry's kind calls for.

Two sources, the same bytes: a layer is the exact tar whose sha256 is its diff id (the
pusher checks it), the config the exact bytes whose sha256 is the image id.
- dockerd's own store, when this process may read it (root, or a rootless engine's
  user) and the engine is overlay2 on this machine: the config from imagedb, each layer
  rebuilt from its diff folder and the tar-split record dockerd keeps to give back the
  tar it was given (moby layer/layer_store.go assembleTarTo, vbatts/tar-split
  tar/asm/assemble.go WriteOutputTarStream: a segment entry is raw tar bytes, a file
  entry is that many bytes of the file named). Only the layers asked for are read.
- the Engine API's image export (`docker save`), streamed: any engine, any user with
  Docker access, but dockerd writes the whole image to its temp folder before the first
  byte (~30 s for 2.8 GB here), and a legacy export names layers by v1 id, so each
  one is known by its hash only once read.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import re
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from imagebuild.docker import engine
from imagebuild.errors import OperationFailed

CHUNK = 1 << 20  # the unit handed on: a slow link still moves one within a socket timeout
SMALL = 1 << 20  # an exported member up to this is read whole and known by its hash first


class StoreUnreadable(OperationFailed):
    """dockerd's store is not as this reader expects (a file gone, a record it cannot
    parse): the push reads the image export instead."""


@dataclass
class Layer:
    """One layer's tar as chunks; diff_id None: an exported member known once hashed."""

    diff_id: str | None
    chunks: Iterator[bytes]
    where: str  # where the bytes come from, for messages


@dataclass
class LocalImage:
    image_id: str
    diff_ids: tuple[str, ...]
    source: str  # "store" | "export"
    config: bytes | None = None  # the export's arrives with the stream
    sequential: bool = False  # layers must be read one after the other, in stream order
    _reader: Any = field(default=None, repr=False)

    def layers(self, wanted: set[str]) -> Iterator[Layer]:
        """The layers in `wanted` (diff ids); from an export every layer it cannot name
        before reading it too (diff_id None)."""
        return self._reader(self, wanted)


def chain_ids(diff_ids: tuple[str, ...]) -> list[str]:
    """Each layer's chain id (OCI image-spec config.md: ChainID(L0|...|Ln) =
    sha256(ChainID(L0|...|Ln-1) + " " + DiffID(Ln))): how dockerd's layerdb names it."""
    out: list[str] = []
    for diff in diff_ids:
        out.append(diff if not out else
                   "sha256:" + hashlib.sha256(f"{out[-1]} {diff}".encode()).hexdigest())
    return out


def local_image(image_id: str) -> LocalImage:
    """The image from dockerd's store when it can be read here, else from its export."""
    info = engine().inspect_image(image_id)
    if info is None:
        raise OperationFailed(f"no local image {image_id}", fix="build it first")
    diff_ids = tuple((info.get("RootFS") or {}).get("Layers") or ())
    store = _store_root()
    if store is not None:
        try:
            return from_store(store, image_id, diff_ids)
        except StoreUnreadable:
            pass
    return from_export(image_id, diff_ids)


def _store_root() -> Path | None:
    """dockerd's data root when the engine runs here on overlay2 and its image store can
    be read by this process; None otherwise (a remote engine, another driver, no access)."""
    seam = engine()
    if not seam.on_this_machine():
        return None  # not the unix socket: the engine's files are on another machine
    info = seam.info()
    if info.get("Driver") != "overlay2" or not info.get("DockerRootDir"):
        return None
    root = Path(info["DockerRootDir"])
    return root if os.access(root / "image" / "overlay2" / "layerdb", os.R_OK | os.X_OK) \
        else None


# ------------------------------------------------------------------ dockerd's store


def from_store(root: Path, image_id: str, diff_ids: tuple[str, ...]) -> LocalImage:
    hexid = image_id.removeprefix("sha256:")
    try:
        config = (root / "image/overlay2/imagedb/content/sha256" / hexid).read_bytes()
    except OSError as exc:
        raise StoreUnreadable(f"cannot read the config of {image_id[:19]}: {exc}") from None
    if "sha256:" + hashlib.sha256(config).hexdigest() != image_id:
        raise StoreUnreadable(f"the store's config of {image_id[:19]} is not that image")
    folders = {}
    for diff, chain in zip(diff_ids, chain_ids(diff_ids), strict=True):
        layer = root / "image/overlay2/layerdb/sha256" / chain.removeprefix("sha256:")
        try:
            recorded = (layer / "diff").read_text().strip()
            cache_id = (layer / "cache-id").read_text().strip()
        except OSError as exc:
            raise StoreUnreadable(f"cannot read layer {diff[:19]}'s record: {exc}") from None
        if recorded != diff or not re.fullmatch(r"[A-Za-z0-9_-]+", cache_id):
            raise StoreUnreadable(f"layerdb's record of {diff[:19]} is not that layer")
        folders[diff] = (layer / "tar-split.json.gz", root / "overlay2" / cache_id / "diff")

    def reader(image: LocalImage, wanted: set[str]) -> Iterator[Layer]:
        for diff in image.diff_ids:
            if diff in wanted:
                split, folder = folders[diff]
                yield Layer(diff, assemble(split, folder), f"Docker's store ({folder})")

    return LocalImage(image_id, diff_ids, "store", config, _reader=reader)


def assemble(split: Path, folder: Path) -> Iterator[bytes]:
    """The layer's tar, as dockerd would export it, in chunks of about CHUNK bytes."""
    buf = bytearray()
    base = os.path.realpath(folder)
    parents: dict[str, str] = {}  # each directory resolved once (realpath is an lstat a part)
    try:
        with gzip.open(split, "rb") as records:
            for line in records:
                entry = json.loads(line)
                if entry.get("type") == 2:  # raw tar bytes: headers, padding, the end
                    buf += base64.b64decode(entry.get("payload") or b"")
                elif entry.get("type") == 1 and entry.get("size"):
                    size = int(entry["size"])
                    with _open_payload(base, _entry_name(entry), parents) as fh:
                        while size:
                            piece = fh.read(min(size, CHUNK))
                            if not piece:
                                raise StoreUnreadable(f"{folder}: "
                                                      f"{_entry_name(entry)} is shorter than "
                                                      "its tar-split record")
                            size -= len(piece)
                            if len(buf) + len(piece) > CHUNK and buf:
                                yield bytes(buf)
                                buf.clear()
                            if len(piece) >= CHUNK:
                                yield piece
                            else:
                                buf += piece
                if len(buf) >= CHUNK:
                    yield bytes(buf)
                    buf.clear()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StoreUnreadable(f"cannot rebuild a layer from {folder}: {exc}") from None
    if buf:
        yield bytes(buf)


def _entry_name(entry: dict[str, Any]) -> str:
    if entry.get("name_raw"):  # a name that is not UTF-8 (tar-split storage/entry.go)
        return os.fsdecode(base64.b64decode(entry["name_raw"]))
    return str(entry["name"])


def _open_payload(base: str, name: str, parents: dict[str, str]) -> IO[bytes]:
    """A regular file inside the layer's diff folder, by the name its tar entry has;
    never a path that leaves the folder (a symlink in a layer points anywhere on this
    host, read as root: its directory is resolved and must stay inside, the file itself
    is opened without following one) and never a FIFO or a device."""
    parent, leaf = os.path.split(name)
    real = parents.get(parent)
    if real is None:
        real = os.path.realpath(os.path.join(base, parent))
        if os.path.commonpath([base, real]) != base:
            raise StoreUnreadable(f"{name} leaves the layer's folder {base}")
        parents[parent] = real
    fd = os.open(os.path.join(real, leaf), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StoreUnreadable(f"{name} in {base} is not a regular file")
    return os.fdopen(fd, "rb")


# ------------------------------------------------------------- the Engine API export


class _ChunkFile:
    """The export's chunk iterator as the file object tarfile's stream mode reads."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks = chunks
        self._cur, self._pos = b"", 0

    def read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            if self._pos >= len(self._cur):
                nxt = next(self._chunks, None)
                if nxt is None:
                    break
                self._cur, self._pos = nxt, 0
            piece = self._cur[self._pos:self._pos + n - len(out)]
            self._pos += len(piece)
            out += piece
        return bytes(out)


def from_export(image_id: str, diff_ids: tuple[str, ...]) -> LocalImage:
    def reader(image: LocalImage, wanted: set[str]) -> Iterator[Layer]:
        stream = engine().export_image(image.image_id)
        with tarfile.open(fileobj=_ChunkFile(stream), mode="r|",  # type: ignore[call-overload]
                          bufsize=CHUNK) as tar:
            for member in tar:
                if not member.isreg():  # a Docker 25+ legacy layer.tar is a symlink
                    continue
                named = _named_digest(member.name)
                if named is not None and named not in wanted and named != image.image_id:
                    continue  # an OCI-layout blob that says what it is: not needed
                fh = tar.extractfile(member)
                assert fh is not None  # a regular member
                if member.size <= SMALL or named == image.image_id:
                    body = fh.read()
                    digest = "sha256:" + hashlib.sha256(body).hexdigest()
                    if digest == image.image_id:
                        image.config = body
                    elif digest in wanted:
                        yield Layer(digest, iter([body]), "the image export")
                    continue
                if named is None and not member.name.endswith("layer.tar"):
                    continue  # a legacy export's big files are its layers
                yield Layer(named, _member_chunks(fh), "the image export")
        if image.config is None:
            raise OperationFailed(f"the export of {image.image_id[:19]} has no config that "
                                  "hashes to its id", fix="re-run; check the Docker engine")

    return LocalImage(image_id, diff_ids, "export", sequential=True, _reader=reader)


def _named_digest(name: str) -> str | None:
    """`blobs/sha256/<hex>` (an OCI-layout export, Docker 25+) names its digest."""
    m = re.fullmatch(r"blobs/sha256/([0-9a-f]{64})", name)
    return f"sha256:{m[1]}" if m else None


def _member_chunks(fh: IO[bytes]) -> Iterator[bytes]:
    while piece := fh.read(CHUNK):
        yield piece
