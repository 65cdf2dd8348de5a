"""Every container, volume and network a run makes carries its run's labels (runowner.py):
each creation path driven with a fake Docker client or with compose stopped at `up`, and
the package searched for a creation call outside those paths."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from imagebuild import docker as dk
from imagebuild.errors import OperationFailed, UserError
from imagebuild.runowner import owner_labels
from tests.support.memengine import MemoryEngine, image_doc, installed

ROOT = Path(__file__).resolve().parents[2]


class _Container:
    id = name = "c1"

    def wait(self) -> dict[str, int]:
        return {"StatusCode": 0}

    def logs(self, **kw: Any) -> bytes:
        return b"1000\n1000\n"


class _Containers:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def run(self, image: str, command: Any = None, **kw: Any) -> Any:
        self.calls.append(kw)
        return b"1000\n1000\n" if kw.get("remove") else _Container()


class _Api:
    def inspect_image(self, ref: str) -> dict[str, Any]:
        return {"Id": "sha256:x", "Config": {}}

    def remove_container(self, *a: Any, **kw: Any) -> None:
        return None


class FakeClient:
    def __init__(self) -> None:
        self.containers = _Containers()
        self.api = _Api()


def _carries(labels: dict[str, str]) -> None:
    assert owner_labels().items() <= labels.items()


def test_every_sdk_container_carries_the_run():
    client = FakeClient()
    eng = dk.Engine(client)  # type: ignore[arg-type]
    with installed(eng):  # the real seam, on an SDK client that records
        eng.run("img", ["serve"], name="imagebuild-bench-1", labels={"io.imagebuild.bench": "1"})
        eng.probe("img", ["true"], entrypoint="sh", mounts={})
        dk.image_user("img", "vllm")
    assert len(client.containers.calls) == 3
    for kw in client.containers.calls:
        _carries(kw["labels"])
    assert client.containers.calls[0]["labels"]["io.imagebuild.bench"] == "1"


def _compose_doc(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    for svc in doc["services"].values():
        _carries(svc["labels"])
    for kind in ("volumes", "networks"):
        for spec in (doc.get(kind) or {}).values():
            _carries(spec["labels"])
    return doc


RENDERED = ROOT / "rendered/cpu/dflashfix/cpu-tiny-ngram.compose.yaml"


def test_smoke_runs_a_labelled_compose_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            memory_engine: MemoryEngine):
    from imagebuild.smoke import runner

    memory_engine.add_image(image_doc("sha256:x"), "img")
    monkeypatch.setattr(runner, "take_down", lambda *a, **kw: None)

    def suite(out: Path, config: dict[str, Any], *a: Any) -> tuple[Path, int]:
        doc = _compose_doc(Path(config["compose_file"]))
        assert doc["volumes"], "the rendered file names a cache volume"
        raise KeyboardInterrupt  # stop where compose would start

    monkeypatch.setattr(runner, "_run_suite", suite)
    with pytest.raises(KeyboardInterrupt):
        runner.smoke_image("img", {"boot_timeout_s": 60}, tmp_path,
                           compose_text=RENDERED.read_text())


def _node_files() -> list[Any]:
    from imagebuild.serving.nodes import NodeFile

    text = RENDERED.read_text()
    return [NodeFile("head", 0, text), NodeFile("worker1", 1, text)]


def test_multinode_workers_and_head_run_labelled_files(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       memory_engine: MemoryEngine):
    from imagebuild.serving import nodes

    started: list[Path] = []

    def compose(self: Any, w: Any, *args: str, **kw: Any) -> Any:
        if args[0] == "up":
            started.append(w.path)
            _compose_doc(w.path)
            return subprocess.CompletedProcess(args, 0 if len(started) == 1 else 1, "", "x")
        return subprocess.CompletedProcess(args, 0, "", "")

    class Watcher:
        def __init__(self, *a: Any, **kw: Any) -> None: ...

        def start(self) -> Watcher:
            return self

        def stop(self, timeout: float) -> None: ...

    monkeypatch.setattr(nodes.NodeRun, "_compose", compose)
    monkeypatch.setattr(nodes.NodeRun, "watch", lambda self: None)
    monkeypatch.setattr(nodes, "LogWatcher", Watcher)
    monkeypatch.setattr(nodes, "take_down", lambda *a, **kw: None)
    monkeypatch.setattr(nodes, "node_hosts", lambda n, cpu: ([None] * n, "127.0.0.1", False))
    with pytest.raises((OperationFailed, UserError)):
        with nodes.serving_nodes("img", _node_files(), tmp_path, tensor_parallel_size=2,
                                 cpu=True, boot_timeout_s=5):
            pass
    assert [p.name for p in started] == ["worker1.compose.yaml", "head.compose.yaml"]


# The only calls that make engine objects, by module: a new one must take its labels
# from runowner.py (and be added here with a test above).
CREATORS = {"imagebuild/docker.py": 3}
CREATE_ATTRS = {"run", "create"}
COMPOSE_UP = {"imagebuild/serving/nodes.py", "imagebuild/serving/launch.py",
              "imagebuild/serving/compose.py", "imagebuild/smoke/suite/conftest.py"}


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def test_no_creation_path_outside_the_labelled_ones():
    found: dict[str, int] = {}
    compose_users = set()
    for path in sorted((ROOT / "imagebuild").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        text = path.read_text()
        if not any(w in text for w in ("containers", "volumes", "networks", "create_",
                                       "compose_argv", "docker_compose_command")):
            continue
        tree = ast.parse(text)
        for call in _calls(tree):
            f = call.func
            if isinstance(f, ast.Attribute) and f.attr in CREATE_ATTRS and \
                    isinstance(f.value, ast.Attribute) and \
                    f.value.attr in ("containers", "volumes", "networks"):
                found[rel] = found.get(rel, 0) + 1
                kw = {k.arg: k.value for k in call.keywords}
                assert "labels" in kw and "run_labels" in ast.unparse(kw["labels"]), \
                    f"{rel}:{call.lineno}: an engine object without the run's labels"
            if isinstance(f, ast.Attribute) and f.attr in ("create_container",
                                                            "create_volume",
                                                            "create_network"):
                pytest.fail(f"{rel}:{call.lineno}: low-level create outside docker.py's run")
            if isinstance(f, ast.Name) and f.id == "compose_argv":
                compose_users.add(rel)
        if "docker_compose_command" in text:
            compose_users.add(rel)
    assert found == CREATORS
    # compose starts projects only in these; launch's are deployments (never reaped,
    # docs/runner-hygiene.md), the suite runs the file smoke wrote (labelled above)
    assert compose_users <= COMPOSE_UP, compose_users - COMPOSE_UP
