"""actions/attest v4.2.2 (1e69f48acb82d1966a394da916b4c1698aa569d6), as the act rehearsal
stands it in: the same inputs, checks, outputs and failures in the same order (src/main.ts
run, src/attest.ts createAttestation), with the one thing it cannot do here, Sigstore
signing, replaced by an UNSIGNED bundle that says so. Its README lists each behaviour
with the upstream file and line.

Order (main.ts:68-147): no OIDC URL -> 'missing "id-token" permission'; inputs checked
(detect.ts); subjects (subject.ts, downcased for a push); push needs exactly one sha256
subject; the predicate (provenance.ts / sbom.ts); bundle-path set; the attestation is
written to GitHub (store.ts) BEFORE the registry push, so a push that fails leaves it
recorded and a re-run records another; then the push with @sigstore/oci 0.7.2
(credentials.ts: $HOME/.docker/config.json only, exact registry match); the storage
record (an organization's repository only; needs artifact-metadata: write, else a
warning, never a failure)."""

from __future__ import annotations

import base64
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

# act runs a copy of this action's folder alone: lib/ is found through the
# rehearsal's IMAGEBUILD_REHEARSAL_STANDINS (beside this file in a checkout)
sys.path.insert(0, str(Path(os.environ.get("IMAGEBUILD_REHEARSAL_STANDINS")
                             or Path(__file__).resolve().parent.parent) / "lib"))

import github_api  # noqa: E402
import runner_context  # noqa: E402
from oci_attach import RegistryClient, attach_artifact_to_image  # noqa: E402
from oci_credentials import get_registry_credentials, parse_image_name  # noqa: E402

OCI_VERSION = "0.7.2"  # the @sigstore/oci actions/attest v4.2.2 bundles (package-lock.json)
BUNDLE_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
SLSA = "https://slsa.dev/provenance/v1"
CYCLONEDX = "https://cyclonedx.org/bom"
UNSIGNED = "UNSIGNED: act rehearsal stand-in for GitHub's attestation service (no Sigstore)"
MAX_BYTES = 16 * 1024 * 1024
DIGEST_LENGTHS = {"sha224": 56, "sha256": 64, "sha384": 96, "sha512": 128,
                  "sha512_224": 56, "sha512_256": 64}


class Failed(Exception):
    """core.setFailed(message): the step fails with it."""


def get_input(name: str, env: dict[str, str]) -> str:
    """@actions/core getInput: INPUT_<NAME> (spaces to _, upper-cased), trimmed."""
    return env.get(f"INPUT_{name.replace(' ', '_').upper()}", "").strip()


def get_boolean_input(name: str, env: dict[str, str]) -> bool:
    val = get_input(name, env)
    if val in ("true", "True", "TRUE"):
        return True
    if val in ("false", "False", "FALSE"):
        return False
    raise Failed(f'Input does not meet YAML 1.2 "Core Schema" specification: {name}\n'
                 "Support boolean input list: `true | True | TRUE | false | False | FALSE`")


def subject(inputs: dict[str, Any]) -> dict[str, Any]:
    """subject.ts subjectFromInputs for subject-digest (the form release.yml uses; a path
    or checksums subject is refused as not stood in, so a new use shows here)."""
    given = [k for k in ("subject-path", "subject-digest", "subject-checksums") if inputs[k]]
    if not given:
        raise Failed("One of subject-path, subject-digest, or subject-checksums must be "
                     "provided")
    if len(given) > 1:
        raise Failed("Only one of subject-path, subject-digest, or subject-checksums may be "
                     "provided")
    if given != ["subject-digest"]:
        raise Failed(f"{given[0]}: not stood in by the rehearsal (subject-digest only)")
    if not inputs["subject-name"]:
        raise Failed("subject-name must be provided when using subject-digest")
    name = inputs["subject-name"].lower() if inputs["push-to-registry"] else \
        inputs["subject-name"]
    parts = inputs["subject-digest"].split(":")
    if len(parts) != 2 or not all(parts):
        raise Failed('subject-digest must be in the format "algorithm:hex_digest"')
    alg, hexd = parts
    if alg not in DIGEST_LENGTHS:
        raise Failed(f'subject-digest has unsupported algorithm "{alg}"')
    if not all(c in "0123456789abcdefABCDEF" for c in hexd):
        raise Failed("subject-digest has invalid hex digits")
    if len(hexd) != DIGEST_LENGTHS[alg]:
        raise Failed(f'subject-digest has invalid length for algorithm "{alg}" '
                     f"(expected {DIGEST_LENGTHS[alg]}, got {len(hexd)})")
    return {"name": name, "digest": {alg: hexd}}


