"""What a release tag already holds, read-only, for a re-run of a release job: is each
cell published under the tag, recorded as smoke-passed (and gated) for exactly the image
it points at, documented and benched (results stored with the release)? A re-run then
skips the steps whose work is done (a rebuild on another runner is a new image id, and
release tags are never overwritten), so a release that half-finished can be finished.

`decide` is the one decision: the whole job (`build.py --tag T`, job.py) skips the
stages it names for the image it built, and `resume --tag` (the workflow's steps) turns
the same answer into $GITHUB_OUTPUT lines."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagebuild.bench.store import release_stored
from imagebuild.buildfolder import GATES_FILE, verdict_path
from imagebuild.docker import engine
from imagebuild.errors import OperationFailed
from imagebuild.gates.summary import passed as gates_passed
from imagebuild.plan import Job
from imagebuild.registry import referrers
from imagebuild.registry.client import RegistryClient
from imagebuild.registry.credentials import docker_auth_config, resolve_credentials
from imagebuild.registry.records import A_CHECKS, A_GATES, A_IMAGE, LATEST, Release, read_release
from imagebuild.release.publish import other_image

# what GitHub's attestation actions sign in release.yml: the provenance and the SBOM
SIGNED_PREDICATES = ("https://slsa.dev/provenance/v1", "https://cyclonedx.org/bom")


@dataclass(frozen=True)
class CellState:
    cell: str
    published: bool  # the release tag exists with this release's record
    tested: bool  # ... recorded smoke-passed for the image it points at
    benched: bool  # bench results are stored with the release
    # its SBOM and provenance are stored with it (for this image) and, where the run
    # signs them, a Sigstore bundle of each predicate is attached too: a run that died
    # before or while signing is not done, so its re-run stores and signs them
    attested: bool = False
    gated: bool = False  # ... and its release gates recorded passed with it


# the stages a cell's release can already hold, in the whole job's order
STAGES = ("smoke", "gates", "sbom", "bench", "latest")


@dataclass(frozen=True)
class Decision:
    """One cell's release as the registry holds it, and the stages its record makes
    unnecessary: `skip` maps each to one line naming the record that says it is done."""
    cell: str
    release: Release | None
    skip: dict[str, str] = field(default_factory=dict)


def recorded_gates(rel: Release) -> dict[str, Any] | None:
    """The release gates' summary publish recorded, None when absent (a release older
    than the gates) or unreadable: either way the gates have not been seen to pass."""
    try:
        doc = json.loads(rel.annotations.get(A_GATES) or "null")
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def decide(client: RegistryClient, job: Job, *, image_id: str | None = None,
           signed: bool = False, force: bool = False) -> Decision:
    """Which stages of `job` its release tag already holds. `image_id`: the local image
    this run would test (the whole job); a release of another image stops here with
    publish's own refusal, before any smoke. None (`resume --tag` on a runner without
    the image): the release tag as it stands. `force` (--resmoke): smoke and the release
    gates run again whatever the record says; documents, bench and latest still resume."""
    repo, tag = job.image.repository, str(job.tag)
    rel = read_release(client, repo, tag)
    if rel is None or not rel.recorded:
        return Decision(job.cell.id, rel)
    if image_id is not None and rel.image_id != image_id:
        raise other_image(repo, tag, rel.image_id, image_id)
    if not rel.passed:
        return Decision(job.cell.id, rel)
    where = f"release record {repo}:{tag} ({rel.digest[:19]})"
    skip = {}
    if not force:
        skip["smoke"] = f"{where} says smoke passed for image {rel.image_id[:19]}"
        gates = recorded_gates(rel)
        if gates is not None and gates_passed(gates):
            skip["gates"] = f"{where} says the release gates passed: " + ", ".join(
                f"{k} {v.get('status')}" for k, v in sorted(gates.items()))
    if attested(client, rel, signed):
        skip["sbom"] = (f"SBOM and provenance of image {rel.image_id[:19]} stored with "
                        f"{repo}:{tag}" + (" and signed" if signed else ""))
    if rel.unmeasured:
        skip["bench"] = f"{where} says promoted unmeasured ({rel.unmeasured})"
    elif release_stored(client, repo, tag) is not None:
        skip["bench"] = f"bench results stored with {repo}:{tag}"
    latest = read_release(client, repo, LATEST)
    if latest is not None and latest.digest == rel.digest:
        skip["latest"] = f"{repo}:{LATEST} is already {rel.digest[:19]} ({tag})"
    return Decision(job.cell.id, rel, skip)


def signing() -> bool:
    """release.yml's cell job signs what publish stores (IMAGEBUILD_ATTESTATIONS=github):
    its documents count as done only once signed."""
    return os.environ.get("IMAGEBUILD_ATTESTATIONS") == "github"


def _keep(path: Path, image_id: str) -> bool:
    """A file this checkout wrote for exactly this image, passed: richer than the record."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("image_id") == image_id and \
        doc.get("passed", True) is not False


def recorded_verdict(rel: Release, job: Job) -> dict[str, Any]:
    """The smoke verdict a release records (its check names and outcomes), as smoke's
    verdict.json holds one."""
    checks = json.loads(rel.annotations.get(A_CHECKS) or "{}")
    return {
        "passed": rel.passed, "image_id": rel.image_id, "image_ref": job.release_ref,
        "source": "release record",
        "message": f"as recorded with release {rel.tag} ({rel.digest}); not run again"
        if rel.passed else f"smoke {rel.verdict}, as recorded with release {rel.tag}",
        "checks": {name: {"passed": bool(ok), "outcome": "passed" if ok else "failed"}
                   for name, ok in checks.items()}}


