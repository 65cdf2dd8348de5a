"""Real CLI commands (`build.py releases`, `prune`, `rollback`, `history`) against a
registry that misbehaves in one way per case (tests/support/faulty_registry.py, loopback).

Every case: the command ends within a bounded wall time, exits 1 (a registry fault, not
the user's bad input), prints no traceback, and nothing the registry said reaches the
terminal raw. No Docker: the fake registry is a stdlib HTTP server; each case ~1-3 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from imagebuild.bench import store
from tests.support.faulty_registry import Answer, Drip, FaultyRegistry, Hang, Request
from tests.support.memregistry import MemRegistry

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "cpu-tiny-ngram"
REPO = f"vllm-spark/{IMAGE}"
TAGS = ("2026-06-01-v0.23.0-pr41703", "2026-06-02-v0.23.0-pr41703",
        "2026-06-03-v0.23.0-pr41703")
DEADLINE = 3.0  # IMAGEBUILD_REGISTRY_DEADLINE of every case: a hang ends by it
WALL = 25.0  # what a case may take, start-up of the interpreter included
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[H\nerror: forged by the registry\r"


def _bench_doc(tok_s: float, image_id: str, reason: str = "burst") -> dict:
    stats = {"median": 50.0, "p90": 60.0, "mean": 52.0}
    return {"image": {"id": image_id, "tag": "t"}, "hardware": {"model": "a test CPU"},
            "settings": {"prompts": "structured", "max_tokens": 64},
            "levels": [{"concurrency": c, "output_tok_s": tok_s * c, "requests": 16,
                        "errors": 0, "request_rate": 1.0, "ttft_ms": stats, "tpot_ms": stats,
                        "itl_ms": stats, "e2e_ms": stats, "client_cpu_ms_per_request": 5.0,
                        "flags": [{"code": "gaps-collapse", "reason": reason}] if c == 4
                        else []} for c in (1, 4)]}


def seeded(*, bench: bool = False, annotate: dict[str, str] | None = None,
           reason: str = "burst", latest: int = -1) -> MemRegistry:
    """Three passing releases, latest on the newest (or TAGS[latest]); bench results on
    each if asked (`reason`: their flag's); `annotate` added to the newest one's record."""
    mem = MemRegistry()
    for tag in TAGS:
        mem.add_release(REPO, tag)
    if annotate:
        client = mem.client()
        body, media, _ = client.get_manifest(REPO, TAGS[-1])
        doc = json.loads(body)
        doc["annotations"].update(annotate)
        client.put_manifest(REPO, TAGS[-1], json.dumps(doc).encode(), media)
    mem.point_latest(REPO, TAGS[latest])
    if bench:
        client = mem.client()
        for i, tag in enumerate(TAGS):
            rel_config = json.loads(client.get_manifest(REPO, tag)[0])["config"]["digest"]
            store.put_results(client, REPO, tag, _bench_doc(10.0 + i, rel_config, reason))
    mem.calls.clear()
    return mem


@dataclass
class Run:
    code: int
    out: str
    err: str
    seconds: float

    def assert_clean_failure(self, code: int = 1) -> None:
        text = self.out + self.err
        assert self.code == code, (self.code, text[-3000:])
        assert "Traceback" not in text, text[-3000:]
        assert self.seconds < WALL, self.seconds
        assert "\x1b" not in text and "\x07" not in text and "\r" not in text, text[-2000:]
        assert not any(line.startswith("error: forged") for line in text.splitlines())


def run(reg: FaultyRegistry, *args: str, tmp: Path, env: dict[str, str] | None = None,
        image: bool | None = True) -> Run:
    full = {**os.environ, "IMAGEBUILD_REGISTRY": reg.host,
            "IMAGEBUILD_NAMESPACE": "vllm-spark",
            "IMAGEBUILD_REGISTRY_DEADLINE": str(DEADLINE),
            "IMAGEBUILD_LOCK_DIR": str(tmp / "locks"),
            "IMAGEBUILD_LEASE_SETTLE": "0", **(env or {})}
    start = time.monotonic()
    select = [] if image is None else ["--image", IMAGE] if image else ["--target", "cpu"]
    proc = subprocess.run([sys.executable, "build.py", *args, *select], cwd=ROOT,
                          env=full, capture_output=True, text=True, timeout=WALL + 30)
    return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def on(kind: str, reg_path_part: str | None = None):
    """A predicate: the request is a GET of this kind (tags, manifests, blobs)."""
    def match(req: Request) -> bool:
        marker = {"tags": "/tags/list", "manifests": "/manifests/", "blobs": "/blobs/"}[kind]
        return (req.method == "GET" and marker in req.bare_path
                and (reg_path_part is None or reg_path_part in req.bare_path))
    return match


def _release_get(tag: str):
    return on("manifests", f"/manifests/{tag}")


# ------------------------------------------------------------------- garbage bodies


@pytest.mark.parametrize("case, fault", [
    ("non-JSON manifest", lambda req, ans: ans.rebody(b"<html>502 Bad Gateway</html>")
     if _release_get(TAGS[1])(req) else ans),
    ("manifest that is a JSON list", lambda req, ans: ans.rebody(b"[1, 2, 3]")
     if _release_get(TAGS[1])(req) else ans),
    ("non-string tags", lambda req, ans: ans.rebody(json.dumps(
        {"name": REPO, "tags": [*TAGS, 42, None]}).encode()) if on("tags")(req) else ans),
    ("an odd tag in the list", lambda req, ans: ans.rebody(json.dumps(
        {"name": REPO, "tags": [*TAGS, "not a tag!"]}).encode()) if on("tags")(req) else ans),
    ("tag list that is not JSON", lambda req, ans: ans.rebody(b"\x00\xff garbage")
     if on("tags")(req) else ans),
])
def test_garbage_bodies_end_in_a_registry_fault(tmp_path, case, fault):
    with FaultyRegistry(seeded(), fault) as reg:
        r = run(reg, "releases", tmp=tmp_path)
    r.assert_clean_failure()
    assert f"the registry at {reg.host} answered" in r.err, r.err


def _annotation_fault(key: str, value: object):
    def fault(req: Request, ans: Answer) -> Answer:
        if not _release_get(TAGS[1])(req) or ans.status != 200:
            return ans
        doc = json.loads(ans.body)
        doc["annotations"][key] = value
        return ans.rebody(json.dumps(doc).encode())
    return fault


@pytest.mark.parametrize("key, value", [
    ("io.imagebuild.release.smoke", 5),
    ("io.imagebuild.release.pins", ["not", "an", "object"]),
    ("io.imagebuild.release.pins", "[1, 2]"),
    ("io.imagebuild.release.checks", "{broken"),
])
def test_malformed_annotations_end_in_a_registry_fault(tmp_path, key, value):
    with FaultyRegistry(seeded(), _annotation_fault(key, value)) as reg:
        r = run(reg, "releases", tmp=tmp_path)
    r.assert_clean_failure()
    assert "answered" in r.err and key in r.err, r.err


@pytest.mark.parametrize("bad", [{"io.imagebuild.lease.expires": 17e8},
                                 {"io.imagebuild.lease.owner": ESCAPES}])
def test_a_malformed_lease_stops_prune_before_any_delete(tmp_path, bad):
    """A lease document that is not text (what an expiry means is the lease's to judge)."""
    mem = seeded()
    client = mem.client()
    config = json.loads(client.get_manifest(REPO, TAGS[0])[0])["config"]
    lease = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
             "config": {**config, "mediaType": "application/vnd.oci.image.config.v1+json"},
             "layers": [], "annotations": {"io.imagebuild.lease.owner": "elsewhere:1:x",
                                           "io.imagebuild.lease.host": "elsewhere",
                                           "io.imagebuild.lease.expires": "1e10", **bad}}
    client.put_manifest(REPO, "imagebuild-lease", json.dumps(lease).encode(),
                        "application/vnd.oci.image.manifest.v1+json")
    mem.calls.clear()
    with FaultyRegistry(mem) as reg:
        r = run(reg, "prune", "--keep", "1", tmp=tmp_path)
    r.assert_clean_failure()
    assert "lease" in r.err and "answered" in r.err, r.err
    assert not [c for c in mem.calls if c[0] == "DELETE"]
    assert set(TAGS) <= set(mem.tags[REPO])


@pytest.mark.parametrize("expires", ["tomorrow", "nan", "inf", ""])
def test_an_unreadable_lease_of_another_host_holds_prune_off_and_unlock_clears_it(
        tmp_path, expires):
    """Issue 39: a lease of another host whose expiry cannot be read may be live: prune
    (a writer) is held off, exit 1, nothing written, the error names the clearing
    command; `unlock` clears it, and the writer then runs."""
    mem = seeded()
    client = mem.client()
    config = json.loads(client.get_manifest(REPO, TAGS[0])[0])["config"]
    lease = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
             "config": {**config, "mediaType": "application/vnd.oci.image.config.v1+json"},
             "layers": [], "annotations": {"io.imagebuild.lease.owner": "elsewhere:1:x",
                                           "io.imagebuild.lease.host": "elsewhere",
                                           "io.imagebuild.lease.expires": expires}}
    client.put_manifest(REPO, "imagebuild-lease", json.dumps(lease).encode(),
                        "application/vnd.oci.image.manifest.v1+json")
    mem.calls.clear()
    with FaultyRegistry(mem) as reg:
        r = run(reg, "prune", "--keep", "1", tmp=tmp_path)
        r.assert_clean_failure()
        assert "cannot read" in r.err and f"unlock --image {IMAGE}" in r.err, r.err
        assert not [c for c in mem.calls if c[0] in ("DELETE", "PUT")]
        assert set(TAGS) <= set(mem.tags[REPO])
        u = run(reg, "unlock", tmp=tmp_path)
        assert u.code == 0 and "removed the registry lease of elsewhere:1:x" in u.out, u
        r = run(reg, "prune", "--keep", "1", tmp=tmp_path)
        assert r.code == 0, r


