"""`build.py verify IMAGE_REF` against the in-memory registry: a release with its record,
SBOM, provenance, bench results and compatibility table, each made as publish makes it;
every check's line and the exit code when one is missing or disagrees."""

from __future__ import annotations

import json
import re

import pytest

from imagebuild.bench import store
from imagebuild.errors import UserError
from imagebuild.registry import referrers
from imagebuild.registry.client import OCI_MANIFEST
from imagebuild.registry.records import A_INPUTS, amended_manifest, read_release
from imagebuild.release import compat
from imagebuild.release import verify as v
from imagebuild.supplychain import provenance, sbom
from tests.support.memregistry import MemRegistry
from tests.unit.test_supplychain import expected, image_tree, probe_tree

REPO, TAG, INPUTS = "ns/img", "2026-06-18-v0.23.0-x", "12" * 32
NAME = "127.0.0.1:5999/" + REPO


def _subject(rel, digest: str | None = None, inputs: str = INPUTS) -> sbom.Subject:
    return sbom.Subject(name=NAME, tag=TAG, digest=digest or rel.digest,
                        image_id=rel.image_id, inputs=inputs)


def _release(tmp_path, *, with_sbom: bool = True, prov_digest: str | None = None,
             prov_inputs: str = INPUTS, sbom_digest: str | None = None):
    """A release as the whole job leaves it; (registry, release)."""
    reg = MemRegistry()
    client = reg.client()
    reg.add_release(REPO, TAG, gates={"lossless": {"passed": True}})
    first = read_release(client, REPO, TAG)
    assert first is not None  # the record with its inputs digest, as publish writes it
    client.put_manifest(REPO, TAG, amended_manifest(first, {A_INPUTS: INPUTS}), OCI_MANIFEST)
    rel = read_release(client, REPO, TAG)
    assert rel is not None
    store.put_results(client, REPO, TAG, {"image": {"id": rel.image_id}, "levels": []})
    snap, ex = probe_tree(image_tree(tmp_path)), expected()
    if with_sbom:
        referrers.put_artifact(client, REPO, rel,
                               sbom.build_sbom(snap, ex, _subject(rel, sbom_digest), []).encode(),
                               artifact_type=referrers.SBOM_TYPE, file_name="sbom.cdx.json")
    statement = provenance.build_statement(
        _subject(rel, prov_digest, prov_inputs), ex, pins={}, lock_entries={},
        commit="c0ffee" * 6 + "1234", dirty=False, repo_uri="git+file:///w", env={},
        records={}, sbom_digest="55" * 32, started=1_700_000_000)
    referrers.put_artifact(client, REPO, rel, statement.encode(),
                           artifact_type=referrers.PROVENANCE_TYPE,
                           file_name="provenance.intoto.json")
    row = compat.make_row(image="img", cell="cpu/img", repo=REPO, drafter=False, rel=rel,
                          bench=store.release_stored(client, REPO, TAG), baseline=None,
                          baseline_tag=None, thresholds=compat.Thresholds(0.1, 0.1))
    assert compat.put_table(client, REPO, TAG, compat.table(TAG, [row]))
    return reg, rel


def _run(reg, ref: str, capsys, monkeypatch) -> tuple[int, dict[str, str]]:
    """`build.py verify REF` with the registry in memory: exit code, status per check."""
    from imagebuild.cli import main

    monkeypatch.setattr(v, "RegistryClient", lambda host: reg.client())
    code = main(["verify", ref])
    out = capsys.readouterr().out
    *checks, last = out.splitlines()
    assert re.fullmatch(r"agrees \d+, missing \d+, disagrees \d+, not checked \d+ -- verify "
                        + ("passed" if code == 0 else "FAILED"), last), last
    lines = {line.split(None, 1)[1].split(":", 1)[0] if not line.startswith("not checked")
             else "signatures": line for line in checks}
    return code, lines


def test_a_release_whose_documents_agree_verifies(tmp_path, capsys, monkeypatch):
    reg, rel = _release(tmp_path)
    for ref in (f"{NAME}:{TAG}", f"{NAME}@{rel.digest}"):
        code, lines = _run(reg, ref, capsys, monkeypatch)
        assert code == 0, lines
        for what in ("release record", "image id", "smoke", "inputs digest", "gates summary",
                     "SBOM", "provenance subject", "provenance inputs", "bench results",
                     "compatibility table"):
            assert lines[what].startswith("agrees"), lines
        assert "not checked" in lines["signatures"] and "not ghcr.io" in lines["signatures"]


def test_a_provenance_of_another_digest_disagrees(tmp_path, capsys, monkeypatch):
    other = "sha256:" + "ab" * 32
    reg, rel = _release(tmp_path, prov_digest=other)
    code, lines = _run(reg, f"{NAME}:{TAG}", capsys, monkeypatch)
    assert code == 1
    assert lines["provenance subject"].startswith("disagrees")
    assert other in lines["provenance subject"] and rel.digest in lines["provenance subject"]
    assert lines["SBOM"].startswith("agrees")


