"""What a release tag already holds, read-only, for a re-run of a release job: is each
cell published under the tag, recorded as smoke-passed for exactly the image it points
at, and benched (results stored with the release)? A re-run then skips the steps whose
work is done (a rebuild on another runner is a new image id, and release tags are never
overwritten), so a release that half-finished can be finished."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from imagebuild.bench.store import release_stored
from imagebuild.buildfolder import GATES_FILE, verdict_path
from imagebuild.docker import engine
from imagebuild.errors import OperationFailed
from imagebuild.plan import Job
from imagebuild.registry import referrers
from imagebuild.registry.client import RegistryClient
from imagebuild.registry.credentials import docker_auth_config, resolve_credentials
from imagebuild.registry.records import A_CHECKS, A_GATES, A_IMAGE, Release, read_release

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


def write_recorded_verdict(client: RegistryClient, job: Job, build_dir: Path) -> Path | None:
    """For a cell done before this run: its smoke verdict as the release records it (the
    check names and outcomes), where the notes read smoke reports, unless a report of this
    checkout is there already, and its release gates' summary as gates.json beside it.
    Says where it comes from: smoke and the gates were not run again."""
    path = verdict_path(build_dir, job.cell)
    rel = read_release(client, job.image.repository, str(job.tag))
    if path.exists() or rel is None or not rel.passed:
        return None
    checks = json.loads(rel.annotations.get(A_CHECKS) or "{}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "passed": True, "image_id": rel.image_id, "source": "release record",
        "message": f"as recorded with release {rel.tag} ({rel.digest}); not run again",
        "checks": {name: {"passed": bool(ok), "outcome": "passed" if ok else "failed"}
                   for name, ok in checks.items()}}, indent=1))
    gates = rel.annotations.get(A_GATES)  # the release gates as recorded: not run again
    if gates and not (path.parent / GATES_FILE).exists():
        (path.parent / GATES_FILE).write_text(json.dumps({
            "image_id": rel.image_id, "source": "release record",
            "summary": json.loads(gates)}, indent=1))
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
    """`signed`: this run signs the documents (release.yml's cell job,
    IMAGEBUILD_ATTESTATIONS=github), so they count only once signed."""
    repo, tag = job.image.repository, str(job.tag)
    rel = read_release(client, repo, tag)
    published = bool(rel and rel.recorded)
    tested = bool(rel and rel.passed)
    benched = bool(tested and (release_stored(client, repo, tag) or (rel and rel.unmeasured)))
    documents = bool(tested and rel and attested(client, rel, signed))
    return CellState(job.cell.id, published, tested, benched, documents)


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
