"""Stored bench results on a real registry (distribution 2.8, no vLLM needed): referrers
of the release manifest that a standard tool (oras) finds, old `.bench` tags still read,
the gate's handling of flagged figures, and the history of three releases."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from imagebuild.bench import gate, history, store
from imagebuild.bench.results import document
from imagebuild.errors import UserError
from imagebuild.registry import referrers
from imagebuild.registry.client import OCI_INDEX, OCI_MANIFEST, RegistryClient
from imagebuild.registry.records import A_IMAGE, A_SMOKE, A_TAG, read_release
from imagebuild.release import rollbacks

pytestmark = pytest.mark.slow
REPO = "vllm-spark/cpu-tiny-ngram"
TAGS = ["2026-06-04-v0.23.0-one", "2026-06-11-v0.23.0-two", "2026-06-18-v0.23.0-three"]


def _release(client: RegistryClient, tag: str) -> str:
    """A minimal passed release (its own config, so its own image id); its digest."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "tag": tag}).encode()
    cfg = client.put_blob(REPO, config)
    layer = b"layer of " + tag.encode()
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": cfg, "size": len(config)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                            "digest": client.put_blob(REPO, layer), "size": len(layer)}],
                "annotations": {A_TAG: tag, A_SMOKE: "passed", A_IMAGE: cfg}}
    return client.put_manifest(REPO, tag, json.dumps(manifest).encode(), OCI_MANIFEST)


def _doc(tag: str, tok_s: dict[int, float], flagged: tuple[int, ...] = ()) -> dict:
    return document(image={"tag": tag}, settings={"max_tokens": 64}, started=tag, levels=[
        {"concurrency": c, "output_tok_s": v, "ttft_ms": {"median": 1000 / v},
         "flags": [{"code": "gaps-collapse", "reason": "burst"}] if c in flagged else []}
        for c, v in tok_s.items()])


def _client(reg) -> RegistryClient:
    return reg.client()


def test_results_are_referrers_of_the_release_that_oras_finds(fresh_registry, tmp_path) -> None:
    import jsonschema
    import oras.client
    import oras.schemas

    reg, client = fresh_registry, _client(fresh_registry)
    digest = _release(client, TAGS[0])
    first = store.put_results(client, REPO, TAGS[0], _doc(TAGS[0], {1: 100.0}))
    doc = _doc(TAGS[0], {1: 120.0, 4: 300.0})
    artifact = store.put_results(client, REPO, TAGS[0], doc)  # a re-run replaces it

    # ours: subject is the release manifest; distribution 2.8 has no referrers API, so
    # the OCI fallback tag lists exactly one bench artifact
    manifest = json.loads(client.get_manifest(REPO, artifact)[0])
    assert manifest["subject"]["digest"] == digest
    assert client.referrers(REPO, digest) is None
    found = store.stored(client, REPO, TAGS[0])
    assert found is not None and found.doc == json.loads(json.dumps(doc))
    assert (found.found_by, found.digest) == ("referrers-tag", artifact)
    client.copy_tag(REPO, TAGS[0], "latest")  # latest is the same manifest: same results
    assert store.release_results(client, REPO, "latest") == found.doc

    # a standard tool: oras (OCI Registry As Storage, the Python SDK) lists the tags,
    # reads the referrers index by the tag schema, validates and pulls the artifact
    o = oras.client.OrasClient(hostname=reg.host, insecure=True, auth_backend="basic")
    o.auth.set_basic_auth(reg.user, reg.password)
    ref = f"{reg.host}/{REPO}"
    fallback = referrers.referrers_tag(digest)
    assert fallback == "sha256-" + digest.removeprefix("sha256:")
    assert fallback in o.get_tags(ref)
    index = o.get_manifest(f"{ref}:{fallback}", allowed_media_type=[OCI_INDEX])
    [entry] = index["manifests"]
    assert entry["artifactType"] == store.ARTIFACT_TYPE and entry["digest"] == artifact
    pulled = o.get_manifest(f"{ref}@{artifact}")
    jsonschema.validate(pulled, oras.schemas.manifest)
    assert pulled["subject"]["digest"] == digest
    [path] = o.pull(target=f"{ref}@{artifact}", outdir=str(tmp_path))
    assert os.path.basename(path) == store.FILE_NAME
    assert json.loads(open(path).read()) == found.doc
    # the replaced artifact is gone (the registry allows deletes), not merely unlisted
    with pytest.raises(Exception, match="not found|404"):
        client.get_manifest(REPO, first)


def test_results_under_the_old_image_id_tag_are_still_read(fresh_registry) -> None:
    """Releases benched before referrers keep their `sha256-<image id>.bench` artifact."""
    client = _client(fresh_registry)
    _release(client, TAGS[0])
    rel = json.loads(client.get_manifest(REPO, TAGS[0])[0])
    image_id = rel["config"]["digest"]
    doc = _doc(TAGS[0], {1: 90.0})
    body = json.dumps(doc).encode()
    old = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": store.ARTIFACT_TYPE,
           "config": {"mediaType": referrers.EMPTY, "digest": client.put_blob(REPO, b"{}"),
                      "size": 2},
           "layers": [{"mediaType": store.ARTIFACT_TYPE, "digest": client.put_blob(REPO, body),
                       "size": len(body)}],
           "annotations": {referrers.A_IMAGE_ID: image_id, store.A_ACCEPTED: "old reason"}}
    client.put_manifest(REPO, store.legacy_tag(image_id), json.dumps(old).encode(),
                        OCI_MANIFEST)
    found = store.stored(client, REPO, TAGS[0])
    assert found is not None and found.found_by == "legacy-tag"
    assert found.doc == doc and found.annotations[store.A_ACCEPTED] == "old reason"
    # annotating it (an accepted regression) moves it to the referrers layout
    store.annotate(client, REPO, TAGS[0], {store.A_UNTRUSTED: "why"})
    moved = store.stored(client, REPO, TAGS[0])
    assert moved is not None and moved.found_by == "referrers-tag"
    assert moved.annotations[store.A_ACCEPTED] == "old reason"
    assert moved.annotations[store.A_UNTRUSTED] == "why"


