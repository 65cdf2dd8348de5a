"""The release record: annotated manifests, what counts as passed, the smoke gate."""

from __future__ import annotations

import json

import pytest

from imagebuild.errors import OperationFailed
from imagebuild.registry.client import DOCKER_MANIFEST, OCI_MANIFEST, sha256_digest
from imagebuild.registry.records import (
    A_IMAGE,
    A_SMOKE,
    A_TAG,
    Release,
    annotated_manifest,
    pins_text,
    release_record,
)
from imagebuild.release.latest import Move
from imagebuild.release.publish import gate
from imagebuild.spec.tags import parse_release_tag

IMG = "sha256:" + "a" * 64
TAG = "2026-06-18-v0.23.0-dflashfix"
PUSHED = {
    "schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
    "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 921,
               "digest": IMG},
    "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                "size": 100, "digest": "sha256:" + "b" * 64}],
}
VERDICT = {"image_id": IMG, "passed": True,
           "checks": {"health": {"passed": True}, "chat": {"passed": True}, "tools": True}}


def _record(**kw):
    return release_record(parse_release_tag(TAG), IMG, VERDICT, pins={"engine": {"name": "x"}},
                          cell="cpu/tiny", inputs=None, pushed_digest="sha256:" + "c" * 64, **kw)


def _release(tag: str, body: bytes) -> Release:
    doc = json.loads(body)
    return Release("ns/img", tag, sha256_digest(body), doc["config"]["digest"],
                   doc.get("annotations", {}), body)


def test_annotated_manifest_keeps_config_and_layers_and_carries_the_record():
    body = annotated_manifest(PUSHED, _record())
    doc = json.loads(body)
    assert doc["mediaType"] == OCI_MANIFEST
    assert doc["config"]["digest"] == IMG and doc["config"]["size"] == 921
    assert doc["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    assert [(layer["digest"], layer["size"]) for layer in doc["layers"]] == [
        ("sha256:" + "b" * 64, 100)]
    assert doc["layers"][0]["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
    ann = doc["annotations"]
    assert ann[A_TAG] == TAG and ann[A_SMOKE] == "passed" and ann[A_IMAGE] == IMG
    assert json.loads(ann["io.imagebuild.release.checks"]) == {
        "health": True, "chat": True, "tools": True}


def test_passed_needs_the_record_to_name_this_tag_and_this_image():
    body = annotated_manifest(PUSHED, _record())
    assert _release(TAG, body).passed
    assert _release("latest", body).passed  # latest carries the record of its release
    # the same manifest copied under another release tag is not that release
    assert not _release("2026-06-19-v0.23.0-dflashfix", body).passed
    plain = json.dumps(PUSHED).encode()
    rel = _release(TAG, plain)
    assert not rel.passed and rel.verdict == "unrecorded"
    failed = annotated_manifest(PUSHED, {**_record(), A_SMOKE: "failed"})
    assert not _release(TAG, failed).passed
    other = annotated_manifest(PUSHED, {**_record(), A_IMAGE: "sha256:" + "d" * 64})
    assert not _release(TAG, other).passed


def test_gate_refuses_failed_smoke_and_a_verdict_for_another_image():
    gate(VERDICT, IMG, "ref")
    with pytest.raises(OperationFailed, match=r"did not pass smoke \(chat\)"):
        gate({**VERDICT, "passed": False, "checks": {"chat": {"passed": False}}}, IMG, "ref")
    with pytest.raises(OperationFailed, match="did not pass smoke"):
        gate({**VERDICT, "passed": "true"}, IMG, "ref")  # only a real boolean true passes
    with pytest.raises(OperationFailed, match="not the one tested"):
        gate(VERDICT, "sha256:" + "e" * 64, "ref")


def test_pins_and_move_lines():
    pins = {"engine": {"name": "dflashfix", "vllm": "0.23.0"},
            "model": {"repository": "AEON-7/x", "revision": "f" * 40},
            "drafter": {"method": "mtp"}}
    assert pins_text(pins) == ("engine dflashfix vLLM 0.23.0; model AEON-7/x@ffffffffffff; "
                               "drafter mtp")
    move = Move("ns/img", TAG, IMG, "2026-06-11-v0.23.0-pr41703", "sha256:" + "1" * 64,
                True, False, 0.5, 4000)
    assert move.line() == (f"ns/img: moved latest 2026-06-11-v0.23.0-pr41703 (111111111111) "
                           f"-> {TAG} (aaaaaaaaaaaa) in 0.50 s, 4,000 bytes")
    move.dry_run = True
    assert move.line().startswith("ns/img: would move latest")


def test_repository_selection():
    from imagebuild.errors import UserError
    from imagebuild.plan import ImageRef
    from imagebuild.release.repositories import match_repositories

    assert ImageRef.parse("127.0.0.1:5000/vllm-spark/qwen36-cpu:latest") == (
        ImageRef("127.0.0.1:5000", "vllm-spark/qwen36-cpu"), "latest")
    assert ImageRef.parse("127.0.0.1:5000/ns/img@sha256:" + "a" * 64)[0].repository == "ns/img"
    with pytest.raises(UserError):
        ImageRef.parse("vllm-spark/qwen36-cpu")
    repos = ["ns/qwen36-gb10-dflash", "ns/qwen36-gb10-mtp", "ns/tiny-cpu"]
    assert match_repositories(repos, "qwen36-*") == repos[:2]
    assert match_repositories(repos, "ns/tiny-cpu") == ["ns/tiny-cpu"]
    assert match_repositories(repos, None) == repos
    assert match_repositories(repos, "nothing*") == []
