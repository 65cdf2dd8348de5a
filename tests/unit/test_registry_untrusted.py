"""A registry's answers are untrusted input (issue 25): the sanitizer, the validating
layer per document kind, the deadline, Retry-After, the page limit and where credentials
go, at unit level (a loopback fake registry, short budgets; the whole file takes seconds)."""

from __future__ import annotations

import json
import time

import pytest

from imagebuild.errors import OperationFailed, UserError
from imagebuild.registry import documents
from imagebuild.registry.client import RETRY_AFTER_CAP, RegistryClient
from imagebuild.registry.credentials import Credentials
from imagebuild.registry.deadline import DEADLINE_ENV, Deadline, deadline_seconds
from imagebuild.registry.errors import MissingBlob, RegistryFault
from imagebuild.safetext import MAX_CHARS, safe, safe_lines
from tests.support.faulty_registry import Answer, Drip, FaultyRegistry, Hang, Request
from tests.support.memregistry import MemRegistry

pytestmark = pytest.mark.timeout(60)

REPO = "ns/img"
TAG = "2026-06-01-v0.23.0-a"
ESC = "\x1b]0;pwned\x07\x1b[2J\nerror: forged\r"
H = "127.0.0.1:5000"


# --------------------------------------------------------------------- safetext


def test_safe_escapes_every_control_and_caps_the_length():
    out = safe(ESC + "\u202e\x85")
    assert "\x1b" not in out and "\x07" not in out and "\n" not in out and "\r" not in out
    assert "\u202e" not in out and "\x85" not in out
    assert out.startswith("\\x1b]0;pwned\\x07\\x1b[2J\\nerror: forged\\r")
    big = safe("x" * 10_000_000)
    assert len(big) < MAX_CHARS + 40 and big.endswith("(9,999,700 more characters)")
    assert safe("plain text: ok") == "plain text: ok"


def test_safe_lines_keeps_our_newlines_and_escapes_the_rest():
    assert safe_lines("a\n  fix: b\x1b[2J") == "a\n  fix: b\\x1b[2J"


def test_an_error_message_never_carries_a_control_to_the_terminal():
    err = OperationFailed(f"registry said {ESC}", fix="retry")
    assert "\x1b" not in err.render() and "\x07" not in err.render()


def test_a_registry_fault_is_exit_1_and_says_what_the_registry_did():
    err = RegistryFault(H, "a body that is not JSON", "manifest ns/img:v1")
    assert err.exit_code == 1
    assert err.render().startswith(f"the registry at {H} answered a body that is not JSON "
                                   "for manifest ns/img:v1")


# -------------------------------------------------------------------- documents


def _manifest(**extra) -> dict:
    return {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": "sha256:" + "a" * 64, "size": 2},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": "sha256:" + "b" * 64, "size": 10}], **extra}


def _b(doc) -> bytes:
    return json.dumps(doc).encode()


def test_well_formed_documents_pass():
    documents.image_manifest(_b(_manifest(annotations={
        "io.imagebuild.release.pins": "{}", "io.imagebuild.lease.expires": "inf"})), H, "m")
    documents.index(_b({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json",
         "digest": "sha256:" + "c" * 64, "size": 5,
         "platform": {"os": "unknown", "architecture": "unknown"}}]}), H, "i")
    assert documents.tag_list(b'{"name": "ns/img", "tags": null}', H, "t") == []
    assert documents.token(b'{"access_token": "t", "expires_in": 300}', H, "tok") == ("t", 300)
    doc = documents.bench_results(_b(_bench([{"concurrency": 1, "output_tok_s": 3,
                                              "ttft_ms": {"median": None}}])), H, "b")
    minimal = b'{"image": {"id": "sha256:1"}, "levels": []}'  # what gate and history need
    assert documents.bench_results(minimal, H, "b") == json.loads(minimal)  # unchanged
    with pytest.raises(RegistryFault, match="the release notes need"):
        documents.bench_table(doc, H, "b")  # no requests, errors, ... for the notes' table


def _bench(levels) -> dict:
    return {"image": {"tag": "t"}, "hardware": {"model": "cpu"}, "settings": {},
            "levels": levels}


