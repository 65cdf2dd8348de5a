"""The smoke suite against the real cpu serve image and against images broken on purpose.

Each bad image is made cheaply FROM the good one: only its CMD changes (labels, model and
engine layers are shared), so no engine is rebuilt. Every bad image must be caught with
the right message, and the container must be gone afterwards.

The smoke runs whose verdicts hold no time bound go two at a time (`verdicts`: each its own
compose project, port and output folder; a boot is ~30 s of mostly one core, and CI has
two); the ones timed (death at boot judged within seconds, Ctrl-C) run alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from imagebuild.smoke.runner import smoke_ref
from tests.support.leftovers import smoke_leftovers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

TAG = "2026-06-18-dflashfix"
GOOD = "127.0.0.1:5000/vllm-spark/cpu-tiny-ngram:2026-06-18-v0.23.0-dflashfix"
BAD = "imagebuild-smoke-negative"


def _leftovers(docker: str, run: subprocess.Popen[bytes] | None = None) -> list[str]:
    """Containers of smoke's compose projects still around, but another run's (the
    smoke `run` this test started counts, exited or not)."""
    return smoke_leftovers(docker, mine=[run.pid] if run else [])


@pytest.fixture(scope="module")
def good(docker_engine: str, cpu_serve_image) -> dict:
    """The real cpu image, built by the real command (once per session)."""
    assert cpu_serve_image.ref == GOOD
    info = json.loads(subprocess.run([docker_engine, "image", "inspect", GOOD],
                                     capture_output=True, text=True, check=True).stdout)[0]
    return {"ref": GOOD, "id": info["Id"], "cmd": info["Config"]["Cmd"]}


@pytest.fixture(scope="module")
def derive(docker_engine: str, good: dict, tmp_path_factory: pytest.TempPathFactory):
    """derive(name, cmd) -> ref of an image FROM the good one with only another CMD."""
    made: list[str] = []

    def build(name: str, cmd: list[str]) -> str:
        ctx = tmp_path_factory.mktemp(name)
        (ctx / "Dockerfile").write_text(f"FROM {good['ref']}\nCMD {json.dumps(cmd)}\n")
        ref = f"{BAD}:{name}"
        proc = subprocess.run([docker_engine, "build", "--network", "host", "-q", "-t", ref,
                               str(ctx)], capture_output=True, text=True,
                              env={**os.environ, "DOCKER_BUILDKIT": "1"})
        assert proc.returncode == 0, proc.stderr
        made.append(ref)
        return ref

    yield build
    if made:
        subprocess.run([docker_engine, "rmi", "-f", *made], capture_output=True)


@pytest.fixture(autouse=True)
def no_container_left(docker_engine: str):
    yield
    assert _leftovers(docker_engine) == [], "a smoke container outlived its run"


def _check(verdict: dict, name: str) -> dict:
    return next(c for n, c in verdict["checks"].items() if n.startswith(name))


def _without(cmd: list[str], flag: str, values: int = 1) -> list[str]:
    i = cmd.index(flag)
    return cmd[:i] + cmd[i + 1 + values:]


# Serves /health with 503 forever and logs every probe: up, never healthy.
UNHEALTHY = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(503); self.end_headers()
port = int(sys.argv[sys.argv.index('--port') + 1])
http.server.HTTPServer(('127.0.0.1', port), H).serve_forever()
"""
HANG = ["python3", "-c", "import time; time.sleep(10**6)"]


@pytest.fixture(scope="module")
def verdicts(good: dict, derive, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, tuple[dict, Path]]:
    """name -> (verdict, output folder) of the smoke runs with no time bound, two at a time
    (a vLLM boot beside a fake server's where it can: less contention for the checks)."""
    cmd = good["cmd"]
    i = cmd.index("--served-model-name")
    cases = {
        "good": (good["ref"], {}),
        "unhealthy": (derive("unhealthy", ["python3", "-c", UNHEALTHY, "--port", "8000"]),
                      {"boot_timeout_s": 20, "stall_s": 600}),
        "wrong-names": (derive("wrong-names", cmd[:i + 1] + ["wrong-name"] + cmd[i + 3:]), {}),
        "hang": (derive("hang", HANG), {"stall_s": 6}),
        "no-spec": (derive("no-spec", _without(cmd, "--speculative-config")), {}),
    }

    def one(name: str) -> tuple[dict, Path]:
        ref, kw = cases[name]
        out = tmp_path_factory.mktemp(f"smoke-{name}")
        return smoke_ref(ref, out_dir=out, **kw), out

    with ThreadPoolExecutor(2) as pool:
        running = {name: pool.submit(one, name) for name in cases}
        return {name: f.result() for name, f in running.items()}


