"""The smoke suite runs against one live container that `imagebuild.smoke` started.

It is driven by `python build.py smoke ...`, which boots the container, writes a JSON
config and points IMAGEBUILD_SMOKE_CONFIG at it. A plain `pytest` run has no container,
so the suite is not collected at all then (it is not skipped: there is nothing to test).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from imagebuild.smoke.probes import quote_log

CONFIG_ENV = "IMAGEBUILD_SMOKE_CONFIG"

if not os.environ.get(CONFIG_ENV):
    collect_ignore_glob = ["test_*.py"]


def _config() -> dict[str, Any]:
    return json.loads(Path(os.environ[CONFIG_ENV]).read_text())


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "concurrency" in metafunc.fixturenames:
        levels = _config()["expect"]["concurrency"]
        metafunc.parametrize("concurrency", levels, ids=[f"c{n}" for n in levels])


@pytest.fixture(scope="session")
def smoke() -> dict[str, Any]:
    return _config()


@pytest.fixture(scope="session")
def expect(smoke: dict[str, Any]) -> dict[str, Any]:
    return smoke["expect"]


@pytest.fixture(scope="session")
def api(smoke: dict[str, Any]) -> Callable[..., requests.Response]:
    """`api(method, path, **kw)` against the container; generous timeout for a CPU engine."""
    session = requests.Session()

    def call(method: str, path: str, **kw: Any) -> requests.Response:
        kw.setdefault("timeout", smoke.get("request_timeout_s", 120))
        return session.request(method, smoke["base_url"] + path, **kw)

    return call


@pytest.fixture
def log(smoke: dict[str, Any]) -> Callable[..., str]:
    """`log(pattern=None)`: container log lines to quote in a failure message."""
    def quote(pattern: str | None = None) -> str:
        lines = Path(smoke["log_path"]).read_text(errors="replace").splitlines()
        return quote_log(lines, pattern)
    return quote


@pytest.fixture
def log_lines(smoke: dict[str, Any]) -> list[str]:
    return Path(smoke["log_path"]).read_text(errors="replace").splitlines()


@pytest.fixture(scope="session")
def model(expect: dict[str, Any]) -> str:
    return expect["served_names"][0]


@pytest.fixture(scope="session")
def chat(api: Callable[..., requests.Response], model: str) -> Callable[..., requests.Response]:
    """A greedy chat request with thinking off unless asked, so answers are reproducible."""
    def send(content: Any, *, thinking: bool = False, **extra: Any) -> requests.Response:
        body: dict[str, Any] = {
            "model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": 32, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": thinking},
        }
        body.update(extra)
        return api("POST", "/v1/chat/completions", json=body)
    return send