def sbom_predicate(path: str) -> tuple[str, Any]:
    """sbom.ts parseSBOMFromPath + generateSBOMPredicate."""
    p = Path(path)
    if not p.exists():
        raise Failed("SBOM file not found")
    if p.stat().st_size > MAX_BYTES:
        raise Failed(f"SBOM file exceeds maximum allowed size: {MAX_BYTES} bytes")
    doc = json.loads(p.read_text())
    if isinstance(doc, dict) and doc.get("spdxVersion") and doc.get("SPDXID"):
        return f"https://spdx.dev/Document/v{doc['spdxVersion'].split('-')[1]}", doc
    if isinstance(doc, dict) and doc.get("bomFormat") and doc.get("serialNumber") and \
            doc.get("specVersion"):
        return CYCLONEDX, doc
    raise Failed("Unsupported SBOM format. Must be valid SPDX or CycloneDX JSON.")


def provenance_predicate(env: dict[str, str]) -> dict[str, Any]:
    """@actions/attest buildSLSAProvenancePredicate: the workflow run's SLSA v1 predicate
    (the fields of the OIDC token it reads, from the run's environment here)."""
    server, repo = env.get("GITHUB_SERVER_URL", "https://github.com"), env.get(
        "GITHUB_REPOSITORY", "")
    wf_ref = runner_context.workflow_ref()
    path, _, ref = wf_ref.removeprefix(f"{repo}/").partition("@")
    return {
        "buildDefinition": {
            "buildType": "https://actions.github.io/buildtypes/workflow/v1",
            "externalParameters": {"workflow": {"ref": ref, "repository": f"{server}/{repo}",
                                                "path": path}},
            "internalParameters": {"github": {
                "event_name": env.get("GITHUB_EVENT_NAME", ""),
                "repository_id": env.get("GITHUB_REPOSITORY_ID", ""),
                "repository_owner_id": env.get("GITHUB_REPOSITORY_OWNER_ID", ""),
                "runner_environment": runner_context.runner_environment()}},
            "resolvedDependencies": [{"uri": f"git+{server}/{repo}@{env.get('GITHUB_REF', '')}",
                                      "digest": {"gitCommit": env.get("GITHUB_SHA", "")}}]},
        "runDetails": {
            "builder": {"id": f"{server}/{wf_ref}"},
            "metadata": {"invocationId": f"{server}/{repo}/actions/runs/"
                                         f"{env.get('GITHUB_RUN_ID', '')}/attempts/"
                                         f"{env.get('GITHUB_RUN_ATTEMPT', '1')}"}}}


def certificate(env: dict[str, str], instance: str) -> dict[str, str]:
    """What the Fulcio certificate of a GitHub OIDC token says (its SAN and the GitHub
    extensions gh checks), unsigned: the job's workflow and where it ran."""
    server, repo = env.get("GITHUB_SERVER_URL", "https://github.com"), env.get(
        "GITHUB_REPOSITORY", "")
    return {"hint": UNSIGNED, "sigstoreInstance": instance,
            "subjectAlternativeName": f"{server}/{runner_context.workflow_ref()}",
            "issuer": "https://token.actions.githubusercontent.com",
            "runnerEnvironment": runner_context.runner_environment(),
            "sourceRepositoryURI": f"{server}/{repo}",
            "sourceRepositoryOwnerURI": f"{server}/{repo.split('/')[0]}",
            "sourceRepositoryRef": env.get("GITHUB_REF", ""),
            "sourceRepositoryDigest": env.get("GITHUB_SHA", "")}


def bundle(stmt: dict[str, Any], cert: dict[str, str]) -> dict[str, Any]:
    payload = base64.b64encode(json.dumps(stmt, separators=(",", ":")).encode()).decode()
    return {"mediaType": BUNDLE_TYPE,
            "verificationMaterial": {"standInCertificate": cert, "tlogEntries": []},
            "dsseEnvelope": {"payload": payload, "payloadType": PAYLOAD_TYPE,
                             "signatures": []}}


