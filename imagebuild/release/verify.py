"""`build.py verify IMAGE_REF`: does what is stored with a release agree with its image?

Reads the release manifest behind the reference (its record in the annotations) and the
referrers kept with it: SBOM, provenance, bench results, compatibility table. One line per
check, `agrees`, `missing` or `disagrees`, then a summary line (or all of it as JSON); any
`missing` or `disagrees` fails the command (exit 1).
Signatures are GitHub's artifact attestations: checked with `gh attestation verify` where
`gh` is installed and the image is on ghcr.io; anywhere else the line says why not.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from imagebuild.bench import store
from imagebuild.errors import UserError
from imagebuild.plan import ImageRef
from imagebuild.registry import referrers
from imagebuild.registry.client import RegistryClient
from imagebuild.registry.errors import NotFound
from imagebuild.registry.records import (
    A_GATES,
    A_IMAGE,
    A_INPUTS,
    A_SMOKE,
    A_TAG,
    Release,
    read_release,
)
from imagebuild.release.compat import table_of
from imagebuild.safetext import safe
from imagebuild.spec.tags import parse_release_tag

AGREES, MISSING, DISAGREES, SKIPPED = "agrees", "missing", "disagrees", "not checked"
GITHUB_REGISTRY = "ghcr.io"
# a gate's recorded status (gates/__init__.py) as every other output says it
STATUS_WORDS = {"pass": "passed", "fail": "failed", "untrusted": "untrusted",
                "not-applicable": "not applicable"}
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Check:
    status: str
    what: str
    detail: str

    def line(self) -> str:
        return f"{self.status:<11} {self.what}: {safe(self.detail)}"


def _record(rel: Release, asked_tag: str | None) -> list[Check]:
    a = rel.annotations
    tag = a.get(A_TAG, "")
    out = []
    if parse_release_tag(tag) is None:
        return [Check(MISSING, "release record", f"{rel.digest} carries no release record")]
    if asked_tag and parse_release_tag(asked_tag) and asked_tag != tag:
        out.append(Check(DISAGREES, "release record", f"tag {asked_tag} holds the record of "
                                                      f"{tag}"))
    else:
        out.append(Check(AGREES, "release record", f"tag {tag}"))
    if a.get(A_IMAGE) != rel.image_id:
        out.append(Check(DISAGREES, "image id", f"the record says {a.get(A_IMAGE)}, the "
                                                f"manifest holds {rel.image_id}"))
    else:
        out.append(Check(AGREES, "image id", rel.image_id))
    smoke = a.get(A_SMOKE)
    out.append(Check(AGREES if smoke == "passed" else DISAGREES, "smoke",
                     f"recorded {smoke or 'nothing'}"))
    inputs = a.get(A_INPUTS)
    out.append(Check(AGREES, "inputs digest", inputs) if inputs else
               Check(MISSING, "inputs digest", "the record has none"))
    gates = a.get(A_GATES)
    out.append(Check(AGREES, "gates summary", _gates_text(gates)) if gates else
               Check(MISSING, "gates summary", "the record has none"))
    return out


def _gates_text(recorded: str) -> str:
    """The record's gates summary (a JSON object per gate) in words: each gate's status."""
    try:
        doc = json.loads(recorded)
    except ValueError:
        return "recorded, but not a JSON object"
    if not isinstance(doc, dict):
        return "recorded, but not a JSON object"
    return ", ".join(f"{name.replace('_', ' ')} " + STATUS_WORDS.get(
        str((g or {}).get("status") if isinstance(g, dict) else g), "?")
                     for name, g in doc.items()) or "no gates"


def _document(client: RegistryClient, repo: str, rel: Release,
              kind: str) -> tuple[str, dict[str, Any] | None] | None:
    """(artifact digest, its JSON document or None when unreadable) of the newest
    artifact of `kind` kept with the release, None when there is none."""
    for desc in referrers.listed(client, repo, rel.digest, kind):
        try:
            raw, _media, digest = client.get_manifest(repo, str(desc["digest"]))
        except NotFound:
            continue
        layers = json.loads(raw).get("layers") or []
        if not layers:
            return digest, None
        try:
            doc = json.loads(client.get_blob(repo, layers[0]["digest"]))
        except (ValueError, NotFound):
            return digest, None
        return digest, doc if isinstance(doc, dict) else None
    return None


def _sbom(client: RegistryClient, repo: str, rel: Release) -> Check:
    found = _document(client, repo, rel, referrers.SBOM_TYPE)
    if found is None:
        return Check(MISSING, "SBOM", f"no {referrers.SBOM_TYPE} referrer of {rel.digest}")
    digest, doc = found
    comp = ((doc or {}).get("metadata") or {}).get("component") or {}
    hashes = [h.get("content") for h in comp.get("hashes") or [] if isinstance(h, dict)]
    name = str(comp.get("name", ""))
    if rel.digest.removeprefix("sha256:") not in hashes or not name.endswith("/" + repo):
        return Check(DISAGREES, "SBOM", f"{digest} describes {name or '?'} "
                                        f"{', '.join(map(str, hashes)) or 'no digest'}, not "
                                        f"{repo}@{rel.digest}")
    return Check(AGREES, "SBOM", f"{digest} names {name}@{rel.digest}")


def _provenance(client: RegistryClient, repo: str, rel: Release) -> list[Check]:
    found = _document(client, repo, rel, referrers.PROVENANCE_TYPE)
    if found is None:
        return [Check(MISSING, "provenance", f"no {referrers.PROVENANCE_TYPE} referrer of "
                                             f"{rel.digest}")]
    digest, doc = found
    doc = doc or {}
    subjects = ["sha256:" + str((s.get("digest") or {}).get("sha256"))
                for s in doc.get("subject") or [] if isinstance(s, dict)]
    out = [Check(AGREES, "provenance subject", f"{digest} names {rel.digest}")
           if rel.digest in subjects else
           Check(DISAGREES, "provenance subject", f"{digest} names "
                                                  f"{', '.join(subjects) or 'no subject'}, "
                                                  f"the release is {rel.digest}")]
    params = ((doc.get("predicate") or {}).get("buildDefinition") or {}).get(
        "externalParameters") or {}
    inputs, recorded = params.get("inputsDigest"), rel.annotations.get(A_INPUTS)
    out.append(Check(AGREES, "provenance inputs", f"inputs digest {inputs}")
               if inputs and inputs == recorded else
               Check(DISAGREES, "provenance inputs", f"inputs digest {inputs}, the record "
                                                     f"says {recorded}"))
    return out


def _bench(client: RegistryClient, repo: str, rel: Release, tag: str) -> Check:
    found = store.stored(client, repo, tag)
    if found is None:
        return Check(MISSING, "bench results", f"none stored with {tag}")
    measured = found.annotations.get(referrers.A_IMAGE_ID) or \
        (found.doc.get("image") or {}).get("id")
    if measured and measured != rel.image_id:
        return Check(DISAGREES, "bench results", f"{found.digest} measured {measured}, the "
                                                 f"image is {rel.image_id}")
    return Check(AGREES, "bench results", found.digest)


def _table(client: RegistryClient, rel: Release, tag: str) -> Check:
    repo = rel.repo
    doc = table_of(client, rel)
    if doc is None:
        return Check(MISSING, "compatibility table", f"none stored with {tag}")
    mine = next((r for r in doc.get("rows") or [] if r.get("repository") == repo), None)
    if mine is None:
        return Check(DISAGREES, "compatibility table", f"{repo} is not in the table of {tag}")
    return Check(AGREES, "compatibility table", f"verdict {mine.get('verdict')}")


Runner = Callable[[list[str]], tuple[int, str]]


def _run(argv: list[str]) -> tuple[int, str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _signatures(registry: str, repo: str, digest: str, *, which: Callable[[str], str | None],
                run: Runner) -> Check:
    if registry != GITHUB_REGISTRY:
        return Check(SKIPPED, "signatures", f"{registry} is not {GITHUB_REGISTRY}: releases "
                                            "stored elsewhere are unsigned")
    if which("gh") is None:
        return Check(SKIPPED, "signatures", "gh is not on PATH (install the GitHub CLI to "
                                            "verify the attestations)")
    ref = f"oci://{registry}/{repo}@{digest}"
    code, out = run(["gh", "attestation", "verify", ref, "--owner", repo.split("/", 1)[0]])
    last = out.splitlines()[-1] if out else ""
    return Check(AGREES if code == 0 else DISAGREES, "signatures",
                 f"gh attestation verify {ref}: " + ("verified" if code == 0 else
                                                     f"exit {code} {last[:200]}"))


def verify(text: str, *, client: RegistryClient | None = None,
           which: Callable[[str], str | None] = shutil.which,
           run: Runner = _run) -> list[Check]:
    """Every check of the release behind reference `text` (REGISTRY/NS/IMAGE:TAG or
    @sha256:...), in order; the registry's credentials as every registry command's."""

    image, tag = ImageRef.parse(text)
    digest = text.split("@", 1)[1] if "@" in text else None
    if digest is not None and not DIGEST.fullmatch(digest):
        raise UserError(f"{text!r}: {digest!r} is not a manifest digest",
                        fix="use REGISTRY/NS/IMAGE@sha256:<64 hex digits>")
    if digest is None and tag is None:
        raise UserError(f"{text!r} names no tag or digest",
                        fix="use REGISTRY/NS/IMAGE:TAG or REGISTRY/NS/IMAGE@sha256:...")
    client = client or RegistryClient(image.registry)
    repo = image.repository
    rel = read_release(client, repo, digest or str(tag))
    if rel is None:
        return [Check(MISSING, "release", f"{text} is not in the registry")]
    checks = _record(rel, tag)
    release_tag = rel.annotations.get(A_TAG, "")
    checks += [_sbom(client, repo, rel), *_provenance(client, repo, rel)]
    if parse_release_tag(release_tag) is not None:
        checks += [_bench(client, repo, rel, release_tag), _table(client, rel, release_tag)]
    checks.append(_signatures(image.registry, repo, rel.digest, which=which, run=run))
    return checks


def failed(checks: list[Check]) -> bool:
    return any(c.status in (MISSING, DISAGREES) for c in checks)


def counts(checks: list[Check]) -> dict[str, int]:
    return {s: sum(c.status == s for c in checks) for s in (AGREES, MISSING, DISAGREES, SKIPPED)}


def summary(checks: list[Check]) -> str:
    """The last line: how many checks said what, and the answer."""
    n = counts(checks)
    return ", ".join(f"{status} {count}" for status, count in n.items()) + \
        " -- verify " + ("FAILED" if failed(checks) else "passed")


def as_json(text: str, checks: list[Check]) -> dict[str, Any]:
    """`verify --format json`: {image, ok, counts, checks: [{status, what, detail}]}."""
    return {"image": text, "ok": not failed(checks), "counts": counts(checks),
            "checks": [{"status": c.status, "what": c.what, "detail": c.detail}
                       for c in checks]}
