"""The engine handoff's plumbing without a daemon (a double of the Docker seam): digest
references, the $GITHUB_OUTPUT lines, digests runners agree on, and `--engine-image`:
the pulled engine is used only when its inputs label is this checkout's, and then only
the serve layers are built. The real thing: tests/e2e/test_engine_handoff_e2e.py."""

from __future__ import annotations

import re
from typing import Any

import pytest

from imagebuild import REPO_ROOT
from imagebuild.builder import bootstrap, builder, downloads, enginepull, engineship
from imagebuild.cli import main
from imagebuild.errors import UserError
from imagebuild.lock.lockfile import read_lock
from imagebuild.render import Rendered
from imagebuild.spec import matrix as mx
from imagebuild.spec.names import INPUTS_LABEL
from tests.support.memengine import SM121A_TABLE

TAG = "2026-06-18-dflashfix"
DIGEST = "sha256:" + "ab" * 32
REF = f"registry.example:5000/team/engine-cpu-dflashfix@{DIGEST}"


def test_engine_refs_must_carry_a_digest():
    image, digest = enginepull.parse_engine_ref(REF + "\n")
    assert (image.registry, image.repository, digest) == (
        "registry.example:5000", "team/engine-cpu-dflashfix", DIGEST)
    for bad in ("registry.example:5000/team/engine-cpu-dflashfix:inputs-" + "ab" * 32,
                "registry.example:5000/team/engine:v1@" + DIGEST,
                "registry.example:5000/team/engine@sha256:abc",
                "team/engine@" + DIGEST, "", "@" + DIGEST):
        with pytest.raises(UserError):
            enginepull.parse_engine_ref(bad)