def record_files(rel: Release, job: Job, build_dir: Path, *,
                 replace: bool = False) -> dict[str, Any] | None:
    """A cell's smoke verdict as its release records it (check names and outcomes) at
    the cell's verdict.json, and its recorded release gates as gates.json beside it,
    where the notes and publish read them; each says it was not run again. A file
    already there is kept unless `replace`, and even then when it is this checkout's own
    for the same image. The verdict (None unless the release is smoke-passed)."""
    if not rel.passed:
        return None
    path = verdict_path(build_dir, job.cell)
    verdict = recorded_verdict(rel, job)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or (replace and not _keep(path, rel.image_id)):
        path.write_text(json.dumps(verdict, indent=1))
    gates, gates_file = recorded_gates(rel), path.parent / GATES_FILE
    if gates is not None and (not gates_file.exists() or
                              (replace and not _keep(gates_file, rel.image_id))):
        gates_file.write_text(json.dumps({
            "image_id": rel.image_id, "source": "release record", "summary": gates},
            indent=1))
    return verdict


def write_recorded_verdict(client: RegistryClient, job: Job, build_dir: Path) -> Path | None:
    """For a cell done before this run (`resume --verdict-dir`): record_files, keeping a
    report of this checkout that is there already. The verdict's path, None when nothing
    was written."""
    path = verdict_path(build_dir, job.cell)
    rel = read_release(client, job.image.repository, str(job.tag))
    if path.exists() or rel is None or not rel.passed:
        return None
    record_files(rel, job, build_dir)
    return path


def attested(client: RegistryClient, rel: Release, signed: bool) -> bool:
    """SBOM and provenance stored for the release's image, and with `signed` a Sigstore
    bundle of each of SIGNED_PREDICATES attached to its digest as well."""
    image_id = rel.annotations.get(A_IMAGE) or rel.image_id
    found = referrers.listed_kinds(client, rel.repo, rel.digest, (
        referrers.SBOM_TYPE, referrers.PROVENANCE_TYPE, referrers.SIGSTORE_BUNDLE_TYPE))
    documented = all(any(d.get("artifactType") == want and (d.get("annotations") or {}).get(
                             referrers.A_IMAGE_ID) == image_id for d in found)
                     for want in (referrers.SBOM_TYPE, referrers.PROVENANCE_TYPE))
    if not documented or not signed:
        return documented
    bundles = set()
    for desc in found:
        if desc.get("artifactType") != referrers.SIGSTORE_BUNDLE_TYPE:
            continue
        predicate = (desc.get("annotations") or {}).get(referrers.A_BUNDLE_PREDICATE)
        if predicate is None:  # a fallback index that kept no annotations: the manifest's
            raw, _media, _digest = client.get_manifest(rel.repo, str(desc["digest"]))
            predicate = (json.loads(raw).get("annotations") or {}).get(
                referrers.A_BUNDLE_PREDICATE)
        bundles.add(predicate)
    return set(SIGNED_PREDICATES) <= bundles


def cell_state(client: RegistryClient, job: Job, *, signed: bool = False) -> CellState:
    """`decide` for the tag as it stands, as flags. `signed`: this run signs the
    documents (release.yml's cell job, `signing()`), so they count only once signed."""
    d = decide(client, job, signed=signed)
    rel = d.release
    return CellState(job.cell.id, published=bool(rel and rel.recorded),
                     tested="smoke" in d.skip, benched="bench" in d.skip,
                     attested="sbom" in d.skip, gated="gates" in d.skip)


def github_output(states: list[CellState]) -> str:
    """name=value lines for $GITHUB_OUTPUT, true only when true of every cell: `tested`
    (published and smoke-passed: nothing to build or smoke), `done` (tested, and its
    SBOM and provenance stored and signed: nothing to publish or sign) and `benched`."""
    def every(flag: str) -> str:
        return "true" if states and all(getattr(s, flag) for s in states) else "false"

    done = "true" if states and all(s.published and s.tested and s.attested
                                    for s in states) else "false"
    return (f"published={every('published')}\ntested={every('tested')}\n"
            f"attested={every('attested')}\nbenched={every('benched')}\ndone={done}\n")


def pull_tested_image(client: RegistryClient, job: Job) -> str | None:
    """For a cell done before this run whose bench is still missing, on a runner that does
    not have it: the tested image pulled by digest and tagged as the release (what `bench
    --tag` runs). Refused unless its id is the one recorded smoke-passed. None: nothing
    to pull (not done, or already here)."""
    rel = read_release(client, job.image.repository, str(job.tag))
    seam = engine()
    if rel is None or not rel.passed or seam.image_id(job.release_ref) == rel.image_id:
        return None
    host = job.image.registry
    got = seam.pull_checked(job.image.by_digest(rel.digest),
                            docker_auth_config(resolve_credentials(host), host))
    if got != rel.image_id:
        raise OperationFailed(f"{job.image.by_digest(rel.digest)} is image {got}, but the "
                              f"release records {rel.image_id} as the tested one",
                              fix="the release tag was changed outside imagebuild: "
                                  "investigate before benching it")
    seam.tag(got, job.image.name, str(job.tag))
    return got
