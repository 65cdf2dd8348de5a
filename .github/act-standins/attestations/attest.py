"""GitHub's artifact attestations, as the act rehearsal stands them in (no Sigstore here).

`attest.py provenance|sbom` is what actions/attest-build-provenance and actions/attest-sbom
do with the inputs release.yml passes: an in-toto statement about the subject (a SLSA v1
provenance of the workflow run, or the SBOM file as predicate), wrapped in a Sigstore
bundle v0.3 and, with push-to-registry, attached to the subject's manifest as an OCI 1.1
referrer of artifactType `application/vnd.dev.sigstore.bundle.v0.3+json` with the
`dev.sigstore.bundle.*` annotations (the registry's referrers API, else the referrers tag
schema, as @sigstore/oci does). Pushed with oras (the ORAS Python SDK) and the job's
Docker config, as the real actions read credentials.

UNSIGNED: the DSSE envelope has no signature and the verification material says it is a
stand-in. `verify()` is what the gh stand-in's `gh attestation verify` runs: the bundle
for the image's digest and predicate type exists and its statement names that digest.
Never used by GitHub itself (the workflow names the real actions, pinned by commit)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BUNDLE_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
SLSA = "https://slsa.dev/provenance/v1"
CYCLONEDX, SPDX = "https://cyclonedx.org/bom", "https://spdx.dev/Document/v2.3"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY = "application/vnd.oci.empty.v1+json"
ACCEPT = ", ".join([OCI_MANIFEST, OCI_INDEX,
                    "application/vnd.docker.distribution.manifest.v2+json",
                    "application/vnd.docker.distribution.manifest.list.v2+json"])
A_CONTENT, A_PREDICATE = "dev.sigstore.bundle.content", "dev.sigstore.bundle.predicateType"
A_CREATED = "org.opencontainers.image.created"
# what stands in for the signing certificate's identity (gh checks --owner against it)
A_STANDIN = "io.imagebuild.rehearsal.stand-in"
A_SIGNER = "io.imagebuild.rehearsal.signer-repository"
UNSIGNED = "UNSIGNED: act rehearsal stand-in for GitHub's attestation service (no Sigstore)"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class Refused(Exception):
    """What the real action or gh would refuse, said as they would."""


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def provenance_predicate() -> dict[str, Any]:
    """The SLSA v1 predicate attest-build-provenance derives from the workflow run."""
    server, repo = _env("GITHUB_SERVER_URL", "https://github.com"), _env("GITHUB_REPOSITORY")
    ref, sha = _env("GITHUB_REF"), _env("GITHUB_SHA")
    workflow = _env("GITHUB_WORKFLOW")
    wf_ref = _env("GITHUB_WORKFLOW_REF", f"{repo}/.github/workflows/{workflow}@{ref}")
    path = wf_ref.split("@")[0].removeprefix(f"{repo}/")
    return {
        "buildDefinition": {
            "buildType": "https://actions.github.io/buildtypes/workflow/v1",
            "externalParameters": {"workflow": {"ref": ref, "repository": f"{server}/{repo}",
                                                "path": path}},
            "internalParameters": {"github": {
                "event_name": _env("GITHUB_EVENT_NAME"),
                "repository_id": _env("GITHUB_REPOSITORY_ID"),
                "repository_owner_id": _env("GITHUB_REPOSITORY_OWNER_ID"),
                "runner_environment": _env("RUNNER_ENVIRONMENT", "self-hosted")}},
            "resolvedDependencies": [{"uri": f"git+{server}/{repo}@{ref}",
                                      "digest": {"gitCommit": sha}}]},
        "runDetails": {
            "builder": {"id": f"{server}/{wf_ref}"},
            "metadata": {"invocationId": f"{server}/{repo}/actions/runs/{_env('GITHUB_RUN_ID')}"
                                         f"/attempts/{_env('GITHUB_RUN_ATTEMPT', '1')}"}}}


def sbom_predicate(path: str) -> tuple[str, dict[str, Any]]:
    """(predicate type, predicate) of an SBOM file: CycloneDX or SPDX JSON, as attest-sbom."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise Refused(f"cannot read SBOM {path!r}: {exc}") from None
    if isinstance(doc, dict) and doc.get("bomFormat") == "CycloneDX":
        return CYCLONEDX, doc
    if isinstance(doc, dict) and doc.get("spdxVersion"):
        return SPDX, doc
    raise Refused(f"{path}: unsupported SBOM format (CycloneDX or SPDX JSON)")


def statement(name: str, digest: str, predicate_type: str,
              predicate: dict[str, Any]) -> dict[str, Any]:
    if not DIGEST.fullmatch(digest):
        raise Refused(f"subject-digest {digest!r} is not sha256:<64 hex>")
    if not name:
        raise Refused("subject-name is required with subject-digest")
    return {"_type": STATEMENT_TYPE,
            "subject": [{"name": name, "digest": {"sha256": digest.split(":", 1)[1]}}],
            "predicateType": predicate_type, "predicate": predicate}


