"""After publish: the SBOM and the build provenance of each pushed serve image, read from
the image itself, stored with its release as OCI referrers of the release manifest
(registry/referrers.py, as the bench results are), and written under
`build/supply-chain/<target>/<image>/` for the workflow's attestation steps.

One `docker run --rm --network none` of the image's own python3 reads it (probe.py). A
re-run finds both documents stored for the same image and stores nothing again. Stored
unsigned here; in the release workflow GitHub's artifact attestations sign the pushed
digest right after (docs/supply-chain.md), and the annotation says which.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imagebuild import buildfolder
from imagebuild.docker import engine
from imagebuild.errors import OperationFailed
from imagebuild.registry import referrers
from imagebuild.registry.records import A_INPUTS, read_release
from imagebuild.supplychain import provenance, sbom
from imagebuild.supplychain.expected import Expected, expected_for

if TYPE_CHECKING:
    from imagebuild.lock.lockfile import Lock
    from imagebuild.plan import Job
    from imagebuild.registry.client import RegistryClient

Log = Callable[[str], None]
PROBE_DIR = "/opt/imagebuild-probe"
SBOM_FILE, PROVENANCE_FILE = "sbom.cdx.json", "provenance.intoto.json"
ANN = "io.imagebuild.supply-chain"
A_SIGNING, A_FINDINGS = f"{ANN}.signing", f"{ANN}.findings"
UNSIGNED = "unsigned"
GITHUB_SIGNED = "github-artifact-attestation"


@dataclass
class Attached:
    cell: str
    subject: sbom.Subject
    sbom_digest: str | None = None  # the artifact manifests in the registry
    provenance_digest: str | None = None
    findings: list[str] = field(default_factory=list)
    reused: bool = False  # both were stored for this image already (a re-run)
    seconds: dict[str, float] = field(default_factory=dict)  # probe, documents, store


def signing(env: Mapping[str, str]) -> str:
    """How the documents get signed: the release workflow's publish step says that its
    attestation steps follow (IMAGEBUILD_ATTESTATIONS=github; under act, which has no
    Sigstore, stand-ins push unsigned bundles). Being on a GitHub runner is not enough:
    CI runs tests there."""
    attested = env.get("IMAGEBUILD_ATTESTATIONS") == "github" and env.get("ACT") != "true"
    return GITHUB_SIGNED if attested else UNSIGNED


def probe_image(ref: str, weights: Mapping[str, str], runner: Any = None) -> dict[str, Any]:
    """probe.py run by the image's python3: no network, read-only, root (reads any file)."""
    if runner is None:
        runner = engine().probe
    script = Path(__file__).with_name("probe.py").resolve()
    argv = [f"{PROBE_DIR}/probe.py"]
    for role, path in weights.items():
        argv += ["--weights", f"{role}={path}"]
    code, out = runner(ref, argv, entrypoint="python3",
                       mounts={str(script): f"{PROBE_DIR}/probe.py"})
    if code != 0:
        raise OperationFailed(f"reading {ref} for its SBOM failed (exit {code}): "
                              f"{out.strip()[-500:]}", fix="check that the image runs python3")
    return dict(json.loads(out))


def _records(build_dir: Path, job: Job) -> dict[str, dict[str, Any]]:
    found = {}
    for kind in ("base", "engine", "serve"):
        path = buildfolder.record_path(build_dir, job.cell, kind)
        if path.is_file():
            try:
                found[kind] = json.loads(path.read_text())
            except ValueError:
                pass
    return found


def _lock_entries(lock: Lock, ex: Expected, job: Job) -> dict[str, Any]:
    """The lock entries the image was built from; file lists become their count (every
    file is in the SBOM with its hash)."""
    entries = {"engine": ex.engine, "base": ex.base,
               "model": lock.entry("models", job.cell.model_name)}
    if job.cell.drafter_model:
        entries["drafter"] = lock.entry("drafters", job.cell.drafter_name)

    def slim(entry: Any) -> Any:
        if isinstance(entry, dict) and isinstance(entry.get("files"), list):
            return {**entry, "files": len(entry["files"])}
        return entry

    return {k: slim(v) for k, v in entries.items()}


