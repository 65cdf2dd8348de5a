"""The speculative half of the gates, recorded while smoke has the image up.

Smoke already boots the image exactly as it ships; the gates' requests sent to that
server (suite/test_gates_capture.py) spare the gates a second boot of the same thing, so
a cell with a drafter costs the gates one boot (the plain server), not two. The record
holds every token, logprob and the server's identity before and after, the plan it sent
(the plain server gets the same one) and vLLM's counters around each phase and during the
long request; the gates use it only for exactly the image and settings they judge, else
they boot the image themselves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from imagebuild.gates.client import Generation
from imagebuild.gates.conditions import Plan
from imagebuild.gates.identity import Identity
from imagebuild.gates.metrics import Counters
from imagebuild.gates.runrecord import Run
from imagebuild.gates.shape import ServerShape
from imagebuild.spec.gates import GateSettings


def _gen_json(g: Generation) -> dict[str, Any]:
    return {**g.as_json(), "seconds": g.seconds, "token_ids": g.tokens,
            "logprobs": g.logprobs, "top": [{str(k): v for k, v in d.items()} for d in g.top]}


def _gen(d: dict[str, Any]) -> Generation:
    return Generation(d["name"], int(d["max_tokens"]), tokens=[int(t) for t in d["token_ids"]],
                      logprobs=[float(x) for x in d["logprobs"]],
                      top=[{int(k): float(v) for k, v in t.items()} for t in d["top"]],
                      finish_reason=d.get("finish_reason"), error=d.get("error"),
                      seconds=float(d.get("seconds") or 0.0))


def save_capture(path: Path, image_id: str, settings: GateSettings, run: Run) -> None:
    path.write_text(json.dumps({
        "image_id": image_id, "settings": settings.model_dump(), "what": run.what,
        "untrusted": run.untrusted, "boot_s": run.boot_s, "seconds": run.seconds,
        "before": run.before.as_json() if run.before else None,
        "after": run.after.as_json() if run.after else None,
        "plan": run.plan.as_json() if run.plan else None,
        "shape": run.shape.as_json() if run.shape else None,
        "evidence": {k: v.as_json() for k, v in run.evidence.items()},
        "decay_readings": [c.as_json() for c in run.decay_readings],
        "phase_seconds": run.phase_seconds,
        "generations": [_gen_json(g) for g in run.gens]}))


def load_capture(path: Path, image_id: str, settings: GateSettings) -> Run | None:
    """The recorded run, for exactly this image and these settings; None otherwise."""
    try:
        d = json.loads(path.read_text())
        if d["image_id"] != image_id or d["settings"] != settings.model_dump():
            return None
        return Run(d["what"], gens=[_gen(g) for g in d["generations"]],
                   untrusted=d.get("untrusted"),
                   before=Identity(**d["before"]) if d.get("before") else None,
                   after=Identity(**d["after"]) if d.get("after") else None,
                   boot_s=float(d.get("boot_s") or 0.0), seconds=float(d.get("seconds") or 0.0),
                   recorded=True, plan=Plan.from_json(d["plan"]) if d.get("plan") else None,
                   shape=ServerShape.from_json(d["shape"]) if d.get("shape") else None,
                   evidence={k: Counters.from_json(v) for k, v in d["evidence"].items()},
                   decay_readings=[Counters.from_json(c) for c in d["decay_readings"]],
                   phase_seconds={k: float(v) for k, v in d["phase_seconds"].items()})
    except (OSError, ValueError, KeyError, TypeError):
        return None