@pytest.mark.parametrize("token", ["tok\r\nX-Injected: yes", " tok", "tok\nX: y"])
def test_a_token_with_a_header_break_ends_in_a_registry_fault(tmp_path, token):
    """Issue 39: a token server answering a token that cannot go into an Authorization
    header ends the command with an error naming it, exit 1, no traceback."""
    with FaultyRegistry() as realm:
        realm.fault = lambda req, ans: Answer(200, {"Content-Type": "application/json"},
                                              json.dumps({"token": token}).encode())

        def fault(req: Request, ans: Answer) -> Answer:
            if req.headers.get("Authorization", "").startswith("Bearer"):
                return ans
            return Answer(401, {"WWW-Authenticate": f'Bearer realm="{realm.url}/token",'
                                'service="reg"'})

        with FaultyRegistry(seeded(), fault) as reg:
            r = run(reg, "releases", tmp=tmp_path,
                    env={"IMAGEBUILD_REGISTRY_USER": "u",
                         "IMAGEBUILD_REGISTRY_PASSWORD": "p"})
    r.assert_clean_failure()
    assert "not a bearer token" in r.err and realm.host in r.err, r.err
    assert not [q for q in reg.requests if "Bearer" in q.headers.get("Authorization", "")]


def _bench_blob(mem: MemRegistry) -> str:
    """The digest of the newest release's bench results document (a blob)."""
    found = store.stored(mem.client(), REPO, TAGS[-1])
    assert found is not None
    body = json.dumps(found.doc, sort_keys=True, indent=1).encode()
    import hashlib

    return "sha256:" + hashlib.sha256(body).hexdigest()


