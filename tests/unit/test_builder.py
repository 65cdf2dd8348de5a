"""Builder logic without a daemon: one-line failures, step counting, inputs digests."""

from __future__ import annotations

import shutil

import pytest

from imagebuild.builder import builder
from imagebuild.errors import OperationFailed
from imagebuild.render import Rendered
from tests.support.memengine import MemoryEngine, image_doc, installed


def test_missing_engine_is_one_line_with_fix(tmp_path):
    import docker

    from imagebuild.docker import Engine

    # the real seam on a socket nothing listens on: its error, not a double's
    nowhere = Engine(docker.DockerClient(base_url=f"unix://{tmp_path}/no-daemon.sock",
                                         version="1.41"))
    with installed(nowhere), pytest.raises(OperationFailed) as info:
        builder.preflight_engine()
    assert "no Docker engine answers" in info.value.message
    assert "scripts/setup.sh" in info.value.fix


def test_old_engine_without_buildkit(memory_engine):
    memory_engine.server = {"ServerVersion": "17.06.0", "DockerRootDir": "/"}
    with pytest.raises(OperationFailed, match="has no usable BuildKit"):
        builder.preflight_engine()


def test_not_enough_disk(tmp_path, monkeypatch):
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(builder.shutil, "disk_usage",
                        lambda _: usage._replace(free=3 * 2**30))
    need = builder.disk_need("wheel", "engine", prefix_cached=False)
    with pytest.raises(OperationFailed) as info:
        builder.check_disk(str(tmp_path), need, "the cpu engine build")
    assert "only 3.0 GiB free" in info.value.message and "prune" in info.value.fix
    assert "the cpu engine build needs about 8 GiB" in info.value.message
    # the same disk is enough once the pip layers are cached (a patch-only change)
    builder.check_disk(str(tmp_path), builder.disk_need("wheel", "engine", prefix_cached=True),
                       "the cpu engine build")
    builder.check_disk(str(tmp_path), builder.disk_need("wheel", "serve", False), "serve")


def test_buildkit_flavour_without_buildx(tmp_path, memory_engine):
    memory_engine.server = {"ServerVersion": "20.10.24", "DockerRootDir": str(tmp_path)}
    memory_engine.buildx = False
    assert builder.preflight_engine() == ("buildkit", str(tmp_path))


def test_prefix_digest_ignores_the_patch_series(tmp_path):
    ctx = tmp_path / "ctx"
    (ctx / "files").mkdir(parents=True)
    (ctx / "patches").mkdir()
    (ctx / "files" / "requirements.txt").write_text("torch==2.9.1\n")
    (ctx / "patches" / "a.patch").write_text("one")
    text = ("FROM base\nCOPY files/requirements.txt /r.txt\nRUN pip install -r /r.txt\n"
            "COPY patches/ /p/\nRUN apply /p/a.patch\n")
    r = Rendered("engine", "e.Dockerfile", text, ())
    before = builder.prefix_digest(r, ctx, "parent")
    assert before is not None
    (ctx / "patches" / "a.patch").write_text("two")
    (ctx / "patches" / "b.patch").write_text("new")
    patched = Rendered("engine", "e.Dockerfile", text + "RUN apply /p/b.patch\n", ())
    assert builder.prefix_digest(patched, ctx, "parent") == before
    assert builder.prefix_digest(r, ctx, "other-parent") != before
    (ctx / "files" / "requirements.txt").write_text("torch==2.10.0\n")
    assert builder.prefix_digest(r, ctx, "parent") != before
    assert builder.prefix_digest(Rendered("serve", "s", "FROM e\n", ()), ctx, "p") is None


PLAIN_PROGRESS = """#1 [internal] load build definition from Dockerfile
#1 DONE 0.0s
#4 [1/4] FROM docker.io/library/base
#4 CACHED
#5 [2/4] COPY files/requirements.txt /opt/imagebuild/requirements.txt
#5 CACHED
#6 [3/4] RUN pip install -r /opt/imagebuild/requirements.txt
#6 0.512 Collecting x
#6 DONE 12.3s
#7 [stage-1 4/4] RUN chmod 0755 /usr/local/bin/vllm
#7 DONE 0.4s
#8 exporting to image
#8 DONE 0.1s
"""