def run(env: dict[str, str], session: Any = None) -> dict[str, str]:
    """The action's outputs; raises Failed (the step's error) as the action fails."""
    inputs = {k: get_input(k, env) for k in (
        "subject-path", "subject-name", "subject-digest", "subject-checksums", "sbom-path",
        "predicate-type", "predicate", "predicate-path", "github-token")}
    for k in ("push-to-registry", "create-storage-record", "show-summary"):
        inputs[k] = get_boolean_input(k, env)
    repository = runner_context.repository()
    instance = "public-good" if repository.get("visibility") == "public" else "github"
    if not runner_context.id_token_url():
        raise Failed('missing "id-token" permission. Please add "permissions: id-token: '
                     'write" to your workflow.')
    if inputs["sbom-path"] and (inputs["predicate-type"] or inputs["predicate"]
                                or inputs["predicate-path"]):
        raise Failed("Cannot specify sbom-path together with predicate-type, predicate, or "
                     "predicate-path")
    if (inputs["predicate"] or inputs["predicate-path"]) and not inputs["predicate-type"]:
        raise Failed("predicate-type is required when using predicate or predicate-path")
    if not inputs["sbom-path"] and (inputs["predicate-type"] or inputs["predicate"]):
        raise Failed("custom predicates: not stood in by the rehearsal")
    subj = subject(inputs)
    if inputs["push-to-registry"] and list(subj["digest"]) != ["sha256"]:
        raise Failed("push-to-registry requires a subject with a SHA-256 digest but the "
                     f"subject has: {', '.join(subj['digest'])}")
    if inputs["sbom-path"]:
        ptype, predicate = sbom_predicate(str(Path(env.get("GITHUB_WORKSPACE", "."))
                                              / inputs["sbom-path"]))
    else:
        ptype, predicate = SLSA, provenance_predicate(env)
    temp = env.get("RUNNER_TEMP")
    if not temp:
        raise Failed("Missing RUNNER_TEMP environment variable")
    out_path = Path(tempfile.mkdtemp(dir=temp)) / "attestation.json"
    outputs = {"bundle-path": str(out_path)}
    stmt = {"_type": STATEMENT_TYPE, "subject": [subj], "predicateType": ptype,
            "predicate": predicate}
    doc = bundle(stmt, certificate(env, instance))
    digest = next(f"{a}:{h}" for a, h in sorted(subj["digest"].items()))
    try:
        ident = github_api.write_attestation(doc, env.get("GITHUB_REPOSITORY", ""), digest,
                                             repository, runner_context.can("attestations"))
    except github_api.APIError as exc:
        raise Failed(str(exc)) from None
    if inputs["push-to-registry"]:
        image = subj["name"].split("@")[0]
        if image.rfind(":") > image.rfind("/"):
            image = image[:image.rfind(":")]
        try:
            creds = get_registry_credentials(image, version=OCI_VERSION,
                                             home=env.get("HOME", ""))
            registry, path = parse_image_name(image)
            client = RegistryClient(registry, path, session)
            pushed = attach_artifact_to_image(
                client, creds, digest, json.dumps(doc).encode(), BUNDLE_TYPE,
                {"dev.sigstore.bundle.content": "dsse-envelope",
                 "dev.sigstore.bundle.predicateType": ptype})
        except Exception as exc:  # noqa: BLE001 - main.ts:148 fails the step with it
            raise Failed(str(exc)) from None
        print(f"Attestation uploaded to registry\n{subj['name']}@{pushed['digest']}")
        if inputs["create-storage-record"]:
            if (repository.get("owner") or {}).get("type") == "Organization":
                if runner_context.can("artifact-metadata"):
                    rid = github_api.write_storage_record(
                        {"name": image, "digest": digest, "repository":
                         env.get("GITHUB_REPOSITORY", "")})
                    outputs["storage-record-ids"] = str(rid)
                else:
                    print("::warning::Failed to create storage record: HttpError: Resource "
                          "not accessible by integration")
                    print('::warning::Please check that the "artifact-metadata:write" '
                          "permission has been included")
    out_path.write_text(json.dumps(doc) + "\n")
    with open(Path(temp) / "created_attestation_paths.txt", "a") as fh:
        fh.write(f"{out_path}\n")
    outputs["attestation-id"] = ident
    outputs["attestation-url"] = (f"{env.get('GITHUB_SERVER_URL', 'https://github.com')}/"
                                  f"{env.get('GITHUB_REPOSITORY', '')}/attestations/{ident}")
    print(f"Attestation created for {subj['name']}@{digest} (stand-in, {UNSIGNED}; "
          f"would sign with the {instance} Sigstore instance)")
    return outputs


def main() -> int:
    env = dict(os.environ)
    try:
        outputs = run(env)
    except Failed as exc:
        print(f"::error::{exc}")
        return 1
    with open(env.get("GITHUB_OUTPUT", os.devnull), "a") as fh:
        fh.write("".join(f"{k}={v}\n" for k, v in outputs.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