@pytest.mark.parametrize("body, says", [
    (b"<html>", "not JSON"),
    (b"[1, 2]", "invalid"),
    (_b(_manifest(annotations={"k": 5})), "annotations.k"),
    (_b(_manifest(layers="none")), "layers"),
    (_b(_manifest(config={"digest": "nope", "size": 1})), "config.digest"),
    (_b(_manifest(annotations={"io.imagebuild.release.pins": "[1]"})), "not a JSON object"),
    (_b(_manifest(annotations={"io.imagebuild.release.checks": "{"})), "not a JSON object"),
    (_b(_manifest(annotations={"io.imagebuild.lease.expires": 17e8})), "annotations"),
    (_b(_manifest(annotations={"io.imagebuild.lease.owner": ESC})), "printable"),
    (_b(_manifest(annotations={"io.imagebuild.lease.purpose": "p" * 300})), "printable"),
    (_b(_manifest(annotations={"x": "y" * (documents.MAX_ANNOTATION + 1)})), "cap"),
    (b" " * (documents.MAX_MANIFEST + 1), "cap"),
])
def test_a_malformed_manifest_is_a_registry_fault(body, says):
    with pytest.raises(RegistryFault, match="answered") as exc:
        documents.image_manifest(body, H, "manifest ns/img:v1")
    assert says in exc.value.message and exc.value.exit_code == 1
    assert "\x1b" not in exc.value.render()


@pytest.mark.parametrize("body", [b'{"tags": [1]}', b'{"tags": ["ok", null]}',
                                  b'{"tags": "v1"}', b'{"tags": ["bad tag!"]}', b"garbage"])
def test_a_malformed_tag_list_is_a_registry_fault(body):
    with pytest.raises(RegistryFault):
        documents.tag_list(body, H, "tags of ns/img")


@pytest.mark.parametrize("body", [b'{"manifests": "x", "schemaVersion": 2}',
                                  b'{"manifests": ["x"], "schemaVersion": 2}',
                                  b'{"manifests": [{"digest": 7}], "schemaVersion": 2}'])
def test_a_corrupt_referrers_index_is_a_registry_fault(body):
    with pytest.raises(RegistryFault, match="referrers index"):
        documents.referrers_index(body, H, "referrers")


@pytest.mark.parametrize("body", [
    b"nope", b"[]", _b(_bench("x")), _b({**_bench([]), "hardware": {"model": 5}}),
    _b({**_bench([]), "image": "x"}), _b({**_bench([]), "settings": []}),
    _b(_bench([{"concurrency": 0, "output_tok_s": 1}])),
    _b(_bench([{"concurrency": 1, "output_tok_s": "fast"}])),
    _b(_bench([{"concurrency": 1, "output_tok_s": 1, "tpot_ms": 5}])),
    _b(_bench([{"concurrency": 1, "output_tok_s": 1, "flags": [{"code": 1}]}])),
    b'{"image": {}, "hardware": {"model": "c"}, "settings": {}, '
    b'"levels": [{"concurrency": 1, "output_tok_s": NaN}]}'])
def test_a_malformed_bench_document_is_a_registry_fault(body):
    with pytest.raises(RegistryFault, match="bench results document"):
        documents.bench_results(body, H, "bench")


def test_the_texts_of_a_bench_document_are_escaped():
    doc = documents.bench_results(_b(_bench([{"concurrency": 1, "output_tok_s": 1,
                                               "flags": [{"code": ESC, "reason": ESC}]}])),
                                  H, "bench")
    assert "\x1b" not in json.dumps(doc, ensure_ascii=False)


@pytest.mark.parametrize("body", [b"{}", b'{"token": 5}', b"x" * (documents.MAX_SMALL + 1)])
def test_a_token_answer_without_a_token_is_a_registry_fault(body):
    with pytest.raises(RegistryFault):
        documents.token(body, H, "token")


def test_the_annotations_checked_are_the_ones_the_project_writes():
    from imagebuild.registry import records
    from imagebuild.release import lease

    assert set(documents.JSON_OBJECT_ANNOTATIONS) == {records.A_PINS, records.A_CHECKS,
                                                      records.A_GATES}
    assert documents.LEASE_PREFIX == lease.LEASE + "."


# --------------------------------------------------------------------- deadline