def test_storing_needs_the_release_and_its_image(fresh_registry) -> None:
    client = _client(fresh_registry)
    with pytest.raises(UserError, match="not in the registry"):
        store.put_results(client, REPO, TAGS[0], _doc(TAGS[0], {1: 1.0}))
    _release(client, TAGS[0])
    other = {**_doc(TAGS[0], {1: 1.0}), "image": {"id": "sha256:" + "0" * 64}}
    with pytest.raises(UserError, match="these results measured sha256:000000000000, but"):
        store.put_results(client, REPO, TAGS[0], other)


def test_gate_refuses_flagged_figures_and_records_the_acceptance(fresh_registry) -> None:
    client = _client(fresh_registry)
    for tag in TAGS[:2]:
        _release(client, tag)
    store.put_results(client, REPO, TAGS[0], _doc(TAGS[0], {1: 100.0, 4: 300.0}))
    store.put_results(client, REPO, TAGS[1], _doc(TAGS[1], {1: 100.0, 4: 290.0}, (4,)))
    client.copy_tag(REPO, TAGS[0], "latest")
    with pytest.raises(UserError, match="cannot be trusted at 1 of 2"):
        gate.check_promotion(client, REPO, TAGS[1], threshold=0.05, log=lambda _: None,
                             accept_regression="a regression reason is no answer here")
    res = gate.check_promotion(client, REPO, TAGS[1], threshold=0.05, log=lambda _: None,
                               accept_untrusted="noisy shared runner")
    assert res.untrusted == {4: ["burst"]} and not res.regressions
    assert store.stored(client, REPO, TAGS[1]).annotations[store.A_UNTRUSTED] == \
        "noisy shared runner"


def test_history_of_three_releases_has_three_points_per_line(fresh_registry, tmp_path) -> None:
    reg, client = fresh_registry, _client(fresh_registry)
    for i, tag in enumerate(TAGS):
        _release(client, tag)
        store.put_results(client, REPO, tag, _doc(tag, {1: 100.0 + i, 4: 300.0 + 10 * i},
                                                  flagged=(4,) if i == 2 else ()))
    client.copy_tag(REPO, TAGS[1], "latest")  # rolled back from the third, as recorded
    config = json.loads(read_release(client, REPO, TAGS[1]).body)["config"]
    rollbacks.record(client, REPO, TAGS[2], TAGS[1],
                     {"digest": config["digest"], "size": config["size"]})
    h = history.gather(client, REPO, rollbacks.rolled_back(client, REPO))
    assert [p.tag for p in h.points] == TAGS
    assert [(p.is_latest, p.rolled_back) for p in h.points] == [
        (False, False), (True, False), (False, True)]
    fig = history.figure(h)
    for ax in fig.axes:
        lines = {ln.get_gid(): ln for ln in ax.get_lines() if ln.get_gid()}
        assert set(lines) == {"c=1", "c=4"}
        for ln in lines.values():
            ys = [y for y in ln.get_ydata() if not math.isnan(y)]
            assert len(ys) == 3, (ln.get_gid(), ys)
    assert h.series(1, "tok_s") == [100.0, 101.0, 102.0]

    # the command: PNG + markdown from the registry alone
    env = {**os.environ, "IMAGEBUILD_REGISTRY": reg.host, "IMAGEBUILD_NAMESPACE": "vllm-spark",
           "IMAGEBUILD_REGISTRY_USER": reg.user, "IMAGEBUILD_REGISTRY_PASSWORD": reg.password}
    proc = subprocess.run([sys.executable, "build.py", "history", "--image", "cpu-tiny-ngram",
                           "--out", str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "history-cpu-tiny-ngram.md").read_text()
    assert (tmp_path / "history-cpu-tiny-ngram.png").read_bytes()[:4] == b"\x89PNG"
    assert f"| **{TAGS[1]}** (latest) | passed | 101.0 | 310.0 |" in md
    assert f"| {TAGS[2]} (rolled back) | passed | 102.0 | 320.0 (untrusted) |" in md


def test_pruning_a_release_deletes_its_results(fresh_registry) -> None:
    from imagebuild.release.prune import prune

    client = _client(fresh_registry)
    digests = [_release(client, tag) for tag in TAGS]
    artifacts = [store.put_results(client, REPO, tag, _doc(tag, {1: 1.0})) for tag in TAGS]
    client.copy_tag(REPO, TAGS[2], "latest")
    plan = prune(client, REPO, 1, log=lambda _: None, settle=0)
    assert plan.delete == [TAGS[0]]  # the middle one is the rollback target
    tags = client.tags(REPO)
    assert referrers.referrers_tag(digests[0]) not in tags
    with pytest.raises(Exception, match="not found|404"):
        client.get_manifest(REPO, artifacts[0])
    assert [store.stored(client, REPO, t).digest for t in TAGS[1:]] == artifacts[1:]
