"""The hardened `docker run` of a smoke container."""

from __future__ import annotations

from imagebuild.smoke.container import image_user, run_args, with_listen


def test_listen_is_forced_to_loopback_and_our_port():
    argv = ["vllm", "serve", "/model", "--host", "0.0.0.0", "--port", "8000", "--x",
            "--port=9"]
    assert with_listen(argv, 4242) == ["vllm", "serve", "/model", "--x", "--host",
                                       "127.0.0.1", "--port", "4242"]
    assert with_listen(["vllm", "serve", "/model"], 5)[-4:] == ["--host", "127.0.0.1",
                                                                "--port", "5"]


def _opts(args: list[str]) -> list[tuple[str, str]]:
    return list(zip(args, args[1:], strict=False))


def test_cpu_run_is_hardened():
    args = run_args("img:1", ["vllm", "serve"], name="n", memory="8g", gpu=False,
                    user=(1000, 1001))
    assert args[-3:] == ["img:1", "vllm", "serve"]
    opts = _opts(args[:-3])
    assert "--read-only" in args
    for pair in [("--security-opt", "no-new-privileges"), ("--cap-drop", "ALL"),
                 ("--memory", "8g"), ("--memory-swap", "8g"), ("--network", "host")]:
        assert pair in opts, pair
    assert not {"-e", "--env", "--env-file", "-v", "--volume", "--privileged"} & set(args)
    tmpfs = dict(b.split(":", 1) for a, b in opts if a == "--tmpfs")
    assert set(tmpfs) == {"/tmp", "/home/vllm/.cache"}
    assert "uid=1000,gid=1001" in tmpfs["/home/vllm/.cache"]
    assert "--gpus" not in args and "--ipc" not in args


def test_gb10_run_gets_the_gpu_and_host_ipc():
    opts = _opts(run_args("img", [], name="n", memory="120g", gpu=True))
    assert ("--gpus", "all") in opts and ("--ipc", "host") in opts
    assert ("--memory", "120g") in opts


def test_numeric_image_users_need_no_container():
    assert image_user("img", "1000:1001") == (1000, 1001)
    assert image_user("img", "1000") == (1000, 1000)