def test_good_image_passes_every_applicable_check(good: dict, verdicts):
    v, out = verdicts["good"]
    assert v["passed"], json.dumps(v["checks"], indent=1)[:4000]
    assert v["image_id"] == good["id"]
    assert all(c["passed"] for c in v["checks"].values())
    # the cpu cell is text-only: the image request is not applicable; nor is recording
    # the release gates' requests, which only `smoke --tag` (gates to follow) does
    assert set(v["not_applicable"]) == {"image_request", "release_gate_requests_answered"}
    assert len(v["checks"]) >= 12
    # the kernels the CPU build chose, read from its boot log, as the profile expects
    chosen = _check(v, "kernel_backends_are_the_expected_ones").get("measured") or {}
    assert (chosen.get("attention"), chosen.get("speculative")) == ("CPU_ATTN", "ngram")
    for name in ("junit.xml", "summary.md", "verdict.json", "container.log"):
        assert (out / name).stat().st_size > 0
    print(f"\nFIGURE good cpu image (smoked beside another run): boot "
          f"{v['timings']['boot_s']}s, checks {v['timings']['checks_s']}s, total "
          f"{v['timings']['total_s']}s")


def test_wrong_served_names(verdicts):
    v, _ = verdicts["wrong-names"]
    assert not v["passed"] and v["outcome"] == "checks failed"
    check = _check(v, "models_lists_exactly_the_served_names")
    assert check["outcome"] == "failed"
    assert "/v1/models lists ['wrong-name'], the cell serves ['tiny', 'tiny-alias']" in \
        check["message"]


def test_speculative_decoding_off(verdicts):
    v, _ = verdicts["no-spec"]
    assert not v["passed"]
    check = _check(v, "speculative_decoding_fires")
    assert check["outcome"] == "failed"
    assert "speculative decoding is off" in check["message"]
    # the boot chose no speculative method, which the profile's expect_backends names
    backends = _check(v, "kernel_backends_are_the_expected_ones")
    assert "speculative: expected ngram, vLLM chose none" in backends["message"]
    assert sorted(n for n, c in v["checks"].items() if not c["passed"]) == sorted(
        [check["name"], backends["name"]])


def test_engine_dying_at_boot_is_judged_within_seconds(good: dict, derive, tmp_path: Path):
    # one KV block cannot hold a 512-token request: the engine core raises while sizing the
    # KV cache, long before any health check would give up
    ref = derive("dies", good["cmd"] + ["--num-gpu-blocks-override", "1"])
    t0 = time.monotonic()
    v = smoke_ref(ref, out_dir=tmp_path)
    wall = time.monotonic() - t0
    assert v["outcome"] == "boot fatal", v["message"]
    assert "engine failed at boot: engine init failed" in v["message"]
    assert v["boot"]["excerpt"] and "Traceback" in v["boot"]["excerpt"]
    after_fatal = v["timings"]["fatal_to_verdict_s"]
    # the verdict waits for the suite's compose teardown (docker-compose 1.29 here): 10.3 to
    # 10.9 s on this kind of machine on 2026-12-01, with this code and the code before it;
    # a health check giving up would take the whole boot timeout (300 s on cpu)
    assert after_fatal < 15, f"{after_fatal}s from the fatal line to the verdict"
    assert "Traceback" in (tmp_path / "container.log").read_text()
    print(f"\nFIGURE dying image: fatal line at {v['boot']['fatal_line_s']:.1f}s after launch, "
          f"verdict {after_fatal:.1f}s later, wall {wall:.1f}s; boot timeout "
          "300s")


def test_never_healthy_times_out_with_the_phase(verdicts):
    v, _ = verdicts["unhealthy"]
    assert v["outcome"] == "boot timeout"
    assert "not healthy after 20s (boot timeout)" in v["message"]
    assert 20 <= v["boot"]["seconds"] < 30


def test_silent_spawn_hang_is_relaunched_once(verdicts):
    v, out = verdicts["hang"]
    assert v["outcome"] == "boot stalled" and v["relaunched"]
    assert [a["kind"] for a in v["attempts"]] == ["stalled", "stalled"]
    assert "silent spawn hang" in v["message"]
    assert (out / "container-attempt1.log").exists()


def test_ctrl_c_removes_the_container(good: dict, derive, docker_engine: str):
    """Ctrl-C while the server boots (after smoke says `booting`) removes the container."""
    ref = derive("hang", HANG)
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from imagebuild.smoke.runner "
                             "import smoke_ref; smoke_ref(sys.argv[1], stall_s=600)", ref],
                            cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr
        for line in proc.stderr:
            lines.append(line.decode(errors="replace"))

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 90
    while not any("booting" in x for x in lines) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _leftovers(docker_engine, proc), "the smoke container never started"
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)  # pytest's teardown gets 20 s, then the backstop
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("smoke did not stop on Ctrl-C:\n" + "".join(lines)[-2000:]) from None
    assert _leftovers(docker_engine, proc) == [], "".join(lines)[-2000:]
