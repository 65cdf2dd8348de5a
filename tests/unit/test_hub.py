"""imagebuild.lock.hub against the real huggingface_hub client and a recorded-Hub replay."""

from __future__ import annotations

import filecmp
import json
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from huggingface_hub import constants
from huggingface_hub.utils import get_session

from imagebuild.errors import OperationFailed, UserError
from imagebuild.lock.hub import HubClient, HubUnreachable
from tests.support.hub import (
    AUTHORIZED_TOKEN,
    FIXTURE_DIR,
    UNAUTHORIZED_TOKEN,
    ReplayServer,
    hub_replay_server,
    load_recordings,
    make_fixtures,
)

ZLAB = "z-lab/Qwen3.6-35B-A3B-DFlash"
ZLAB_SMALL_PAGE = "31977fbe13a86e8b961774f773058175676d89b8"
NVIDIA = "nvidia/Qwen3.6-35B-A3B-NVFP4"
NVIDIA_SHA = "491c2f1ea524c639598bf8fa787a93fed5a6fbce"
HERETIC = "AEON-7/Qwen3.6-35B-A3B-heretic-NVFP4"
GATED = "imagebuild-fixtures/gated-NVFP4"
PRIVATE = "imagebuild-fixtures/private-drafter"
METADATA = [
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "tokenizer_config.json",
    "hf_quant_config.json",
]
RECORDED = load_recordings(FIXTURE_DIR)


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    with hub_replay_server(FIXTURE_DIR) as running:
        yield running


def main_sha(repo_id: str) -> str:
    return RECORDED[repo_id].refs["main"]


@pytest.fixture
def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(autouse=True)
def no_ambient_hub_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No token, no offline switch and no HF_ENDPOINT from the machine running the tests."""
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


class OffLoopback(Exception):
    pass


@pytest.fixture(autouse=True)
def loopback_only() -> Iterator[None]:
    """Fail any request the client would send off 127.0.0.1 (never reach the real Hub)."""

    def guard(request) -> None:  # type: ignore[no-untyped-def]
        if request.url.host != "127.0.0.1":
            raise OffLoopback(f"test tried to reach {request.url}")

    session = get_session()  # huggingface_hub's shared client, used by every call
    session.event_hooks["request"].insert(0, guard)
    yield
    session.event_hooks["request"].remove(guard)


def client(replay: ReplayServer, token: str | None = None) -> HubClient:
    return HubClient(endpoint=replay.endpoint, token=token, timeout=5)


# -- resolve ----------------------------------------------------------------------------
def test_full_sha_resolves_with_lfs_file_list(replay: ReplayServer) -> None:
    got = client(replay).resolve(NVIDIA, NVIDIA_SHA)
    assert (got.repo_id, got.requested, got.sha, got.from_branch) == (
        NVIDIA,
        NVIDIA_SHA,
        NVIDIA_SHA,
        False,
    )
    shards = [f for f in got.files if f.path.endswith(".safetensors")]
    assert len(shards) == 5 and all(f.lfs_sha256 and len(f.lfs_sha256) == 64 for f in shards)
    assert 20e9 < sum(f.size for f in shards) < 26e9  # ~22 GB of NVFP4 weights
    assert got.file("config.json").lfs_sha256 is None  # type: ignore[union-attr]
    assert got.file("hf_quant_config.json") is not None
    assert [f.path for f in got.files] == sorted(f.path for f in got.files)
    (req,) = replay.requests
    assert (req.method, req.path) == ("GET", f"/api/models/{NVIDIA}/revision/{NVIDIA_SHA}")
    assert req.query == {"blobs": ["true"]}


def test_short_sha_resolves_to_the_full_commit(replay: ReplayServer) -> None:
    got = client(replay).resolve(ZLAB, "31977FBE13A8")
    assert got.sha == ZLAB_SMALL_PAGE
    assert got.requested == "31977FBE13A8" and not got.from_branch
    assert got.file("model.safetensors") is not None


def test_branch_is_refused_where_a_pin_belongs(replay: ReplayServer) -> None:
    with pytest.raises(UserError) as err:
        client(replay).resolve(ZLAB, "main")
    assert "'main'" in err.value.message
    assert "build.py lock --update" in (err.value.fix or "")
    assert err.value.exit_code == 2
    assert replay.requests == []  # refused before asking the Hub


def test_branch_allowed_for_a_tracked_entry(replay: ReplayServer) -> None:
    got = client(replay).resolve(ZLAB, "main", allow_branch=True)
    assert got.sha == main_sha(ZLAB) != ZLAB_SMALL_PAGE
    assert got.from_branch and got.requested == "main"


def test_branch_named_like_a_short_sha_is_not_a_commit(replay: ReplayServer) -> None:
    repo = "imagebuild-fixtures/hex-named-branch"
    with pytest.raises(UserError, match="names a branch or tag") as err:
        client(replay).resolve(repo, "c0ffee1234")
    assert main_sha(repo) in (err.value.fix or "")


def test_head_sha_follows_the_branch(replay: ReplayServer) -> None:
    assert client(replay).head_sha(ZLAB) == main_sha(ZLAB)
    assert client(replay).head_sha(NVIDIA, "main") == NVIDIA_SHA


@pytest.mark.parametrize("rev", ["0" * 40, "0123456789ab"])
def test_missing_revision_is_a_user_error(replay: ReplayServer, rev: str) -> None:
    with pytest.raises(UserError, match="does not exist") as err:
        client(replay).resolve(ZLAB, rev)
    assert rev in err.value.message


def test_missing_repo_is_a_user_error(replay: ReplayServer) -> None:
    # Anonymous: the Hub answers 401 for missing and private repos alike.
    with pytest.raises(UserError, match="not found") as err:
        client(replay).resolve("AEON-7/no-such-model", ZLAB_SMALL_PAGE)
    assert "HF_TOKEN" in (err.value.fix or "")
    # Authenticated: a plain 404, no token hint.
    with pytest.raises(UserError, match="not found") as err:
        client(replay, UNAUTHORIZED_TOKEN).resolve("AEON-7/no-such-model", ZLAB_SMALL_PAGE)
    assert "HF_TOKEN" not in (err.value.fix or "")


def test_invalid_repo_id_is_a_user_error(replay: ReplayServer) -> None:
    with pytest.raises(UserError, match="not a valid Hub repo id"):
        client(replay).resolve("not//valid", ZLAB_SMALL_PAGE)


def test_private_repo_needs_a_token(replay: ReplayServer) -> None:
    with pytest.raises(UserError) as err:
        client(replay).resolve(PRIVATE, "main", allow_branch=True)
    assert "HF_TOKEN" in (err.value.fix or "")
    got = client(replay, AUTHORIZED_TOKEN).resolve(PRIVATE, "main", allow_branch=True)
    assert got.sha == main_sha(PRIVATE)
    assert replay.requests[-1].authorization == f"Bearer {AUTHORIZED_TOKEN}"


def test_gated_repo_401_and_403_mention_hf_token(replay: ReplayServer, tmp_path: Path) -> None:
    sha = client(replay).resolve(GATED, "main", allow_branch=True).sha  # listing is public
    with pytest.raises(UserError, match=r"gated .*needs a token \(401\)") as err:
        client(replay).download_metadata(GATED, sha, ["config.json"], tmp_path)
    assert "HF_TOKEN" in (err.value.fix or "")
    with pytest.raises(UserError, match=r"gated .*refused this token \(403\)") as err:
        client(replay, UNAUTHORIZED_TOKEN).download_metadata(GATED, sha, ["config.json"], tmp_path)
    assert "HF_TOKEN" in (err.value.fix or "")
    assert not (tmp_path / "config.json").exists()
    got = client(replay, AUTHORIZED_TOKEN).download_metadata(GATED, sha, ["config.json"], tmp_path)
    assert got == [tmp_path / "config.json"]


# -- unreachable ------------------------------------------------------------------------
@pytest.fixture
def silent_port() -> Iterator[int]:
    """Accepts connections (backlog) and never answers: a hung Hub."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield s.getsockname()[1]
    s.close()