def test_the_deadline_setting_is_checked():
    assert deadline_seconds({}) == 600
    assert deadline_seconds({DEADLINE_ENV: "2.5"}) == 2.5
    for bad in ("0", "-1", "inf", "nan", "soon"):
        with pytest.raises(UserError, match=DEADLINE_ENV) as exc:
            deadline_seconds({DEADLINE_ENV: bad})
        assert exc.value.exit_code == 2


def test_the_deadline_charges_registry_time_only_and_once_when_nested():
    now = [0.0]
    d = Deadline(10, clock=lambda: now[0])
    with d.running():
        now[0] += 3
        with d.running():  # a token fetch inside a request
            now[0] += 2
    now[0] += 100  # a build between two registry calls is not the registry's time
    assert d.remaining() == 5
    with d.running():
        now[0] += 6
        assert d.expired()


# ------------------------------------------------------------ a live fake registry


def _seeded() -> MemRegistry:
    mem = MemRegistry()
    mem.add_release(REPO, TAG)
    return mem


def _client(reg: FaultyRegistry, seconds: float = 30, **kw) -> tuple[RegistryClient, list]:
    c = RegistryClient(reg.url, credentials=Credentials("u", "secret"),
                       deadline=Deadline(seconds), backoff=0.01, timeout=5, **kw)
    said: list[str] = []
    c.say = said.append
    return c, said


def _on_tags(answer):
    return lambda req, ans: answer(req, ans) if "/tags/list" in req.path else ans


@pytest.mark.parametrize("hint, slept", [("2", 2.0), ("300", RETRY_AFTER_CAP)])
def test_retry_after_is_honoured_up_to_the_cap_and_said(hint, slept):
    calls = {"n": 0}

    def fault(req: Request, ans: Answer) -> Answer:
        calls["n"] += 1
        return Answer(429, {"Retry-After": hint}) if calls["n"] == 1 else ans

    with FaultyRegistry(_seeded(), _on_tags(fault)) as reg:
        client, said = _client(reg, seconds=600)
        sleeps: list[float] = []
        client._sleep = sleeps.append  # noqa: SLF001 - no real waiting
        assert client.tags(REPO) == [TAG]
    assert sleeps == [slept]
    assert len(said) == 1 and f"asked to wait {int(hint)} s (Retry-After)" in said[0]
    assert ("capped" in said[0]) == (float(hint) > RETRY_AFTER_CAP)


def test_a_retry_after_beyond_the_deadline_ends_at_once():
    with FaultyRegistry(_seeded(), _on_tags(lambda r, a: Answer(429, {"Retry-After": "86400"}))
                        ) as reg:
        client, _ = _client(reg, seconds=20)
        sleeps: list[float] = []
        client._sleep = sleeps.append  # noqa: SLF001
        with pytest.raises(RegistryFault, match="Retry-After 86400"):
            client.tags(REPO)
    assert sleeps == []


@pytest.mark.parametrize("fault", [lambda req, ans: Hang(), lambda req, ans: Drip(ans, 0.2),
                                   lambda req, ans: Drip(ans, 0.2, headers_too=True)],
                         ids=["never-answers", "drips", "drips-its-headers"])
def test_a_stuck_registry_ends_by_the_deadline(fault):
    with FaultyRegistry(_seeded(), lambda req, ans: fault(req, ans)
                        if "/manifests/" in req.path and req.method == "GET" else ans) as reg:
        client, _ = _client(reg, seconds=1.5)
        start = time.monotonic()
        with pytest.raises(RegistryFault, match="deadline"):
            client.get_manifest(REPO, TAG)
        assert time.monotonic() - start < 3.0


def test_a_dripping_answer_is_hung_up_on_at_the_deadline():
    """The reader stops too (not only the wait for it): no socket left reading after."""
    body = Answer(200, {"Content-Type": "application/json"}, b" " * 400 + b"{}")
    with FaultyRegistry(_seeded(), _on_tags(lambda r, a: Drip(body, 0.05))) as reg:
        client, _ = _client(reg, seconds=1)
        with pytest.raises(RegistryFault, match="deadline"):
            client.tags(REPO)
        end = time.monotonic()
        while not reg.hung_up and time.monotonic() < end + 3:
            time.sleep(0.05)
        assert reg.hung_up and reg.hung_up[0] - end < 1.5


