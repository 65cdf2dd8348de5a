"""The smoke runner's backstop clean-up (serving/compose.py take_down): after a suite that ended by
itself and whose own `compose down` left nothing, it costs no compose process and no
settle; anything left, or a suite cut short, gets the whole backstop as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagebuild.serving import compose
from tests.support.memengine import MemoryEngine


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(compose.subprocess, "run", lambda argv, **kw: seen.append(" ".join(argv)))
    monkeypatch.setattr(compose.time, "sleep", lambda s: seen.append(f"sleep {s}"))
    monkeypatch.setattr("imagebuild.serving.compose.compose_argv",
                        lambda: ["docker-compose"])
    return seen


@pytest.mark.parametrize("finished, left, backstop", [
    (True, [], False),  # the suite's own down removed everything
    (True, ["volume imagebuild-smoke-x_cache"], True),  # it left something
    (False, [], True),  # cut short (Ctrl-C, a crash): compose may still be creating
])
def test_backstop_runs_unless_a_finished_suite_left_nothing(
        memory_engine: MemoryEngine, calls: list[str], finished: bool, left: list[str],
        backstop: bool) -> None:
    eng = memory_engine
    for what in left:  # what the project's own `down` left behind
        kind, name = what.split()
        eng.objects[kind][name] = {compose.PROJECT_LABEL: "imagebuild-smoke-x"}
    compose.take_down("imagebuild-smoke-x", Path("compose.yaml"), suite_finished=finished)
    label = f"{compose.PROJECT_LABEL}=imagebuild-smoke-x"
    if backstop:
        assert eng.called("remove_labelled") == [label, label]
        assert calls == ["docker-compose -f compose.yaml -p imagebuild-smoke-x down --volumes "
                         "--timeout 5", f"sleep {compose.SWEEP_SETTLE_S}"]
    else:
        assert eng.called("remove_labelled") == [] and calls == []