@pytest.mark.parametrize("doc", [{"levels": [{"concurrency": "x", "output_tok_s": 1}]},
                                 {"levels": "none"},
                                 {"levels": [{"concurrency": 1, "output_tok_s": None}]}])
def test_a_malformed_bench_document_ends_history_cleanly(tmp_path, doc):
    """Stored as results are (its digest right): only its shape is wrong."""
    mem = seeded(bench=True)
    store.put_results(mem.client(), REPO, TAGS[-1], doc)
    mem.calls.clear()
    with FaultyRegistry(mem) as reg:
        r = run(reg, "history", "--out", str(tmp_path / "h"), tmp=tmp_path)
    r.assert_clean_failure()
    assert "answered" in r.err and "bench results document" in r.err, r.err


def test_a_corrupt_referrers_index_ends_history_cleanly(tmp_path):
    mem = seeded(bench=True)

    def fault(req: Request, ans: Answer) -> Answer:
        if on("manifests", "/manifests/sha256-")(req) and ans.status == 200:
            return ans.rebody(json.dumps({"schemaVersion": 2, "mediaType":
                                          "application/vnd.oci.image.index.v1+json",
                                          "manifests": ["garbage", {"digest": 7}]}).encode())
        return ans

    with FaultyRegistry(mem, fault) as reg:
        r = run(reg, "history", "--out", str(tmp_path / "h"), tmp=tmp_path)
    r.assert_clean_failure()
    assert "image index" in r.err or "referrers" in r.err, r.err


