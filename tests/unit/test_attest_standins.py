"""The act rehearsal's stand-ins for GitHub's artifact attestations (the two actions and
`gh attestation verify`, .github/act-standins/attestations/attest.py) against an
in-memory registry: the bundles land beside the image as GitHub's do, gh's verify passes
only what agrees with the image, `build.py resume` counts a cell done only once its
documents are stored and signed, and prune deletes the bundles with their release.
The same stand-ins run in the act rehearsal (tests/e2e/test_act_release.py)."""

from __future__ import annotations

import base64
import json

from imagebuild.bench import store
from imagebuild.registry.records import read_release
from tests.support import attest_standin
from tests.support.attest_standin import HOST
from tests.support.memregistry import MemRegistry

REPO = "ns/img"
NAME = f"{HOST}/{REPO}"
TAGS = [f"2026-06-{d:02d}-v0.23.0-x" for d in (4, 11, 18)]
BOM = {"bomFormat": "CycloneDX", "specVersion": "1.6", "components": []}


def _signed(reg, monkeypatch, tmp_path, tag):
    """A release whose digest both stand-ins attested; (stand-in module, release)."""
    client = reg.client()
    rel = read_release(client, REPO, tag)
    sbom = tmp_path / "sbom.cdx.json"
    sbom.write_text(json.dumps(BOM))
    sc = attest_standin.on(reg, monkeypatch)
    for kind in ("provenance", "sbom"):
        attest_standin.attest(sc, monkeypatch, tmp_path, kind, NAME, rel.digest, sbom)
    return sc, rel


