"""The client's blob calls a push makes (registry/client.py), over HTTP on loopback: a
layer body streamed in one chunked PATCH and closed under its digest, a mount that asks
the token server for the source's pull too, and a registry whose answers about a blob
disagree with the digest asked for, a fault naming it."""

from __future__ import annotations

import hashlib
from urllib.parse import parse_qs, urlsplit

import pytest

from imagebuild.registry.client import RegistryClient
from imagebuild.registry.credentials import Credentials
from imagebuild.registry.errors import RegistryFault
from tests.support.faulty_registry import Answer, FaultyRegistry, Request
from tests.support.memregistry import MemRegistry

pytestmark = pytest.mark.timeout(60)

REPO, SOURCE = "ns/cell", "ns/engine"


def _client(reg: FaultyRegistry) -> RegistryClient:
    return RegistryClient(reg.url, credentials=Credentials("u", "p"), retries=0,
                          backoff=0.01)


def test_a_body_is_streamed_once_and_closed_under_its_digest():
    body = [b"a" * 70_000, b"b" * 30_000]
    digest = "sha256:" + hashlib.sha256(b"".join(body)).hexdigest()
    with FaultyRegistry() as reg:
        client = _client(reg)
        url = client.start_upload(REPO)
        assert client.send_blob(REPO, url, iter(body), lambda: digest) == digest
        assert client.head_blob(REPO, digest) == 100_000
        patch = [r for r in reg.requests if r.method == "PATCH"]
        assert len(patch) == 1 and patch[0].headers.get("Transfer-Encoding") == "chunked"
        assert client.bytes.by_kind["blob"] >= 100_000


def test_a_mount_takes_the_blob_from_the_source_and_asks_for_both_scopes():
    mem = MemRegistry()
    mem.blobs[SOURCE] = {"sha256:" + "1" * 64: b"layer"}
    with FaultyRegistry() as realm:
        scopes: list[list[str]] = []

        def token(req: Request, ans: Answer) -> Answer:
            scopes.append(parse_qs(urlsplit(req.path).query).get("scope", []))
            return Answer(200, {"Content-Type": "application/json"},
                          b'{"token": "tok", "expires_in": 300}')

        realm.fault = token

        def bearer(req: Request, ans: Answer) -> Answer:
            if req.headers.get("Authorization") == "Bearer tok":
                return ans
            return Answer(401, {"WWW-Authenticate": f'Bearer realm="{realm.url}/token",'
                                'service="reg"'})

        with FaultyRegistry(mem, bearer) as reg:
            client = _client(reg)
            assert client.start_upload(REPO, mount="sha256:" + "1" * 64, source=SOURCE) is None
        assert mem.blobs[REPO] == {"sha256:" + "1" * 64: b"layer"}
        assert sorted(scopes[-1]) == [f"repository:{REPO}:pull,push",
                                      f"repository:{SOURCE}:pull"]


def test_a_refused_mount_opens_an_upload_instead():
    with FaultyRegistry() as reg:
        url = _client(reg).start_upload(REPO, mount="sha256:" + "2" * 64, source=SOURCE)
        assert url is not None and "/blobs/uploads/" in url


@pytest.mark.parametrize("where, header", [
    ("HEAD", {"Docker-Content-Digest": "sha256:" + "9" * 64, "Content-Length": "5"}),
    ("PUT", {"Docker-Content-Digest": "sha256:" + "9" * 64}),
], ids=["head-other-digest", "close-other-digest"])
def test_a_blob_answer_that_disagrees_is_a_registry_fault(where, header):
    mem = MemRegistry()
    mem.blobs[REPO] = {"sha256:" + "1" * 64: b"layer"}

    def fault(req: Request, ans: Answer) -> Answer:
        if req.method == where and "/blobs/" in req.path:
            keep = {k: v for k, v in ans.headers.items()
                    if k not in ("Docker-Content-Digest", "Content-Length")}
            return Answer(ans.status, {**keep, **header}, ans.body)
        return ans

    with FaultyRegistry(mem, fault) as reg:
        client = _client(reg)
        with pytest.raises(RegistryFault, match=reg.host):
            if where == "HEAD":
                client.head_blob(REPO, "sha256:" + "1" * 64)
            else:
                client.put_blob(REPO, b"other")
