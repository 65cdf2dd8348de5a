"""Recorded-Hub replay for tests: the real huggingface_hub client against 127.0.0.1.

In a conftest: `from tests.support.hub import hub_replay  # noqa: F401` makes the `hub_replay`
fixture available; it yields a ReplayServer whose `.endpoint` goes to
`HubClient(endpoint=...)` and whose `.requests` is the log of what the client asked.
Outside pytest, `with hub_replay_server(FIXTURE_DIR) as replay: ...`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.paths import HUB_DATA

from .recording import RecordedRepo, git_blob_id, load_recordings
from .server import RecordedRequest, ReplayServer, hub_replay_server

FIXTURE_DIR = HUB_DATA

# Tokens the recordings accept for their gated/private repos (fixture values, not secrets).
AUTHORIZED_TOKEN = "hf_imagebuildFixtureAuthorized"
UNAUTHORIZED_TOKEN = "hf_imagebuildFixtureNotOnTheList"


@pytest.fixture
def hub_replay() -> Iterator[ReplayServer]:
    with hub_replay_server(FIXTURE_DIR) as replay:
        yield replay


__all__ = [
    "AUTHORIZED_TOKEN",
    "FIXTURE_DIR",
    "UNAUTHORIZED_TOKEN",
    "RecordedRepo",
    "RecordedRequest",
    "ReplayServer",
    "git_blob_id",
    "hub_replay",
    "hub_replay_server",
    "load_recordings",
]
