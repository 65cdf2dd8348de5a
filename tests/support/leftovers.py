"""Containers a test may call its own leftovers, when other runs share the Docker engine.

Tests run in two lanes at once (pytest-xdist) and developers run commands beside them, so
"every imagebuild-smoke-* container" may hold another live run's. Every container a run
makes carries its run's pid (io.imagebuild.run.pid, runowner.py); one that names any process
but this test's (this process, or the run it started: `mine`) is another run's and is left
out, live or not: another lane's test SIGKILLs runs on purpose (test_killed_run_sweep.py),
and what they leave is the next run's to reap, not this test's leak. A container without
that label always counts: an unlabelled leak still fails the test."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable

from imagebuild.runowner import PID_LABEL

DOCKER = "/usr/bin/docker"


def containers(*labels: str, mine: Iterable[int] = (), docker: str = DOCKER
               ) -> list[tuple[str, dict[str, str]]]:
    """(name, {label: value}) of every container but other runs' ones; `labels` are the
    labels read for each (the run's pid label is always read)."""
    keys = [*labels, PID_LABEL]
    fmt = "\t".join(["{{.Names}}", *(f'{{{{.Label "{k}"}}}}' for k in keys)])
    out = subprocess.run([docker, "ps", "-a", "--format", fmt], capture_output=True,
                         text=True, check=True).stdout
    own = {os.getpid(), *mine}
    found = []
    for line in out.splitlines():
        name, *values = (line.split("\t") + [""] * len(keys))[:len(keys) + 1]
        got = dict(zip(keys, values, strict=True))
        pid = got[PID_LABEL]
        if pid.isdigit() and int(pid) not in own:
            continue  # another run's, live or killed
        found.append((name, got))
    return found


def smoke_leftovers(docker: str = DOCKER, mine: Iterable[int] = ()) -> list[str]:
    """Containers of smoke's compose projects (imagebuild-smoke-*) still around."""
    project = "com.docker.compose.project"
    return [name for name, got in containers(project, mine=mine, docker=docker)
            if got[project].startswith("imagebuild-smoke-")]