def test_a_missing_blob_is_a_registry_fault_not_bad_input(tmp_path):
    mem = seeded(bench=True)
    blob = _bench_blob(mem)

    def fault(req: Request, ans: Answer) -> Answer:
        if on("blobs", blob)(req):
            return Answer(404, {"Content-Type": "application/json"},
                          b'{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]}')
        return ans

    with FaultyRegistry(mem, fault) as reg:
        r = run(reg, "history", "--out", str(tmp_path / "h"), tmp=tmp_path)
    r.assert_clean_failure(1)
    assert "BLOB_UNKNOWN" in r.err and "check the repository and tag names" not in r.err


# ------------------------------------------------------------- time without bound


def test_a_huge_retry_after_ends_by_the_deadline(tmp_path):
    def fault(req: Request, ans: Answer) -> Answer:
        if on("tags")(req):
            return Answer(429, {"Retry-After": "86400", "Content-Type": "application/json"},
                          b'{"errors":[{"code":"TOOMANYREQUESTS","message":"slow down"}]}')
        return ans

    with FaultyRegistry(seeded(), fault) as reg:
        r = run(reg, "releases", tmp=tmp_path)
    r.assert_clean_failure()
    assert "Retry-After 86400" in r.err and r.seconds < DEADLINE + 10, (r.seconds, r.err)


def test_a_registry_that_never_answers_ends_by_the_deadline(tmp_path):
    with FaultyRegistry(seeded(), lambda req, ans: Hang() if on("tags")(req) else ans) as reg:
        r = run(reg, "releases", tmp=tmp_path)
    r.assert_clean_failure()
    assert "deadline" in r.err and r.seconds < DEADLINE + 10, (r.seconds, r.err)


def test_a_registry_that_drips_a_byte_a_second_ends_by_the_deadline(tmp_path):
    def fault(req: Request, ans: Answer) -> Answer | Drip:
        return Drip(ans, 0.5) if _release_get(TAGS[1])(req) else ans

    with FaultyRegistry(seeded(), fault) as reg:
        r = run(reg, "releases", tmp=tmp_path)
    r.assert_clean_failure()
    assert "deadline" in r.err and r.seconds < DEADLINE + 10, (r.seconds, r.err)


