"""images/serve/files/fetch-hub-files.py against two real HTTP servers on 127.0.0.1.

The "Hub" redirects weight files to a "CDN" on another port (another origin, as the real
Hub's LFS redirects go to another host) and small files within its own origin. The token
must reach the Hub on every hop within its origin and never the CDN, nor the Hub's own
port under another host name (localhost is another origin than 127.0.0.1).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT

FETCH = REPO_ROOT / "images" / "serve" / "files" / "fetch-hub-files.py"
TOKEN = "hf_secret_token_for_the_test"
REV = "a" * 40
FILES = {"config.json": b'{"model_type": "qwen3"}\n', "model.safetensors": b"\x00\x01" * 5000,
         "tokenizer.json": b'{"version": "1.0"}\n'}


class Recorder(http.server.ThreadingHTTPServer):
    def __init__(self, handler: type) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.seen: list[dict[str, str | None]] = []
        self.redirect_to: dict[str, str] = {}

    @property
    def port(self) -> int:
        return self.server_address[1]


class Handler(http.server.BaseHTTPRequestHandler):
    server: Recorder

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.server.seen.append({"path": self.path, "host": self.headers.get("Host"),
                                 "auth": self.headers.get("Authorization")})
        if self.path in self.server.redirect_to:
            self.send_response(302)
            self.send_header("Location", self.server.redirect_to[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        name = self.path.rsplit("/", 1)[-1]
        if self.path.startswith(("/blob/", "/cache/")) and name in FILES:
            body = FILES[name]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving() -> Iterator[Recorder]:
    server = Recorder(Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _entry(name: str, body: bytes) -> dict:
    blob = hashlib.sha1(f"blob {len(body)}\0".encode() + body).hexdigest()
    lfs = hashlib.sha256(body).hexdigest() if name.endswith(".safetensors") else None
    return {"path": name, "size": len(body), "lfs_sha256": lfs, "blob_id": blob}


@pytest.fixture
def hub_and_cdn(tmp_path: Path) -> Iterator[tuple[Recorder, Recorder, Path]]:
    with serving() as hub, serving() as cdn:
        base = f"/org/model/resolve/{REV}"
        # LFS weights: to the CDN (another port = another origin)
        hub.redirect_to[f"{base}/model.safetensors"] = (
            f"http://127.0.0.1:{cdn.port}/blob/model.safetensors")
        # a small file: relative redirect within the Hub's own origin
        hub.redirect_to[f"{base}/config.json"] = "/cache/config.json"
        # same port, other host name: another origin as well
        hub.redirect_to[f"{base}/tokenizer.json"] = (
            f"http://localhost:{hub.port}/blob/tokenizer.json")
        manifest = tmp_path / "model-files.json"
        manifest.write_text(json.dumps({"repository": "org/model", "revision": REV,
                                        "files": [_entry(n, b) for n, b in FILES.items()]}))
        yield hub, cdn, manifest


def test_token_stays_with_the_hub_origin(hub_and_cdn, tmp_path: Path) -> None:
    hub, cdn, manifest = hub_and_cdn
    token_file = tmp_path / "hf_token"
    token_file.write_text(TOKEN + "\n")
    proc = subprocess.run(
        [sys.executable, str(FETCH), "--manifest", str(manifest), "--dest",
         str(tmp_path / "model"), "--token-file", str(token_file), *FILES],
        capture_output=True, text=True, timeout=60,
        env={"HF_ENDPOINT": f"http://127.0.0.1:{hub.port}", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    for name, body in FILES.items():  # downloaded and verified against the manifest
        assert (tmp_path / "model" / name).read_bytes() == body
    bearer = f"Bearer {TOKEN}"
    by_host = {"127.0.0.1": [r for r in hub.seen if r["host"].startswith("127.0.0.1")],
               "localhost": [r for r in hub.seen if r["host"].startswith("localhost")]}
    # the Hub's origin: the first request for each file and the relative redirect
    assert len(by_host["127.0.0.1"]) == 4
    assert all(r["auth"] == bearer for r in by_host["127.0.0.1"]), by_host["127.0.0.1"]
    assert any(r["path"] == "/cache/config.json" for r in by_host["127.0.0.1"])
    # other origins: the CDN port, and the Hub's port under another host name
    assert [r["path"] for r in cdn.seen] == ["/blob/model.safetensors"]
    assert [r["path"] for r in by_host["localhost"]] == ["/blob/tokenizer.json"]
    leaked = [r for r in cdn.seen + by_host["localhost"] if r["auth"]]
    assert not leaked, f"the Hub token went to another origin: {leaked}"


def test_without_a_token_nothing_is_sent(hub_and_cdn, tmp_path: Path) -> None:
    hub, cdn, manifest = hub_and_cdn
    proc = subprocess.run(
        [sys.executable, str(FETCH), "--manifest", str(manifest), "--dest",
         str(tmp_path / "model"), "--token-file", str(tmp_path / "absent"), "config.json"],
        capture_output=True, text=True, timeout=60,
        env={"HF_ENDPOINT": f"http://127.0.0.1:{hub.port}", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert hub.seen and not any(r["auth"] for r in hub.seen)