def bundle(stmt: dict[str, Any]) -> dict[str, Any]:
    """A Sigstore bundle v0.3 holding `stmt` in a DSSE envelope with no signature."""
    payload = base64.b64encode(json.dumps(stmt, separators=(",", ":")).encode()).decode()
    return {"mediaType": BUNDLE_TYPE,
            "verificationMaterial": {"publicKey": {"hint": UNSIGNED}, "tlogEntries": []},
            "dsseEnvelope": {"payload": payload, "payloadType": PAYLOAD_TYPE,
                             "signatures": []}}


def statement_of(bundle_doc: dict[str, Any]) -> dict[str, Any]:
    env = bundle_doc.get("dsseEnvelope") or {}
    if env.get("payloadType") != PAYLOAD_TYPE:
        raise Refused(f"bundle payload is {env.get('payloadType')!r}, not an in-toto statement")
    return dict(json.loads(base64.b64decode(env.get("payload", ""))))


# --- the registry (oras) -------------------------------------------------------------

class Registry:
    """One repository of a registry through the ORAS SDK, with the job's Docker config."""

    def __init__(self, name: str) -> None:
        import oras.client

        host, _, self.repo = name.partition("/")
        if not self.repo:
            raise Refused(f"subject-name {name!r} is not REGISTRY/REPOSITORY")
        self.host = host
        loopback = host.split(":")[0] in ("localhost", "127.0.0.1", "::1")
        self.oras = oras.client.OrasClient(hostname=host, insecure=loopback,
                                           auth_backend="basic")
        self.container = self.oras.get_container(f"{host}/{self.repo}")
        config = Path(_env("DOCKER_CONFIG", str(Path.home() / ".docker"))) / "config.json"
        if config.is_file():
            self.oras.auth.load_configs(self.container, configs=[str(config)])
        self.base = f"{self.oras.prefix}://{host}/v2/{self.repo}"

    def _request(self, method: str, path: str, **kw: Any) -> Any:
        return self.oras.do_request(f"{self.base}/{path}", method, **kw)

    def manifest(self, ref: str) -> tuple[bytes, str] | None:
        r = self._request("GET", f"manifests/{ref}", headers={"Accept": ACCEPT})
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise Refused(f"GET {self.host}/{self.repo} manifest {ref}: HTTP {r.status_code}")
        return r.content, r.headers.get("Content-Type", OCI_MANIFEST).split(";")[0]

    def put_blob(self, body: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        with tempfile.NamedTemporaryFile(prefix="blob-") as fh:
            fh.write(body)
            fh.flush()
            r = self.oras.upload_blob(fh.name, self.container,
                                      {"digest": digest, "size": len(body), "mediaType": EMPTY})
        if r.status_code not in (200, 201, 202):
            raise Refused(f"blob upload to {self.host}/{self.repo}: HTTP {r.status_code}")
        return digest

    def put_manifest(self, ref: str, raw: bytes, media: str) -> Any:
        r = self._request("PUT", f"manifests/{ref}", data=raw, headers={"Content-Type": media})
        if r.status_code not in (200, 201):
            raise Refused(f"PUT {self.host}/{self.repo} manifest {ref}: HTTP {r.status_code}")
        return r

    def referrers(self, digest: str) -> list[dict[str, Any]]:
        """Descriptors attached to `digest`: the referrers API, else the tag schema."""
        r = self._request("GET", f"referrers/{digest}", headers={"Accept": OCI_INDEX})
        if r.status_code == 200 and r.headers.get("Content-Type", "").startswith(OCI_INDEX):
            return list(r.json().get("manifests") or [])
        got = self.manifest(digest.replace(":", "-"))
        return list(json.loads(got[0]).get("manifests") or []) if got else []

    def attach(self, digest: str, doc: dict[str, Any], annotations: dict[str, str]) -> str:
        """The bundle as an artifact whose subject is manifest `digest` (must exist)."""
        got = self.manifest(digest)
        if got is None:
            raise Refused(f"{self.host}/{self.repo}@{digest}: no such manifest to attach to")
        subject_raw, subject_media = got
        body = json.dumps(doc, separators=(",", ":")).encode()
        layer, config = self.put_blob(body), self.put_blob(b"{}")
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": BUNDLE_TYPE,
                    "config": {"mediaType": EMPTY, "digest": config, "size": 2},
                    "layers": [{"mediaType": BUNDLE_TYPE, "digest": layer, "size": len(body)}],
                    "subject": {"mediaType": subject_media, "digest": digest,
                                "size": len(subject_raw)},
                    "annotations": annotations}
        raw = json.dumps(manifest, separators=(",", ":")).encode()
        ours = "sha256:" + hashlib.sha256(raw).hexdigest()
        r = self.put_manifest(ours, raw, OCI_MANIFEST)
        if not r.headers.get("OCI-Subject"):  # no referrers API: the tag schema's index
            tag = digest.replace(":", "-")
            old = self.manifest(tag)
            entries = [m for m in json.loads(old[0]).get("manifests") or []
                       if m.get("digest") != ours] if old else []
            entries.append({"mediaType": OCI_MANIFEST, "digest": ours, "size": len(raw),
                            "artifactType": BUNDLE_TYPE, "annotations": annotations})
            index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}
            self.put_manifest(tag, json.dumps(index, separators=(",", ":")).encode(), OCI_INDEX)
        return ours

    def blob_json(self, digest: str) -> dict[str, Any]:
        r = self._request("GET", f"blobs/{digest}")
        if r.status_code != 200:
            raise Refused(f"GET blob {digest}: HTTP {r.status_code}")
        return dict(json.loads(r.content))


