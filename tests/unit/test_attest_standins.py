"""The act rehearsal's stand-ins keep the contract of what they stand in for: each case
where the real action (actions/attest v4.2.2 with @sigstore/oci 0.7.2, gh attestation
verify of cli v2.60.0) fails is fed to the stand-in, which must fail the same way and at
the same point (.github/act-standins/README.md lists each with its upstream line). Then
what the release relies on: the bundles land beside the image, `build.py resume` counts a
cell done only once both are attached, prune deletes them with their release."""

from __future__ import annotations

import base64
import json

import pytest

from imagebuild.registry import referrers
from imagebuild.registry.records import read_release
from tests.support import attest_standin as sa
from tests.support.attest_standin import HOST

REPO = "ns/img"
NAME = f"{HOST}/{REPO}"
TAGS = [f"2026-06-{d:02d}-v0.23.0-x" for d in (4, 11, 18)]
BOM = {"bomFormat": "CycloneDX", "specVersion": "1.6",
       "serialNumber": "urn:uuid:3e671687-395b-41f5-a30f-a58921a69b79", "components": []}
SIGNER = "Org/imagebuild/.github/workflows/release.yml"


@pytest.fixture
def mods():
    return sa.modules()


def _release(tag: str = TAGS[0]):
    reg = sa.AuthRegistry()
    reg.add_release(REPO, tag)
    return reg, read_release(reg.client(), REPO, tag)


def _sbom(tmp_path, doc=None):
    path = tmp_path / "sbom.cdx.json"
    path.write_text(json.dumps(BOM if doc is None else doc))
    return str(path)


def _recorded(env) -> int:
    from pathlib import Path

    return len(list((Path(env["IMAGEBUILD_REHEARSAL_GH"]) / "attestations").rglob("*.json")))


# --- @sigstore/oci: where the login is read, and which one ----------------------------

def test_no_docker_config_in_home_fails_after_the_attestation_is_recorded(mods, monkeypatch,
                                                                          tmp_path):
    """credentials.ts:57-66: $HOME/.docker/config.json or "No credential file found";
    attest.ts:35-52: the attestation is written to GitHub before that lookup, so each
    failing attempt leaves one more (a re-run signs again)."""
    reg, rel = _release()
    before = len(reg.writes())
    env = sa.job_env(tmp_path)
    for attempt in (1, 2):
        with pytest.raises(mods["attest"].Failed,
                           match=r"No credential file found at .*/home/\.docker/config\.json"):
            sa.attest(mods, monkeypatch, env, reg, NAME, rel.digest)
        assert _recorded(env) == attempt
    assert len(reg.writes()) == before  # nothing reached the registry


def test_docker_config_is_not_where_the_push_looks(mods, monkeypatch, tmp_path):
    """A login in $DOCKER_CONFIG (where `docker login` wrote it under `make job-env`) is
    never read: only $HOME/.docker/config.json is."""
    reg, rel = _release()
    env = sa.job_env(tmp_path)
    sa.login(tmp_path / "docker-config-dir-parent")
    env["DOCKER_CONFIG"] = str(tmp_path / "docker-config-dir-parent" / ".docker")
    with pytest.raises(mods["attest"].Failed, match="No credential file found"):
        sa.attest(mods, monkeypatch, env, reg, NAME, rel.digest)
    sa.login(tmp_path / "home")  # the same login in the job's home: it pushes
    out = sa.attest(mods, monkeypatch, env, reg, NAME, rel.digest)
    assert out["attestation-id"]


