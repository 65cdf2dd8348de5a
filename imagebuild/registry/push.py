"""Pushing a local image to a registry, retried, and reading back that the registry holds
exactly the image pushed: publish pushes its releases this way, the engine handoff its
engines (builder/engineship.py). docs/push.md says why not `docker push` and what each
kind of registry gets.

Each layer (by diff id) goes the cheapest way the registry allows:
1. this repository holds it already (the blob this machine pushed for it before, the
   engine's blob a cell was built on, or the uncompressed tar itself): nothing is sent;
2. another repository of the registry holds it (this machine's records, registry/
   pushrecords.py, or the `known` images, e.g. that engine): a cross-repository mount;
3. else it is read (dockerstore.py: dockerd's store, else its export) and streamed,
   several layers at once: uncompressed to a registry on loopback, where compressing
   costs more than writing the bytes, gzip on every core elsewhere (registry/streams.py).
Then the config blob (the image's exact config bytes: its digest is the image id) and an
OCI manifest under the tag. A killed push resumes: what reached the registry is found by
step 1 on the re-run.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from imagebuild import progress
from imagebuild.dockerstore import Layer, LocalImage, StoreUnreadable, from_export, local_image
from imagebuild.errors import OperationFailed, UserError
from imagebuild.registry import documents
from imagebuild.registry.client import OCI_MANIFEST, RegistryClient
from imagebuild.registry.errors import MissingBlob, RegistryFault
from imagebuild.registry.pushrecords import Blob, recall, remember
from imagebuild.registry.records import Log, compact
from imagebuild.registry.streams import (
    ENCODINGS,
    MEDIA,
    OCI_GZIP,
    OCI_TAR,
    encoding_for,
    gzip_members,
    prefetched,
)

OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
# the layer blobs Docker 20.10's pull reads (not zstd), as the OCI type our manifest says
READABLE = {OCI_TAR: OCI_TAR, OCI_GZIP: OCI_GZIP,
            "application/vnd.docker.image.rootfs.diff.tar": OCI_TAR,
            "application/vnd.docker.image.rootfs.diff.tar.gzip": OCI_GZIP}
PARALLEL_LAYERS = 2  # layers streamed at once from dockerd's store (benchmarks/time_push.py)


@dataclass(frozen=True)
class Placed:
    """Where a layer ended up: its blob in the repository, and how it got there."""

    blob: Blob
    how: str  # "there" | "mounted" | "sent"


class _Unwanted(Exception):  # noqa: N818 - a member of an export no one asked for
    """An exported layer read on speculation that turned out not to be needed."""


@dataclass
class _Tally:
    """Bytes sent so far, for the progress line (added to from the layer threads), and
    the word that ends every layer's stream at its next chunk (another layer failed)."""

    sent: int = 0
    layers: int = 0
    done: int = 0
    stop: threading.Event = field(default_factory=threading.Event)


def push_image(client: RegistryClient, repo: str, tag: str, image_id: str, *,
               known: Iterable[str] = (), encoding: str | None = None,
               log: Log = print) -> str:
    """Push local image `image_id` to repo:tag; returns the manifest digest. `known`:
    images in this registry (`host/repo@sha256:...`) whose layers this one may share."""
    enc = encoding or encoding_for(client.host)
    image = local_image(image_id)
    hints = _known_blobs(client, known)
    placed: dict[str, Placed] = {}
    uploads = _place(client, repo, image.diff_ids, enc, hints, placed)
    if uploads:
        try:
            placed.update(_send_layers(client, repo, image, uploads, enc))
        except StoreUnreadable as exc:
            log(f"{repo}: Docker's store could not be read ({exc.message}); reading the "
                "image export instead")
            image = from_export(image_id, image.diff_ids)
            # the layers sent before the store failed are found, not sent again
            uploads = _place(client, repo, uploads, enc, hints, placed)
            if uploads:
                placed.update(_send_layers(client, repo, image, uploads, enc))
    config = _put_config(client, repo, image)
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": image_id, "size": config},
        "layers": [{"mediaType": placed[d].blob.media_type, "digest": placed[d].blob.digest,
                    "size": placed[d].blob.size} for d in image.diff_ids],
    }
    digest = client.put_manifest(repo, tag, compact(manifest).encode(), OCI_MANIFEST)
    counts = {how: sum(p.how == how for p in placed.values()) for how in ("sent", "mounted",
                                                                          "there")}
    log(f"{repo}: {len(placed)} layer(s) from {image.source}: {counts['sent']} sent "
        f"({'uncompressed' if enc == 'none' else 'gzip'}), {counts['mounted']} mounted, "
        f"{counts['there']} already there")
    return digest