# --- the two stand-ins and gh attestation verify -------------------------------------

def attest(kind: str) -> int:
    name, digest = _env("SUBJECT_NAME"), _env("SUBJECT_DIGEST")
    if kind == "sbom":  # a relative sbom-path is the workspace's, as for the real action
        ptype, predicate = sbom_predicate(str(Path(_env("GITHUB_WORKSPACE", "."))
                                              / _env("SBOM_PATH")))
    else:
        ptype, predicate = SLSA, provenance_predicate()
    doc = bundle(statement(name, digest, ptype, predicate))
    out = Path(_env("RUNNER_TEMP") or tempfile.gettempdir()) / \
        f"attestation-{kind}-{digest[7:19]}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc))
    outputs = [f"bundle-path={out}"]
    if _env("PUSH") == "true":
        ann = {A_CONTENT: "dsse-envelope", A_PREDICATE: ptype,
               A_CREATED: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               A_STANDIN: UNSIGNED, A_SIGNER: _env("GITHUB_REPOSITORY")}
        pushed = Registry(name).attach(digest, doc, ann)
        outputs.append(f"attestation-digest={pushed}")
        print(f"attest-{kind} (stand-in, unsigned): {ptype} for {name}@{digest} "
              f"pushed as {pushed}")
    with open(_env("GITHUB_OUTPUT", os.devnull), "a") as fh:
        fh.write("".join(line + "\n" for line in outputs))
    return 0


def problems(bundles: list[tuple[dict[str, str], dict[str, Any]]], digest: str,
             predicate_type: str, owner: str) -> list[str]:
    """Why no attached bundle verifies for `digest`, `predicate_type` and `owner` (empty:
    one does). `bundles`: (descriptor annotations, bundle document) of each referrer."""
    if not bundles:
        return [f"no attestations found for {digest}"]
    why: list[str] = []
    for ann, doc in bundles:
        try:
            stmt = statement_of(doc)
        except (Refused, ValueError) as exc:
            why.append(str(exc))
            continue
        subjects = [s.get("digest", {}).get("sha256") for s in stmt.get("subject") or []]
        signer = ann.get(A_SIGNER, "")
        if stmt.get("_type") != STATEMENT_TYPE:
            why.append(f"statement type {stmt.get('_type')!r}")
        elif stmt.get("predicateType") != predicate_type:
            why.append(f"predicate type {stmt.get('predicateType')!r}, not {predicate_type}")
        elif digest.split(":", 1)[1] not in subjects:
            why.append(f"statement subject {subjects} is not {digest}")
        elif signer.split("/")[0].lower() != owner.lower():
            why.append(f"signed for {signer or 'nobody'}, not owner {owner}")
        else:
            return []
    return why


def verify(ref: str, owner: str, predicate_type: str = SLSA) -> int:
    """gh attestation verify oci://NAME@DIGEST|oci://NAME:TAG --owner OWNER
    [--predicate-type T]: a tag is resolved to the digest it holds, as gh does."""
    image = ref.removeprefix("oci://")
    name, sep, wanted = image.partition("@")
    if not sep:
        head, colon, tag = image.rpartition(":")
        name, wanted = (head, tag) if colon and "/" not in tag else (image, "latest")
    elif not DIGEST.fullmatch(wanted):
        raise Refused(f"{ref}: not oci://NAME@sha256:<hex> or oci://NAME:TAG")
    reg = Registry(name)
    got = reg.manifest(wanted)
    if got is None:
        raise Refused(f"{image}: no such image in the registry")
    digest = "sha256:" + hashlib.sha256(got[0]).hexdigest()
    if sep and digest != wanted:
        raise Refused(f"{image}: the registry answered another manifest ({digest})")
    bundles = [(d.get("annotations") or {}, reg.blob_json(
                    json.loads(reg.manifest(d["digest"])[0])["layers"][0]["digest"]))  # type: ignore[index]
               for d in reg.referrers(digest) if d.get("artifactType") == BUNDLE_TYPE]
    found = [(a, b) for a, b in bundles if a.get(A_PREDICATE, predicate_type) == predicate_type]
    why = problems(found, digest, predicate_type, owner)
    if why:
        print(f"gh attestation verify (stand-in): {image}: verification failed: "
              + "; ".join(why), file=sys.stderr)
        return 1
    print(f"gh attestation verify (stand-in): {image}: {predicate_type} attestation for "
          f"owner {owner} agrees with the image ({UNSIGNED})")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(attest(sys.argv[1]) if sys.argv[1:2] in (["provenance"], ["sbom"])
                 else f"usage: {sys.argv[0]} provenance|sbom")
    except Refused as exc:
        sys.exit(f"error: {exc}")