def test_a_link_next_chain_without_end_is_cut(tmp_path):
    def fault(req: Request, ans: Answer) -> Answer:
        if on("tags")(req):
            page = int(req.path.rsplit("page=", 1)[-1]) if "page=" in req.path else 0
            headers = {**ans.headers,
                       "Link": f'</v2/{REPO}/tags/list?page={page + 1}>; rel="next"'}
            return Answer(ans.status, headers, ans.body)
        return ans

    with FaultyRegistry(seeded(), fault) as reg:
        r = run(reg, "releases", tmp=tmp_path, env={"IMAGEBUILD_REGISTRY_DEADLINE": "60"})
    r.assert_clean_failure()
    assert "Link: next chain longer than" in r.err, r.err
    assert len([q for q in reg.requests if "/tags/list" in q.path]) <= 1001


# ------------------------------------------------------------ text from the registry


def test_escape_sequences_in_annotations_never_reach_the_terminal(tmp_path):
    mem = seeded(annotate={"io.imagebuild.release.smoke": ESCAPES,
                           "io.imagebuild.release.bench": "unmeasured",
                           "io.imagebuild.release.unmeasured-reason": ESCAPES + "x" * 50_000})
    with FaultyRegistry(mem) as reg:
        r = run(reg, "releases", tmp=tmp_path)
    text = r.out + r.err
    assert r.code == 0, text
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text
    assert "\\x1b]0;pwned" in text  # shown, escaped
    assert len(text) < 3000, len(text)  # a 50,000-character reason, capped
    assert not any(line.startswith("error: forged") for line in text.splitlines())


def test_escape_sequences_in_an_error_body_never_reach_the_terminal(tmp_path):
    body = json.dumps({"errors": [{"code": "DENIED", "message": ESCAPES * 100}]}).encode()

    def fault(req: Request, ans: Answer) -> Answer:
        return Answer(400, {"Content-Type": "application/json"}, body) if on("tags")(req) \
            else ans

    with FaultyRegistry(seeded(), fault) as reg:
        r = run(reg, "releases", tmp=tmp_path)
    r.assert_clean_failure()
    assert "DENIED" in r.err and len(r.err) < 2000, len(r.err)


def test_a_10_mb_annotation_is_refused_not_printed(tmp_path):
    with FaultyRegistry(seeded(), _annotation_fault("io.imagebuild.release.cell",
                                                    "x" * 10_000_000)) as reg:
        r = run(reg, "releases", tmp=tmp_path)
    r.assert_clean_failure()
    assert len(r.out) + len(r.err) < 3000, len(r.out) + len(r.err)


# ------------------------------------------------------------------- credentials


def test_a_link_next_on_another_origin_gets_no_credentials(tmp_path):
    with FaultyRegistry() as other:
        def fault(req: Request, ans: Answer) -> Answer:
            if on("tags")(req) and ans.status == 200:
                return Answer(200, {**ans.headers, "Link":
                                    f'<{other.url}/v2/{REPO}/tags/list?last=x>; rel="next"'},
                              ans.body)
            return ans

        with FaultyRegistry(seeded(), fault, basic_auth=("u", "secret")) as reg:
            r = run(reg, "releases", tmp=tmp_path,
                    env={"IMAGEBUILD_REGISTRY_USER": "u",
                         "IMAGEBUILD_REGISTRY_PASSWORD": "secret"})
        assert reg.authorizations(), "the registry itself got the credentials"
        assert [q.path for q in other.requests], "the page on the other origin was asked"
        assert other.authorizations() == []
    assert "Traceback" not in r.out + r.err and "secret" not in r.out + r.err