@pytest.mark.parametrize("config", [
    {"auths": {"ghcr.io": {"auth": base64.b64encode(b"a:b").decode()}}},  # another registry
    {"auths": {}, "credsStore": "secretservice"},  # a helper: @sigstore/oci cannot ask it
    {"auths": {f"https://{HOST}/v1/": {}}},  # an entry without auth (0.7.2 matches the key)
])
def test_no_matching_auth_fails(mods, monkeypatch, tmp_path, config):
    reg, rel = _release()
    before = len(reg.writes())
    env = sa.job_env(tmp_path)
    (tmp_path / "home" / ".docker").mkdir(parents=True)
    (tmp_path / "home" / ".docker" / "config.json").write_text(json.dumps(config))
    with pytest.raises(mods["attest"].Failed,
                       match=f"No credentials found for registry {HOST}|an auths entry "
                             "without"):
        sa.attest(mods, monkeypatch, env, reg, NAME, rel.digest)
    assert len(reg.writes()) == before


def test_a_key_that_merely_contains_the_registry_is_no_login_for_it(mods, tmp_path):
    """0.6.0 (credentials.ts:47-50 `key.includes(registry)`) hands ghcr.io the mirror's
    credentials; 0.7.1+ (exact canonical match) refuses: the version actions/attest
    v4.2.2 bundles, so the stand-in refuses too."""
    creds = mods["oci_credentials"]
    home = tmp_path / "h"
    sa.login(home, registry="mirror-ghcr.io.example.net", user="mirror", password="secret")
    got = creds.get_registry_credentials("ghcr.io/org/img", version="0.6.0", home=str(home))
    assert (got.username, got.password) == ("mirror", "secret")  # the 0.6.0 leak
    for version in ("0.7.1", "0.7.2"):
        with pytest.raises(creds.CredentialsError, match="No credentials found for registry "
                                                         "ghcr.io"):
            creds.get_registry_credentials("ghcr.io/org/img", version=version, home=str(home))
    # 0.7.x still finds the registry's own entry under a scheme or path
    sa.login(home, registry="https://ghcr.io/v2/", user="me", password="pw")
    assert creds.get_registry_credentials("ghcr.io/org/img", home=str(home)).username == "me"
    assert mods["attest"].OCI_VERSION == "0.7.2"


def test_the_push_sends_the_login_only_to_its_registry(mods, monkeypatch, tmp_path):
    reg, rel = _release()
    env = sa.job_env(tmp_path)
    sa.login(tmp_path / "home")
    reg.authorizations.clear()
    sa.attest(mods, monkeypatch, env, reg, NAME, rel.digest)
    assert set(reg.authorizations) == {reg.good}


# --- the subject and the inputs --------------------------------------------------------

def test_a_digest_the_registry_does_not_hold_fails_the_push(mods, monkeypatch, tmp_path):
    """image.ts:70-73: HEAD manifests/<digest> must answer 200."""
    reg, _rel = _release()
    env = sa.job_env(tmp_path)
    sa.login(tmp_path / "home")
    wrong = "sha256:" + "ab" * 32
    with pytest.raises(mods["attest"].Failed,
                       match=r"Error uploading artifact to container registry: Error fetching "
                             rf"http://{HOST}/v2/{REPO}/manifests/{wrong} - expected 200, "
                             "received 404"):
        sa.attest(mods, monkeypatch, env, reg, NAME, wrong)


@pytest.mark.parametrize("digest,says", [
    ("sha256:abc", 'invalid length for algorithm "sha256" (expected 64, got 3)'),
    ("md5:" + "a" * 32, 'unsupported algorithm "md5"'),
    ("sha256:" + "g" * 64, "invalid hex digits"),
    ("a" * 64, 'must be in the format "algorithm:hex_digest"'),
])
def test_a_malformed_digest_fails_before_anything_is_signed(mods, monkeypatch, tmp_path,
                                                            digest, says):
    reg, _rel = _release()
    env = sa.job_env(tmp_path)
    with pytest.raises(mods["attest"].Failed, match=says.replace("(", r"\(").replace(")", r"\)")):
        sa.attest(mods, monkeypatch, env, reg, NAME, digest)
    assert _recorded(env) == 0


