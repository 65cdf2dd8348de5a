"""Releases as the registry records them: the release record and reading it back.

Why annotations, not labels: labels live in the image config, whose digest *is* the image
id, so writing the smoke verdict into a label after the smoke test would change the image
that was tested. Instead the release tag points at an OCI image manifest that references
the tested config and layers unchanged and carries the release record in its
`annotations` (tag, date, pins, smoke verdict, image id). Any machine reads a release with
one manifest GET; `docker pull` of the release tag yields the tested image id.
"""

from __future__ import annotations

import calendar
import datetime as dt
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from imagebuild.errors import OperationFailed, UserError
from imagebuild.registry.client import (
    DOCKER_MANIFEST,
    IMAGE_MANIFESTS,
    OCI_MANIFEST,
    NotFound,
    RegistryClient,
)
from imagebuild.spec.tags import FULL, SHORT, ReleaseTag, parse_release_tag

DATE_SKEW = dt.timedelta(days=1)  # a tag dated beyond tomorrow (UTC) is a typo

Log = Callable[[str], None]

LATEST = "latest"
STAGING_PREFIX = "staging-"  # pushed and verified, not yet a release (see publish.py)
ANN = "io.imagebuild.release"
A_TAG, A_DATE, A_IMAGE, A_SMOKE = f"{ANN}.tag", f"{ANN}.date", f"{ANN}.image-id", f"{ANN}.smoke"
A_CHECKS, A_PINS, A_CELL = f"{ANN}.checks", f"{ANN}.pins", f"{ANN}.cell"
A_INPUTS, A_PUSHED = f"{ANN}.inputs", f"{ANN}.pushed-manifest"
# a release promoted without a measurement says so in its record: `unmeasured` and why
A_BENCH, A_UNMEASURED = f"{ANN}.bench", f"{ANN}.unmeasured-reason"
A_GATES = f"{ANN}.gates"  # the release gates' summary (imagebuild/gates)
UNMEASURED = "unmeasured"
A_CREATED = "org.opencontainers.image.created"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
# Docker v2 media types -> their OCI twins (same bytes, same digests)
_TO_OCI = {
    "application/vnd.docker.container.image.v1+json": OCI_CONFIG,
    "application/vnd.docker.image.rootfs.diff.tar.gzip":
        "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip":
        "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
}


def compact(obj: Any) -> str:
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
    return compact(doc).encode()


def release_record(tag: ReleaseTag, image_id: str, verdict: dict[str, Any], *,
                   pins: dict[str, Any] | None, cell: str | None, inputs: str | None,
                   pushed_digest: str, gates: dict[str, Any] | None = None
                   ) -> dict[str, str]:
    checks = verdict.get("checks") or {}
    summary = {k: bool(v.get("passed", v.get("ok")) if isinstance(v, dict) else v)
               for k, v in checks.items()}
    record = {
        A_TAG: str(tag), A_DATE: tag.date.isoformat(), A_IMAGE: image_id,
        A_SMOKE: "passed" if verdict.get("passed") is True else "failed",
        A_CHECKS: compact(summary), A_PINS: compact(pins or {}), A_PUSHED: pushed_digest,
        A_CREATED: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if cell:
        record[A_CELL] = cell
    if inputs:
        record[A_INPUTS] = inputs
    if gates is not None:
        record[A_GATES] = compact(gates)
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
    def unmeasured(self) -> str | None:
        """Why it was promoted without a measurement, when it was."""
        if self.annotations.get(A_BENCH) != UNMEASURED:
            return None
        return self.annotations.get(A_UNMEASURED) or "no reason recorded"

    @property
    def recorded_at(self) -> float | None:
        """When publish recorded it (UTC seconds), None when the record does not say."""
        try:
            return float(calendar.timegm(time.strptime(self.annotations.get(A_CREATED, ""),
                                                       "%Y-%m-%dT%H:%M:%SZ")))
        except ValueError:
            return None

    def order_key(self) -> tuple[Any, ...]:
        """Newer sorts greater: by when it was recorded, the tag's date only a bound. The
        day is the tag date, or the recording day when the tag claims a later one (a
        future-dated typo must not outrank every release to come); within a day, the
        recording time (not the name's alphabet); the tag as the last tie-break."""
        rt = parse_release_tag(self.annotations.get(A_TAG, "")) or self.release_tag
        at = self.recorded_at
        day = rt.date if rt else dt.date.min
        if at is not None:
            day = min(day, dt.datetime.fromtimestamp(at, dt.UTC).date())
        return (day, at or 0.0) + (rt.sort_key() if rt else (dt.date.min,))

    @property
    def config_descriptor(self) -> dict[str, Any]:
        return json.loads(self.body)["config"]

    def as_json(self) -> dict[str, Any]:
        return {"tag": self.tag, "digest": self.digest, "image_id": self.image_id,
                "latest": self.is_latest, "verdict": self.verdict,
                "date": self.annotations.get(A_DATE), "cell": self.annotations.get(A_CELL),
                "created": self.annotations.get(A_CREATED), "pins": self.pins,
                "unmeasured": self.unmeasured,
                "checks": json.loads(self.annotations.get(A_CHECKS, "{}") or "{}")}


def amended_manifest(rel: Release, extra: dict[str, str]) -> bytes:
    """The release's manifest with `extra` added to its record: the same config and
    layers (the same tested image), the annotations in order."""
    doc = json.loads(rel.body)
    doc["annotations"] = dict(sorted({**(doc.get("annotations") or {}), **extra}.items()))
    return compact(doc).encode()


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
    latest = client.head_manifest(repo, LATEST)  # directly: a short tag list may lack it
    found = []
    for tag in tags:
        if parse_release_tag(tag) is None:
            continue
        rel = read_release(client, repo, tag)
        if rel is not None:
            rel.is_latest = bool(latest and latest[0] == rel.digest)
            found.append(rel)
    return sorted(found, key=Release.order_key, reverse=True)


def check_tag_date(tag: ReleaseTag, *, today: dt.date | None = None) -> None:
    """Refuse a release dated in the future (beyond a day of skew): exit 2, nothing
    written. Such a tag would sort after every release to come."""
    today = today or dt.datetime.now(dt.UTC).date()
    if tag.date > today + DATE_SKEW:
        raise UserError(f"--tag {tag}: its date {tag.date} is in the future (today is "
                        f"{today} UTC)", fix=f"tag the release with today's date, e.g. "
                                             f"{today.isoformat()}-{tag.name}")


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


def short_digest(digest: str | None) -> str:
    return (digest or "-").removeprefix("sha256:")[:12]


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