def test_documents_of_other_inputs_or_another_image_disagree(tmp_path, capsys, monkeypatch):
    reg, _rel = _release(tmp_path, prov_inputs="34" * 32)
    code, lines = _run(reg, f"{NAME}:{TAG}", capsys, monkeypatch)
    assert code == 1 and lines["provenance inputs"].startswith("disagrees")
    assert "34" * 32 in lines["provenance inputs"] and INPUTS in lines["provenance inputs"]
    reg, _rel = _release(tmp_path / "2", sbom_digest="sha256:" + "ab" * 32)
    code, lines = _run(reg, f"{NAME}:{TAG}", capsys, monkeypatch)
    assert code == 1 and lines["SBOM"].startswith("disagrees")
    assert lines["provenance inputs"].startswith("agrees")


def test_a_missing_sbom_fails(tmp_path, capsys, monkeypatch):
    reg, _rel = _release(tmp_path, with_sbom=False)
    code, lines = _run(reg, f"{NAME}:{TAG}", capsys, monkeypatch)
    assert code == 1
    assert lines["SBOM"].startswith("missing")
    assert lines["provenance subject"].startswith("agrees")


@pytest.mark.parametrize("ref", ["no-host/img:tag", f"{NAME}@sha256:nothex", NAME])
def test_a_bad_reference_is_bad_input(ref, capsys, monkeypatch):
    from imagebuild.cli import main

    reg = MemRegistry()
    monkeypatch.setattr(v, "RegistryClient", lambda host: reg.client())
    assert main(["verify", ref]) == 2
    err = capsys.readouterr().err
    assert "error" in err and ("fix:" in err or "IMAGE_REF" in err), err
    assert reg.calls == []  # refused before the registry is asked
    with pytest.raises(UserError):  # the same refusals without the command line's parser
        v.verify(ref, client=reg.client())
    assert reg.calls == []


def test_signatures_are_verified_with_gh_on_ghcr(tmp_path):
    reg, rel = _release(tmp_path)
    asked: list[list[str]] = []

    def run(argv: list[str]) -> tuple[int, str]:
        asked.append(argv)
        return 0, "ok"

    checks = v.verify(f"ghcr.io/{REPO}:{TAG}", client=reg.client(), which=lambda _: "/bin/gh",
                      run=run)
    assert asked == [["gh", "attestation", "verify", f"oci://ghcr.io/{REPO}@{rel.digest}",
                      "--owner", "ns"]]
    assert checks[-1].status == v.AGREES and not v.failed(checks)
    bad = v.verify(f"ghcr.io/{REPO}:{TAG}", client=reg.client(), which=lambda _: "/bin/gh",
                   run=lambda argv: (1, "no attestations found"))
    assert bad[-1].status == v.DISAGREES and v.failed(bad)
    unsure = v.verify(f"ghcr.io/{REPO}:{TAG}", client=reg.client(), which=lambda _: None)
    assert unsure[-1].status == v.SKIPPED and "gh is not on PATH" in unsure[-1].detail
    assert json.dumps([c.line() for c in unsure])


def test_a_bare_release_says_what_is_missing(capsys, monkeypatch):
    """A release with its record only (older releases, or a run that stopped after
    publish): each document and record field it lacks is a `missing` line."""
    reg = MemRegistry()
    reg.add_release(REPO, TAG)
    code, lines = _run(reg, f"{NAME}:{TAG}", capsys, monkeypatch)
    assert code == 1
    assert lines["release record"].startswith("agrees") and lines["smoke"].startswith("agrees")
    for what in ("inputs digest", "gates summary", "SBOM", "provenance", "bench results",
                 "compatibility table"):
        assert lines[what].startswith("missing"), lines
    reg.add_release(REPO, "2026-06-19-v0.23.0-x", smoke="failed")
    code, lines = _run(reg, f"{NAME}:2026-06-19-v0.23.0-x", capsys, monkeypatch)
    assert code == 1 and lines["smoke"].startswith("disagrees")
    code, lines = _run(reg, f"{NAME}:2026-06-20-v0.23.0-x", capsys, monkeypatch)
    assert code == 1 and lines == {"release": lines["release"]}
    assert lines["release"].startswith("missing")


def test_verify_says_agrees_sums_up_and_speaks_json(tmp_path, capsys, monkeypatch):
    """Issue 38, item 12: verify said "present" for what agrees, printed the gates summary
    as raw JSON, had no summary line and no JSON output."""
    from imagebuild.cli import main

    reg, rel = _release(tmp_path)
    monkeypatch.setattr(v, "RegistryClient", lambda host: reg.client())
    code, lines = _run(reg, f"{NAME}:{TAG}", capsys, monkeypatch)
    assert code == 0 and lines["gates summary"].endswith("gates summary: lossless ?"), lines
    assert "{" not in "".join(lines.values())  # nothing dumped as raw JSON
    assert main(["verify", f"{NAME}:{TAG}", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["image"] == f"{NAME}:{TAG}" and doc["ok"] is True
    assert doc["counts"] == {"agrees": 10, "missing": 0, "disagrees": 0, "not checked": 1}
    assert {c["status"] for c in doc["checks"]} == {"agrees", "not checked"}
    assert [c["what"] for c in doc["checks"]] == list(lines)
    reg.add_release(REPO, "2026-06-19-v0.23.0-x", smoke="failed")
    assert main(["verify", f"{NAME}:2026-06-19-v0.23.0-x", "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["counts"]["disagrees"] == 1


def test_the_gates_summary_reads_in_words():
    assert v._gates_text(json.dumps({"lossless": {"status": "pass"},
                                     "long_generation": {"status": "fail"}})) == \
        "lossless passed, long generation failed"
    assert v._gates_text("not json") == "recorded, but not a JSON object"