def test_bundles_land_beside_the_image_as_githubs_and_gh_verifies_them(monkeypatch, tmp_path):
    reg = MemRegistry()
    for tag in TAGS[:2]:
        reg.add_release(REPO, tag)
    sc, rel = _signed(reg, monkeypatch, tmp_path, TAGS[0])
    client = reg.client()
    found = store.listed(client, REPO, rel.digest, store.SIGSTORE_BUNDLE_TYPE)
    assert sorted(d["annotations"][store.A_BUNDLE_PREDICATE] for d in found) == [
        sc.CYCLONEDX, sc.SLSA]
    for desc in found:
        raw, _media, _ = client.get_manifest(REPO, desc["digest"])
        manifest = json.loads(raw)
        assert manifest["artifactType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
        assert manifest["subject"]["digest"] == rel.digest
        assert manifest["annotations"]["dev.sigstore.bundle.content"] == "dsse-envelope"
        bundle = json.loads(client.get_blob(REPO, manifest["layers"][0]["digest"]))
        # unsigned, and says so: no Sigstore under act
        assert bundle["dsseEnvelope"]["signatures"] == []
        assert "UNSIGNED" in bundle["verificationMaterial"]["publicKey"]["hint"]
        stmt = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        assert stmt["subject"] == [{"name": NAME, "digest": {"sha256": rel.digest[7:]}}]
        if stmt["predicateType"] == sc.CYCLONEDX:
            assert stmt["predicate"] == BOM
        else:
            assert stmt["predicate"]["buildDefinition"]["externalParameters"]["workflow"][
                "repository"] == "https://github.com/Org/imagebuild"
    ref = f"oci://{NAME}@{rel.digest}"
    assert sc.verify(ref, "org") == 0  # owner as gh compares it: case-insensitive
    assert sc.verify(ref, "Org", sc.CYCLONEDX) == 0
    assert sc.verify(ref, "someone-else") == 1
    assert sc.verify(ref, "Org", sc.SPDX) == 1  # no SPDX attestation was made
    # a wrong subject: another release's digest has no attestation
    other = read_release(client, REPO, TAGS[1]).digest
    assert sc.verify(f"oci://{NAME}@{other}", "Org") == 1
    # by tag, as users and the workflow's verify step run it: the digest the tag holds
    assert sc.verify(f"oci://{NAME}:{TAGS[0]}", "Org") == 0
    assert sc.verify(f"oci://{NAME}:{TAGS[1]}", "Org") == 1


def test_a_bundle_whose_statement_names_another_digest_does_not_verify():
    sc = attest_standin.load()
    digest, other = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    ann = {sc.A_PREDICATE: sc.SLSA, sc.A_SIGNER: "Org/imagebuild"}
    good = sc.bundle(sc.statement("r/i", digest, sc.SLSA, {}))
    moved = sc.bundle(sc.statement("r/i", other, sc.SLSA, {}))
    assert sc.problems([(ann, good)], digest, sc.SLSA, "org") == []
    assert sc.problems([(ann, moved)], digest, sc.SLSA, "org") == [
        f"statement subject ['{'b' * 64}'] is not {digest}"]
    assert sc.problems([], digest, sc.SLSA, "org") == [f"no attestations found for {digest}"]
    sbom_typed = sc.bundle(sc.statement("r/i", digest, sc.CYCLONEDX, {}))
    assert "predicate type" in sc.problems([(ann, sbom_typed)], digest, sc.SLSA, "org")[0]


def test_a_cell_is_done_only_once_its_documents_are_stored_and_signed(monkeypatch, tmp_path,
                                                                     matrix_dir):
    """The re-run after a failed signing step signs: `done` needs the SBOM and provenance
    stored for the image and, in the release workflow's cell job, both bundles."""
    from imagebuild.plan import load_plan
    from imagebuild.rehearse_workflow.outputs import parse
    from imagebuild.release.resume import cell_state, github_output

    tag = "2026-06-18-v0.23.0-dflashfix"
    (job,) = load_plan(matrix_dir / "matrix.yaml", tag, "cpu").jobs
    repo = job.image.repository
    reg = MemRegistry()
    reg.add_release(repo, tag)
    client = reg.client()

    def done(signed: bool) -> str:
        return parse(github_output([cell_state(client, job, signed=signed)]))["done"]

    assert done(False) == "false"  # published and tested; publish died before the SBOM
    rel = read_release(client, repo, tag)
    for kind in (store.SBOM_TYPE, store.PROVENANCE_TYPE):
        store.put_artifact(client, repo, rel, b"{}", artifact_type=kind, file_name="f")
    assert done(False) == "true"  # a local release: stored is all there is
    assert done(True) == "false"  # the release workflow: signing failed or never ran
    sc = attest_standin.on(reg, monkeypatch)
    attest_standin.attest(sc, monkeypatch, tmp_path, "provenance", f"{HOST}/{repo}", rel.digest)
    assert done(True) == "false"  # the SBOM's signing step failed
    sbom = tmp_path / "sbom.json"
    sbom.write_text(json.dumps(BOM))
    attest_standin.attest(sc, monkeypatch, tmp_path, "sbom", f"{HOST}/{repo}", rel.digest, sbom)
    assert done(True) == "true"
    # a fallback index whose entries kept no annotations (as cosign writes them): the
    # bundles' own manifests say their predicate
    tag = store.referrers_tag(rel.digest)
    raw, _media, _ = client.get_manifest(repo, tag)
    index = json.loads(raw)
    for entry in index["manifests"]:
        if entry["artifactType"] == store.SIGSTORE_BUNDLE_TYPE:
            entry.pop("annotations")
    client.put_manifest(repo, tag, json.dumps(index).encode(), index["mediaType"])
    assert done(True) == "true"


def test_prune_deletes_the_signed_bundles_with_their_release(monkeypatch, tmp_path):
    from imagebuild.release.prune import prune

    reg = MemRegistry()
    for tag in TAGS:
        reg.add_release(REPO, tag)
    client = reg.client()
    bundles = {}
    for tag in TAGS:
        _sc, rel = _signed(reg, monkeypatch, tmp_path, tag)
        bundles[tag] = [d["digest"] for d in store.listed(client, REPO, rel.digest,
                                                          store.SIGSTORE_BUNDLE_TYPE)]
        assert len(bundles[tag]) == 2
    reg.point_latest(REPO, TAGS[2])
    digest = read_release(client, REPO, TAGS[0]).digest
    plan = prune(client, REPO, 1, log=lambda _: None, settle=0)
    assert plan.delete == [TAGS[0]]
    for artifact in bundles[TAGS[0]]:
        assert client.head_manifest(REPO, artifact) is None
    assert store.referrers_tag(digest) not in client.tags(REPO)
    for tag in TAGS[1:]:
        for artifact in bundles[tag]:
            assert client.head_manifest(REPO, artifact) is not None