def test_connection_refused_is_hub_unreachable_and_quick(closed_port: int) -> None:
    hub = HubClient(endpoint=f"http://127.0.0.1:{closed_port}", timeout=2)
    start = time.monotonic()
    with pytest.raises(HubUnreachable, match="unreachable") as err:
        hub.resolve(ZLAB, ZLAB_SMALL_PAGE)
    assert time.monotonic() - start < 3
    assert isinstance(err.value, OperationFailed) and err.value.exit_code == 1


def test_timeout_is_hub_unreachable_for_every_call(silent_port: int, tmp_path: Path) -> None:
    hub = HubClient(endpoint=f"http://127.0.0.1:{silent_port}", timeout=0.3)
    calls = [
        lambda: hub.resolve(ZLAB, ZLAB_SMALL_PAGE),
        lambda: hub.head_sha(ZLAB),
        lambda: hub.download_metadata(ZLAB, ZLAB_SMALL_PAGE, ["config.json"], tmp_path),
    ]
    for call in calls:
        start = time.monotonic()
        with pytest.raises(HubUnreachable, match="timed out"):
            call()
        assert time.monotonic() - start < 3


@pytest.fixture
def hub_outage() -> Iterator[str]:
    """An endpoint that answers every request with 503, like the Hub during an outage."""

    class Outage(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Outage)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_hub_outage_is_hub_unreachable(hub_outage: str) -> None:
    with pytest.raises(HubUnreachable, match="503"):
        HubClient(endpoint=hub_outage, timeout=2).resolve(ZLAB, ZLAB_SMALL_PAGE)


def test_offline_mode_is_hub_unreachable(
    replay: ReplayServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubUnreachable, match="offline"):
        client(replay).resolve(ZLAB, ZLAB_SMALL_PAGE)
    assert replay.requests == []