def test_no_token_fetch_from_a_host_that_challenges_after_a_redirect(tmp_path):
    with FaultyRegistry() as other:
        def elsewhere(req: Request, ans: Answer) -> Answer:
            return Answer(401, {"WWW-Authenticate":
                                f'Bearer realm="{other.url}/token",service="evil"',
                                "Content-Type": "application/json"}, b"{}")
        other.fault = elsewhere

        def fault(req: Request, ans: Answer) -> Answer:
            if _release_get(TAGS[1])(req):
                return Answer(307, {"Location": f"{other.url}{req.path}"})
            return ans

        with FaultyRegistry(seeded(), fault, basic_auth=("u", "secret")) as reg:
            r = run(reg, "releases", tmp=tmp_path,
                    env={"IMAGEBUILD_REGISTRY_USER": "u",
                         "IMAGEBUILD_REGISTRY_PASSWORD": "secret"})
        assert other.requests, "the redirect was followed"
        assert other.authorizations() == []
        assert not [q for q in other.requests if q.bare_path == "/token"]
    assert r.code in (1, 2) and "Traceback" not in r.out + r.err


# ----------------------------------------------- commands that move or describe latest

SHORT = [t.replace("-v0.23.0", "") for t in TAGS]  # 2026-06-03-pr41703: what --tag takes


def _latest(mem: MemRegistry) -> str:
    return mem.tags[REPO]["latest"]


def test_promote_stops_on_a_corrupt_referrers_index_and_leaves_latest(tmp_path):
    mem = seeded(bench=True, latest=1)
    before = _latest(mem)

    def fault(req: Request, ans: Answer) -> Answer:
        if on("manifests", "/manifests/sha256-")(req) and ans.status == 200:
            return ans.rebody(b'{"schemaVersion": 2, "manifests": {"not": "a list"}}')
        return ans

    with FaultyRegistry(mem, fault) as reg:
        r = run(reg, "promote", "--tag", SHORT[2], tmp=tmp_path, image=False)
    r.assert_clean_failure()
    assert _latest(mem) == before
    assert "image index" in r.err, r.err


def test_promote_that_hangs_on_the_results_ends_by_the_deadline(tmp_path):
    mem = seeded(bench=True, latest=1)
    before = _latest(mem)
    with FaultyRegistry(mem, lambda req, ans: Hang() if on("blobs")(req) else ans) as reg:
        r = run(reg, "promote", "--tag", SHORT[2], tmp=tmp_path, image=False)
    r.assert_clean_failure()
    assert _latest(mem) == before and "deadline" in r.err, r.err


def test_rollback_to_a_release_whose_manifest_is_garbage_moves_nothing(tmp_path):
    mem = seeded()
    before = _latest(mem)

    def fault(req: Request, ans: Answer) -> Answer:
        return ans.rebody(b"\x1b[2J not a manifest") if _release_get(TAGS[1])(req) else ans

    with FaultyRegistry(mem, fault) as reg:
        r = run(reg, "rollback", "--to", SHORT[1], tmp=tmp_path)
    r.assert_clean_failure()
    assert _latest(mem) == before and not [c for c in mem.calls if c[0] in ("PUT", "DELETE")
                                           and "/manifests/latest" in c[1]]


def test_notes_show_registry_text_escaped(tmp_path):
    mem = seeded(bench=True, reason=ESCAPES)
    client = mem.client()
    store.put_results(client, REPO, TAGS[2], store.stored(client, REPO, TAGS[2]).doc,
                      annotations={store.A_ACCEPTED: ESCAPES + "y" * 5000})
    with FaultyRegistry(mem) as reg:
        r = run(reg, "notes", "--tag", SHORT[2], tmp=tmp_path, image=False)
    text = r.out + r.err
    assert r.code == 0, text[-3000:]
    assert "\\x1b]0;pwned" in text and "Traceback" not in text
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text
    assert not any(line.startswith("error: forged") for line in text.splitlines())
    assert "y" * 400 not in text  # the 5,000-character reason, capped


def test_notes_on_a_bare_bench_document_end_in_a_registry_fault(tmp_path):
    """Results without the figures the notes' table shows (gate and history read them)."""
    mem = seeded()
    store.put_results(mem.client(), REPO, TAGS[2], {"image": {"tag": TAGS[2]}, "levels": [
        {"concurrency": 1, "output_tok_s": 10.0}]})
    with FaultyRegistry(mem) as reg:
        r = run(reg, "notes", "--tag", SHORT[2], tmp=tmp_path, image=False)
    r.assert_clean_failure(1)
    assert "the release notes need the whole table" in r.err, r.err


