"""The release gates' requests on the image as it ships, while smoke has it up: greedy,
with logprobs, one of them as long as the target's long generation, and the condition
loads cut to this server (prefix-cache hits, concurrency, preemption, a prompt near
max-model-len: imagebuild/gates/conditions.py). Recorded for the gates
(imagebuild/gates/capture.py) so they need not boot this image a second time; the check
itself: every request answered in full, on one unrestarted server."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from imagebuild.gates.capture import save_capture
from imagebuild.gates.runrecord import Run
from imagebuild.gates.send import send_all
from imagebuild.spec.gates import GateSettings


def test_release_gate_requests_answered(smoke):
    cap = smoke.get("gates_capture")
    if not cap:
        pytest.skip("no release gates follow this smoke run (`smoke IMAGE_REF`): "
                    "nothing to record for them")
    settings = GateSettings.model_validate(cap["settings"])
    t0 = time.monotonic()
    run = send_all(Run(cap["what"]), smoke["container"], smoke["base_url"], settings,
                   command=cap.get("command") or ())
    run.seconds = time.monotonic() - t0
    save_capture(Path(cap["path"]), smoke["image_id"], settings, run)
    bad = [f"{g.name}: {g.error or f'{len(g.tokens)} of {g.max_tokens} tokens'}"
           for g in run.gens if g.error or g.truncated]
    assert not bad, "greedy requests with logprobs not answered in full: " + "; ".join(bad)
    assert run.untrusted is None, run.untrusted
