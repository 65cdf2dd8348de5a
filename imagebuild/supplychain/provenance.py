"""The build provenance of one serve image: an in-toto Statement v1 whose predicate is
SLSA provenance v1, made with in-toto-attestation (the in-toto project's bindings).

buildDefinition: what decided the image, the inputs digest its label carries and what
went into it (this repository's commit, the cell's matrix entries, the lock's engine,
base, model and drafter entries, the patches, the base images by digest). runDetails: who
built it, the release workflow run when GITHUB_* says so, else this host. subject: the
release manifest that was pushed (what `docker pull IMAGE@DIGEST` fetches).
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import google.protobuf.json_format as pb_json
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
from in_toto_attestation.v1.statement import Statement

from imagebuild.supplychain.expected import Expected
from imagebuild.supplychain.sbom import Subject

SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
# what a serve image build is; docs/supply-chain.md describes its parameters
BUILD_TYPE = "urn:imagebuild:build-type:serve-image:v1"


def repository_commit(root: Path) -> tuple[str | None, bool]:
    """(HEAD commit, whether tracked files differ from it) of this checkout."""
    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)

    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        return None, False
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip() != ""
    return head.stdout.strip(), dirty


def builder(env: Mapping[str, str]) -> dict[str, Any]:
    """The builder's id and the run: the GitHub workflow run, or this host."""
    if env.get("GITHUB_ACTIONS") == "true" and env.get("GITHUB_RUN_ID"):
        server = env.get("GITHUB_SERVER_URL", "https://github.com")
        repo = env.get("GITHUB_REPOSITORY", "")
        workflow = env.get("GITHUB_WORKFLOW_REF", f"{repo}/.github/workflows/release.yml")
        return {"id": f"{server}/{workflow}",
                "invocation": f"{server}/{repo}/actions/runs/{env['GITHUB_RUN_ID']}/attempts/"
                              f"{env.get('GITHUB_RUN_ATTEMPT', '1')}",
                "runner": {k: env[k] for k in ("RUNNER_NAME", "RUNNER_OS", "RUNNER_ARCH",
                                               "RUNNER_ENVIRONMENT", "GITHUB_JOB") if k in env},
                "act": env.get("ACT") == "true"}
    host = socket.gethostname()
    return {"id": f"urn:imagebuild:local-host:{host}", "invocation": None,
            "runner": {"hostname": host}, "act": False}


def _dependencies(ex: Expected, commit: str | None, repo_uri: str,
                  records: Mapping[str, Mapping[str, Any]]) -> list[Any]:
    deps = []
    if commit:
        deps.append(ResourceDescriptor(name="imagebuild", uri=repo_uri,
                                       digest={"gitCommit": commit}).pb)
    b = ex.base
    for key, image in (("digest", b.get("image")), ("runtime_digest", b.get("runtime_image"))):
        if image:
            digest = b.get(key)
            deps.append(ResourceDescriptor(
                name=image, uri=f"oci://{image}",
                digest={"sha256": digest.removeprefix("sha256:")} if digest else None,
                annotations=None if digest else {"unresolved": "no digest in the lock"}).pb)
    for kind in ("base", "engine"):
        rec = records.get(kind)
        if rec and rec.get("image_id"):
            deps.append(ResourceDescriptor(
                name=f"{kind} image", uri=str(rec.get("ref") or ""),
                digest={"sha256": str(rec["image_id"]).removeprefix("sha256:")},
                annotations={"inputsDigest": str(rec.get("inputs_digest", ""))}).pb)
    src, wheel = ex.source, ex.wheel
    if src and src.get("commit"):
        deps.append(ResourceDescriptor(name="vllm", uri=f"git+{src.get('repository')}",
                                       digest={"gitCommit": src["commit"]}).pb)
    if wheel and wheel.get("sha256"):
        deps.append(ResourceDescriptor(name=f"{wheel.get('package')}=={wheel.get('version')}",
                                       digest={"sha256": wheel["sha256"]}).pb)
    for p in ex.engine.get("patches") or []:
        deps.append(ResourceDescriptor(name=f"patches/{p['file']}",
                                       digest={"sha256": p["sha256"]}).pb)
    for name, d in sorted((ex.engine.get("dependencies") or {}).items()):
        if d.get("commit"):
            deps.append(ResourceDescriptor(name=name, uri=f"git+{d.get('repository')}",
                                           digest={"gitCommit": d["commit"]}).pb)
    for w in ex.weights:
        if w.repository and w.revision:
            deps.append(ResourceDescriptor(name=f"{w.role} {w.name}", uri=w.repository,
                                           digest={"gitCommit": w.revision}).pb)
    return deps


def _parameters(value: Any) -> Any:
    """JSON-safe with integers as strings: protobuf's Struct holds numbers as doubles."""
    if isinstance(value, dict):
        return {str(k): _parameters(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_parameters(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    return str(value)


def build_statement(subject: Subject, ex: Expected, *, pins: Mapping[str, Any],
                    lock_entries: Mapping[str, Any], commit: str | None, dirty: bool,
                    repo_uri: str, env: Mapping[str, str],
                    records: Mapping[str, Mapping[str, Any]] | None = None,
                    sbom_digest: str | None = None, started: float | None = None) -> str:
    """The in-toto statement as JSON text (validated by in-toto-attestation)."""
    who = builder(env)
    prov = provenance_pb2.Provenance()
    bd = prov.build_definition
    bd.build_type = BUILD_TYPE
    bd.external_parameters.update(_parameters({
        "releaseTag": subject.tag, "cell": ex.cell, "target": ex.target,
        "inputsDigest": subject.inputs, "matrix": dict(pins),
        "source": {"commit": commit, "uncommittedChanges": dirty}}))
    bd.internal_parameters.update(_parameters({"lock": dict(lock_entries)}))
    bd.resolved_dependencies.extend(_dependencies(ex, commit, repo_uri, records or {}))
    rd = prov.run_details
    rd.builder.id = who["id"]
    if who["runner"]:
        rd.builder.version.update({k: str(v) for k, v in who["runner"].items()})
    if who["invocation"]:
        rd.metadata.invocation_id = who["invocation"]
    if started is not None:
        rd.metadata.started_on.FromSeconds(int(started))
    rd.metadata.finished_on.FromSeconds(int(time.time()))
    if sbom_digest:
        rd.byproducts.append(ResourceDescriptor(
            name="sbom.cdx.json", media_type="application/vnd.cyclonedx+json",
            digest={"sha256": sbom_digest.removeprefix("sha256:")}).pb)
    stmt = Statement([ResourceDescriptor(
        name=subject.name, digest={"sha256": subject.digest.removeprefix("sha256:")},
        annotations={"tag": subject.tag, "imageId": subject.image_id}).pb],
        SLSA_PROVENANCE, pb_json.MessageToDict(prov))
    stmt.validate()
    return json.dumps(pb_json.MessageToDict(stmt.pb), indent=1, sort_keys=True)
