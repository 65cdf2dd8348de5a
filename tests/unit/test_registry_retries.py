"""The registry client retries what is transient (429, 5xx, a dropped connection) on
idempotent requests, honours Retry-After, and never retries a refusal (401/403) or a write
that is not idempotent."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from imagebuild.errors import OperationFailed
from imagebuild.registry.client import RegistryClient
from imagebuild.registry.credentials import Credentials
from imagebuild.registry.errors import AuthError


def _response(status: int, body: bytes = b"{}", headers: dict | None = None
              ) -> requests.Response:
    r = requests.Response()
    r.status_code = status
    r._content = body  # noqa: SLF001 - a canned answer
    r.headers.update({"Docker-Distribution-API-Version": "registry/2.0",
                      "Content-Type": "application/json", **(headers or {})})
    r.url = "http://127.0.0.1:5000/v2/"
    return r


class Script(requests.Session):
    """A session that answers from a script: a response, or an exception to raise."""

    def __init__(self, answers: list):
        super().__init__()
        self.answers: Iterator = iter(answers)
        self.calls: list[tuple[str, str]] = []

    def request(self, method, url, **kw):  # type: ignore[override]
        self.calls.append((method, url))
        answer = next(self.answers)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _client(answers: list, **kw) -> tuple[RegistryClient, Script, list[float]]:
    session = Script(answers)
    client = RegistryClient("127.0.0.1:5000", session=session, backoff=0.01, retries=3,
                            credentials=Credentials("u", "p"), **kw)
    slept: list[float] = []
    client._sleep = slept.append  # noqa: SLF001 - no real waiting in a unit test
    return client, session, slept


@pytest.mark.parametrize("status", [429, 500, 502, 503])
def test_transient_answers_are_retried_until_success(status):
    client, session, slept = _client([_response(status), _response(status), _response(200)])
    client.ping()
    assert len(session.calls) == 3 and len(slept) == 2


def test_retry_after_is_honoured():
    client, _, slept = _client([_response(429, headers={"Retry-After": "2"}), _response(200)])
    client.ping()
    assert slept == [2.0]


def test_a_dropped_connection_is_retried():
    client, session, _ = _client([requests.ConnectionError("reset"), _response(200)])
    client.ping()
    assert len(session.calls) == 2


def test_retries_give_up_with_a_clear_error():
    client, session, _ = _client([_response(503)] * 4)
    with pytest.raises(OperationFailed, match="HTTP 503 after 4 attempts"):
        client.tags("ns/img")
    assert len(session.calls) == 4


@pytest.mark.parametrize("status", [401, 403])
def test_refusals_are_never_retried(status):
    # 401 with no challenge: nothing to answer; 403: the credentials lack permission
    client, session, slept = _client([_response(status, b'{"errors": []}')] * 3)
    with pytest.raises(AuthError):
        client.tags("ns/img")
    assert len(session.calls) == 1 and slept == []


def test_a_non_idempotent_write_is_not_retried():
    client, session, slept = _client([_response(404), _response(500), _response(500)])
    with pytest.raises(OperationFailed):
        client.put_blob("ns/img", b"layer")  # HEAD: not there; POST starts an upload
    assert [m for m, _ in session.calls] == ["HEAD", "POST"] and slept == []
