"""Who started an object, and whether that run is gone (runowner.py); what the reaper does
with each kind of object (reaper.py), on a fake engine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from imagebuild import runowner
from imagebuild.reaper import UNOWNED_MAX_AGE_S, reap
from imagebuild.runowner import (
    HOST_LABEL,
    OWNER_KEYS,
    PID_LABEL,
    RUN_LABEL,
    START_LABEL,
    owned_compose,
    owner_labels,
    process_start,
    run_state,
    start_ticks,
)
from tests.support.memengine import MemoryEngine


def _labels(host: str = "h1", pid: int = 4242, start: str = "boot/100") -> dict[str, str]:
    return {HOST_LABEL: host, PID_LABEL: str(pid), START_LABEL: start, RUN_LABEL: "r1"}


def test_start_ticks_reads_field_22_past_a_command_name_with_parentheses(tmp_path: Path):
    (tmp_path / "77").mkdir()
    # comm may hold ") (" and spaces: counting starts after its last ')'
    rest = ["S"] + [str(i) for i in range(4, 22)] + ["987654"] + ["0"] * 30
    (tmp_path / "77/stat").write_text("77 (py ) (x) " + " ".join(rest) + "\n")
    assert start_ticks(77, tmp_path) == 987654
    assert start_ticks(78, tmp_path) is None


def test_this_process_start_is_stable_and_matches_proc():
    mine = process_start(os.getpid())
    assert mine and mine == process_start(os.getpid())
    assert mine.endswith("/" + Path(f"/proc/{os.getpid()}/stat").read_text()
                         .rsplit(")", 1)[1].split()[19])
    assert owner_labels()[START_LABEL] == mine
    assert set(owner_labels()) == set(OWNER_KEYS)


def test_states_gone_reused_other_host_live_unowned():
    starts = {4242: "boot/100", 4243: "boot/999"}  # 4243: pid reused by a later process
    start_of = starts.get
    assert run_state(_labels(pid=4242), host="h1", start_of=start_of) == "live"
    assert run_state(_labels(pid=4243), host="h1", start_of=start_of) == "gone"
    assert run_state(_labels(pid=5000), host="h1", start_of=start_of) == "gone"
    # another host's dead pid: not ours to judge
    assert run_state(_labels(host="h2", pid=5000), host="h1", start_of=start_of) == "other-host"
    assert run_state({}, host="h1", start_of=start_of) == "unowned"
    assert run_state({**_labels(), PID_LABEL: "x"}, host="h1", start_of=start_of) == "unowned"
    # an alive pid whose start cannot be read is never taken for gone
    assert run_state(_labels(), host="h1", start_of=lambda pid: "unknown") == "live"


def test_real_processes_dead_and_alive():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        alive = _labels(host=runowner.host_name(), pid=child.pid,
                        start=process_start(child.pid) or "")
        assert run_state(alive) == "live"
        # the same pid with another start time: a reused pid, not the same run
        assert run_state({**alive, START_LABEL: alive[START_LABEL] + "1"}) == "gone"
    finally:
        child.kill()
        child.wait()
    assert run_state(alive) == "gone"
    assert run_state(owner_labels()) == "live"


def test_owned_compose_labels_services_volumes_networks():
    text = yaml.safe_dump({
        "services": {"vllm": {"image": "x", "labels": {"io.imagebuild.service": "a"}},
                     "w": {"image": "y", "labels": ["k=v"]}},
        "volumes": {"c-cache": {}, "ext": {"external": True}},
        "networks": {"n": None}})
    doc = yaml.safe_load(owned_compose(text))
    mine = owner_labels()
    assert doc["services"]["vllm"]["labels"] == {"io.imagebuild.service": "a", **mine}
    assert doc["services"]["w"]["labels"] == {"k": "v", **mine}
    assert doc["volumes"]["c-cache"]["labels"] == mine
    assert "labels" not in doc["volumes"]["ext"]  # not made by the run
    assert doc["networks"]["n"]["labels"] == mine


def _engine(rows: dict[str, list[dict[str, Any]]], fail: set[str] = frozenset()
            ) -> MemoryEngine:
    """The Docker seam's double holding these `docker KIND ls` rows; removing a name in
    `fail` fails (it is in use)."""
    eng = MemoryEngine()
    for row in rows.get("container", []):
        eng.add_container(row["Name"], labels=row["Labels"],
                          state={"Status": row.get("State", "running")},
                          status=row.get("Status", ""), created=row.get("Created", 0.0))
    for kind in ("volume", "network"):
        eng.objects[kind] = {row["Name"]: row["Labels"] for row in rows.get(kind, [])}
    eng.in_use = set(fail)
    return eng


def test_reap_removes_gone_runs_only_and_says_so():
    now = 1_000_000.0
    old = now - UNOWNED_MAX_AGE_S - 60
    gone, live, other = _labels(pid=1), _labels(pid=2), _labels(host="h2", pid=1)
    eng = _engine({
        "container": [
            {"Name": "imagebuild-bench-dead", "Labels": gone, "State": "running"},
            {"Name": "imagebuild-bench-live", "Labels": live, "State": "running"},
            {"Name": "imagebuild-bench-other", "Labels": other, "State": "running"},
            # before run labels: stopped/unhealthy and old go, the rest stays
            {"Name": "imagebuild-bench-oldexit", "Labels": {}, "State": "exited",
             "Status": "Exited (137)", "Created": old},
            {"Name": "imagebuild-bench-oldsick", "Labels": {}, "State": "running",
             "Status": "Up 9 hours (unhealthy)", "Created": old},
            {"Name": "imagebuild-bench-oldup", "Labels": {}, "State": "running",
             "Status": "Up 9 hours (healthy)", "Created": old},
            {"Name": "imagebuild-bench-newexit", "Labels": {}, "State": "exited",
             "Status": "Exited (1)", "Created": now - 60},
            {"Name": "someone-elses", "Labels": {}, "State": "exited", "Created": old}],
        "volume": [{"Name": "imagebuild-smoke-1_c-cache", "Labels": gone},
                   {"Name": "imagebuild-smoke-2_c-cache", "Labels": live},
                   {"Name": "imagebuild-smoke-3_c", "Labels": None}],
        "network": [{"Name": "imagebuild-smoke-1_default", "Labels": gone}]})
    lines: list[str] = []
    out = reap(eng, log=lines.append, host="h1", start_of={2: "boot/100"}.get, now=now)
    assert eng.called("remove_object") == [("container", "imagebuild-bench-dead"),
                           ("container", "imagebuild-bench-oldexit"),
                           ("container", "imagebuild-bench-oldsick"),
                           ("volume", "imagebuild-smoke-1_c-cache"),
                           ("network", "imagebuild-smoke-1_default")]
    assert out.kept_unowned == ["container imagebuild-bench-oldup",
                                "container imagebuild-bench-newexit",
                                "volume imagebuild-smoke-3_c"]
    assert out.other_hosts == {"h2": 1}
    assert sum(line.startswith("reaped ") for line in lines) == 5
    assert any("reaped container imagebuild-bench-dead: run r1 (pid 1 on h1) is gone" == line
               for line in lines)
    assert any("h2" in line and "shared" in line for line in lines)


def test_reap_dry_run_and_a_failed_removal_change_nothing_else():
    eng = _engine({"container": [{"Name": "a", "Labels": _labels(pid=1)}],
                      "volume": [{"Name": "v", "Labels": _labels(pid=1)}]}, fail={"v"})
    lines: list[str] = []
    assert reap(eng, log=lines.append, host="h1", start_of=lambda p: None,
                dry_run=True).removed == ["container a", "volume v"]
    assert eng.called("remove_object") == [] and lines[0].startswith("would reap container a")
    out = reap(eng, log=lines.append, host="h1", start_of=lambda p: None)
    assert out.removed == ["container a"]
    assert any(line.startswith("could not reap volume v") for line in lines)


@pytest.mark.parametrize("live", [True, False])
def test_reap_on_this_host_uses_the_real_liveness(live: bool):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    labels = _labels(host=runowner.host_name(), pid=child.pid,
                     start=process_start(child.pid) or "")
    if not live:
        child.kill()
        child.wait()
    try:
        eng = _engine({"container": [{"Name": "imagebuild-bench-x", "Labels": labels}]})
        reap(eng, log=lambda s: None)
        assert eng.called("remove_object") == (
            [] if live else [("container", "imagebuild-bench-x")])
    finally:
        child.kill()
        child.wait()


# ------------------------------------------------------------------ processes of a run

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def _marker_of(pid: int) -> str:
    """RUN_ENV of a run whose process is `pid` on this host."""
    labels = _labels(host=runowner.host_name(), pid=pid, start=process_start(pid) or "")
    return "|".join(labels[k] for k in OWNER_KEYS)


def _started_by(marker: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(SLEEP, env={**os.environ, runowner.RUN_ENV: marker})


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        p.kill()
        p.wait()


def test_children_marked_reaches_grandchildren_and_is_undone():
    before = os.environ.get(runowner.RUN_ENV)
    with runowner.children_marked():
        out = subprocess.run([sys.executable, "-c", (
            "import os, subprocess, sys; subprocess.run([sys.executable, '-c', "
            f"'import os; print(os.environ[\"{runowner.RUN_ENV}\"])'])")],
            capture_output=True, text=True, check=True).stdout.strip()
    assert os.environ.get(runowner.RUN_ENV) == before
    assert runowner.labels_of_marker(out) == owner_labels()
    assert runowner.labels_of_marker("a|b") == {}


def test_reap_kills_a_gone_runs_processes_only():
    gone_owner, live_owner = subprocess.Popen(SLEEP), subprocess.Popen(SLEEP)
    gone_marker = _marker_of(gone_owner.pid)
    _stop(gone_owner)
    orphan, live_child = _started_by(gone_marker), _started_by(_marker_of(live_owner.pid))
    try:
        found = {p.pid: p for p in runowner.marked_processes()}
        assert found[orphan.pid].labels == runowner.labels_of_marker(gone_marker)
        lines: list[str] = []
        out = reap(_engine({}), log=lines.append, dry_run=True)
        assert f"process {orphan.pid}" in out.removed and orphan.poll() is None
        out = reap(_engine({}), log=lines.append)
        assert f"process {orphan.pid}" in out.removed
        assert f"process {live_child.pid}" not in out.removed
        assert orphan.wait(timeout=5) == -9 and live_child.poll() is None
        assert any(line.startswith(f"reaped process {orphan.pid} (") and "is gone" in line
                   for line in lines), lines
    finally:
        _stop(orphan, live_child, live_owner)


def test_reap_never_kills_this_process_or_its_parents(tmp_path: Path):
    """A run started by a run that is gone (its parent) reaps that run's other orphans,
    never itself nor the parent chain it runs in: a fake /proc where this process's
    parent is a real process marked by a gone run (this process is left unmarked there: a
    broken exclusion would kill the test runner itself)."""
    gone_owner = subprocess.Popen(SLEEP)
    marker = _marker_of(gone_owner.pid)
    _stop(gone_owner)
    parent = _started_by(marker)
    me = os.getpid()
    for pid, ppid in ((me, parent.pid), (parent.pid, 1)):
        d = tmp_path / str(pid)
        d.mkdir()
        d.joinpath("stat").write_text(
            f"{pid} (python) S {ppid} " + " ".join(["0"] * 17) + f" {start_ticks(pid)} 0\n")
        env = f"{runowner.RUN_ENV}={marker}\0" if pid == parent.pid else "HOME=/\0"
        d.joinpath("environ").write_bytes(env.encode())
        d.joinpath("cmdline").write_bytes(b"python\0")
    try:
        out = reap(_engine({}), log=lambda s: None, proc=tmp_path,
                   start_of=lambda pid: None)
        assert out.removed == [] and parent.poll() is None
    finally:
        _stop(parent)