def _place(client: RegistryClient, repo: str, diffs: Iterable[str], enc: str,
           hints: dict[str, list[tuple[Blob, str]]], placed: dict[str, Placed]
           ) -> dict[str, str | None]:
    """Each layer the repository holds or can mount goes into `placed`; the others are
    returned with the upload the registry opened for each (None: none yet)."""
    uploads: dict[str, str | None] = {}
    for diff in dict.fromkeys(diffs):
        found = _find(client, repo, diff, enc, hints)
        if isinstance(found, Placed):
            placed[diff] = found
            _remember(client, repo, diff, found)
        else:
            uploads[diff] = found
    return uploads


def _remember(client: RegistryClient, repo: str, diff: str, where: Placed) -> None:
    """Recorded as soon as the layer is in the repository, not once the whole image is:
    a push killed after some gzipped layers finds them on its re-run (their digests
    cannot be known without compressing them again)."""
    enc = "none" if where.blob.media_type == OCI_TAR else "gzip"
    remember(client.host, diff, enc, where.blob, repo)


def _known_blobs(client: RegistryClient, refs: Iterable[str]
                 ) -> dict[str, list[tuple[Blob, str]]]:
    """diff id -> (blob, repository) of every layer of the `refs` in this registry: the
    manifest by digest (as dockerd pulled and checked it) beside its config's diff ids."""
    out: dict[str, list[tuple[Blob, str]]] = {}
    for ref in refs:
        name, _, digest = ref.partition("@")
        host, _, repo = name.partition("/")
        if host != client.host or not digest:
            continue
        try:
            manifest, _ = client.image_manifest(repo, digest)
            config = documents.json_object(
                client.get_blob(repo, manifest["config"]["digest"]), client.host,
                "image config", f"config of {ref}")
        except UserError:  # gone since, or not one image: the layers go the other ways
            continue
        diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
        layers = manifest.get("layers") or []
        if len(diff_ids) != len(layers):
            raise RegistryFault(client.host, f"{len(layers)} layers for {len(diff_ids)} diff "
                                "ids", f"manifest {ref}")
        for diff, desc in zip(diff_ids, layers, strict=True):
            media = READABLE.get(desc.get("mediaType"))
            if media and isinstance(desc.get("size"), int):
                out.setdefault(diff, []).append(
                    (Blob(desc["digest"], desc["size"], media), repo))
    return out


def _find(client: RegistryClient, repo: str, diff: str, enc: str,
          hints: dict[str, list[tuple[Blob, str]]]) -> Placed | str | None:
    """The layer's blob in `repo` (found there or mounted), else the upload URL a failed
    mount opened (or None): the layer must be sent."""
    candidates: list[tuple[Blob, str | None]] = []
    for e in (enc, *(x for x in ENCODINGS if x != enc)):
        if e == "none":
            candidates.append((Blob(diff, None, OCI_TAR), None))
        recalled = recall(client.host, diff, e)
        if recalled:
            candidates += [(recalled[0], r) for r in (None, *recalled[1])]
    candidates += hints.get(diff, [])
    seen: set[str] = set()
    for blob, _ in candidates:
        if blob.digest in seen:
            continue
        seen.add(blob.digest)
        size = client.head_blob(repo, blob.digest)
        if size is not None:
            if blob.size is not None and size != blob.size:
                raise RegistryFault(client.host, f"a size of {size:,} bytes for blob "
                                    f"{blob.digest} (it is {blob.size:,})",
                                    f"HEAD blob {repo}@{blob.digest}")
            return Placed(Blob(blob.digest, size, blob.media_type), "there")
    upload = None
    for blob, source in candidates:
        if source is None or source == repo or blob.size is None:
            continue
        upload = client.start_upload(repo, mount=blob.digest, source=source)
        if upload is None:
            return Placed(blob, "mounted")
    return upload


def _send_layers(client: RegistryClient, repo: str, image: LocalImage,
                 uploads: dict[str, str | None], enc: str) -> dict[str, Placed]:
    """Read and send the layers in `uploads` (several at once when the source allows;
    an export's, in its order), with a progress line while they go."""
    tally = _Tally(layers=len(uploads))
    placed: dict[str, Placed] = {}
    lock = threading.Lock()

    def one(layer: Layer) -> None:
        try:
            diff, where = _send(client, repo, layer, uploads, enc, tally)
        except _Unwanted:
            return
        with lock:
            if diff in placed:
                return
            placed[diff] = where
            tally.done += 1
        _remember(client, repo, diff, where)

    def every_layer() -> None:  # an export: one stream, in its order
        for layer in image.layers(set(uploads)):
            one(layer)

    start = time.monotonic()
    workers = 1 if image.sequential else PARALLEL_LAYERS
    with ThreadPoolExecutor(workers, thread_name_prefix="push-layer") as pool:
        futures = ([pool.submit(every_layer)] if image.sequential else
                   [pool.submit(one, layer) for layer in image.layers(set(uploads))])
        pending = set(futures)
        try:
            while pending:
                finished, pending = wait(pending, timeout=1.0, return_when=FIRST_EXCEPTION)
                progress.wait("push", f"{tally.sent / 1e6:,.0f} MB sent, {tally.done} of "
                                      f"{tally.layers} layer(s) from {image.source}")
                for fut in finished:
                    fut.result()  # a failed layer ends the push
        finally:  # an error or Ctrl-C: the other layers stop at their next chunk
            if pending:
                tally.stop.set()
                pool.shutdown(cancel_futures=True)
    missing = [d for d in uploads if d not in placed]
    if missing:
        raise OperationFailed(f"{image.source} of {image.image_id[:19]} did not hold layer(s) "
                              f"{', '.join(d[:19] for d in missing)}",
                              fix="re-run; check the image with `docker image inspect`")
    secs = time.monotonic() - start
    progress.wait("push", f"{tally.sent / 1e6:,.0f} MB sent in {secs:.1f} s")
    return placed