@pytest.mark.parametrize("argv, says", [
    (["--push"], "--push goes with --engine-only"),
    (["--engine-only", "--engine-image", REF], "--engine-only builds the engine"),
    (["--engine-image", "registry.example/team/engine:latest"], "is not REPOSITORY@sha256"),
])
def test_build_options_that_do_not_fit_exit_2_before_anything(argv, says, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["build", "--tag", TAG, "--target", "cpu", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert not out.exists()


def test_the_handoff_goes_to_a_file_and_to_github_output(tmp_path):
    gh = tmp_path / "gh-output"
    gh.write_text("earlier=1\n")
    engineship.write_handoff(tmp_path / "out", {"cpu": REF}, {"GITHUB_OUTPUT": str(gh)})
    assert (tmp_path / "out" / "engines" / "cpu.ref").read_text() == REF + "\n"
    assert gh.read_text() == f"earlier=1\nengine_image={REF}\n"
    engineship.write_handoff(tmp_path / "two", {"cpu": REF, "gb10": REF + "x"},
                          {"GITHUB_OUTPUT": str(gh)})
    assert gh.read_text().splitlines()[-2:] == [f"engine_image_cpu={REF}",
                                               f"engine_image_gb10={REF}x"]
    engineship.write_handoff(tmp_path / "local", {"cpu": REF}, {})  # no workflow: file only
    assert (tmp_path / "local" / "engines" / "cpu.ref").exists()


def test_runners_agree_on_an_engine_digest_whatever_their_memory(tmp_path):
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    r = Rendered("engine", "e.Dockerfile", "FROM base\nARG MAX_JOBS\n", ())
    small = builder.inputs_digest(r, ctx, {"BASE_IMAGE": "b", "MAX_JOBS": "4",
                                           "NVCC_THREADS": "1"}, "p", [])
    big = builder.inputs_digest(r, ctx, {"BASE_IMAGE": "b", "MAX_JOBS": "20",
                                         "NVCC_THREADS": "2"}, "p", [])
    assert small == big
    assert builder.inputs_digest(r, ctx, {"BASE_IMAGE": "c", "MAX_JOBS": "4"}, "p", []) != small


def _image(image_id: str, labels: dict[str, str], layers: list[str]) -> dict[str, Any]:
    return {"Id": image_id, "Size": 7, "RootFS": {"Layers": layers},
            "Config": {"Labels": labels, "Env": ["PATH=/usr/bin"], "Cmd": ["/bin/bash"]}}


@pytest.fixture
def seam(tmp_path, monkeypatch, memory_engine):
    """The Docker seam's double: images in memory, a registry of pullable images, and
    BuildKit builds that record their arguments and write an image id."""
    monkeypatch.setattr(bootstrap, "ensure_base_image", lambda *a, **k: "sha256:upstream")
    memory_engine.server = {"ServerVersion": "27.0", "DockerRootDir": str(tmp_path)}
    memory_engine.probe_answer = (0, SM121A_TABLE)  # the GPU-code table
    # the bootstrapped upstream base: its content, not its id, is what digests see
    memory_engine.add_image(_image("sha256:" + "1" * 64, {}, ["sha256:rootfs"]),
                            bootstrap.DEFAULT_BASE_REF)
    return memory_engine


def _cell_and_builder(tmp_path):
    lm = mx.load(None)
    cell = next(c for c in mx.expand(lm) if c.id == "cpu/cpu-tiny-ngram"
                and c.engine_name == "dflashfix")
    return cell, builder.Builder(lm, read_lock(lm.root), out_dir=tmp_path / "out",
                                 log=lambda _: None, ca_bundle="", hf_token="")


def test_a_reimported_base_keeps_its_digest(seam, tmp_path):
    cell, b = _cell_and_builder(tmp_path)
    before = b.engine_digest(cell)
    # the same rootfs imported again on another runner: another image id and time
    seam.images_by_ref[bootstrap.DEFAULT_BASE_REF] = {
        **_image("sha256:" + "2" * 64, {}, ["sha256:rootfs"]), "Created": "tomorrow"}
    assert b.engine_digest(cell) == before
    seam.images_by_ref[bootstrap.DEFAULT_BASE_REF] = _image("sha256:" + "3" * 64, {},
                                                            ["sha256:other-rootfs"])
    assert b.engine_digest(cell) != before  # other content: another engine
    assert builder.upstream_identity("any/image", "sha256:" + "c" * 64) == "sha256:" + "c" * 64


def test_engine_image_is_pulled_verified_and_only_serve_is_built(seam, tmp_path):
    cell, b = _cell_and_builder(tmp_path)
    want = b.engine_digest(cell)
    engine_id = "sha256:" + "e" * 64
    seam.pullable[REF] = _image(
        engine_id, {INPUTS_LABEL: want}, ["sha256:rootfs", "sha256:engine"])
    records = b.build_cell(cell, "registry.example:5000/team/cpu-tiny-ngram:rel", REF)
    assert [r.kind for r in records] == ["engine", "serve"]  # no base, no engine build
    engine, serve = records
    assert engine.pulled_from == REF and engine.image_id == engine_id and engine.avoided
    local = f"imagebuild/engine-cpu-dflashfix:{want[:16]}"
    tags = seam.called("tag")
    assert (engine_id, local) in tags and (engine_id, f"imagebuild/inputs:{want}") in tags
    assert len(seam.builds) == 1  # the serve image, FROM the pulled engine's local tag
    argv = seam.builds[0].argv
    assert f"ENGINE_IMAGE={local}" in argv and f"io.imagebuild.parent={engine_id}" in argv
    assert not serve.avoided
    written = sorted(p.name for p in (tmp_path / "out" / "records" / "cpu" / "dflashfix")
                     .iterdir())
    assert written == ["cpu-tiny-ngram.json", "engine.json"]


def test_an_engine_of_other_inputs_is_refused_and_leaves_nothing(seam, tmp_path):
    cell, b = _cell_and_builder(tmp_path)
    seam.pullable[REF] = _image("sha256:" + "f" * 64, {INPUTS_LABEL: "0" * 64},
                                ["sha256:rootfs", "sha256:engine"])
    with pytest.raises(UserError) as info:
        b.build_cell(cell, "registry.example:5000/team/cpu-tiny-ngram:rel", REF)
    assert re.search(r"is not the cpu/dflashfix engine this checkout builds: its "
                     r"io.imagebuild.inputs label is 0{16}", info.value.message)
    assert "--engine-image" in (info.value.fix or "")
    assert seam.builds == [] and seam.called("tag") == []  # nothing built, nothing tagged
    assert seam.called("remove_image") == [REF]  # the pull brought it in: it goes again
    seam.pullable[REF] = _image("sha256:" + "f" * 64, {}, [])  # no label at all
    with pytest.raises(UserError, match=r"label is \(missing\)"):
        b.build_cell(cell, "registry.example:5000/team/cpu-tiny-ngram:rel", REF)


def test_one_engine_image_for_one_engine(tmp_path):
    from imagebuild.plan import load_plan

    plan = load_plan(None, TAG, "all")
    with pytest.raises(UserError, match="--engine-image is one engine, but these cells use 2"):
        builder.build_jobs(plan.lm, plan.lock, plan.jobs, out_dir=tmp_path, engine_image=REF)


def test_a_wheel_engine_build_drops_its_download_stage_and_nothing_else(seam, tmp_path):
    """After the cpu (wheel) engine is built, BuildKit's records of its ~3 GB download step
    go (found by the download script the step runs); the install layers, another
    engine's steps, and a record a running build uses stay (imagebuild/builder/downloads.py)."""
    def rec(rid, what, size, in_use=False):
        return {"ID": rid, "Description": f"mount / from exec /bin/sh -c {what}",
                "Size": size, "InUse": in_use, "Shared": False, "Type": "regular"}
    seam.build_records = [
        rec("wheels023", f"python3 {downloads.MARK} /tmp/reqs.txt /wheels", 3_000_000_000),
        rec("wheels032", f"python3 {downloads.MARK} /tmp/r.txt /wheels", 3_100_000_000),
        rec("busy", f"python3 {downloads.MARK} /tmp/r.txt /wheels", 5, in_use=True),
        rec("install", "pip install --no-deps --no-index --find-links /wheels", 1_000_000_000),
        rec("copy", "COPY files/download-wheels.py /opt/imagebuild/", 10)]
    cell, b = _cell_and_builder(tmp_path)
    said: list[str] = []
    b.log = said.append
    b.build_engine(cell)
    assert [r["ID"] for r in seam.build_records] == ["busy", "install", "copy"]
    assert seam.called("prune_build_cache") == ["wheels023", "wheels032"]
    assert any("dropped the wheel downloads (6.1 GB)" in line for line in said), said
    # nothing more to drop: no line, no prune
    said.clear()
    assert downloads.drop_download_stages(seam, said.append) == 0 and not said


def test_the_engine_template_runs_the_download_script_in_its_wheels_stage_only():
    """downloads.MARK is how the records are found: the rendered cpu engines' wheels stage
    runs it, and no later stage's step names it (those are the install layers)."""
    for engine in ("dflashfix", "vllm032"):
        text = (REPO_ROOT / "rendered" / "cpu" / engine / "engine.Dockerfile").read_text()
        stages = text.split("\nFROM ")
        runs = [i for i, stage in enumerate(stages) if downloads.MARK in stage]
        assert runs == [1] and stages[1].startswith("${BASE_IMAGE} AS wheels"), engine
