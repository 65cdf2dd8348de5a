"""Fast tests of the registry client's parsing and credential handling (no registry)."""

from __future__ import annotations

import base64
import email.utils
import json
import os
import stat
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from imagebuild.errors import UserError
from imagebuild.registry.client import (
    PASSWORD_ENV,
    USER_ENV,
    AuthError,
    ByteCounter,
    Credentials,
    RegistryClient,
    _retry_after,
    docker_config_credentials,
    normalize_base_url,
    parse_challenges,
    parse_link_next,
    resolve_credentials,
)

# --- WWW-Authenticate


def test_bearer_challenge_keeps_commas_inside_quoted_scope():
    (c,) = parse_challenges(
        'Bearer realm="https://auth.example.com/token",service="registry.example.com",'
        'scope="repository:team/vllm:pull,push"'
    )
    assert c.scheme == "bearer"
    assert c.params == {
        "realm": "https://auth.example.com/token",
        "service": "registry.example.com",
        "scope": "repository:team/vllm:pull,push",
    }


def test_basic_challenge_and_case_insensitive_scheme():
    (c,) = parse_challenges('basic realm="imagebuild-registry"')
    assert c.scheme == "basic" and c.params == {"realm": "imagebuild-registry"}


def test_two_challenges_in_one_header_and_escaped_quote():
    got = parse_challenges(
        'Basic realm="a \\"quoted\\" realm", Bearer realm="https://t/x", error=insufficient_scope'
    )
    assert [c.scheme for c in got] == ["basic", "bearer"]
    assert got[0].params["realm"] == 'a "quoted" realm'
    assert got[1].params == {"realm": "https://t/x", "error": "insufficient_scope"}


def test_empty_challenge_header():
    assert parse_challenges("") == []


# --- Link pagination


def test_link_next_relative_is_resolved_against_the_page_url():
    base = "http://127.0.0.1:5000/v2/_catalog?n=1"
    link = '</v2/_catalog?last=probe%2Fother&n=1>; rel="next"'
    assert parse_link_next(link, base) == "http://127.0.0.1:5000/v2/_catalog?last=probe%2Fother&n=1"


def test_link_next_picked_among_several_links():
    link = (
        '<https://r.example/v2/a/tags/list?n=2&last=b>; rel="prev", '
        "<https://r.example/v2/a/tags/list?n=2&last=d>; rel=next"
    )
    assert parse_link_next(link, "https://r.example/v2/a/tags/list?n=2") == (
        "https://r.example/v2/a/tags/list?n=2&last=d"
    )


def test_no_next_link():
    assert parse_link_next(None, "http://x/") is None
    assert parse_link_next('</v2/x>; rel="prev"', "http://x/") is None


# --- Docker config


def _write_config(tmp_path, doc):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    return path


def test_auths_entry_is_base64_user_colon_password(tmp_path):
    auth = base64.b64encode(b"alice:pa:ss").decode()  # passwords may hold colons
    path = _write_config(tmp_path, {"auths": {"https://127.0.0.1:5000/v2/": {"auth": auth}}})
    creds = docker_config_credentials("127.0.0.1:5000", path)
    assert (creds.username, creds.password) == ("alice", "pa:ss")
    assert docker_config_credentials("127.0.0.1:5001", path) is None


def test_identity_token_entry(tmp_path):
    path = _write_config(tmp_path, {"auths": {"ghcr.io": {"identitytoken": "refresh-xyz"}}})
    creds = docker_config_credentials("ghcr.io", path)
    assert creds.identity_token == "refresh-xyz" and creds.password is None


def test_bad_auth_entry_is_a_user_error(tmp_path):
    for bad in ("%%%not-base64", base64.b64encode(b"no-colon").decode()):
        path = _write_config(tmp_path, {"auths": {"r.example": {"auth": bad}}})
        with pytest.raises(UserError, match="not base64 'user:password'") as err:
            docker_config_credentials("r.example", path)
        assert "docker login r.example" in err.value.fix


def test_missing_config_means_no_credentials(tmp_path):
    assert docker_config_credentials("r.example", tmp_path / "absent.json") is None


