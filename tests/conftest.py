"""Shared fixtures. Tests needing Docker/registry/vLLM are marked `slow`/`vllm` and run in CI."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT

# No test may reach the real Hub: offline unless a test points a client at the replay
# server on 127.0.0.1 (set before huggingface_hub is first imported: it reads these once).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

# files matrix.yaml refers to; copied so a test can edit its own matrix in isolation
MATRIX_FILES = ("matrix.yaml", "matrix.lock.json", "locked", "patches", "images/engine/cpu",
                "scripts/make_tiny_model.py")


@pytest.fixture
def matrix_dir(tmp_path: Path) -> Path:
    """A copy of the real matrix.yaml with everything it references, editable per test."""
    for rel in MATRIX_FILES:
        src, dst = REPO_ROOT / rel, tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
    return tmp_path


@pytest.fixture
def hub_online_loopback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Let huggingface_hub make requests, but only to 127.0.0.1 (the replay server)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))

    def guard(request) -> None:  # type: ignore[no-untyped-def]
        if request.url.host != "127.0.0.1":
            raise AssertionError(f"test tried to reach {request.url}")

    session = get_session()
    session.event_hooks["request"].insert(0, guard)
    yield
    session.event_hooks["request"].remove(guard)