def test_step_counting_from_plain_progress(tmp_path, memory_engine):
    memory_engine.build_output = PLAIN_PROGRESS  # replayed instead of a build
    b = builder.Builder.__new__(builder.Builder)
    b.log = lambda _: None
    run, cached, tail = b._stream(["build", "."], tmp_path / "log.txt", "engine")
    assert (run, cached) == (2, 1)  # FROM resolves an image: not a step
    assert (tmp_path / "log.txt").read_text() == PLAIN_PROGRESS
    assert "exporting to image" in tail


def test_inputs_digest_tracks_every_input(tmp_path):
    ctx = tmp_path / "ctx"
    (ctx / "files").mkdir(parents=True)
    (ctx / "files" / "a.txt").write_text("one")
    r = Rendered("engine", "x.Dockerfile", "FROM base\n", ())
    base = builder.inputs_digest(r, ctx, {"A": "1"}, "parent", [{"k": 1}])
    assert base == builder.inputs_digest(r, ctx, {"A": "1"}, "parent", [{"k": 1}])
    (ctx / "files" / "a.txt").write_text("two")
    changed_file = builder.inputs_digest(r, ctx, {"A": "1"}, "parent", [{"k": 1}])
    assert changed_file != base
    assert builder.inputs_digest(r, ctx, {"A": "2"}, "parent", [{"k": 1}]) != changed_file
    assert builder.inputs_digest(r, ctx, {"A": "1"}, "other", [{"k": 1}]) != changed_file
    assert builder.inputs_digest(r, ctx, {"A": "1"}, "parent", [{"k": 2}]) != changed_file
    r2 = Rendered("engine", "x.Dockerfile", "FROM base\nRUN true\n", ())
    assert builder.inputs_digest(r2, ctx, {"A": "1"}, "parent", [{"k": 1}]) != changed_file


