"""What runs that are gone left on this host and its Docker engine, removed: the first
step of every run that starts servers and of `runner-clean` (docs/commands.md, "Runs that
were killed").

A run cleans up after itself on failure, Ctrl-C and SIGTERM; a SIGKILL (the OOM killer,
a cancelled runner) leaves its containers running and its child processes (the smoke
suite, a `docker build` or `docker push` client, docker-compose) going on without it.
Every object a run makes names its run (runowner.py), so the next run removes those whose
run is gone: same host, and its pid dead or reused; processes first (they would make
more objects), then containers, volumes and networks. Never a live run's, never this
process or its parents, never another host's (a Docker engine shared by several hosts:
that host's own next run reaps them; they are counted, not touched).

Objects made before run labels existed (or by hand) under our names are judged by what
they are: a container that is stopped, or running but unhealthy, and older than
UNOWNED_MAX_AGE_S goes; anything else of theirs is reported, never removed."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagebuild.docker import OWNER_LABEL, DockerEngine, engine
from imagebuild.errors import OperationFailed
from imagebuild.runowner import (
    HOST_LABEL,
    PROC,
    ancestors,
    marked_processes,
    owner_of,
    process_start,
    run_state,
    start_ticks,
    stat_fields,
)

KINDS = ("container", "volume", "network")  # removal order: a volume in use stays
NAME_PREFIXES = ("imagebuild-",)  # bench containers; smoke's compose projects
UNOWNED_MAX_AGE_S = 6 * 3600  # the longest a healthy smoke, gates and bench run takes, x2
EXIT_WAIT_S = 5.0  # for SIGKILLed processes to be gone before their containers are removed
Log = Callable[[str], None]


@dataclass(frozen=True)
class Reaped:
    removed: list[str]  # "container NAME" ...
    kept_unowned: list[str]
    other_hosts: Counter[str]


def _ours_unowned(kind: str, row: dict[str, Any]) -> bool:
    labels = row.get("Labels") or {}
    if owner_of(labels) is not None:
        return False
    project = labels.get("com.docker.compose.project", "")
    return (str(row.get("Name", "")).startswith(NAME_PREFIXES)
            or project.startswith(NAME_PREFIXES) or labels.get(OWNER_LABEL) == "imagebuild")


def _stale_unowned(row: dict[str, Any], now: float) -> bool:
    """A container of ours without run labels that is safe to remove: not serving (stopped,
    or its health check failing) and too old to belong to a run still going."""
    down = row.get("State") != "running" or "(unhealthy)" in str(row.get("Status", ""))
    return down and now - float(row.get("Created") or now) > UNOWNED_MAX_AGE_S


def _say(line: str) -> None:
    print(line, file=sys.stderr)  # stdout stays the command's own (read by scripts)


def _gone_or_zombie(pid: int, ticks: int | None, proc: Path) -> bool:
    """No process `pid` of start `ticks` runs: none, another (its pid reused), or a zombie
    (dead; its parent, init, collects it)."""
    fields = stat_fields(pid, proc)
    return (fields is None or len(fields) < 20 or fields[19] != str(ticks)
            or fields[0] == "Z")


def reap_processes(*, log: Log = _say, host: str | None = None,
                   start_of: Any = process_start, proc: Path = PROC,
                   dry_run: bool = False) -> list[str]:
    """SIGKILL every process on this host started by a run that is gone (its RUN_ENV);
    one line each. Waits up to EXIT_WAIT_S for them to be gone."""
    verb = "would reap" if dry_run else "reaped"
    mine = ancestors(os.getpid(), proc)
    killed: list[tuple[int, int | None]] = []
    removed: list[str] = []
    for p in marked_processes(proc):
        if p.pid in mine or run_state(p.labels, host=host, start_of=start_of) != "gone":
            continue
        owner = owner_of(p.labels)
        if not dry_run:
            if start_ticks(p.pid, proc) != p.ticks:  # it ended, its pid was reused
                continue
            try:
                os.kill(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError) as exc:
                log(f"could not reap process {p.pid} ({p.command}): {exc}")
                continue
            killed.append((p.pid, p.ticks))
        removed.append(f"process {p.pid}")
        log(f"{verb} process {p.pid} ({p.command}): {owner.describe() if owner else '?'} "
            "is gone")
    deadline = time.monotonic() + EXIT_WAIT_S
    while killed and time.monotonic() < deadline:
        killed = [(pid, t) for pid, t in killed if not _gone_or_zombie(pid, t, proc)]
        if killed:
            time.sleep(0.05)
    for pid, _ in killed:
        log(f"process {pid} was sent SIGKILL and is still there after {EXIT_WAIT_S:.0f} s")
    return removed


def reap(eng: DockerEngine | None = None, *, log: Log = _say, host: str | None = None,
         start_of: Any = process_start, now: float | None = None,
         dry_run: bool = False, proc: Path = PROC) -> Reaped:
    """Remove every process, container, volume and network of this host's gone runs; one
    line per object removed, one per unowned object kept, one per other host. An object
    that cannot be removed (a volume still in use) is said and left: the run goes on."""
    eng = eng or engine()
    now = time.time() if now is None else now
    verb = "would reap" if dry_run else "reaped"
    processes = reap_processes(log=log, host=host, start_of=start_of, proc=proc,
                               dry_run=dry_run)

    def remove(kind: str, name: str, why: str) -> None:
        try:
            if not dry_run:
                eng.remove_object(kind, name)
        except OperationFailed as exc:
            log(f"could not reap {kind} {name} ({why}): {exc}")
            return
        removed.append(f"{kind} {name}")
        log(f"{verb} {kind} {name}: {why}")

    removed: list[str] = []
    kept: list[str] = []
    others: Counter[str] = Counter()
    for kind in KINDS:
        for row in eng.listing(kind, label=HOST_LABEL):
            labels = row.get("Labels") or {}
            state = run_state(labels, host=host, start_of=start_of)
            owner = owner_of(labels)
            if state == "other-host" and owner:
                others[owner.host] += 1
            elif state == "gone" and owner:
                remove(kind, row["Name"], f"{owner.describe()} is gone")
        for row in eng.listing(kind):
            if not _ours_unowned(kind, row):
                continue
            if kind == "container" and _stale_unowned(row, now):
                remove(kind, row["Name"], f"no run labels, {row.get('Status')}, older than "
                                          f"{UNOWNED_MAX_AGE_S // 3600} h")
            else:
                kept.append(f"{kind} {row['Name']}")
                log(f"kept {kind} {row['Name']}: no run labels (made before them, or by "
                    f"hand); remove it by hand if no run uses it: "
                    f"docker {kind} rm {'-f ' if kind == 'container' else ''}{row['Name']}")
    for other, n in sorted(others.items()):
        log(f"left {n} object(s) of runs on host {other}: this engine is shared, and only "
            f"that host can tell whether its runs are gone")
    return Reaped(processes + removed, kept, others)
