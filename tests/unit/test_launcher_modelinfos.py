"""The engine's `vllm` launcher seeds vLLM's model-info cache from the one baked into the
image (images/engine/files/vllm-serve.py, bake-modelinfos.py): what is missing is copied,
what vLLM already has is left, a cache folder it cannot write costs only the seeding, and
both engines' images bake the cache and start vLLM through the launcher. The boot that
reads the baked cache is checked with the real engine in tests/e2e/test_cpu_build.py."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import types

import pytest

from imagebuild import REPO_ROOT

LAUNCHER = REPO_ROOT / "images" / "engine" / "files" / "vllm-serve.py"


@pytest.fixture
def launcher(monkeypatch, tmp_path):
    """The launcher loaded as a module, with a `vllm.envs` whose cache root is a temporary
    folder (the project's venv has no vLLM); its version alias is undone afterwards."""
    monkeypatch.setattr(importlib.metadata, "version", importlib.metadata.version)
    envs = types.SimpleNamespace(VLLM_CACHE_ROOT=str(tmp_path / "cache-root"))
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(envs=envs))
    monkeypatch.setitem(sys.modules, "vllm.envs", envs)
    spec = importlib.util.spec_from_file_location("vllm_serve_launcher", LAUNCHER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, tmp_path / "cache-root" / "modelinfos"


def _baked(tmp_path, names):
    baked = tmp_path / "vllm-cache" / "modelinfos"
    baked.mkdir(parents=True)
    for name in names:
        (baked / name).write_text(f'{{"hash": "{name}", "modelinfo": {{}}}}')
    return baked


def test_missing_inspections_are_copied_and_present_ones_left(launcher, tmp_path):
    module, dest = launcher
    baked = _baked(tmp_path, ["a-A.json", "b-B.json", "c-C.json"])
    dest.mkdir(parents=True)
    (dest / "b-B.json").write_text("vLLM's own")
    assert module.seed_modelinfos(baked) == 2
    assert sorted(p.name for p in dest.iterdir()) == ["a-A.json", "b-B.json", "c-C.json"]
    assert (dest / "b-B.json").read_text() == "vLLM's own"
    assert (dest / "a-A.json").read_text() == (baked / "a-A.json").read_text()
    assert module.seed_modelinfos(baked) == 0  # a restart in the same cache copies nothing


def test_no_baked_cache_is_no_seeding(launcher, tmp_path):
    module, dest = launcher
    assert module.seed_modelinfos(tmp_path / "absent") == 0
    assert not dest.exists()


def test_an_unwritable_cache_folder_is_said_and_not_fatal(launcher, tmp_path, capsys):
    module, dest = launcher
    baked = _baked(tmp_path, ["a-A.json"])
    dest.parent.parent.mkdir(parents=True, exist_ok=True)
    dest.parent.write_text("a file where the cache folder should be")
    assert module.seed_modelinfos(baked) == 0
    assert "model-info cache not seeded" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["cpu", "gb10"])
def test_every_engine_bakes_the_cache_and_starts_vllm_through_the_launcher(target):
    for path in (REPO_ROOT / "rendered" / target).glob("*/engine.Dockerfile"):
        text = path.read_text()
        bake = text.index("python /opt/imagebuild/bake-modelinfos.py /opt/imagebuild/vllm-cache")
        launcher = text.index("/opt/imagebuild/vllm-serve.py \"$@\"")
        assert launcher < bake, path
        # the bake comes after vLLM is installed in the image's final stage
        assert text.rindex("FROM ") < bake, path
