"""Who started a container, volume or network: the labels every one a run makes carries
(this host, this process, when it started, a run id), and whether that run is gone.

A pid alone does not name a run: the kernel reuses pids, so a label also holds the
process's start time (field 22 of /proc/PID/stat, clock ticks since boot) and the boot id
(/proc/sys/kernel/random/boot_id; after a reboot the tick count starts again). A run is
gone when its host is this one and its pid is not alive, or alive with another start.
Another host's objects (a Docker engine shared by several hosts) are never judged here:
that host's pids mean nothing on this one.

Every creation path takes its labels from here: the Docker seam (docker.py) for the SDK's
containers, `owned_compose` for every compose file a run starts (services, volumes,
networks); `build.py launch` is the exception by design (a deployment meant to outlive
the command; docs/runner-hygiene.md)."""

from __future__ import annotations

import functools
import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

HOST_LABEL = "io.imagebuild.run.host"
PID_LABEL = "io.imagebuild.run.pid"
START_LABEL = "io.imagebuild.run.start"  # BOOT_ID/TICKS of the process
RUN_LABEL = "io.imagebuild.run.id"
OWNER_KEYS = (HOST_LABEL, PID_LABEL, START_LABEL, RUN_LABEL)
PROC = Path("/proc")
BOOT_ID = PROC / "sys/kernel/random/boot_id"

State = Literal["live", "gone", "other-host", "unowned"]


def host_name() -> str:
    return socket.gethostname()


def boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return "unknown-boot"


def start_ticks(pid: int, proc: Path = PROC) -> int | None:
    """The process's start time in clock ticks since boot, None when there is no such
    process. The command name (field 2) may hold spaces and parentheses: the fields
    after its last ')' are counted."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    fields = text[text.rfind(")") + 2:].split()
    try:
        return int(fields[19])  # field 22 overall; field 3 (state) is fields[0]
    except (IndexError, ValueError):
        return None


def process_start(pid: int, proc: Path = PROC) -> str | None:
    """BOOT_ID/TICKS of a live process, None when it is not alive ("unknown" when it is
    alive but its stat cannot be read: never taken for gone)."""
    ticks = start_ticks(pid, proc)
    if ticks is not None:
        return f"{boot_id()}/{ticks}"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except (PermissionError, OverflowError, ValueError):
        return "unknown" if pid > 0 else None
    return "unknown"


@functools.cache
def owner_labels() -> dict[str, str]:
    """This process's labels (one run id per process)."""
    pid = os.getpid()
    return {HOST_LABEL: host_name(), PID_LABEL: str(pid),
            START_LABEL: process_start(pid) or "unknown",
            RUN_LABEL: secrets.token_hex(6)}


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    start: str
    run: str

    def describe(self) -> str:
        return f"run {self.run} (pid {self.pid} on {self.host})"


def owner_of(labels: Mapping[str, str] | None) -> Owner | None:
    """The run an object's labels name, None when they name none (made before run labels,
    or by hand) or cannot be read."""
    labels = labels or {}
    if not all(labels.get(k) for k in (HOST_LABEL, PID_LABEL, START_LABEL)):
        return None
    try:
        pid = int(labels[PID_LABEL])
    except ValueError:
        return None
    return Owner(labels[HOST_LABEL], pid, labels[START_LABEL], labels.get(RUN_LABEL, "?"))


def run_state(labels: Mapping[str, str] | None, *, host: str | None = None,
              start_of: Any = process_start) -> State:
    """live, gone, other-host or unowned: what a reaper may do with an object is decided
    by this alone. `start_of(pid)`: BOOT_ID/TICKS of a live pid, None when none."""
    owner = owner_of(labels)
    if owner is None:
        return "unowned"
    if owner.host != (host if host is not None else host_name()):
        return "other-host"
    now = start_of(owner.pid)
    if now is None:
        return "gone"
    return "live" if "unknown" in (now, owner.start) or now == owner.start else "gone"


def owned_compose(text: str) -> str:
    """A compose file with this run's labels on every service, named volume and network
    it declares (compose puts service labels on the containers it makes)."""
    doc = yaml.safe_load(text) or {}
    mine = {k: v.replace("$", "$$") for k, v in owner_labels().items()}  # no interpolation
    for svc in (doc.get("services") or {}).values():
        svc["labels"] = {**_as_mapping(svc.get("labels")), **mine}
    for kind in ("volumes", "networks"):
        for name, spec in list((doc.get(kind) or {}).items()):
            spec = spec or {}
            if not spec.get("external"):
                spec["labels"] = {**_as_mapping(spec.get("labels")), **mine}
            doc[kind][name] = spec
    return yaml.safe_dump(doc, sort_keys=False, width=100)


def _as_mapping(labels: Any) -> dict[str, str]:
    """Compose's labels as a mapping or as a list of KEY=VALUE."""
    if isinstance(labels, Mapping):
        return dict(labels)
    out: dict[str, str] = {}
    for item in labels or []:
        key, _, value = str(item).partition("=")
        out[key] = value
    return out
