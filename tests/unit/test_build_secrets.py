"""Build secrets reach builds only as BuildKit secrets: the CA bundle, the Hub token, the
runner's pip configuration (index URLs may carry credentials) and the shared compile
cache's credentials are each a `--secret id=...,src=FILE`, and none of them appears in
the command line (no --build-arg, no --label), the environment handed to the build, the
Dockerfiles and build contexts, the logs or the build records. The real Builder runs
every build of a gb10 and a cpu cell against the Docker seam's double."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from imagebuild import pipconfig
from imagebuild.builder import builder
from imagebuild.lock.lockfile import read_lock
from imagebuild.spec import matrix as mx
from tests.support.memengine import SM121A_TABLE, MemoryEngine

CANARIES = {"hf_token": "hf_tokenCANARY41703", "pip_conf": "pipPasswordCANARY0815",
            "sccache_env": "redisPasswordCANARY4711", "ca_bundle": "caBundleCANARY1234"}
BUILD_PY_ARGS = {"BASE_IMAGE", "ENGINE_IMAGE", "MAX_JOBS", "NVCC_THREADS"}


@pytest.fixture
def built(locked: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
          memory_engine: MemoryEngine):
    """The Docker seam's double: no image exists yet, every build succeeds; each build's
    command line, environment and secret files (read while they exist) are kept."""
    path = locked / "matrix.yaml"
    path.write_text(path.read_text().replace(
        "      local_max_size: 40G\n",
        "      local_max_size: 40G\n      shared: {backend: redis, endpoint: "
        "\"redis://cache.lan:6379/0\"}\n"))
    bundle = tmp_path / "ca.pem"
    bundle.write_text(f"# {CANARIES['ca_bundle']}\n")
    monkeypatch.setenv("HF_TOKEN", CANARIES["hf_token"])
    monkeypatch.setenv("PIP_INDEX_URL", f"https://ci:{CANARIES['pip_conf']}@mirror.invalid/simple")
    monkeypatch.setenv("SCCACHE_REDIS_PASSWORD", CANARIES["sccache_env"])
    monkeypatch.setenv("IMAGEBUILD_CA_BUNDLE", str(bundle))
    monkeypatch.delenv("IMAGEBUILD_SCCACHE_ENV_FILE", raising=False)
    pipconfig.pip_indexes.cache_clear()
    memory_engine.server = {"ServerVersion": "20.10.24", "DockerRootDir": str(tmp_path)}
    memory_engine.probe_answer = (0, SM121A_TABLE)
    monkeypatch.setattr(builder, "check_disk", lambda *a: None)
    import imagebuild.builder.bootstrap as bootstrap
    monkeypatch.setattr(bootstrap, "ensure_base_image", lambda *a, **k: "sha256:0")
    lm = mx.load(path)
    cells = mx.expand(lm)
    out = tmp_path / "out"
    logs: list[str] = []
    b = builder.Builder(lm, read_lock(lm.root), out_dir=out, log=logs.append)
    for image in ("spark-heretic-aeon", "cpu-tiny-ngram"):
        cell = next(c for c in cells if c.image == image and c.engine_name == "dflashfix")
        b.build_cell(cell, f"127.0.0.1:5000/vllm-spark/{image}:t")
    pipconfig.pip_indexes.cache_clear()
    return [asdict(b) for b in memory_engine.builds], out, logs


def _values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_every_build_gets_the_secrets_as_buildkit_secrets_only(built):
    builds, out, logs = built
    assert len(builds) == 6  # base, engine and serve of each cell
    engines = [b for b in builds if any("engine-" in a for a in _values(b["argv"], "-t"))]
    assert len(engines) == 2
    for b in builds:
        argv = b["argv"]
        assert set(b["secrets"]) == set(CANARIES)  # every build: the same four ids
        assert CANARIES["ca_bundle"] in b["secrets"]["ca_bundle"]
        assert b["secrets"]["hf_token"] == CANARIES["hf_token"]
        assert {v.split("=", 1)[0] for v in _values(argv, "--build-arg")} <= BUILD_PY_ARGS
        for secret in CANARIES.values():
            assert not any(secret in a for a in argv), f"{secret} on the command line"
            assert not any(secret in v for v in b["env"].values()), f"{secret} in the env"
        assert all("secret" not in v.lower() for v in _values(argv, "--label"))
    # the runner's package indexes go to every engine build; the compile cache's
    # credentials to the source (gb10) engine, whose target shares a cache
    for b in engines:
        assert CANARIES["pip_conf"] in b["secrets"]["pip_conf"]
    gb10 = next(b for b in engines if any("gb10" in a for a in _values(b["argv"], "-t")))
    assert all(b["secrets"]["sccache_env"] == "" for b in builds if b is not gb10)
    assert f"SCCACHE_REDIS_PASSWORD={CANARIES['sccache_env']}" in gb10["secrets"]["sccache_env"]


def test_no_secret_is_written_to_a_dockerfile_context_log_or_record(built):
    builds, out, logs = built
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "Dockerfile" for p in files) and any(
        p.suffix == ".log" for p in files) and any(p.suffix == ".json" for p in files)
    for path in files:
        text = path.read_bytes().decode(errors="replace")
        for name, secret in CANARIES.items():
            assert secret not in text, f"the {name} secret is in {path.relative_to(out)}"
    said = "\n".join(logs)
    assert not any(secret in said for secret in CANARIES.values())
    records = [json.loads(p.read_text()) for p in (out / "records").rglob("*.json")]
    assert len(records) == 6 and all("kind" in r for r in records)
