"""A release's engine stage on the real Docker engine and a real registry with htpasswd
(slow; heavy lock): the cpu engine is built once (here: found by its inputs) and pushed by
digest; a re-run finds it in the registry and neither builds nor pushes; a second
"runner" without the local base and engine images pulls that digest and builds only its
serve layers on it; an engine whose inputs label is not this checkout's is refused, and
a tag without a digest is refused before anything happens.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from imagebuild.cli import main
from imagebuild.registry.client import RegistryClient
from tests.support.cpu_build import TAG
from tests.support.registry import docker_login

# alone: runner B starts without the session's base and engine images (removed here), which
# the other lane may be running a container of (tests/e2e/test_arch_table.py reads the
# engine image inside it: `rmi -f` refused "image is being used by running container")
pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(2400)]
DOCKER = "/usr/bin/docker"
NS = "handoff"
FAMILY = "handoff"  # the second runner's image family: its own serve image, same engine


@pytest.fixture(scope="module")
def registry(shared_registry):
    """The session's registry shared by the modules pushing the cpu engine (conftest)."""
    return shared_registry


def _docker(*args: str, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [DOCKER, *(["--config", str(config)] if config else []), *args]
    return subprocess.run(cmd, capture_output=True, text=True,
                          env={**os.environ, "DOCKER_BUILDKIT": "1"})


def _inspect(ref: str) -> dict | None:
    proc = _docker("image", "inspect", ref)
    return json.loads(proc.stdout)[0] if proc.returncode == 0 else None


def _record(out: Path, name: str) -> dict:
    return json.loads((out / "records" / "cpu" / "dflashfix" / f"{name}.json").read_text())


def _second_runner_matrix(matrix_dir: Path) -> Path:
    """The real matrix with the cpu image family renamed: the same engine, a serve image
    of its own (so its build runs here instead of being found by its inputs)."""
    path = matrix_dir / "matrix.yaml"
    data = yaml.safe_load(path.read_text())
    data["images"][FAMILY] = data["images"].pop("cpu")
    data["images"][FAMILY]["matrix"]["engine"] = ["dflashfix"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_engine_built_once_pushed_by_digest_and_only_serve_built_on_it(
        cpu_serve_image, registry, matrix_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("IMAGEBUILD_TARGET", raising=False)
    second = _second_runner_matrix(matrix_dir)
    made: list[str] = []  # local tags this test creates
    reg = registry
    config = docker_login(reg)
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    monkeypatch.setenv("IMAGEBUILD_REGISTRY", reg.host)
    monkeypatch.setenv("IMAGEBUILD_NAMESPACE", NS)
    gh_output = tmp_path / "github-output"
    monkeypatch.setenv("GITHUB_OUTPUT", str(gh_output))
    client = RegistryClient(reg.url, username=reg.user, password=reg.password)
    repo = f"{NS}/engine-cpu-dflashfix"
    try:
        # runner A: the engine stage
        a = tmp_path / "runner-a"
        assert main(["build", "--tag", TAG, "--target", "cpu", "--engine-only", "--push",
                     "--out", str(a)]) == 0
        out = capsys.readouterr().out
        ref = (a / "engines" / "cpu.ref").read_text().strip()
        m = re.fullmatch(rf"{re.escape(reg.host)}/{repo}@(sha256:[0-9a-f]{{64}})", ref)
        assert m, ref
        assert gh_output.read_text() == f"engine_image={ref}\n"
        assert f"pushed {ref}" in out and "[serve]" not in out
        engine = _record(a, "engine")
        # the registry holds exactly the local engine (its config is the image id),
        # under its digest and its inputs tag
        manifest, digest = client.image_manifest(repo, m[1])
        assert digest == m[1] and manifest["config"]["digest"] == engine["image_id"]
        assert client.digest(repo, f"inputs-{engine['inputs_digest']}") == m[1]
        assert client.image_labels(repo, m[1])["io.imagebuild.inputs"] == \
            engine["inputs_digest"]

        # a re-run of the engine stage: the registry has these inputs, nothing happens
        gh_output.write_text("")
        a2 = tmp_path / "runner-a-again"
        assert main(["build", "--tag", TAG, "--target", "cpu", "--engine-only", "--push",
                     "--out", str(a2)]) == 0
        out = capsys.readouterr().out
        assert "already holds inputs" in out and "not built, not pushed" in out
        assert f"pushed {ref}" not in out
        assert (a2 / "engines" / "cpu.ref").read_text().strip() == ref
        assert not (a2 / "records").exists()  # nothing was built
        assert gh_output.read_text() == f"engine_image={ref}\n"

        # runner B: no base, no engine image of its own
        base_ref = _record(a, "base")["ref"]
        engine_ref = engine["ref"]
        for image in (base_ref, engine_ref):
            info = _inspect(image)
            assert info is not None
            assert _docker("rmi", "-f", info["Id"]).returncode == 0
        assert _inspect(engine_ref) is None and _inspect(base_ref) is None
        b = tmp_path / "runner-b"
        code = main(["build", "--matrix", str(second), "--tag", TAG, "--target", "cpu",
                     "--engine-image", ref, "--out", str(b)])
        out, err = capsys.readouterr()
        assert code == 0, out + err
        assert f"pulled {ref}" in out
        assert "[engine] building" not in out and "[base]" not in out
        assert _inspect(base_ref) is None  # the base was not built either
        made.append(ref)  # the pull's digest reference (the image keeps its local tags)
        pulled = _inspect(engine_ref)
        assert pulled is not None and pulled["Id"] == engine["image_id"]
        assert _inspect(f"imagebuild/inputs:{engine['inputs_digest']}")["Id"] == \
            engine["image_id"]  # build avoidance finds it from now on
        records = sorted(p.name for p in (b / "records" / "cpu" / "dflashfix").iterdir())
        assert records == ["engine.json", f"{FAMILY}-tiny-ngram.json"]
        assert _record(b, "engine")["pulled_from"] == ref
        serve = _record(b, f"{FAMILY}-tiny-ngram")
        made += [serve["ref"], f"imagebuild/inputs:{serve['inputs_digest']}"]
        assert serve["avoided"] is False and serve["steps_run"] + serve["steps_cached"] > 0
        image = _inspect(serve["ref"])
        assert image["Config"]["Labels"]["io.imagebuild.parent"] == engine["image_id"]
        # the serve image is the pulled engine's layers plus its own
        engine_layers = pulled["RootFS"]["Layers"]
        assert image["RootFS"]["Layers"][:len(engine_layers)] == engine_layers
        assert len(image["RootFS"]["Layers"]) > len(engine_layers)

        # an engine with other inputs (relabelled here) is refused, and nothing built
        ctx = tmp_path / "tampered"
        ctx.mkdir()
        (ctx / "Dockerfile").write_text(
            f"FROM {engine_ref}\nLABEL io.imagebuild.inputs={'0' * 64}\n")
        tampered = f"{reg.host}/{repo}:tampered"
        made.append(tampered)
        assert _docker("build", "--network", "host", "-t", tampered,
                       str(ctx)).returncode == 0
        pushed = _docker("push", tampered, config=config)
        assert pushed.returncode == 0, pushed.stderr
        tampered_ref = (f"{reg.host}/{repo}@"
                        + re.search(r"digest: (sha256:[0-9a-f]{64})", pushed.stdout)[1])
        _docker("rmi", tampered)  # a runner that never had it
        c = tmp_path / "runner-c"
        code = main(["build", "--matrix", str(second), "--tag", TAG, "--target", "cpu",
                     "--engine-image", tampered_ref, "--out", str(c)])
        out, err = capsys.readouterr()
        assert code == 2, out + err
        assert "is not the cpu/dflashfix engine this checkout builds" in err
        assert "0000000000000000" in err and "Traceback" not in err
        assert "[serve]" not in out and not (c / "records").exists()
        assert _inspect(tampered_ref) is None  # refused, and not left behind
        assert _inspect(engine_ref)["Id"] == engine["image_id"]  # untouched

        # a tag names no fixed content: refused before anything happens
        code = main(["build", "--tag", TAG, "--target", "cpu", "--engine-image",
                     f"{reg.host}/{repo}:inputs-{engine['inputs_digest']}",
                     "--out", str(tmp_path / "runner-d")])
        assert code == 2 and "is not REPOSITORY@sha256" in capsys.readouterr().err
        assert not (tmp_path / "runner-d").exists()
    finally:
        for tag in made:
            _docker("rmi", tag)
        # leave this engine as later tests expect it: base and engine found by their inputs
        capsys.readouterr()
        main(["build", "--tag", TAG, "--target", "cpu", "--engine-only",
              "--out", str(tmp_path / "restore")])
        capsys.readouterr()
