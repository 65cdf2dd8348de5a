"""A local image in memory for the push's unit tests: what dockerstore.local_image gives
(config bytes, diff ids, layer tars), and which layers the push read."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Iterator

from imagebuild.dockerstore import Layer, LocalImage


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tar_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def random_layer(size: int, name: str = "payload.bin") -> bytes:
    return tar_of({name: os.urandom(size)})


class MemImage:
    """Layers (tars) and the config naming their diff ids; `local_image` is the double of
    dockerstore.local_image. `source="export"`: read in one stream, the config known once
    read; `unnamed`: an export's layers the reader cannot name before hashing them."""

    def __init__(self, layers: list[bytes], *, source: str = "store", unnamed: bool = False,
                 chunk: int = 64 * 1024):
        self.tars, self.source, self.unnamed, self.chunk = layers, source, unnamed, chunk
        self.diff_ids = tuple(sha(t) for t in layers)
        self.config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {
            "type": "layers", "diff_ids": list(self.diff_ids)}}).encode()
        self.image_id = sha(self.config)
        self.read: list[str] = []  # diff ids read, in order
        self.opened = 0  # local_image calls

    def local_image(self, image_id: str) -> LocalImage:
        assert image_id == self.image_id
        self.opened += 1
        export = self.source == "export"
        return LocalImage(image_id, self.diff_ids, self.source,
                          None if export else self.config, sequential=export,
                          _reader=self._reader)

    def _reader(self, image: LocalImage, wanted: set[str]) -> Iterator[Layer]:
        for diff, tar in zip(self.diff_ids, self.tars, strict=True):
            if diff in wanted or self.unnamed:
                self.read.append(diff)
                yield Layer(None if self.unnamed else diff, self._chunks(tar), "memory")
        image.config = self.config

    def _chunks(self, data: bytes) -> Iterator[bytes]:
        for i in range(0, len(data), self.chunk):
            yield data[i:i + self.chunk]
