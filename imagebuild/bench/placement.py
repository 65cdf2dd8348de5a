"""Where the server and the load generator run during a bench: apart.

A streaming bench measures the server only while the client reads each chunk the moment
it arrives. Sharing CPUs with a server that keeps every core busy, the client reads late
and in bursts (issue 15, measured in README "Why the cpu bench pins server and client").
So by default the client takes the last CPU this process may use and the server container
gets the others (docker --cpuset-cpus); with one CPU there is nothing to split and the
bench's trust flags say what that did to the figures. `--server-cpus`/`--client-cpus`
choose by hand.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    server_cpus: str | None  # docker --cpuset-cpus syntax, None: anywhere
    client_cpus: frozenset[int] | None  # None: anywhere
    why: str

    @contextlib.contextmanager
    def client_pinned(self) -> Iterator[None]:
        """This process (the load generator) on the client CPUs while the body runs."""
        if not self.client_cpus:
            yield
            return
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, self.client_cpus)
        try:
            yield
        finally:
            os.sched_setaffinity(0, before)

    def as_settings(self) -> dict[str, object]:
        return {"server_cpus": self.server_cpus,
                "client_cpus": sorted(self.client_cpus) if self.client_cpus else None,
                "placement": self.why}


def cpuset(cpus: set[int] | frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def parse_cpus(text: str) -> set[int]:
    """'0', '1,3' or '2-5' (docker's cpuset syntax) as CPU numbers; ValueError if not."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def choose(server_cpus: str | None = None, client_cpus: set[int] | None = None,
           available: set[int] | None = None) -> Placement:
    """Explicit choices win, and a side not given gets the CPUs the other one left (never
    the same ones: a client sharing a CPU with any vLLM process reads late); with no
    choice, the last CPU this process may use goes to the client, the rest to the server."""
    cpus = set(available if available is not None else os.sched_getaffinity(0))
    if server_cpus and client_cpus:
        return Placement(server_cpus, frozenset(client_cpus),
                         f"given: server on CPU {server_cpus}, client on CPU "
                         f"{cpuset(client_cpus)}")
    if client_cpus:
        rest = cpus - client_cpus
        return Placement(cpuset(rest) if rest else None, frozenset(client_cpus),
                         f"client given, server on {cpuset(rest) if rest else 'any CPU'}")
    if server_cpus:
        rest = cpus - parse_cpus(server_cpus)
        return Placement(server_cpus, frozenset(rest) if rest else None,
                         f"server given, client on {cpuset(rest) if rest else 'any CPU'}")
    if len(cpus) < 2:
        return Placement(None, None, f"not split: only {len(cpus)} CPU")
    client = max(cpus)
    return Placement(cpuset(cpus - {client}), frozenset({client}),
                     f"auto: server on CPU {cpuset(cpus - {client})}, client on CPU {client}")
