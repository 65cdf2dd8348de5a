"""A SIGKILLed run's containers, volumes and networks are gone after the next run starts;
a live run's stay (reaper.py, runowner.py). The real engine, the real cpu serve image:

- a killed `build.py bench` (the stage issue 39 saw leaking: its `imagebuild-bench-*`
  server kept running): killed once the engine has its container;
- a killed run-like process that made a container through the Docker seam and a compose
  project with a named volume and a network (the objects smoke and multi-node make);
- a live process that made the same, and must keep them.

The next run is a real `build.py bench`: it reaps first, says so one line per object, and
is then stopped with SIGTERM (its own clean-up; no vLLM boot is waited for)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from imagebuild.runowner import PID_LABEL
from tests.e2e.test_interrupts_e2e import BENCH, Run
from tests.support.cpu_build import CPU_SERVE_REF

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# a run-like process: one container through the seam, one compose project with a named
# volume and a network, all labelled by this process; "ready" once they exist
RUN_LIKE = textwrap.dedent("""
    import subprocess, sys, time, yaml
    from pathlib import Path
    from imagebuild.docker import engine
    from imagebuild.runowner import owned_compose
    from imagebuild.serving.compose import compose_argv
    image, name, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    engine().run(image, ["-c", "sleep 600"], name=name, labels={}, entrypoint="sh",
                 network_mode="host")
    doc = {"services": {"s": {"image": image, "entrypoint": ["sh", "-c", "sleep 600"],
                              "networks": ["n"], "volumes": ["v:/data"]}},
           "volumes": {"v": {}}, "networks": {"n": {}}}
    out.write_text(owned_compose(yaml.safe_dump(doc)))
    subprocess.run([*compose_argv(), "-f", str(out), "-p", name, "up", "-d"], check=True,
                   capture_output=True)
    print("ready", flush=True)
    time.sleep(600)
""")


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True,
                          check=True).stdout


def _objects(name: str) -> set[str]:
    """The container `name`, and what compose project `name` made, by kind."""
    found = {f"container {n}" for n in _docker("ps", "-a", "--format", "{{.Names}}").split()
             if n == name or n.startswith(f"{name}_")}
    found |= {f"volume {v}" for v in _docker("volume", "ls", "-q").split()
              if v.startswith(f"{name}_")}
    found |= {f"network {n}" for n in _docker("network", "ls", "--format", "{{.Name}}").split()
              if n.startswith(f"{name}_")}
    return found


class RunLike:
    def __init__(self, name: str, tmp: Path):
        self.name = name
        self.compose = tmp / f"{name}.yaml"
        self.proc = subprocess.Popen([sys.executable, "-c", RUN_LIKE, CPU_SERVE_REF, name,
                                      str(self.compose)], cwd=REPO_ROOT,
                                     stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        assert self.proc.stdout and self.proc.stdout.readline().strip() == "ready"

    def remove(self) -> None:
        self.proc.kill()
        self.proc.wait()
        subprocess.run(["docker", "rm", "-f", self.name], capture_output=True)
        subprocess.run(["docker-compose", "-f", str(self.compose), "-p", self.name, "down",
                        "-v", "-t", "1"], capture_output=True)


def _bench_of(pid: int) -> list[str]:
    out = _docker("ps", "-a", "--filter", f"label={PID_LABEL}={pid}", "--format",
                  "{{.Names}}")
    return [n for n in out.split() if n.startswith("imagebuild-bench-")]


def test_next_run_reaps_a_killed_runs_objects_and_keeps_a_live_runs(
        docker_engine: str, cpu_serve_image, tmp_path: Path) -> None:
    assert cpu_serve_image.ref == CPU_SERVE_REF
    token = f"{os.getpid()}-{int(time.time())}"
    live = RunLike(f"imagebuild-reaptest-live-{token}", tmp_path)
    killed = RunLike(f"imagebuild-reaptest-killed-{token}", tmp_path)
    try:
        kinds = {o.split()[0] for o in _objects(killed.name)}
        assert kinds == {"container", "volume", "network"}, _objects(killed.name)
        killed.proc.send_signal(signal.SIGKILL)
        killed.proc.wait()

        bench = Run([*BENCH, CPU_SERVE_REF, "--out", str(tmp_path / "bench1")])
        bench.wait_for(lambda: bool(_bench_of(bench.proc.pid)))
        leaked = _bench_of(bench.proc.pid)
        bench.proc.send_signal(signal.SIGKILL)
        bench.proc.wait()
        state = json.loads(_docker("inspect", "--format", "{{json .State}}", leaked[0]))
        assert state["Status"] in ("created", "running"), state  # what a SIGKILL leaves

        left = _objects(killed.name) | {f"container {n}" for n in leaked}
        before_live = _objects(live.name)
        nxt = Run([*BENCH, CPU_SERVE_REF, "--out", str(tmp_path / "bench2")])
        nxt.wait_for(lambda: bool(_bench_of(nxt.proc.pid)))  # reaping is done by then
        nxt.interrupt(signal.SIGTERM)
        said = {line.split(":")[0].removeprefix("reaped ").strip()
                for line in nxt.lines if line.startswith("reaped ")}
        assert left <= said, (left - said, nxt.output[-3000:])
        assert not _objects(killed.name), _objects(killed.name)
        assert not [n for n in leaked if n in _docker("ps", "-a", "--format",
                                                       "{{.Names}}").split()]
        assert _objects(live.name) == before_live  # a live run's: untouched
        assert not any(live.name in line for line in nxt.lines if "reap" in line)
        assert nxt.proc.returncode == 130, nxt.output[-3000:]
    finally:
        live.remove()
        killed.remove()