def _stored_for(client: RegistryClient, repo: str, digest: str, kind: str,
                image_id: str) -> str | None:
    for desc in referrers.listed(client, repo, digest, kind):
        if (desc.get("annotations") or {}).get(referrers.A_IMAGE_ID) == image_id:
            return str(desc["digest"])
    return None


def attach(client: RegistryClient, job: Job, lock: Lock, *, root: Path, build_dir: Path,
           env: Mapping[str, str] | None = None, log: Log = print,
           runner: Any = None) -> Attached:
    """SBOM + provenance of `job`'s published release, stored with it (once)."""
    env = os.environ if env is None else env
    repo, tag = job.image.repository, str(job.tag)
    rel = read_release(client, repo, tag)
    if rel is None or not rel.passed:
        raise OperationFailed(f"{repo}:{tag} is not a published release",
                              fix="publish it first; the SBOM is stored with the release")
    subject = sbom.Subject(name=job.image.name, tag=tag, digest=rel.digest,
                           image_id=rel.image_id, inputs=rel.annotations.get(A_INPUTS))
    res = Attached(job.cell.id, subject)
    out = buildfolder.supply_chain_dir(build_dir, job.cell)
    have = {kind: _stored_for(client, repo, rel.digest, kind, rel.image_id)
            for kind in (referrers.SBOM_TYPE, referrers.PROVENANCE_TYPE)}
    if all(have.values()) and (out / SBOM_FILE).is_file():
        res.sbom_digest = have[referrers.SBOM_TYPE]
        res.provenance_digest = have[referrers.PROVENANCE_TYPE]
        res.reused = True
        log(f"{job.id}: SBOM and provenance already stored with {tag}")
        return res

    local = engine().image_id(job.release_ref) if runner is None else rel.image_id
    if local != rel.image_id:
        raise OperationFailed(f"{job.release_ref} is {local}, but {repo}:{tag} holds "
                              f"{rel.image_id}: the SBOM must be read from the released image",
                              fix="pull the release by digest (`make resume-pull`), re-run")
    t0 = time.monotonic()
    ex = expected_for(job, lock, root)
    snapshot = probe_image(job.release_ref, {w.role: w.path for w in ex.weights}, runner)
    res.seconds["probe"] = time.monotonic() - t0
    t1 = time.monotonic()
    res.findings = sbom.findings(snapshot, ex)
    sbom_text = sbom.build_sbom(snapshot, ex, subject, res.findings)
    commit, dirty = provenance.repository_commit(root)
    server, gh_repo = env.get("GITHUB_SERVER_URL"), env.get("GITHUB_REPOSITORY")
    repo_uri = (f"git+{server}/{gh_repo}" if server and gh_repo
                else f"git+file://{root.resolve()}")
    statement = provenance.build_statement(
        subject, ex, pins=job.pins, lock_entries=_lock_entries(lock, ex, job), commit=commit,
        dirty=dirty, repo_uri=repo_uri, env=env, records=_records(build_dir, job),
        sbom_digest=hashlib.sha256(sbom_text.encode()).hexdigest())
    res.seconds["documents"] = time.monotonic() - t1
    out.mkdir(parents=True, exist_ok=True)
    (out / SBOM_FILE).write_text(sbom_text)
    (out / PROVENANCE_FILE).write_text(statement)
    (out / "subject.txt").write_text(f"name={subject.name}\ndigest={subject.digest}\n"
                                     f"sbom={out / SBOM_FILE}\ntag={tag}\n")
    t2 = time.monotonic()
    ann = {A_SIGNING: signing(env), A_FINDINGS: str(len(res.findings))}
    res.sbom_digest = referrers.put_artifact(client, repo, rel, sbom_text.encode(),
                                             artifact_type=referrers.SBOM_TYPE, file_name=SBOM_FILE,
                                             annotations=ann)
    res.provenance_digest = referrers.put_artifact(
        client, repo, rel, statement.encode(), artifact_type=referrers.PROVENANCE_TYPE,
        file_name=PROVENANCE_FILE, annotations=ann)
    res.seconds["store"] = time.monotonic() - t2
    for text in res.findings:
        log(f"{job.id}: FINDING (image vs lock): {text}")
    log(f"{job.id}: SBOM ({res.sbom_digest[:19]}) and provenance "
        f"({res.provenance_digest[:19]}) stored with {tag}, {ann[A_SIGNING]}; "
        f"{len(res.findings)} finding(s)")
    return res
