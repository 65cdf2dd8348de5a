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
the command; docs/commands.md, "Runs that were killed"). Processes carry the same owner in
their environment (RUN_ENV, set for a command's duration by `children_marked`): every
child inherits it, so the smoke suite, a `docker build` or `docker-compose` client that
outlive a SIGKILLed run are found by it (`marked_processes`); /proc/PID/environ shows the
environment a process was started with, which names the run that started it."""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

HOST_LABEL = "io.imagebuild.run.host"
PID_LABEL = "io.imagebuild.run.pid"
START_LABEL = "io.imagebuild.run.start"  # BOOT_ID/TICKS of the process
RUN_LABEL = "io.imagebuild.run.id"
OWNER_KEYS = (HOST_LABEL, PID_LABEL, START_LABEL, RUN_LABEL)
RUN_ENV = "IMAGEBUILD_RUN_OWNER"  # HOST|PID|START|RUN of the run a process belongs to
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


def stat_fields(pid: int, proc: Path = PROC) -> list[str] | None:
    """Fields 3 onwards of /proc/PID/stat (state, ppid, ...), None when there is no such
    process. The command name (field 2) may hold spaces and parentheses: the fields
    after its last ')' are counted."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    return text[text.rfind(")") + 2:].split()


def start_ticks(pid: int, proc: Path = PROC) -> int | None:
    """The process's start time in clock ticks since boot, None when there is no such
    process."""
    fields = stat_fields(pid, proc)
    try:
        return int(fields[19]) if fields else None  # field 22 overall; 3 (state) is [0]
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


def owner_marker() -> str:
    """This process's owner as RUN_ENV holds it (a hostname holds no "|")."""
    labels = owner_labels()
    return "|".join(labels[k] for k in OWNER_KEYS)


def labels_of_marker(marker: str) -> dict[str, str]:
    """A RUN_ENV value as the labels it stands for ({} when it is not one)."""
    parts = marker.split("|")
    return dict(zip(OWNER_KEYS, parts, strict=True)) if len(parts) == len(OWNER_KEYS) else {}


@contextlib.contextmanager
def children_marked() -> Iterator[None]:
    """Every process started meanwhile (and each of its own children) carries this run's
    owner in RUN_ENV; the environment is as before afterwards (tests call commands
    in-process)."""
    before = os.environ.get(RUN_ENV)
    os.environ[RUN_ENV] = owner_marker()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(RUN_ENV, None)
        else:
            os.environ[RUN_ENV] = before


@dataclass(frozen=True)
class MarkedProcess:
    pid: int
    ticks: int | None  # its own start: a pid reused before it is signalled is not it
    labels: dict[str, str]  # of the run whose environment it was started with
    command: str


def marked_processes(proc: Path = PROC) -> Iterator[MarkedProcess]:
    """Every process on this host started with RUN_ENV in its environment. A process
    that ends while it is read, or whose environment cannot be read, is passed over."""
    key = RUN_ENV.encode() + b"="
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        for var in env.split(b"\0"):
            if var.startswith(key):
                labels = labels_of_marker(var[len(key):].decode(errors="replace"))
                if labels:
                    command = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
                    pid = int(entry.name)
                    yield MarkedProcess(pid, start_ticks(pid, proc), labels, command[:120])
                break


def ancestors(pid: int, proc: Path = PROC) -> set[int]:
    """pid and every parent above it (field 4 of /proc/PID/stat)."""
    out: set[int] = set()
    while pid > 0 and pid not in out:
        out.add(pid)
        fields = stat_fields(pid, proc)
        try:
            pid = int(fields[1]) if fields else 0
        except (ValueError, IndexError):
            break
    return out


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