def test_hf_endpoint_is_read_at_call_time(
    replay: ReplayServer, monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    # huggingface_hub froze HF_ENDPOINT at import; HubClient must not depend on that. The
    # frozen default points at a closed loopback port here, so a regression fails instead
    # of reaching the public Hub. (Only model_info runs: hf_hub_url would still build
    # huggingface.co URLs from its import-time template if ENDPOINT were patched there.)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{closed_port}")
    monkeypatch.setenv("HF_ENDPOINT", replay.endpoint)
    assert HubClient().head_sha(NVIDIA) == NVIDIA_SHA
    assert len(replay.requests) == 1


# -- download_metadata ------------------------------------------------------------------
def test_metadata_download_is_byte_exact_plain_files(replay: ReplayServer, tmp_path: Path) -> None:
    got = client(replay).download_metadata(NVIDIA, NVIDIA_SHA, METADATA, tmp_path)
    assert got == [tmp_path / name for name in METADATA]
    for name in METADATA:
        target = tmp_path / name
        assert target.is_file() and not target.is_symlink()
        assert target.read_bytes() == (FIXTURE_DIR / NVIDIA / NVIDIA_SHA / name).read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(METADATA)  # no cache dirs
    # only the git-stored files were fetched; nothing asked the LFS CDN
    assert not [r for r in replay.requests if r.server == "cdn"]


def test_metadata_download_skips_files_absent_at_the_commit(
    replay: ReplayServer, tmp_path: Path
) -> None:
    got = client(replay).download_metadata(ZLAB, ZLAB_SMALL_PAGE, METADATA, tmp_path)
    assert got == [tmp_path / "config.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]
    asked = {r.path.rsplit("/", 1)[1] for r in replay.requests if "/resolve" in r.path}
    assert asked == {"config.json"}  # absent files are not even requested


def test_metadata_download_needs_a_full_sha(replay: ReplayServer, tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        client(replay).download_metadata(ZLAB, "main", ["config.json"], tmp_path)


def test_metadata_download_rejects_bytes_that_do_not_match_the_commit(
    tmp_path: Path,
) -> None:
    fixtures = tmp_path / "hub"
    shutil.copytree(FIXTURE_DIR / ZLAB, fixtures / ZLAB)
    with hub_replay_server(fixtures) as replay:
        # the listing was loaded; now the served bytes change under it (a stale mirror)
        served = fixtures / ZLAB / ZLAB_SMALL_PAGE / "config.json"
        served.write_bytes(
            served.read_bytes().replace(b'"num_key_value_heads": 4', b'"num_key_value_heads": 8')
        )
        with pytest.raises(OperationFailed, match="do not match"):
            client(replay).download_metadata(
                ZLAB, ZLAB_SMALL_PAGE, ["config.json"], tmp_path / "out"
            )
    assert not (tmp_path / "out" / "config.json").exists()


# -- the recordings themselves -----------------------------------------------------------
def test_recorded_contents_carry_the_domain_facts(replay: ReplayServer, tmp_path: Path) -> None:
    hub = client(replay)

    def fetch(repo_id: str, sha: str, name: str) -> dict:
        (path,) = hub.download_metadata(repo_id, sha, [name], tmp_path / repo_id / sha)
        return json.loads(path.read_text())

    old = fetch(ZLAB, ZLAB_SMALL_PAGE, "config.json")
    new = fetch(ZLAB, main_sha(ZLAB), "config.json")
    assert (old["num_key_value_heads"], old["sliding_window"]) == (4, None)
    assert (new["num_key_value_heads"], new["sliding_window"]) == (8, 4096)

    heretic = fetch(HERETIC, main_sha(HERETIC), "config.json")
    assert heretic["quantization_config"]["quant_method"] == "compressed-tensors"
    assert heretic["text_config"]["num_key_value_heads"] == 2
    index = fetch(HERETIC, main_sha(HERETIC), "model.safetensors.index.json")
    assert sum(k.startswith("model.visual.") for k in index["weight_map"]) == 333

    assert fetch(NVIDIA, NVIDIA_SHA, "config.json")["quantization_config"]["quant_method"] == (
        "modelopt"
    )
    quant = fetch(NVIDIA, NVIDIA_SHA, "hf_quant_config.json")
    assert quant["quantization"]["quant_algo"] == "MIXED_PRECISION"


def test_committed_fixtures_match_their_generator(tmp_path: Path) -> None:
    make_fixtures.write_all(tmp_path)
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(
        p.relative_to(FIXTURE_DIR)
        for p in FIXTURE_DIR.rglob("*")
        if p.is_file() and p.parent != FIXTURE_DIR  # the folder README is hand-written
    )
    assert generated == committed
    _, mismatch, errors = filecmp.cmpfiles(tmp_path, FIXTURE_DIR, generated, shallow=False)
    assert mismatch == [] and errors == []