def test_build_command_without_engine_exits_1(tmp_path, memory_engine, monkeypatch, capsys):
    from imagebuild.cli import main

    memory_engine.answers = False  # no engine answers; no image exists
    import imagebuild.builder.bootstrap as bootstrap
    monkeypatch.setattr(bootstrap, "ensure_base_image", lambda *a, **k: "sha256:0")
    code = main(["build", "--tag", "2026-06-18-dflashfix", "--target", "cpu",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 1
    assert "no Docker engine answers" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "records").exists()


def test_a_source_engine_build_needs_an_engine_that_takes_run_network(tmp_path, memory_engine):
    """The offline compile's `RUN --network=none` is parsed by dockerd's built-in Dockerfile
    frontend: 20.10 rejects it (buildx or not), so a source engine is refused up front."""
    from imagebuild import REPO_ROOT

    memory_engine.buildx = True
    gb10 = (REPO_ROOT / "rendered/gb10/dflashfix/engine.Dockerfile").read_text()
    cpu = (REPO_ROOT / "rendered/cpu/dflashfix/engine.Dockerfile").read_text()
    assert builder.uses_run_network(gb10) and not builder.uses_run_network(cpu)
    memory_engine.server = {"ServerVersion": "20.10.24", "DockerRootDir": str(tmp_path)}
    with pytest.raises(OperationFailed) as info:
        builder.preflight_engine(run_network=True)
    assert "20.10.24 cannot build a source engine" in info.value.message
    assert "Docker Engine 23.0 or newer" in info.value.fix
    assert builder.preflight_engine() == ("buildx", str(tmp_path))  # a wheel engine builds
    memory_engine.server = {"ServerVersion": "27.5.1", "DockerRootDir": str(tmp_path)}
    assert builder.preflight_engine(run_network=True) == ("buildx", str(tmp_path))


def _built_engine(double: MemoryEngine, tmp_path, version="20.10.24") -> MemoryEngine:
    """The Docker seam's double: an image with the inputs "d"*64 exists already; every
    build makes the image "1"*64 (each build is kept in `.builds`)."""
    double.server = {"ServerVersion": version, "DockerRootDir": str(tmp_path)}
    double.build_id = "sha256:" + "1" * 64
    double.add_image(image_doc("sha256:" + "0" * 64), f"{builder.INPUTS_REPO}:{'d' * 64}")
    return double


def _cpu_builder(tmp_path, **kw):
    from imagebuild import REPO_ROOT
    from imagebuild.lock.lockfile import read_lock
    from imagebuild.spec import matrix as mx

    lm = mx.load(REPO_ROOT / "matrix.yaml")
    b = builder.Builder(lm, read_lock(lm.root), out_dir=tmp_path / "out", ca_bundle="",
                        hf_token="", **kw)
    b.log = lambda _: None
    return b


def test_no_cache_rebuilds_an_image_whose_inputs_are_built(tmp_path, monkeypatch,
                                                           memory_engine):
    """`build --no-cache` (a reproducibility check) runs the build an image found by its
    inputs digest would skip, and tells BuildKit not to use its layer cache either."""
    built = _built_engine(memory_engine, tmp_path)
    monkeypatch.setattr(builder, "check_disk", lambda *a: None)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    pending = builder.Pending("base", Rendered("base", "b", "FROM x\n", ()), ctx,
                              "imagebuild/base-cpu:abc", {}, None, [], "d" * 64)
    for no_cache in (False, True):
        record = _cpu_builder(tmp_path, no_cache=no_cache)._build_one(pending)
        assert record.avoided is not no_cache
    assert len(built.builds) == 1 and "--no-cache" in built.builds[0].argv
    assert record.image_id == "sha256:" + "1" * 64


@pytest.mark.parametrize("version,config_epoch", [("20.10.24", False), ("23.0.6", True)])
def test_one_build_time_for_context_label_and_config(tmp_path, monkeypatch, version,
                                                    config_epoch, memory_engine):
    """SOURCE_DATE_EPOCH: the context's files clamped to it (a COPY keeps their mtimes),
    a label on every image, and the build arg only where BuildKit reads it (Docker 23+);
    never part of the inputs digest, so build avoidance is unchanged across commits."""
    built = _built_engine(memory_engine, tmp_path, version)
    monkeypatch.setattr(builder, "check_disk", lambda *a: None)
    monkeypatch.setattr(builder, "_find_by_inputs", lambda d: None)
    ctx = tmp_path / "ctx"
    (ctx / "model").mkdir(parents=True)
    (ctx / "model" / "config.json").write_text("{}")
    rendered = Rendered("serve", "s", "FROM x\nCOPY model/ /model/\n", ())
    digests = set()
    for epoch in ("1700000000", "1800000000"):
        monkeypatch.setenv("SOURCE_DATE_EPOCH", epoch)
        b = _cpu_builder(tmp_path)
        p = b._pending("serve", rendered, ctx, "r:t", {}, None, [])
        digests.add(p.digest)
        b._build_one(p)
        argv = built.builds[-1].argv
        assert f"io.imagebuild.source-date-epoch={epoch}" in argv
        assert (f"SOURCE_DATE_EPOCH={epoch}" in argv) is config_epoch
        assert (ctx / "model" / "config.json").stat().st_mtime <= int(epoch)
        assert (ctx / "model").stat().st_mtime <= int(epoch)
    assert len(digests) == 1


def test_no_cache_with_push_exits_2_before_anything(tmp_path, capsys):
    """--push takes an engine the registry holds: a forced rebuild cannot go with it."""
    from imagebuild.cli import main

    out = tmp_path / "out"
    assert main(["build", "--tag", "2026-06-18-dflashfix", "--target", "cpu", "--out",
                 str(out), "--engine-only", "--push", "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert "--no-cache rebuilds here" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("context", ["default", "spark-local"])
def test_buildx_builds_name_the_contexts_docker_driver_builder(tmp_path, monkeypatch, context,
                                                               memory_engine):
    """A runner whose current buildx builder is a docker-container one (`buildx create
    --use`) cannot see the base built into the daemon: every build names the active
    context's docker-driver builder (issue 33, point 5)."""
    import subprocess

    built = _built_engine(memory_engine, tmp_path)
    built.buildx = True
    monkeypatch.setattr(builder, "check_disk", lambda *a: None)
    real_run = subprocess.run

    def run(cmd, *a, **kw):
        if cmd[1:] == ["context", "show"]:
            return subprocess.CompletedProcess(cmd, 0, stdout=f"{context}\n", stderr="")
        return real_run(cmd, *a, **kw)

    monkeypatch.setattr(builder.subprocess, "run", run)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    pending = builder.Pending("base", Rendered("base", "b", "FROM x\n", ()), ctx,
                              "imagebuild/base-cpu:abc", {}, None, [], "d" * 64)
    _cpu_builder(tmp_path, no_cache=True)._build_one(pending)
    assert built.builds[-1].argv[:5] == ["buildx", "build", "--builder", context, "--load"]