def test_without_id_token_write_nothing_is_signed(mods, monkeypatch, tmp_path):
    """main.ts:69-73: the OIDC URL exists only with id-token: write (the cell job has
    none since signing moved to the sign job)."""
    reg, rel = _release()
    env = sa.job_env(tmp_path, permissions={"contents": "read", "packages": "write"})
    sa.login(tmp_path / "home")
    with pytest.raises(mods["attest"].Failed, match='missing "id-token" permission'):
        sa.attest(mods, monkeypatch, env, reg, NAME, rel.digest)
    assert _recorded(env) == 0


def test_without_attestations_write_or_in_a_users_private_repository_nothing_persists(
        mods, monkeypatch, tmp_path):
    reg, rel = _release()
    perms = {k: v for k, v in sa.SIGNER_PERMISSIONS.items() if k != "attestations"}
    env = sa.job_env(tmp_path / "a", permissions=perms)
    with pytest.raises(mods["attest"].Failed, match="Failed to persist attestation"):
        sa.attest(mods, monkeypatch, env, reg, NAME, rel.digest)
    env = sa.job_env(tmp_path / "b", visibility="private", owner_type="User")
    with pytest.raises(mods["attest"].Failed,
                       match="Feature not available for user-owned private repositories"):
        sa.attest(mods, monkeypatch, env, reg, NAME, rel.digest)


@pytest.mark.parametrize("doc,says", [
    ({"bomFormat": "CycloneDX", "specVersion": "1.6"}, "Unsupported SBOM format"),  # no serial
    ({"spdxVersion": "SPDX-2.3"}, "Unsupported SBOM format"),  # no SPDXID
    (None, "SBOM file not found"),
])
def test_an_sbom_the_action_cannot_read_fails(mods, monkeypatch, tmp_path, doc, says):
    reg, rel = _release()
    env = sa.job_env(tmp_path)
    sbom = _sbom(tmp_path, doc) if doc is not None else str(tmp_path / "missing.json")
    with pytest.raises(mods["attest"].Failed, match=says):
        sa.attest(mods, monkeypatch, env, reg, NAME, rel.digest, sbom)


def test_the_storage_record_needs_artifact_metadata_but_never_fails_the_step(
        mods, monkeypatch, tmp_path, capsys):
    reg, rel = _release()
    env = sa.job_env(tmp_path / "a")
    sa.login(tmp_path / "a" / "home")
    assert sa.attest(mods, monkeypatch, env, reg, NAME, rel.digest)["storage-record-ids"]
    perms = {k: v for k, v in sa.SIGNER_PERMISSIONS.items() if k != "artifact-metadata"}
    env = sa.job_env(tmp_path / "b", permissions=perms)
    sa.login(tmp_path / "b" / "home")
    out = sa.attest(mods, monkeypatch, env, reg, NAME, rel.digest)
    assert "storage-record-ids" not in out
    assert 'Please check that the "artifact-metadata:write" permission' in capsys.readouterr().out


# --- what lands in the registry, and gh attestation verify -----------------------------

def _signed(mods, monkeypatch, tmp_path, reg, rel, **job):
    env = sa.job_env(tmp_path, **job)
    sa.login(tmp_path / "home")
    sbom = _sbom(tmp_path)
    sa.attest(mods, monkeypatch, env, reg, NAME, rel.digest)
    sa.attest(mods, monkeypatch, env, reg, NAME, rel.digest, sbom)
    return env