def test_notes_with_a_missing_blob_end_in_a_registry_fault(tmp_path):
    mem = seeded(bench=True)

    def fault(req: Request, ans: Answer) -> Answer:
        if on("blobs")(req):
            return Answer(404, {"Content-Type": "application/json"},
                          b'{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]}')
        return ans

    with FaultyRegistry(mem, fault) as reg:
        r = run(reg, "notes", "--tag", SHORT[2], tmp=tmp_path, image=False)
    r.assert_clean_failure(1)
    assert "BLOB_UNKNOWN" in r.err


# -------------------------------------------------- the tag list that hides `latest`


def test_prune_stops_when_the_tag_list_stops_showing_latest(tmp_path):
    """The first tag list shows `latest`, later ones do not: prune must not take that as
    'no latest' and delete latest's release and its rollback target (latest rolled back
    to b of a..d, so neither is among the newest 1; the plan before the lease protects
    them, the one under it, from the later list, did not)."""
    mem = seeded()
    mem.add_release(REPO, "2026-06-04-v0.23.0-pr41703")
    mem.point_latest(REPO, TAGS[1])
    mem.calls.clear()
    seen = {"tags": 0}

    def fault(req: Request, ans: Answer) -> Answer:
        if on("tags")(req) and ans.status == 200:
            seen["tags"] += 1
            if seen["tags"] > 1:
                doc = json.loads(ans.body)
                doc["tags"] = [t for t in doc["tags"] if t != "latest"]
                return ans.rebody(json.dumps(doc).encode())
        return ans

    with FaultyRegistry(mem, fault) as reg:
        r = run(reg, "prune", "--keep", "1", tmp=tmp_path)
    left = set(mem.tags[REPO])
    assert {TAGS[0], TAGS[1], "latest"} <= left, (r.out, r.err)  # latest, its rollback target
    r.assert_clean_failure()


def test_a_landed_latest_put_whose_read_back_is_stale_is_put_back(tmp_path):
    """`rollback` of a set of three: the middle image's PUT of latest lands, but the
    registry answers its read-back with the old digest (a stale cache in front of it).
    The command fails (exit 1) and its undo reads latest again: the middle image, whose
    move landed, goes back with the first (the third never moved): no split set."""
    repos = [f"vllm-spark/spark-heretic-{n}" for n in ("aeon", "mtp", "zlab")]
    mem = MemRegistry()
    for repo in repos:
        for tag in TAGS:
            mem.add_release(repo, tag)
        mem.point_latest(repo, TAGS[-1])
    old = mem.tags[repos[1]]["latest"]
    latest_path = f"/v2/{repos[1]}/manifests/latest"
    stale = [False]

    def fault(req: Request, ans: Answer) -> Answer:
        landed = mem.tags[repos[1]]["latest"] != old
        if req.method == "HEAD" and req.bare_path == latest_path and landed and not stale[0]:
            stale[0] = True
            return Answer(ans.status, {**ans.headers, "Docker-Content-Digest": old}, ans.body)
        return ans

    with FaultyRegistry(mem, fault) as reg:
        r = run(reg, "rollback", "--to", SHORT[1], "--accept-unmeasured", "a test",
                "--image", "spark-heretic-*", tmp=tmp_path, image=None)
    r.assert_clean_failure()
    assert stale[0], r.out + r.err
    assert "does not point at" in r.err, r.err
    assert [mem.tags[repo]["latest"] for repo in repos] == [
        mem.tags[repo][TAGS[-1]] for repo in repos], r.out + r.err
    assert sum("put back" in line for line in r.out.splitlines()) == 2, r.out
