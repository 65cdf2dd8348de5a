"""A container another caller is already removing is reported removed only once it is
gone (the reaper's "reaped" line, a run's teardown): on a busy engine, removal in progress
lasted seconds and a killed run's bench container was still listed after "reaped"."""

from __future__ import annotations

from typing import Any

import docker.errors
import pytest

from imagebuild import docker as seam
from imagebuild.errors import OperationFailed


class Api:
    def __init__(self, gone_after: int) -> None:
        self.inspects = 0
        self.gone_after = gone_after

    def remove_container(self, name: str, **kw: Any) -> None:
        raise docker.errors.APIError(
            f"removal of container {name} is already in progress")

    def inspect_container(self, name: str) -> dict[str, Any]:
        self.inspects += 1
        if self.inspects > self.gone_after:
            raise docker.errors.NotFound("no such container")
        return {"Name": name}


def _engine(api: Api) -> seam.Engine:
    client = type("Client", (), {"api": api})()
    return seam.Engine(client)  # type: ignore[arg-type]


def test_removal_in_progress_waits_until_the_container_is_gone(monkeypatch) -> None:
    monkeypatch.setattr(seam.time, "sleep", lambda s: None)
    api = Api(gone_after=3)
    _engine(api).remove_object("container", "imagebuild-bench-1")
    assert api.inspects == 4  # returned only once inspect said it is gone


def test_a_removal_that_never_ends_is_an_error_naming_the_container(monkeypatch) -> None:
    monkeypatch.setattr(seam.time, "sleep", lambda s: None)
    clock = iter(range(0, 10_000, 10))
    monkeypatch.setattr(seam.time, "monotonic", lambda: next(clock))
    with pytest.raises(OperationFailed, match="imagebuild-bench-1 is still being removed"):
        _engine(Api(gone_after=10**9)).remove_object("container", "imagebuild-bench-1")
