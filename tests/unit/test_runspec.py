"""One definition of how a serve image runs: compose file, `docker run`, Docker SDK."""

from __future__ import annotations

import yaml

from imagebuild.serving.runspec import (
    RunSpec,
    compose_document,
    docker_run_argv,
    sdk_run_kwargs,
)
from imagebuild.spec.servecmd import with_listen

CPU = RunSpec(image="reg/ns/img@sha256:" + "a" * 64, command=("vllm", "serve", "/model",
              "--port", "8000"), memory="8g", gpu=False, user=(1000, 1001))
GPU = RunSpec(image="reg/ns/img:t", command=("vllm", "serve"), memory="120g", gpu=True)


def test_listen_is_forced_to_loopback_and_the_port():
    argv = ["vllm", "serve", "/model", "--host", "0.0.0.0", "--port", "8000", "--x",
            "--port=9"]
    assert with_listen(argv, 4242) == ["vllm", "serve", "/model", "--x", "--host",
                                       "127.0.0.1", "--port", "4242"]
    assert with_listen(["vllm", "serve", "/model"], 5)[-4:] == ["--host", "127.0.0.1",
                                                                "--port", "5"]


def test_the_compose_service_is_hardened():
    svc = compose_document(CPU, name="img")["services"]["vllm"]
    assert svc["read_only"] is True and svc["network_mode"] == "host"
    assert svc["cap_drop"] == ["ALL"] and svc["security_opt"] == ["no-new-privileges"]
    assert svc["mem_limit"] == svc["memswap_limit"] == "8g" and svc["shm_size"] == "2g"
    assert "environment" not in svc and "env_file" not in svc and "privileged" not in svc
    tmpfs = dict(entry.split(":", 1) for entry in svc["tmpfs"])
    assert set(tmpfs) == {"/tmp", "/home/vllm/.cache"}
    assert "uid=1000,gid=1001" in tmpfs["/home/vllm/.cache"]
    assert "ipc" not in svc and "deploy" not in svc
    # the image reference and the port can be overridden; the server stays on loopback
    assert svc["image"] == "${IMAGEBUILD_IMAGE:-" + CPU.image + "}"
    assert svc["command"][-4:] == ["--host", "127.0.0.1", "--port", "${IMAGEBUILD_PORT:-8000}"]


def test_gpu_targets_get_every_gpu_and_host_ipc():
    svc = compose_document(GPU, name="img")["services"]["vllm"]
    assert svc["ipc"] == "host" and "shm_size" not in svc
    dev = svc["deploy"]["resources"]["reservations"]["devices"][0]
    assert dev["capabilities"] == ["gpu"] and dev["count"] == "all"
    lines = [" ".join(line) for line in docker_run_argv(GPU, name="img")]
    assert "--gpus all --ipc host" in lines
    kw = sdk_run_kwargs(GPU)
    assert kw["ipc_mode"] == "host" and kw["device_requests"][0].count == -1


def test_compose_docker_run_and_sdk_say_the_same():
    """The three renderings of one spec agree flag for flag."""
    svc = compose_document(CPU, name="img")["services"]["vllm"]
    argv = [a for line in docker_run_argv(CPU, name="img") for a in line]
    kw = sdk_run_kwargs(CPU)
    pairs = list(zip(argv, argv[1:], strict=False))
    assert ("--memory", svc["mem_limit"]) in pairs and kw["mem_limit"] == svc["mem_limit"]
    assert ("--pids-limit", str(svc["pids_limit"])) in pairs
    assert kw["pids_limit"] == svc["pids_limit"]
    assert ("--shm-size", svc["shm_size"]) in pairs and kw["shm_size"] == svc["shm_size"]
    tmpfs = dict(entry.split(":", 1) for entry in svc["tmpfs"])
    assert kw["tmpfs"] == tmpfs
    assert {b for a, b in pairs if a == "--tmpfs"} == set(svc["tmpfs"])
    assert kw["read_only"] and "--read-only" in argv and kw["cap_drop"] == svc["cap_drop"]


def test_a_cache_volume_replaces_the_cache_tmpfs():
    spec = RunSpec(image="i", command=(), memory=None, gpu=False, cache_volume="img-cache")
    doc = compose_document(spec, name="img")
    assert doc["services"]["vllm"]["volumes"] == ["img-cache:/home/vllm/.cache"]
    assert doc["volumes"] == {"img-cache": {}}
    assert yaml.safe_load(yaml.safe_dump(doc)) == doc


def test_a_dollar_in_the_command_is_not_interpolated_by_compose():
    spec = RunSpec(image="i", command=("vllm", "serve", "--x", "${HOME}", "--y", "a$b"),
                   memory=None, gpu=False)
    cmd = compose_document(spec, name="i")["services"]["vllm"]["command"]
    assert "$${HOME}" in cmd and "a$$b" in cmd
    assert cmd[-1] == "${IMAGEBUILD_PORT:-8000}"  # the one variable meant for compose