def _send(client: RegistryClient, repo: str, layer: Layer, uploads: dict[str, str | None],
          enc: str, tally: _Tally) -> tuple[str, Placed]:
    """One layer read, hashed, encoded and streamed into an upload; closed under its
    digest only when the bytes are the layer asked for."""
    plain = hashlib.sha256()
    packed = hashlib.sha256() if enc == "gzip" else plain
    size = 0

    def hashed(chunks: Iterator[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            plain.update(chunk)
            yield chunk

    def counted(chunks: Iterator[bytes]) -> Iterator[bytes]:
        nonlocal size
        for chunk in chunks:
            if tally.stop.is_set():
                raise OperationFailed("push stopped: another layer failed")
            if packed is not plain:
                packed.update(chunk)
            size += len(chunk)
            tally.sent += len(chunk)
            yield chunk

    def digest() -> str:
        diff = "sha256:" + plain.hexdigest()
        if layer.diff_id is not None and diff != layer.diff_id:
            raise OperationFailed(f"layer {layer.diff_id[:19]} read from {layer.where} "
                                  f"hashes to {diff[:19]}: not pushing it",
                                  fix="re-run; if it persists, rebuild the image")
        if diff not in uploads:
            raise _Unwanted(diff)
        return "sha256:" + packed.hexdigest()

    body = prefetched(hashed(layer.chunks))
    if enc == "gzip":
        body = gzip_members(body)
    url = uploads.get(layer.diff_id or "") or client.start_upload(repo)
    assert url is not None  # no mount asked for
    blob_digest = client.send_blob(repo, url, counted(body), digest)
    return "sha256:" + plain.hexdigest(), Placed(Blob(blob_digest, size, MEDIA[enc]), "sent")


def _put_config(client: RegistryClient, repo: str, image: LocalImage) -> int:
    """The config blob in repo (its digest is the image id); its size."""
    size = client.head_blob(repo, image.image_id)
    if size is not None:
        return size
    if image.config is None:  # an export not read yet: every layer was in the registry
        for _ in image.layers(set()):
            pass
    assert image.config is not None
    if client.put_blob(repo, image.config) != image.image_id:
        raise OperationFailed(f"the config of {image.image_id[:19]} read from {image.source} "
                              "is not that image", fix="re-run")
    return len(image.config)


def push_with_retries(client: RegistryClient, repo: str, tag: str, image_id: str, *,
                      known: Iterable[str] = (), attempts: int = 3, backoff: float = 1.0,
                      log: Log = print) -> str:
    """A failed push is tried again whole (a layer body cannot be replayed; what reached
    the registry is found there); wrong credentials are not (AuthError is no
    OperationFailed)."""
    for attempt in range(1, attempts + 1):
        try:
            return push_image(client, repo, tag, image_id, known=known, log=log)
        except OperationFailed as exc:
            if attempt == attempts:
                raise
            log(f"{repo}: push attempt {attempt} failed ({exc.message}); retrying")
            time.sleep(backoff * attempt)
    raise AssertionError("unreachable")


def verify_pushed(client: RegistryClient, repo: str, tag: str, image_id: str,
                  pushed_digest: str) -> dict[str, Any]:
    """Read back what the registry holds under tag; it must be the tested image, and
    every blob it names must be there at its size."""
    manifest, digest = client.image_manifest(repo, tag)
    config = (manifest.get("config") or {}).get("digest")
    if digest != pushed_digest or config != image_id:
        raise OperationFailed(
            f"{repo}:{tag} holds manifest {digest} with config {config}, but this run "
            f"pushed {pushed_digest} of tested image {image_id}: not promoting it",
            fix="someone else wrote this tag; re-run to push again")
    for desc in [manifest["config"], *manifest.get("layers", [])]:
        if client.head_blob(repo, desc["digest"]) != desc["size"]:
            raise MissingBlob(client.host, f"no blob {desc['digest']} of {desc['size']:,} "
                              "bytes", f"HEAD blob {repo}@{desc['digest']}",
                              fix="the registry lost a blob it had just taken: check its "
                              "storage, then re-run")
    return manifest
