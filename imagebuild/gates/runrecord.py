"""One run's answers to the gate requests: what smoke's recording (capture.py) and the
gates' own runs (run.py) share. A leaf module: the smoke suite imports it without
reaching the servers the gates boot."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from imagebuild.gates.client import Generation
from imagebuild.gates.conditions import Plan
from imagebuild.gates.identity import Identity
from imagebuild.gates.metrics import Counters
from imagebuild.gates.shape import ServerShape


@dataclass
class Run:
    what: str  # speculative | plain
    gens: list[Generation] = field(default_factory=list)
    untrusted: str | None = None  # why this run's answers cannot be trusted
    before: Identity | None = None
    after: Identity | None = None
    boot_s: float = 0.0
    seconds: float = 0.0
    recorded: bool = False  # by smoke (capture.py), not a boot of the gates' own
    plan: Plan | None = None  # the phases sent (the shipped server's, for both runs)
    shape: ServerShape | None = None  # this server's own
    evidence: dict[str, Counters] = field(default_factory=dict)  # per phase: counter deltas
    decay_readings: list[Counters] = field(default_factory=list)  # around each chained request
    phase_seconds: dict[str, float] = field(default_factory=dict)  # wall time of each phase

    def gen(self, name: str) -> Generation | None:
        return next((g for g in self.gens if g.name == name), None)

    def as_json(self) -> dict[str, Any]:
        return {"what": self.what, "untrusted": self.untrusted,
                "source": "smoke's server" if self.recorded else "booted by the gates",
                "boot_s": round(self.boot_s, 2), "seconds": round(self.seconds, 2),
                "server_before": self.before.as_json() if self.before else None,
                "server_after": self.after.as_json() if self.after else None,
                "shape": self.shape.as_json() if self.shape else None,
                "evidence": {k: v.as_json() for k, v in self.evidence.items()},
                "phase_seconds": self.phase_seconds,
                "requests": [g.as_json() for g in self.gens]}
