"""`build.py runner-clean` on the real Docker engine and a real registry (slow; heavy lock).

Small base -> engine -> serve chains are built FROM the cpu base under a target name of
their own (so no other image on this engine is in scope), four releases are published,
latest is rolled back, and the command must keep the newest release, latest and its
rollback target with everything they were built from, remove the oldest release's chain
and its inputs tags, leave an image a user tagged, and keep BuildKit's cache mounts.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from imagebuild.builder.bootstrap import DEFAULT_BASE_REF, ensure_base_image
from imagebuild.cli import main
from imagebuild.registry.client import Credentials
from imagebuild.registry.records import read_release
from imagebuild.release.latest import Accept, advance, set_latest
from imagebuild.release.publish import publish
from imagebuild.spec.tags import parse_release_tag
from tests.e2e.test_publish import PINS, verdict
from tests.support.registry import docker_login, running_registry

# it checks that nothing outside its scope on the whole engine was touched: no test of the
# other lane makes or removes images meanwhile (tests/support/lanes.py)
pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(1200)]
DOCKER = "/usr/bin/docker"
R = [f"2026-06-0{d}-v0.23.0-dflashfix" for d in (1, 2, 3, 4)]


def _docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True,
                          env={**os.environ, "DOCKER_BUILDKIT": "1"})


def _exists(ref: str) -> bool:
    return _docker("image", "inspect", ref).returncode == 0


def _all_images(*, but_inputs_only: bool = False) -> set[str]:
    """Ids of the engine's images; optionally without those only an inputs tag names
    (runner-clean drops those tags wherever they are: they keep nothing alive)."""
    import docker

    images = docker.from_env().images.list()
    return {i.id for i in images if not (but_inputs_only and i.tags and all(
        t.startswith("imagebuild/inputs:") for t in i.tags))}


class Chains:
    """Builds tagged images and remembers every tag, for the assertions and cleanup."""

    def __init__(self, tmp: Path, base: str):
        self.tmp, self.base, self.tags = tmp, base, []

    def build(self, name: str, parent: str, run: str, tags: list[str]) -> str:
        ctx = self.tmp / name
        ctx.mkdir()
        (ctx / "Dockerfile").write_text(f"FROM {parent}\nRUN {run}\n")
        inputs = f"imagebuild/inputs:{uuid.uuid4().hex}{uuid.uuid4().hex}"
        cmd = ["build", "--network", "host", "--iidfile", str(ctx / "iid")]
        if parent != self.base:  # the lineage label build.py sets
            cmd += ["--label", f"io.imagebuild.parent={self._id(parent)}"]
        for tag in [*tags, inputs]:
            cmd += ["-t", tag]
        proc = _docker(*cmd, str(ctx))
        assert proc.returncode == 0, proc.stderr[-2000:]
        self.tags += [*tags, inputs]
        return (ctx / "iid").read_text().strip()

    @staticmethod
    def _id(ref: str) -> str:
        return _docker("image", "inspect", "-f", "{{.Id}}", ref).stdout.strip()

    def inputs_of(self, image_id: str) -> list[str]:
        tags = json.loads(_docker("image", "inspect", "-f", "{{json .RepoTags}}",
                                  image_id).stdout or "[]")
        return [t for t in tags if t.startswith("imagebuild/inputs:")]

    def cleanup(self) -> None:
        for tag in self.tags:
            _docker("rmi", tag)


def _matrix(matrix_dir: Path, target: str, registry: str) -> Path:
    """The real matrix with the cpu target renamed, publishing to the test registry."""
    path = matrix_dir / "matrix.yaml"
    data = yaml.safe_load(path.read_text())
    data["publish"].update(registry=registry, namespace="rctest")
    data["targets"][target] = data["targets"].pop("cpu")
    for engine in data["engines"].values():
        engine["realize"][target] = engine["realize"].pop("cpu")
    data["models"]["tiny"]["targets"] = [target]
    data["drafters"]["ngram"]["targets"] = [target]
    data["profiles"]["cpu-ngram"]["target"] = target
    data["images"]["cpu"]["target"] = target
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_runner_clean_keeps_by_release_age_and_never_the_cache(
        docker_engine, matrix_dir, tmp_path, monkeypatch, capsys):
    ensure_base_image(DEFAULT_BASE_REF, workdir=tmp_path / "boot")
    target = f"rc{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("IMAGEBUILD_LOCK_DIR", str(tmp_path / "locks"))
    with running_registry() as reg:
        monkeypatch.setenv("DOCKER_CONFIG", str(docker_login(reg)))
        matrix = _matrix(matrix_dir, target, reg.host)
        serve = f"{reg.host}/rctest/cpu-tiny-ngram"
        base, engine = f"imagebuild/base-{target}", f"imagebuild/engine-{target}-dflashfix"
        c = Chains(tmp_path, DEFAULT_BASE_REF)
        try:
            stamp = f"stamp-{target}"
            # chain 0 (release R0 only), with a cache mount and a user's own tag on its base
            b0 = c.build("b0", DEFAULT_BASE_REF,
                         f"--mount=type=cache,id={target},target=/c echo {stamp} > /c/stamp "
                         "&& echo b0 > /b", [f"{base}:b0", f"user/{target}:mine"])
            e0 = c.build("e0", f"{base}:b0", "echo e0 > /e", [f"{engine}:e0"])
            s0 = c.build("s0", f"{engine}:e0", "echo r0 > /s", [f"{serve}:{R[0]}"])
            # chain 1 (R1, R2) and chain 2 (R3)
            b1 = c.build("b1", DEFAULT_BASE_REF, "echo b1 > /b", [f"{base}:b1"])
            e1 = c.build("e1", f"{base}:b1", "echo e1 > /e", [f"{engine}:e1"])
            s1 = c.build("s1", f"{engine}:e1", "echo r1 > /s", [f"{serve}:{R[1]}"])
            s2 = c.build("s2", f"{engine}:e1", "echo r2 > /s", [f"{serve}:{R[2]}"])
            b2 = c.build("b2", DEFAULT_BASE_REF, "echo b2 > /b", [f"{base}:b2"])
            e2 = c.build("e2", f"{base}:b2", "echo e2 > /e", [f"{engine}:e2"])
            s3 = c.build("s3", f"{engine}:e2", "echo r3 > /s", [f"{serve}:{R[3]}"])
            orphan = c.build("orphan", DEFAULT_BASE_REF, "echo orphan > /o", [])
            gone_inputs = c.inputs_of(s0) + c.inputs_of(e0) + c.inputs_of(b0)
            client = reg.client()
            creds = Credentials(reg.user, reg.password)
            for tag, image_id in zip(R, (s0, s1, s2, s3), strict=True):
                ref, rtag = f"{serve}:{tag}", parse_release_tag(tag)
                publish(client, "rctest/cpu-tiny-ngram", local_ref=ref, release_tag=rtag,
                        verdict=verdict(image_id, ref), pins=PINS, credentials=creds,
                        log=lambda _: None, settle=0.05)
                advance(client, "rctest/cpu-tiny-ngram", rtag, log=lambda _: None,
                        settle=0.05)
            set_latest(client, "rctest/cpu-tiny-ngram", R[2], log=lambda _: None,
                       accept=Accept(unmeasured="test releases are not benched"))
            assert read_release(client, "rctest/cpu-tiny-ngram", "latest").annotations[
                "io.imagebuild.release.tag"] == R[2]
            others = (_all_images(but_inputs_only=True)
                      - {b0, e0, s0, b1, e1, s1, s2, b2, e2, s3, orphan})

            assert main(["runner-clean", "--matrix", str(matrix), "--keep", "1",
                         "--dry-run"]) == 0
            dry = capsys.readouterr().out
            assert f"keep release {R[3]} (newest 1)" in dry
            assert f"keep release {R[2]} (latest)" in dry
            assert f"keep release {R[1]} (rollback target)" in dry
            assert f"drop release {R[0]}" in dry and "would remove" in dry
            assert all(_exists(t) for t in c.tags)  # a dry run removes nothing

            assert main(["runner-clean", "--matrix", str(matrix), "--keep", "1"]) == 0
            out = capsys.readouterr().out
            assert "BuildKit cache mounts kept" in out
            # the oldest release, its engine and base, and their inputs tags are gone
            for ref in (f"{serve}:{R[0]}", f"{engine}:e0", f"{base}:b0", *gone_inputs):
                assert not _exists(ref), (ref, out)
            assert not _exists(s0) and not _exists(e0)
            assert _exists(f"user/{target}:mine") and _exists(b0)  # a user's tag keeps it
            # newest, latest, rollback target and everything they were built from stay
            for ref in (f"{serve}:{R[1]}", f"{serve}:{R[2]}", f"{serve}:{R[3]}",
                        f"{engine}:e1", f"{engine}:e2", f"{base}:b1", f"{base}:b2"):
                assert _exists(ref), ref
            assert all(c.inputs_of(i) for i in (s1, s2, s3, e1, e2, b1, b2))
            assert not _exists(orphan)  # only an inputs tag was left on it
            assert others <= _all_images()  # nothing outside its scope was touched
            # the BuildKit cache mount written by chain 0 is still there
            ctx = tmp_path / "reader"
            ctx.mkdir()
            (ctx / "Dockerfile").write_text(
                f"FROM {DEFAULT_BASE_REF}\nARG NONCE\n"
                f"RUN --mount=type=cache,id={target},target=/c cat /c/stamp\n")
            # a new ARG value forces the RUN; --no-cache would also hand it a fresh mount
            proc = _docker("build", "--network", "host", "--progress", "plain",
                           "--build-arg", f"NONCE={uuid.uuid4().hex}", str(ctx))
            assert proc.returncode == 0 and stamp in proc.stdout + proc.stderr, proc.stderr
        finally:
            c.cleanup()