def test_retries_stop_when_the_deadline_is_spent():
    """No wait past the deadline: a backoff longer than what is left ends the command."""
    with FaultyRegistry(_seeded(), _on_tags(lambda r, a: Answer(503))) as reg:
        client, _ = _client(reg, seconds=1, retries=1000)
        client.backoff = 5
        start = time.monotonic()
        with pytest.raises(RegistryFault, match="deadline"):
            client.tags(REPO)
        assert time.monotonic() - start < 2.0


def test_a_body_over_its_cap_is_refused_before_it_is_read():
    big = Answer(200, {"Content-Length": str(documents.MAX_TAG_PAGE + 1)}, b"")
    with FaultyRegistry(_seeded(), _on_tags(lambda r, a: big)) as reg:
        client, _ = _client(reg)
        with pytest.raises(RegistryFault, match="cap"):
            client.tags(REPO)


def test_a_head_of_a_big_blob_is_not_a_body_over_its_cap():
    big = str(documents.MAX_BLOB * 10)

    def fault(req: Request, ans: Answer) -> Answer:
        if req.method == "HEAD" and "/blobs/" in req.path:
            return Answer(200, {"Content-Length": big,
                                "Docker-Content-Digest": req.path.rsplit("/", 1)[1]})
        return ans

    with FaultyRegistry(_seeded(), fault) as reg:
        client, _ = _client(reg)
        assert client.put_blob(REPO, b"exists already")  # HEAD says it is there
        assert [q.method for q in reg.requests] == ["HEAD"]


def test_a_link_chain_has_a_page_limit():
    def fault(req: Request, ans: Answer) -> Answer:
        n = int(req.path.rsplit("=", 1)[-1]) if "p=" in req.path else 0
        return Answer(200, {**ans.headers, "Link": f'</v2/{REPO}/tags/list?p={n + 1}>; '
                            'rel="next"'}, ans.body)

    with FaultyRegistry(_seeded(), _on_tags(fault)) as reg:
        client, _ = _client(reg, max_pages=5)
        with pytest.raises(RegistryFault, match="longer than 5 pages"):
            client.tags(REPO)
        assert len([q for q in reg.requests if "/tags/list" in q.path]) == 5


def test_a_missing_blob_is_exit_1_not_bad_input():
    with FaultyRegistry(_seeded()) as reg:
        client, _ = _client(reg)
        with pytest.raises(MissingBlob) as exc:
            client.get_blob(REPO, "sha256:" + "e" * 64)
    assert exc.value.exit_code == 1 and "BLOB_UNKNOWN" in exc.value.message


# --------------------------------------------------------------------- credentials


def test_an_upload_location_on_another_origin_gets_no_credentials():
    with FaultyRegistry() as other:
        other.fault = lambda req, ans: Answer(201, {})  # it takes the upload it never opened

        def fault(req: Request, ans: Answer) -> Answer:
            if req.method == "POST" and "/blobs/uploads/" in req.path and ans.status == 202:
                return Answer(202, {"Location": other.url + ans.headers["Location"]})
            return ans

        with FaultyRegistry(_seeded(), fault, basic_auth=("u", "secret")) as reg:
            client, _ = _client(reg)
            client.put_blob(REPO, b"a new blob")
        assert reg.authorizations()  # the registry itself did get them
        assert [q.method for q in other.requests] == ["PUT"]
        assert other.authorizations() == []


def test_a_redirect_to_another_origin_gets_no_credentials_and_its_challenge_no_answer():
    with FaultyRegistry() as other:
        other.fault = lambda req, ans: Answer(401, {
            "WWW-Authenticate": f'Bearer realm="{other.url}/token",service="evil"'})

        def fault(req: Request, ans: Answer) -> Answer:
            if req.method == "GET" and "/manifests/" in req.path:
                return Answer(307, {"Location": other.url + req.path})
            return ans

        with FaultyRegistry(_seeded(), fault, basic_auth=("u", "secret")) as reg:
            client, _ = _client(reg)
            assert client.tags(REPO) == [TAG]  # learns Basic: the next request carries it
            with pytest.raises(UserError):  # 401: the registry needs credentials
                client.get_manifest(REPO, TAG)
        assert reg.authorizations()[-1].startswith("Basic ")  # the redirecting request had it
        assert [q.bare_path for q in other.requests] == [f"/v2/{REPO}/manifests/{TAG}"]
        assert other.authorizations() == []


