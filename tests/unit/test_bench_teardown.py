"""`make teardown` (the job's if: always() sweep) removes a bench server a cancelled job
left behind: the container serving/container.py starts carries this workspace under the key
the sweep filters by. Runs the Makefile's own sweep against a stand-in `docker` that
lists the containers serving() started (and one of another workspace, which must stay)."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from tests.support.memengine import MemoryEngine, installed

STANDIN = textwrap.dedent("""\
    #!/usr/bin/env python3
    import json, sys
    state = sys.argv[0] + ".json"
    containers = json.load(open(state))
    args = sys.argv[1:]
    if args[:1] == ["ps"]:
        key = args[args.index("--filter") + 1].removeprefix("label=")
        for cid, labels in containers.items():
            if key in labels:
                print(cid, labels[key])
    elif args[:2] == ["rm", "-f"]:
        for cid in args[2:]:
            containers.pop(cid, None)
        json.dump(containers, open(state, "w"))
    """)


def _started_labels() -> dict[str, str]:
    """The labels serving() gives the container it starts (the run is cancelled then)."""
    from imagebuild.serving import container as server
    from imagebuild.serving.runspec import Limits

    double = MemoryEngine()
    double.run_error = KeyboardInterrupt()  # the job is cancelled while the server boots
    with installed(double), pytest.raises(KeyboardInterrupt):
        with server.serving("img:t", {"Config": {"Cmd": ["vllm", "serve"]}},
                            Limits(memory=None, gpu=False, boot_timeout_s=5),
                            log=lambda _: None):
            pytest.fail("the server cannot have booted")
    return dict(double.called_with("run")[0]["labels"])


def test_make_teardown_removes_a_left_bench_container(tmp_path: Path):
    labels = _started_labels()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(STANDIN)
    docker.chmod(0o755)
    other = {k: "/elsewhere/another-job" for k in labels}
    Path(str(docker) + ".json").write_text(json.dumps({"bench1": labels, "theirs": other}))
    proc = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(REPO_ROOT),
                           "teardown"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    left = json.loads(Path(str(docker) + ".json").read_text())
    assert left == {"theirs": other}  # ours swept, another workspace's left alone
