"""Every body a registry sends is parsed here, against the schema of the document asked
for, before any other code looks at it: a registry's answer is untrusted input.

One function per document kind (manifest, index, referrers index, tag list, catalog,
token, error body, bench results); each takes the raw bytes, enforces a size cap, checks
the shape with pydantic and raises RegistryFault ("the registry at HOST answered X for
Y", exit 1) instead of letting a KeyError or a JSONDecodeError become a traceback three
modules later. The callers keep the raw bytes (digests are computed over them); the models
only prove that the fields the project reads have the types it expects.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
)

from imagebuild.errors import validation_text
from imagebuild.registry.errors import RegistryFault
from imagebuild.safetext import safe

# size caps (docs/design.md): distribution itself refuses manifests over 4 MiB
MAX_MANIFEST = 4 * 2**20
MAX_TAG_PAGE = 4 * 2**20  # ~100k tags of 40 characters
MAX_BLOB = 16 * 2**20  # config blobs and bench results are KBs; nothing we read is larger
MAX_SMALL = 64 * 2**10  # token answers and error bodies
MAX_ANNOTATION = 64 * 2**10  # one annotation value (release records are < 2 KB)

TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
REPO_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
# OCI image-spec descriptor digest grammar
DIGEST_RE = re.compile(r"^[a-z0-9]+(?:[+._-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$")

# annotations the project writes and later parses (registry/records.py, release/lease.py,
# registry/referrers.py, bench/store.py name them; tests/unit/test_registry_untrusted.py
# keeps the two in step)
JSON_OBJECT_ANNOTATIONS = ("io.imagebuild.release.pins", "io.imagebuild.release.checks",
                           "io.imagebuild.release.gates")
LEASE_PREFIX = "io.imagebuild.lease."
# RFC 6750 section 2.1: a bearer token is b64token (it goes into our Authorization header,
# so anything else, a CR or LF above all, would be a header a registry wrote for us)
BEARER_TOKEN_RE = re.compile(r"^[A-Za-z0-9._~+/-]+=*$")
_PRINTABLE_SHORT = re.compile(r"^[\x20-\x7e]{0,200}$")  # what a lease's owner/host/purpose is


class _Doc(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class Platform(_Doc):
    os: StrictStr | None = None
    architecture: StrictStr | None = None
    variant: StrictStr | None = None


class Descriptor(_Doc):
    mediaType: StrictStr | None = None  # noqa: N815 - the JSON field name
    digest: StrictStr = Field(pattern=DIGEST_RE.pattern)
    size: StrictInt = Field(ge=0)
    artifactType: StrictStr | None = None  # noqa: N815
    annotations: dict[StrictStr, StrictStr] | None = None
    platform: Platform | None = None


class ImageManifest(_Doc):
    schemaVersion: StrictInt  # noqa: N815
    mediaType: StrictStr | None = None  # noqa: N815
    artifactType: StrictStr | None = None  # noqa: N815
    config: Descriptor
    layers: list[Descriptor]
    subject: Descriptor | None = None
    annotations: dict[StrictStr, StrictStr] | None = None


class Index(_Doc):
    schemaVersion: StrictInt  # noqa: N815
    mediaType: StrictStr | None = None  # noqa: N815
    manifests: list[Descriptor] | None = None
    subject: Descriptor | None = None
    annotations: dict[StrictStr, StrictStr] | None = None


class TagList(_Doc):
    name: StrictStr | None = None
    tags: list[StrictStr] | None = None  # distribution sends null for a repo without tags


class Catalog(_Doc):
    repositories: list[StrictStr] | None = None


class Token(_Doc):
    token: StrictStr | None = None
    access_token: StrictStr | None = None
    expires_in: float | None = Field(default=None, ge=0, le=10 * 365 * 86400)


class ErrorEntry(_Doc):
    code: Any = ""
    message: Any = ""


class ErrorBody(_Doc):
    errors: list[ErrorEntry | Any] | None = None


class _Figures(_Doc):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class Stats(_Figures):
    median: float | None = None
    p90: float | None = None
    mean: float | None = None


class Flag(_Doc):
    code: StrictStr
    reason: StrictStr


class BenchLevel(_Figures):
    concurrency: StrictInt = Field(ge=1)
    output_tok_s: float = Field(ge=0)
    requests: StrictInt | None = None
    errors: StrictInt | None = None
    request_rate: float | None = None
    ttft_ms: Stats | None = None
    tpot_ms: Stats | None = None
    itl_ms: Stats | None = None
    e2e_ms: Stats | None = None
    client_cpu_ms_per_request: float | None = None
    server_ttft_mean_ms: float | None = None
    spec_decode: dict[StrictStr, float | None] | None = None
    flags: list[Flag] | None = None


class BenchImage(_Doc):
    id: StrictStr | None = None
    tag: StrictStr | None = None
    ref: StrictStr | None = None
    label: StrictStr | None = None


class Hardware(_Doc):
    model: StrictStr | None = None
    machine: StrictStr | None = None


class PlainTwin(_Doc):
    """The same image measured without --speculative-config (bench_image's `plain`)."""

    levels: list[BenchLevel] = []


class BenchResults(_Doc):
    image: BenchImage | None = None
    hardware: Hardware | None = None
    settings: dict[StrictStr, Any] | None = None
    levels: list[BenchLevel] = []
    plain: PlainTwin | None = None


def _describe(exc: ValidationError) -> str:
    """The first schema violation, short: 'tags.3: Input should be a valid string'."""
    err = exc.errors(include_url=False)[0]
    if err["type"] == "json_invalid":
        return "a body that is not JSON"
    loc = ".".join(str(p) for p in err["loc"]) or "the document"
    return f"a document whose {safe(loc, 80)} is invalid ({safe(validation_text(err), 120)})"


def _check_size(body: bytes, cap: int, host: str, kind: str, what: str) -> None:
    if len(body) > cap:
        raise RegistryFault(host, f"a {kind} of {len(body):,} bytes (the cap is {cap:,})", what)


def _parse(model: type[BaseModel], body: bytes, cap: int, host: str, kind: str,
           what: str) -> Any:
    _check_size(body, cap, host, kind, what)
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise RegistryFault(host, f"{_describe(exc)} as the {kind}", what) from None


def _check_annotations(ann: dict[str, str] | None, host: str, what: str) -> None:
    for key, value in (ann or {}).items():
        if len(value) > MAX_ANNOTATION:
            raise RegistryFault(host, f"an annotation {safe(key, 80)} of {len(value):,} "
                                f"characters (the cap is {MAX_ANNOTATION:,})", what)
        if key in JSON_OBJECT_ANNOTATIONS:
            try:
                ok = isinstance(json.loads(value), dict)
            except ValueError:
                ok = False
            if not ok:
                raise RegistryFault(host, f"an annotation {key} that is not a JSON object", what)
        elif key.startswith(LEASE_PREFIX) and not _PRINTABLE_SHORT.match(value):
            # owner, host, purpose: printed as they are when a run waits or takes over.
            # What the values mean (an expiry that is no time) is the lease's to judge.
            raise RegistryFault(
                host, f"a lease whose {safe(key, 60)} is not a short printable text", what,
                fix="a run wrote a broken lease; once no run is promoting, delete the tag "
                "imagebuild-lease of that repository")


def image_manifest(body: bytes, host: str, what: str) -> ImageManifest:
    doc: ImageManifest = _parse(ImageManifest, body, MAX_MANIFEST, host, "image manifest",
                                what)
    _check_annotations(doc.annotations, host, what)
    for layer in doc.layers:
        _check_annotations(layer.annotations, host, what)
    return doc


def index(body: bytes, host: str, what: str, kind: str = "image index") -> Index:
    doc: Index = _parse(Index, body, MAX_MANIFEST, host, kind, what)
    _check_annotations(doc.annotations, host, what)
    for desc in doc.manifests or []:
        _check_annotations(desc.annotations, host, what)
    return doc


def referrers_index(body: bytes, host: str, what: str) -> Index:
    return index(body, host, what, "referrers index")


def tag_list(body: bytes, host: str, what: str) -> list[str]:
    doc: TagList = _parse(TagList, body, MAX_TAG_PAGE, host, "tag list", what)
    tags = doc.tags or []
    for tag in tags:
        if not TAG_RE.match(tag):
            raise RegistryFault(host, f"a tag list holding {safe(tag, 80)!r}, which is not "
                                "a valid tag", what)
    return tags


def catalog(body: bytes, host: str, what: str) -> list[str]:
    doc: Catalog = _parse(Catalog, body, MAX_TAG_PAGE, host, "catalog", what)
    repos = doc.repositories or []
    for repo in repos:
        if not REPO_RE.match(repo) or len(repo) > 255:
            raise RegistryFault(host, f"a catalog holding {safe(repo, 80)!r}, which is not "
                                "a repository name", what)
    return repos


def token(body: bytes, host: str, what: str) -> tuple[str, float]:
    """(token, lifetime in seconds) of a token server's answer."""
    doc: Token = _parse(Token, body, MAX_SMALL, host, "token answer", what)
    tok = doc.token or doc.access_token
    if not tok:
        raise RegistryFault(host, "a token answer without a token", what)
    if len(tok) > MAX_SMALL or not BEARER_TOKEN_RE.match(tok):
        raise RegistryFault(host, f"a token that is not a bearer token (RFC 6750 b64token: "
                            f"letters, digits and -._~+/ then '='): {safe(tok, 60)}", what)
    return tok, float(doc.expires_in or 60)


def error_codes(body: bytes) -> list[tuple[str, str]]:
    """(code, message) pairs of a distribution error body; [] when it is not one. Never
    raises: an error body only decorates a message."""
    if len(body) > MAX_SMALL:
        return []
    try:
        doc = ErrorBody.model_validate_json(body)
    except ValidationError:
        return []
    return [(safe(e.code, 60), safe(e.message, 200)) for e in doc.errors or []
            if isinstance(e, ErrorEntry)]


def _escaped(value: Any) -> Any:
    """Every string of a JSON value with its control characters escaped (numbers and
    structure unchanged): a results document's texts (flag codes, reasons) are shown."""
    if isinstance(value, str):
        return safe(value, 2000)
    if isinstance(value, list):
        return [_escaped(v) for v in value]
    if isinstance(value, dict):
        return {safe(k, 200): _escaped(v) for k, v in value.items()}
    return value


def bench_results(body: bytes, host: str, what: str) -> dict[str, Any]:
    """A bench results document: the checked shape, returned as the plain dict readers
    use, its texts made safe to print."""
    _parse(BenchResults, body, MAX_BLOB, host, "bench results document", what)
    doc: dict[str, Any] = _escaped(json.loads(body))
    return doc


class _TableLevel(_Figures):
    """A level as the notes' table reads it: every figure's key present (null allowed)."""

    concurrency: StrictInt
    output_tok_s: float
    requests: StrictInt | None
    errors: StrictInt | None
    request_rate: float | None
    ttft_ms: Stats | None
    tpot_ms: Stats | None
    itl_ms: Stats | None
    e2e_ms: Stats | None
    client_cpu_ms_per_request: float | None


class _TableHardware(_Doc):
    model: StrictStr


class _TablePlain(_Doc):
    levels: list[_TableLevel]


class _BenchTable(_Doc):
    image: dict[StrictStr, Any]
    hardware: _TableHardware
    settings: dict[StrictStr, Any]
    levels: list[_TableLevel]
    plain: _TablePlain | None = None


def bench_table(doc: dict[str, Any], host: str, what: str) -> dict[str, Any]:
    """A results document (from bench_results) that also holds everything the release
    notes' table shows, as `build.py bench` writes it; a bare one (gate and history need
    only concurrency and tok/s) is a fault here, not a KeyError in the notes."""
    try:
        _BenchTable.model_validate(doc)
    except ValidationError as exc:
        raise RegistryFault(host, f"{_describe(exc)} as the bench results document (the "
                            "release notes need the whole table)", what) from None
    return doc


class _CompatRow(_Doc):
    """A row as `build.py releases` and the notes read it (release/compat.py)."""

    image: StrictStr
    repository: StrictStr
    smoke: StrictStr
    verdict: StrictStr
    why: list[StrictStr]
    lossless: dict[StrictStr, Any]
    long_generation: dict[StrictStr, Any]
    bench: dict[StrictStr, Any]
    acceptance: dict[StrictStr, Any]


class _CompatEngine(_Doc):
    engine: StrictStr
    vllm: StrictStr
    tag: StrictStr
    this: StrictBool
    verdict: StrictStr
    tok_s: dict[StrictStr, Any]
    acceptance: dict[StrictStr, Any]


class _CompatEngines(_Doc):
    image: StrictStr
    repository: StrictStr
    releases: list[_CompatEngine]


class _CompatTable(_Doc):
    tag: StrictStr
    rows: list[_CompatRow]
    advice: list[dict[StrictStr, Any]] = []  # release/advice.py, one per image family
    engines: list[_CompatEngines] = []  # each cell across engines (release/compat.py)


def compat_table(body: bytes, host: str, what: str) -> dict[str, Any]:
    """A release's compatibility table (release/compat.py), its texts made safe to print."""
    _parse(_CompatTable, body, MAX_BLOB, host, "compatibility table", what)
    doc: dict[str, Any] = _escaped(json.loads(body))
    return doc


def json_object(body: bytes, host: str, kind: str, what: str) -> dict[str, Any]:
    """A JSON object of no fixed schema (an image config): at least an object."""
    _check_size(body, MAX_BLOB, host, kind, what)
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise RegistryFault(host, f"a {kind} that is not a JSON object", what)
    return doc
