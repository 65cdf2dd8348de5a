"""The rendered gb10 engine and serve Dockerfiles against the defects of issue 11.

Each test reads the real rendered text (no Docker); the slow conformance tests
(tests/conformance) hold the same files against the pinned vLLM source itself.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from imagebuild.builder import builder
from imagebuild.errors import OperationFailed, UserError
from imagebuild.lock.lockfile import read_lock
from imagebuild.lock.resolve import build_lock, verify_cells
from imagebuild.render import SERVE_USER, VLLM_PATHS, render_engine, render_serve
from imagebuild.spec import matrix as mx

DIGEST = "sha256:" + "ab" * 32
RUNTIME_DIGEST = "sha256:" + "cd" * 32


def logical_lines(text: str) -> list[str]:
    """Dockerfile instructions with continuations joined, comments dropped."""
    out, cur = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        cur += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            out.append(cur)
            cur = ""
    return out


def stages(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    name = "(none)"
    for line in logical_lines(text):
        m = re.match(r"FROM \S+(?: AS (\S+))?", line)
        if m:
            name = m.group(1) or "(last)"
            found[name] = [line]
        else:
            found.setdefault(name, []).append(line)
    return found


def _engine(matrix_dir: Path, engine: str = "dflashfix") -> str:
    lm = mx.load(matrix_dir / "matrix.yaml")
    return render_engine(lm, "gb10", engine, read_lock(lm.root)).text


def _set_lock_bases(matrix_dir: Path, **entry: object) -> None:
    path = matrix_dir / "matrix.lock.json"
    lock = json.loads(path.read_text())
    lock["bases"]["gb10"].update(entry)
    path.write_text(json.dumps(lock))


def _edit_matrix(matrix_dir: Path, edit) -> None:  # type: ignore[no-untyped-def]
    path = matrix_dir / "matrix.yaml"
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


# --- 1: build requirements path ---------------------------------------------------------

def test_every_vllm_path_the_recipe_uses_is_checked_right_after_the_patches(matrix_dir):
    text = _engine(matrix_dir)
    used = set(re.findall(r"/src/vllm/([\w./-]+\.\w+)", text))
    assert used, "the recipe reads files of the source tree"
    assert used <= set(VLLM_PATHS.values()), used - set(VLLM_PATHS.values())
    src = stages(text)["source"]
    check = next(line for line in src if line.startswith("RUN ")
                 and "sh /opt/imagebuild/check-source-tree.sh" in line)
    args = shlex.split(check.split("check-source-tree.sh", 1)[1])
    assert args[0] == "/src/vllm" and set(args[1:]) == set(VLLM_PATHS.values())
    assert src.index(check) == len(src) - 1  # last step of the source stage: after patches
    assert "requirements/build/cuda.txt" in used  # vLLM 0.23.0's own build requirements


# --- 2: a runtime stage that can compile at run time --------------------------------------

def test_runtime_stage_has_the_run_time_toolchain(matrix_dir):
    runtime = stages(_engine(matrix_dir))["runtime"]
    joined = "\n".join(runtime)
    apt = next(line for line in runtime if "apt-get install" in line)
    for pkg in ("python3-dev", "gcc", "g++", '"cuda-nvcc-$cuda"', '"cuda-nvrtc-$cuda"',
                '"cuda-cudart-dev-$cuda"'):
        assert pkg in apt.split(), pkg
    env = next(line for line in runtime if line.startswith("ENV "))
    assert "TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas" in env
    assert "TRITON_PTXAS_BLACKWELL_PATH=/usr/local/cuda/bin/ptxas" in env
    assert 'pip install "flashinfer-jit-cache==${fi_version}"' in joined
    assert "runtime-selfcheck.py --arch sm_121a --phase toolchain" in joined
    assert "runtime-selfcheck.py --arch sm_121a --phase installed" in joined
    # the toolchain check runs before the vLLM requirements and the wheel arrive
    order = [i for i, line in enumerate(runtime)
             if "--phase toolchain" in line or "vllm-requirements/cuda.txt" in line
             or "from=build" in line]
    assert len(order) == 3 and order == sorted(order)


def test_runtime_stage_has_the_rdma_libraries_nccl_loads(matrix_dir):
    """NCCL's RoCE transport dlopens libibverbs.so.1 (and its mlx5 provider); without them
    a TP=2 pair of Sparks falls back to TCP sockets silently (issue 33, point 4)."""
    for engine in ("dflashfix", "pr41703"):
        runtime = stages(_engine(matrix_dir, engine))["runtime"]
        apt = set().union(*(line.split() for line in runtime if "apt-get install" in line))
        assert {"libibverbs1", "ibverbs-providers"} <= apt, engine


# --- 3: the serve user -----------------------------------------------------------------

def test_serve_user_is_ensured_not_blindly_added(matrix_dir):
    lm = mx.load(matrix_dir / "matrix.yaml")
    cell = next(c for c in mx.expand(lm) if c.target_name == "cpu")
    text = render_serve(lm, cell, read_lock(lm.root)).text
    assert "useradd" not in text
    lines = logical_lines(text)
    ensure = next(i for i, line in enumerate(lines) if "ensure-serve-user.sh" in line
                  and line.startswith("RUN"))
    weights = next(i for i, line in enumerate(lines) if "/model" in line)
    assert ensure < weights  # fails in seconds, before any weights are fetched
    assert lines[ensure].endswith(f"{SERVE_USER['uid']} vllm /home/vllm")
    assert f"USER {SERVE_USER['uid']}:{SERVE_USER['uid']}" in lines
    runtime = "\n".join(stages(_engine(matrix_dir))["runtime"])
    assert "ensure-serve-user.sh --check 1000 vllm /home/vllm" in runtime


# --- 4: the version --------------------------------------------------------------------

def test_wheel_and_image_carry_the_engines_vllm_version(matrix_dir):
    st = stages(_engine(matrix_dir))
    compile_step = next(line for line in st["build"]
                        if line.startswith("RUN ") and "build-vllm-wheel.sh" in line)
    assert compile_step.rstrip().endswith("build-vllm-wheel.sh /src/vllm /wheels 0.23.0")
    assert any("check-vllm-version.py --expect 0.23.0" in line for line in st["runtime"])


# --- 5: every FROM pinned by digest; unresolved images refuse to build ------------------

def test_runtime_from_is_digest_pinned_from_the_lock(matrix_dir):
    _set_lock_bases(matrix_dir, digest=DIGEST, runtime_digest=RUNTIME_DIGEST,
                    status="resolved")
    runtime = stages(_engine(matrix_dir))["runtime"][0]
    image = "nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04"
    assert runtime == f"FROM {image}@{RUNTIME_DIGEST} AS runtime"


@pytest.mark.parametrize("missing", ["digest", "runtime_digest"])
def test_build_refuses_an_unpinned_base_or_runtime_image(matrix_dir, missing):
    pinned = {"digest": DIGEST, "runtime_digest": RUNTIME_DIGEST}
    _set_lock_bases(matrix_dir, **{**pinned, missing: None}, status="unresolved")
    path = matrix_dir / "matrix.lock.json"
    lock = json.loads(path.read_text())
    lock["models"]["nvfp4"].update(status="resolved", files=[], metadata=[])
    engine = lock["engines"]["dflashfix"]["gb10"]
    for dep in engine["dependencies"].values():
        dep["commit"] = dep["commit"] or "ef" * 20  # as `lock --update gb10` resolves tags
    engine.update(status="resolved")
    engine.pop("fix", None)
    path.write_text(json.dumps(lock))  # the cell's other pins are fine: only the image is not
    lm = mx.load(matrix_dir / "matrix.yaml")
    cells = [c for c in mx.expand(lm) if c.image == "spark-nvfp4-mtp"]
    with pytest.raises(UserError) as err:
        verify_cells(lm, cells[:1], read_lock(lm.root))
    image = ("nvcr.io/nvidia/cuda:13.0.1-devel-ubuntu24.04" if missing == "digest"
             else "nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04")
    assert f"{image} of target gb10 has no digest" in err.value.message
    assert "lock --update gb10" in err.value.fix
    verify_cells(lm, cells[:1], read_lock(lm.root), allow_unresolved=True)  # lock --check


def test_lock_update_target_records_both_digests(matrix_dir):
    lm = mx.load(matrix_dir / "matrix.yaml")
    asked: list[str] = []

    def resolve(ref: str) -> str:
        asked.append(ref)
        return DIGEST if "devel" in ref else RUNTIME_DIGEST

    class NoHub:
        def resolve(self, *args: object, **kw: object) -> None:
            from imagebuild.lock.hub import HubUnreachable

            raise HubUnreachable("offline in this test")

    plain = build_lock(lm, NoHub(), log=lambda _: None, resolve_image=resolve)
    assert not asked and plain["bases"]["gb10"]["status"] == "unresolved"  # no registry
    data = build_lock(lm, NoHub(), update={"gb10"}, log=lambda _: None, resolve_image=resolve,
                      resolve_tag=lambda repo, ref: "ef" * 20)
    entry = data["bases"]["gb10"]
    assert (entry["digest"], entry["runtime_digest"], entry["status"]) == (
        DIGEST, RUNTIME_DIGEST, "resolved")
    assert "fix" not in entry and len(asked) == 2


# --- 6: disk, caches --------------------------------------------------------------------

def test_serve_disk_check_is_sized_from_the_locked_weights(tmp_path, monkeypatch):
    files = [{"path": f"model-{i}.safetensors", "size": 4 * 10**9} for i in range(5)]
    weights = builder.locked_weight_bytes([{"files": files}, None, {"files": []}])
    assert weights == 20 * 10**9
    need = builder.disk_need("gb10", "serve", False, weights)
    assert need >= 2 * weights  # the weights land twice (snapshot, loaded image)
    usage = __import__("shutil").disk_usage(tmp_path)
    monkeypatch.setattr(builder.shutil, "disk_usage", lambda _: usage._replace(free=30 * 2**30))
    with pytest.raises(OperationFailed) as err:
        builder.check_disk(str(tmp_path), need, "the gb10 serve build")
    assert "runner-clean" in err.value.fix
    assert "docker system prune" not in err.value.fix and "builder prune" not in err.value.fix


def test_local_compile_cache_is_capped_from_matrix_yaml(matrix_dir):
    build = "\n".join(stages(_engine(matrix_dir))["build"])
    assert "CCACHE_MAXSIZE=40G" in build and "id=ccache-gb10" in build
    assert "VLLM_DISABLE_SCCACHE=1" in build  # vLLM's setup.py would take any sccache
    assert "sccache" not in build.replace("VLLM_DISABLE_SCCACHE", "")

    def smaller(data: dict) -> None:
        data["targets"]["gb10"]["compile_cache"]["local_max_size"] = "12G"

    _edit_matrix(matrix_dir, smaller)
    assert "CCACHE_MAXSIZE=12G" in _engine(matrix_dir)


# --- 7: MAX_JOBS after the shared layers -------------------------------------------------

def test_max_jobs_is_declared_only_right_before_the_compile(matrix_dir):
    text = _engine(matrix_dir)
    st = stages(text)
    assert not any("MAX_JOBS" in line or "NVCC_THREADS" in line
                   for name in ("source", "runtime") for line in st[name])
    build = st["build"]
    first_arg = next(i for i, line in enumerate(build)
                     if re.match(r"ARG (MAX_JOBS|NVCC_THREADS)\b", line))
    compile_at = next(i for i, line in enumerate(build)
                      if line.startswith("RUN ") and "build-vllm-wheel.sh" in line)
    # between the declarations and the compile: ARGs only (no layer to lose)
    assert all(line.startswith("ARG ") for line in build[first_arg:compile_at])
    pip_at = next(i for i, line in enumerate(build) if "build-requirements.txt" in line
                  and line.startswith("RUN"))
    copy_src = next(i for i, line in enumerate(build) if line.startswith("COPY --from=source "
                                                                        "/src/vllm /src/vllm"))
    assert pip_at < copy_src < first_arg


# --- 4 (compile cache): sccache with a shared backend ------------------------------------

def test_shared_sccache_backend_is_rendered_without_credentials(matrix_dir):
    def shared(data: dict) -> None:
        data["targets"]["gb10"]["compile_cache"]["shared"] = {
            "backend": "redis", "endpoint": "redis://cache.lan:6379/0"}

    _edit_matrix(matrix_dir, shared)
    lm = mx.load(matrix_dir / "matrix.yaml")
    rendered = render_engine(lm, "gb10", "dflashfix", read_lock(lm.root))
    build = "\n".join(stages(rendered.text)["build"])
    for piece in ("SCCACHE_REDIS_ENDPOINT=redis://cache.lan:6379/0",
                  "CMAKE_CUDA_COMPILER_LAUNCHER=sccache", "id=sccache-gb10",
                  "--mount=type=secret,id=sccache_env", "sccache --start-server",
                  "SCCACHE_CACHE_SIZE=40G", "requirements-sccache.txt"):
        assert piece in build, piece
    assert "VLLM_DISABLE_SCCACHE" not in build
    assert ("files/requirements-sccache.txt",) == tuple(
        d for d, _ in rendered.context_files if d.endswith("sccache.txt"))
    pin = (Path(dict(rendered.context_files)["files/requirements-sccache.txt"])).read_text()
    assert re.search(r"^sccache==\d+\.\d+\.\d+$", pin, re.M)


def test_credentials_never_go_into_matrix_yaml(matrix_dir):
    def leaky(data: dict) -> None:
        data["targets"]["gb10"]["compile_cache"]["shared"] = {
            "backend": "redis", "endpoint": "redis://:hunter2@cache.lan:6379"}

    _edit_matrix(matrix_dir, leaky)
    with pytest.raises(UserError) as err:
        mx.load(matrix_dir / "matrix.yaml")
    assert "credentials do not belong in `endpoint`" in err.value.message
    assert err.value.where and "matrix.yaml:" in err.value.where


def test_sccache_secret_comes_from_the_runner_environment(tmp_path):
    env = {"SCCACHE_REDIS_PASSWORD": "pw", "AWS_ACCESS_KEY_ID": "id", "HOME": "/root"}
    assert builder.sccache_secret(env) == b"SCCACHE_REDIS_PASSWORD=pw\nAWS_ACCESS_KEY_ID=id\n"
    f = tmp_path / "sccache.env"
    f.write_text("SCCACHE_REDIS_PASSWORD=fromfile\n")
    assert builder.sccache_secret({"IMAGEBUILD_SCCACHE_ENV_FILE": str(f)}) == f.read_bytes()


def test_engine_builds_get_the_runners_pip_configuration(matrix_dir, tmp_path, monkeypatch):
    from imagebuild import pipconfig

    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "http://127.0.0.1:9/extra")
    monkeypatch.setenv("SCCACHE_REDIS_PASSWORD", "pw")
    pipconfig.pip_indexes.cache_clear()
    try:
        lm = mx.load(matrix_dir / "matrix.yaml")
        b = builder.Builder(lm, read_lock(lm.root), out_dir=tmp_path, ca_bundle="",
                            hf_token="")
        b._target_name = "gb10"
        secrets = b._secrets("engine")
        assert secrets["pip_conf"].decode() == (
            "[global]\nindex-url = http://127.0.0.1:9/simple\n"
            "extra-index-url = http://127.0.0.1:9/extra\n")
        assert secrets["sccache_env"] == b""  # no shared cache configured for gb10
        assert b._secrets("serve")["pip_conf"] == b""
        b._target_name = "cpu"  # the cpu (wheel) engine installs from the same indexes
        assert b._secrets("engine")["pip_conf"] == secrets["pip_conf"]
    finally:
        pipconfig.pip_indexes.cache_clear()


def test_sccache_pins_agree():
    from imagebuild import REPO_ROOT

    image_pin = (REPO_ROOT / "images/engine/files/requirements-sccache.txt").read_text()
    dev_pin = (REPO_ROOT / "requirements-dev.txt").read_text()
    pin = re.search(r"^sccache==\S+$", image_pin, re.M)
    assert pin and pin.group(0) in dev_pin.splitlines()


# --- issue 20: hermetic compile, run-time CuTe arch, PTX cache ---------------------------

def test_compile_has_no_network_and_gets_every_locked_source_by_commit(matrix_dir):
    """Each FetchContent source the lock pins is fetched by its commit in the source stage
    (CA bundle mounted), copied to the build and handed to CMake; the compile is offline."""
    lm = mx.load(matrix_dir / "matrix.yaml")
    deps = read_lock(lm.root).entry("engines", "dflashfix")["gb10"]["dependencies"]
    assert len(deps) == 6
    st = stages(_engine(matrix_dir))
    fetches = {shlex.split(line.split("fetch-git-commit.sh", 1)[1])[2]: line
               for line in st["source"] if "fetch-git-commit.sh https" in line}
    assert set(fetches) == {f"/src/deps/{name}" for name in deps}
    for name, dep in deps.items():
        line = fetches[f"/src/deps/{name}"]
        args = shlex.split(line.split("fetch-git-commit.sh", 1)[1])
        assert args[:2] == [dep["repository"], dep["commit"] or f"unresolved:{dep['ref']}"]
        assert args[3:] == ([dep["submodules"]] if isinstance(dep["submodules"], str)
                            else dep["submodules"])
        assert "--mount=type=secret,id=ca_bundle" in line and "GIT_SSL_CAINFO" in line
    assert "COPY --from=source /src/deps /src/deps" in st["build"]
    compile_run = next(line for line in st["build"] if "build-vllm-wheel.sh /src/vllm" in line)
    assert compile_run.startswith("RUN --network=none ")
    assert "id=ca_bundle" not in compile_run and "pip_conf" not in compile_run
    cmake_args = shlex.split(re.search(r"CMAKE_ARGS=('[^']*')", compile_run).group(1))[0]
    assert set(cmake_args.split()) == {"-DFETCHCONTENT_FULLY_DISCONNECTED=ON"} | {
        f"-DFETCHCONTENT_SOURCE_DIR_{name.upper()}=/src/deps/{name}" for name in deps}


def test_an_unresolved_tag_is_refused_by_the_fetch_and_the_build(matrix_dir):
    path = matrix_dir / "matrix.lock.json"
    data = json.loads(path.read_text())
    data["models"]["nvfp4"].update(status="resolved", files=[], metadata=[])
    path.write_text(json.dumps(data))  # the cell's other pins are fine
    lm = mx.load(matrix_dir / "matrix.yaml")
    lock = read_lock(lm.root)
    entry = lock.entry("engines", "dflashfix")["gb10"]
    assert entry["dependencies"]["cutlass"]["commit"] is None  # v4.4.2 is a tag
    assert "unresolved:v4.4.2 /src/deps/cutlass" in _engine(matrix_dir)
    cells = [c for c in mx.expand(lm) if c.image == "spark-nvfp4-mtp"]
    with pytest.raises(UserError) as err:
        verify_cells(lm, cells[:1], lock)
    assert "engine source is unresolved" in err.value.message
    assert "cutlass v4.4.2" in err.value.fix and "lock --update gb10" in err.value.fix


def test_cute_dsl_arch_is_set_where_the_cute_dsl_runs(matrix_dir):
    runtime = stages(_engine(matrix_dir))["runtime"]
    env = next(line for line in runtime if line.startswith("ENV "))
    assert 'CUTE_DSL_ARCH="sm_121a"' in env


def test_the_ptx_cache_is_in_the_serve_containers_writable_cache(matrix_dir):
    from imagebuild.serving.runspec import CACHE_DIR

    lm = mx.load(matrix_dir / "matrix.yaml")
    cell = next(c for c in mx.expand(lm) if c.target_name == "cpu")
    text = render_serve(lm, cell, read_lock(lm.root)).text
    env = next(line for line in logical_lines(text) if line.startswith("ENV HOME="))
    path = dict(w.split("=", 1) for w in env.split()[1:])["CUDA_CACHE_PATH"]
    assert path.startswith(CACHE_DIR + "/")  # the tmpfs (or cache volume) over ~/.cache


# --- issue 33, point 5: what the first boot compiles, and what a build resolved ----------

def test_every_first_boot_compile_lands_in_the_cache_that_can_persist(locked):
    """Triton, vLLM's compile cache, FlashInfer's JIT (~/.cache/flashinfer: HOME-based, no
    FLASHINFER_WORKSPACE_BASE) and the driver's PTX JIT cache (FA2 is 8.0+PTX on sm_121)
    all live under the cache tmpfs or volume, and a GPU image keeps 2 GiB of PTX JIT output
    instead of the driver's 256 MiB."""
    from imagebuild.serving.runspec import CACHE_DIR

    lm = mx.load(locked / "matrix.yaml")
    cells = {c.target_name: c for c in mx.expand(lm)}
    for target, cell in cells.items():
        text = render_serve(lm, cell, read_lock(lm.root)).text
        env_line = next(line for line in logical_lines(text) if line.startswith("ENV HOME="))
        env = dict(w.split("=", 1) for w in env_line.split()[1:])
        assert env["HOME"] + "/.cache" == CACHE_DIR and "FLASHINFER_WORKSPACE_BASE" not in env
        for key in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
                    "CUDA_CACHE_PATH"):
            assert env[key].startswith(CACHE_DIR + "/"), key
        assert (env.get("CUDA_CACHE_MAXSIZE") == "2147483648") is (target == "gb10")


def test_the_engine_keeps_the_python_packages_pip_resolved(matrix_dir):
    """vLLM's cuda.txt leaves transitive versions open: the image records what it got."""
    runtime = stages(_engine(matrix_dir))["runtime"]
    last = next(line for line in runtime if "--phase installed" in line)
    assert last.rstrip().endswith("pip list --format=freeze | LC_ALL=C sort > "
                                  "/opt/imagebuild/python-packages.txt")
