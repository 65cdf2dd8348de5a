"""Registry text in promote/rollback/prune output goes through safetext.safe(): a release
record's tag annotation or a rollbacks entry holding an escape sequence or a newline that
forges an `error:` line reaches the terminal escaped (issue 25, item 10)."""

from __future__ import annotations

import pytest

from imagebuild.errors import OperationFailed
from imagebuild.registry.client import OCI_MANIFEST
from imagebuild.registry.records import A_TAG, LATEST, amended_manifest, read_release
from imagebuild.release import latest, rollbacks
from imagebuild.release.latest import Accept, advance, set_latest
from imagebuild.release.prune import prune
from imagebuild.spec.tags import parse_release_tag
from tests.support.memregistry import MemRegistry

REPO, OTHER = "ns/img", "ns/other"
A, B, C = "2026-06-01-v0.23.0-a", "2026-06-02-v0.23.0-b", "2026-06-03-v0.23.0-c"
EVIL = "\x1b]0;pwned\x07\x1b[2Jx\nerror: forged"


@pytest.fixture
def reg(monkeypatch, tmp_path):
    monkeypatch.setenv("IMAGEBUILD_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("IMAGEBUILD_LEASE_SETTLE", "0")
    r = MemRegistry()
    for repo in (REPO, OTHER):
        for tag in (A, B, C):
            r.add_release(repo, tag, benched=True)
    return r


def _evil_latest(reg, repo=REPO):
    """latest of repo points at A's image under a record whose tag annotation is EVIL."""
    c = reg.client()
    body = amended_manifest(read_release(c, repo, A), {A_TAG: EVIL})
    c.put_manifest(repo, LATEST, body, OCI_MANIFEST)


def _clean(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text and "\nerror:" not in text, text


def test_a_move_line_prints_latests_tag_annotation_escaped(reg):
    _evil_latest(reg)
    out: list[str] = []
    set_latest(reg.client(), REPO, C, mode="promote", log=out.append)
    assert any("moved latest" in line for line in out)
    for line in out:
        _clean(line)


def test_a_rollback_refusal_names_latest_escaped(reg):
    _evil_latest(reg)
    with pytest.raises(OperationFailed, match="newer than latest") as err:
        set_latest(reg.client(), REPO, C, mode="rollback", log=lambda _: None)
    _clean(err.value.render())


def test_latest_stays_line_prints_a_rollbacks_entry_escaped(reg):
    c = reg.client()
    reg.point_latest(REPO, B)
    config = read_release(c, REPO, B).config_descriptor
    rollbacks._write(c, REPO, {C: {"to": EVIL, "at": EVIL}}, config)
    out: list[str] = []
    assert advance(c, REPO, parse_release_tag(C), log=out.append) is None
    assert any("latest stays" in line for line in out)
    for line in out:
        _clean(line)


def test_undo_prints_the_put_back_tag_escaped(reg):
    _evil_latest(reg)
    reg.point_latest(OTHER, A)

    def other_run_moves_other(method, path):
        if method == "PUT" and path == f"/v2/{REPO}/manifests/latest" and \
                reg.tags[OTHER][LATEST] == reg.tags[OTHER][A]:
            reg.point_latest(OTHER, B)  # a writer that ignores the lease

    reg.before = other_run_moves_other
    rels = [read_release(reg.client(), r, C) for r in (REPO, OTHER)]
    out: list[str] = []
    with pytest.raises(OperationFailed, match="latest moved during this run"):
        latest.move_set(reg.client(), rels, mode="promote", accept=Accept(), log=out.append)
    assert any("put back" in line for line in out)
    for line in out:
        _clean(line)


def test_prunes_tag_list_error_names_latest_escaped(reg):
    _evil_latest(reg)
    with pytest.raises(OperationFailed, match="disagrees with a direct read") as err:
        prune(reg.client(), REPO, 1, log=lambda _: None)
    _clean(err.value.render())