def test_credentials_go_only_to_the_realm_the_first_challenge_named():
    """The registry's first challenge names realm A; a later one names realm B: B gets
    nothing (not the password, not a request)."""
    with FaultyRegistry() as realm_a, FaultyRegistry() as realm_b:
        realm_a.fault = lambda req, ans: Answer(200, {"Content-Type": "application/json"},
                                               b'{"token": "tok-a", "expires_in": 300}')
        seen = {"n": 0}

        def fault(req: Request, ans: Answer) -> Answer:
            if req.headers.get("Authorization") == "Bearer tok-a" and "/tags/" in req.path:
                return ans
            seen["n"] += 1
            realm = realm_a if seen["n"] == 1 else realm_b
            return Answer(401, {"WWW-Authenticate": f'Bearer realm="{realm.url}/token",'
                                f'service="reg",scope="repository:{REPO}:pull"'})

        with FaultyRegistry(_seeded(), fault) as reg:
            client, _ = _client(reg)
            assert client.tags(REPO) == [TAG]
            with pytest.raises(RegistryFault, match="another|after"):
                client.get_manifest(REPO, TAG)
        assert realm_a.authorizations()  # basic credentials for the first realm
        assert realm_b.requests == []


# ------------------------------------------------ values HTTP cannot carry (issue 39)


@pytest.mark.parametrize("tok", ["tok\r\nX-Injected: yes", "tok\nX-Injected: yes", " tok",
                                 "tok en", "t\u00f6k", "tok\x00"])
def test_a_token_that_no_header_can_carry_is_a_fault_naming_the_registry(tok):
    """A token server's token goes into our Authorization header: one that requests would
    refuse (CR/LF, a leading space) or that no bearer token can be is the registry's
    fault, exit 1, never a traceback; and no request carries it."""
    with FaultyRegistry() as realm:
        realm.fault = lambda req, ans: Answer(200, {"Content-Type": "application/json"},
                                              json.dumps({"token": tok}).encode())

        def fault(req: Request, ans: Answer) -> Answer:
            if req.headers.get("Authorization", "").startswith("Bearer"):
                return ans
            return Answer(401, {"WWW-Authenticate": f'Bearer realm="{realm.url}/token",'
                                f'service="reg",scope="repository:{REPO}:pull"'})

        with FaultyRegistry(_seeded(), fault) as reg:
            client, _ = _client(reg)
            with pytest.raises(RegistryFault) as exc:
                client.tags(REPO)
        assert exc.value.exit_code == 1
        assert "not a bearer token" in exc.value.message
        assert realm.url.split("//", 1)[1] in exc.value.message  # the token server, named
        assert not [q for q in reg.requests if "Bearer" in q.headers.get("Authorization", "")]


@pytest.mark.parametrize("location", ["ftp://127.0.0.1:1/upload", "http://127.0.0.1:99999/u", "http://[::1/x",
                                      "file:///etc/passwd"])
def test_an_upload_location_http_cannot_follow_is_a_fault_naming_the_registry(location):
    def fault(req: Request, ans: Answer) -> Answer:
        if req.method == "POST" and "/blobs/uploads/" in req.path and ans.status == 202:
            return Answer(202, {"Location": location})
        return ans

    with FaultyRegistry(_seeded(), fault) as reg:
        client, _ = _client(reg)
        with pytest.raises(RegistryFault) as exc:
            client.put_blob(REPO, b"a new blob")
    assert exc.value.exit_code == 1
    assert exc.value.message.startswith(f"the registry at {reg.url.split('//', 1)[1]} answered")


def test_a_redirect_http_cannot_follow_is_a_fault_naming_the_registry():
    with FaultyRegistry(_seeded(), _on_tags(lambda req, ans: Answer(
            307, {"Location": "gopher://127.0.0.1:1/x"}))) as reg:
        client, _ = _client(reg)
        with pytest.raises(RegistryFault, match="HTTP cannot follow"):
            client.tags(REPO)
