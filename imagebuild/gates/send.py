"""The gates' requests sent to a healthy server, one at a time, with the server's identity
before and after: what the gates' own runs (run.py) and smoke's recording of them
(smoke/suite/test_gates_capture.py) both do. A leaf: no server is started here."""

from __future__ import annotations

from imagebuild import progress
from imagebuild.gates.client import generate, served_model
from imagebuild.gates.identity import changed, identity
from imagebuild.gates.prompts import GateRequest
from imagebuild.gates.runrecord import Run


def request_timeout(max_tokens: int) -> float:
    """Generous: a server slower than 2 tokens/s at a batch of one is broken anyway."""
    return 60.0 + max_tokens / 2


def send_all(run: Run, container: str, base_url: str, reqs: list[GateRequest], *,
             seed: int) -> Run:
    """Every request, one at a time, to a healthy server, with its identity before and
    after (a restart in between makes the run untrusted)."""
    model = served_model(base_url)
    run.before = identity(container)
    for r in reqs:
        progress.wait("gates", f"{r.name} ({r.max_tokens} tokens) on the {run.what} server")
        run.gens.append(generate(base_url, model, r, seed=seed,
                                 timeout_s=request_timeout(r.max_tokens)))
    run.after = identity(container)
    why = changed(run.before, run.after)
    if why:
        run.untrusted = f"the {run.what} run: {why}"
    return run