def test_cred_helper_is_run_with_the_server_on_stdin(tmp_path, monkeypatch):
    # a real executable on PATH, as docker would find it
    helper = tmp_path / "bin" / "docker-credential-fake"
    helper.parent.mkdir()
    helper.write_text(
        "#!/bin/sh\n"
        "read server\n"
        'if [ "$1" = get ] && [ "$server" = "r.example:443" ]; then\n'
        '  echo \'{"ServerURL":"r.example:443","Username":"bob","Secret":"s3cret"}\'\n'
        "else echo 'credentials not found in native keychain'; exit 1; fi\n"
    )
    helper.chmod(helper.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{helper.parent}{os.pathsep}{os.environ['PATH']}")
    path = _write_config(tmp_path, {"credHelpers": {"r.example:443": "fake"}})
    creds = docker_config_credentials("r.example:443", path)
    assert (creds.username, creds.password) == ("bob", "s3cret")
    assert creds.source == "docker-credential-fake"
    # credsStore is the fallback for hosts without an auths/credHelpers entry
    path = _write_config(tmp_path, {"credsStore": "fake"})
    assert docker_config_credentials("r.example:443", path).username == "bob"
    assert docker_config_credentials("other.example", path) is None  # helper said not found


def test_helper_token_username_means_identity_token(tmp_path):
    path = _write_config(tmp_path, {"credsStore": "x"})
    creds = docker_config_credentials(
        "r.example", path, run_helper=lambda h, s: {"Username": "<token>", "Secret": "rt"}
    )
    assert creds.identity_token == "rt" and creds.username is None


def test_credentials_priority_arguments_env_config(tmp_path):
    auth = base64.b64encode(b"cfg:cfgpw").decode()
    path = _write_config(tmp_path, {"auths": {"r.example": {"auth": auth}}})
    env = {USER_ENV: "envuser", PASSWORD_ENV: "envpw"}
    assert resolve_credentials("r.example", "arg", "argpw", env, path).username == "arg"
    assert resolve_credentials("r.example", None, None, env, path).username == "envuser"
    assert resolve_credentials("r.example", None, None, {}, path).username == "cfg"
    assert resolve_credentials("none.example", None, None, {}, path) is None


# --- masking


def test_credentials_repr_never_shows_the_secret():
    creds = Credentials("alice", "hunter2-secret")
    assert "hunter2-secret" not in repr(creds) and "hunter2-secret" not in str(creds)
    assert "alice" in repr(creds)
    client = RegistryClient("127.0.0.1:9", username="alice", password="hunter2-secret")
    assert "hunter2-secret" not in repr(client)


class _AlwaysBasic401(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server API)
        body = b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}'
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="test"')
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def basic_401_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _AlwaysBasic401)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_wrong_password_message_names_env_vars_and_hides_the_password(basic_401_server):
    client = RegistryClient(basic_401_server, username="alice", password="hunter2-secret")
    with pytest.raises(AuthError) as err:
        client.ping()
    text = err.value.render()
    assert "hunter2-secret" not in text
    assert "rejected the credentials" in text and "alice" in text
    assert USER_ENV in text and PASSWORD_ENV in text


def test_no_credentials_message(basic_401_server, monkeypatch, tmp_path):
    monkeypatch.delenv(USER_ENV, raising=False)
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    with pytest.raises(AuthError, match="needs credentials"):
        RegistryClient(basic_401_server).ping()


# --- small pieces


def test_base_url_scheme_defaults_follow_dockerd():
    assert normalize_base_url("127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert normalize_base_url("localhost:5000/") == "http://localhost:5000"
    assert normalize_base_url("ghcr.io") == "https://ghcr.io"
    assert normalize_base_url("http://127.0.0.1:5000/v2/") == "http://127.0.0.1:5000"
    with pytest.raises(UserError):
        normalize_base_url("ftp://x")


def test_retry_after_seconds_and_http_date():
    assert _retry_after("3") == 3.0
    assert _retry_after(None) is None and _retry_after("soon") is None
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= _retry_after(later) <= 31


def test_byte_counter_summary_by_kind():
    c = ByteCounter()
    c.add("manifest", 0, 526)
    c.add("manifest", 526, 0)
    c.add("ping", 0, 2)
    assert c.total == 1054 and c.requests == 3
    assert c.by_kind == {"manifest": 1052, "ping": 2}
    assert c.summary() == "1,054 bytes in 3 requests (manifest 1,052, ping 2)"