def test_bundles_land_beside_the_image_as_githubs(mods, monkeypatch, tmp_path):
    reg, rel = _release()
    _signed(mods, monkeypatch, tmp_path, reg, rel)
    client = reg.client()
    found = referrers.listed(client, REPO, rel.digest, referrers.SIGSTORE_BUNDLE_TYPE)
    assert sorted(d["annotations"][referrers.A_BUNDLE_PREDICATE] for d in found) == [
        "https://cyclonedx.org/bom", "https://slsa.dev/provenance/v1"]
    for desc in found:
        raw, _media, _ = client.get_manifest(REPO, desc["digest"])
        manifest = json.loads(raw)
        assert manifest["artifactType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
        assert manifest["subject"]["digest"] == rel.digest
        assert manifest["config"]["mediaType"] == "application/vnd.oci.empty.v1+json"
        assert set(manifest["annotations"]) == {"dev.sigstore.bundle.content",
                                                "dev.sigstore.bundle.predicateType",
                                                "org.opencontainers.image.created"}
        bundle = json.loads(client.get_blob(REPO, manifest["layers"][0]["digest"]))
        assert bundle["dsseEnvelope"]["signatures"] == []  # unsigned, and says so
        assert "UNSIGNED" in bundle["verificationMaterial"]["standInCertificate"]["hint"]
        stmt = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        assert stmt["subject"] == [{"name": NAME, "digest": {"sha256": rel.digest[7:]}}]
        if stmt["predicateType"] == "https://cyclonedx.org/bom":
            assert stmt["predicate"] == BOM


def test_gh_verify_follows_gh_policy(mods, monkeypatch, tmp_path):
    reg, rel = _release()
    other = read_release(reg.client(), REPO, reg.add_release(REPO, TAGS[1]) and TAGS[1])
    env = _signed(mods, monkeypatch, tmp_path, reg, rel)
    env["DOCKER_CONFIG"] = str(tmp_path / "home" / ".docker")  # gh's keychain reads it

    def verify(*argv):
        return sa.gh_verify(mods, monkeypatch, env, reg, *argv)

    ref, strict = f"oci://{NAME}:{TAGS[0]}", ("--signer-workflow", SIGNER,
                                               "--deny-self-hosted-runners")
    assert verify(ref, "--repo", "Org/imagebuild", *strict) == 0
    assert verify(ref, "--repo", "Org/imagebuild", *strict,
                  "--predicate-type", "https://cyclonedx.org/bom") == 0
    assert verify(f"oci://{NAME}@{rel.digest}", "--owner", "org") == 0  # case-insensitive
    assert verify(ref, "--repo", "Org/imagebuild", "--bundle-from-oci") == 0
    assert verify(ref, "--owner", "someone-else") == 1
    assert verify(ref, "--repo", "Org/other") == 1
    assert verify(ref, "--repo", "Org/imagebuild", "--signer-workflow",
                  "Org/imagebuild/.github/workflows/ci.yml") == 1
    assert verify(ref, "--repo", "Org/imagebuild", "--predicate-type",
                  "https://spdx.dev/Document/v2.3") == 1
    assert verify(f"oci://{NAME}:{TAGS[1]}", "--repo", "Org/imagebuild") == 1  # not signed
    assert other is not None
    assert verify(ref, "--owner", "Org", "--repo", "Org/imagebuild") == 1  # one of them
    assert verify(ref) == 1
    assert verify(ref, "--repo", "Org", ) == 1  # not OWNER/REPO
    env.pop("DOCKER_CONFIG")
    (tmp_path / "home" / ".docker" / "config.json").unlink()
    assert verify(ref, "--repo", "Org/imagebuild") == 1  # no login: the digest is unknown


def test_gh_denies_what_a_self_hosted_runner_signed(mods, monkeypatch, tmp_path):
    reg, rel = _release()
    env = _signed(mods, monkeypatch, tmp_path, reg, rel, runs_on="${{ matrix.runner }}")
    ref = f"oci://{NAME}@{rel.digest}"
    assert sa.gh_verify(mods, monkeypatch, env, reg, ref, "--repo", "Org/imagebuild") == 0
    assert sa.gh_verify(mods, monkeypatch, env, reg, ref, "--repo", "Org/imagebuild",
                        "--deny-self-hosted-runners") == 1


def test_a_bundle_whose_statement_names_another_digest_does_not_verify(mods):
    v = mods["gh_verify"]
    att = mods["attest"]
    digest, other = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    cert = {"subjectAlternativeName": f"https://github.com/{sa.WORKFLOW_REF}",
            "issuer": "https://token.actions.githubusercontent.com",
            "runnerEnvironment": "github-hosted",
            "sourceRepositoryURI": "https://github.com/Org/imagebuild",
            "sourceRepositoryOwnerURI": "https://github.com/Org"}
    stmt = {"_type": att.STATEMENT_TYPE, "predicateType": att.SLSA, "predicate": {},
            "subject": [{"name": "r/i", "digest": {"sha256": other[7:]}}]}
    args = v.parser().parse_args(["oci://x", "--repo", "Org/imagebuild"])
    assert "do not include" in v.why_not(att.bundle(stmt, cert), digest, args)
    stmt["subject"][0]["digest"]["sha256"] = digest[7:]
    assert v.why_not(att.bundle(stmt, cert), digest, args) is None


# --- what the release relies on ---------------------------------------------------------

def test_a_cell_is_done_only_once_its_documents_are_stored_and_signed(mods, monkeypatch,
                                                                     tmp_path, matrix_dir):
    """The re-run after a failed signing step signs: `done` needs the SBOM and provenance
    stored for the image and, for the sign job (IMAGEBUILD_ATTESTATIONS=github), both
    bundles."""
    from imagebuild.plan import load_plan
    from imagebuild.release.resume import cell_state, github_output
    from tools.rehearse_release.outputs import parse

    tag = "2026-06-18-v0.23.0-dflashfix"
    (job,) = load_plan(matrix_dir / "matrix.yaml", tag, "cpu").jobs
    repo = job.image.repository
    reg = sa.AuthRegistry()
    reg.add_release(repo, tag)
    client = reg.client()

    def done(signed: bool) -> str:
        return parse(github_output([cell_state(client, job, signed=signed)]))["done"]

    assert done(False) == "false"  # published and tested; publish died before the SBOM
    rel = read_release(client, repo, tag)
    for kind in (referrers.SBOM_TYPE, referrers.PROVENANCE_TYPE):
        referrers.put_artifact(client, repo, rel, b"{}", artifact_type=kind, file_name="f")
    assert done(False) == "true"  # the cell job: stored is all it makes
    assert done(True) == "false"  # the sign job: signing failed or never ran
    env = sa.job_env(tmp_path)
    sa.login(tmp_path / "home")
    sa.attest(mods, monkeypatch, env, reg, f"{HOST}/{repo}", rel.digest)
    assert done(True) == "false"  # the SBOM's signing step failed
    sa.attest(mods, monkeypatch, env, reg, f"{HOST}/{repo}", rel.digest, _sbom(tmp_path))
    assert done(True) == "true"


def test_prune_deletes_the_signed_bundles_with_their_release(mods, monkeypatch, tmp_path):
    from imagebuild.release.prune import prune

    reg = sa.AuthRegistry()
    for tag in TAGS:
        reg.add_release(REPO, tag)
    client = reg.client()
    bundles = {}
    for i, tag in enumerate(TAGS):
        rel = read_release(client, REPO, tag)
        _signed(mods, monkeypatch, tmp_path / str(i), reg, rel)
        bundles[tag] = [d["digest"] for d in referrers.listed(client, REPO, rel.digest,
                                                              referrers.SIGSTORE_BUNDLE_TYPE)]
        assert len(bundles[tag]) == 2
    reg.point_latest(REPO, TAGS[2])
    digest = read_release(client, REPO, TAGS[0]).digest
    plan = prune(client, REPO, 1, log=lambda _: None, settle=0)
    assert plan.delete == [TAGS[0]]
    for artifact in bundles[TAGS[0]]:
        assert client.head_manifest(REPO, artifact) is None
    assert referrers.referrers_tag(digest) not in client.tags(REPO)
    for tag in TAGS[1:]:
        for artifact in bundles[tag]:
            assert client.head_manifest(REPO, artifact) is not None
