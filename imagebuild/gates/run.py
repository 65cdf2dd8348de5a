"""Run the gates for one serve image: the image as it ships (the run smoke recorded,
capture.py, else a boot of its own) and, when it speculates, once more without
`--speculative-config` (serving/container.py's `serving`: the hardened run of
serving/runspec.py, a free loopback port, always removed); both get the same greedy
requests one at a time (send.py); judge (verdict.py); write gates.json. A multi-node
cell is served on all its nodes, as its smoke runs them (serving/container.py
server_for).

One server at a time, each request alone: a batch of one is the shape both runs share,
so the plain run is the reference the speculative one must reproduce token for token."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imagebuild import progress
from imagebuild.buildfolder import CAPTURE_FILE, GATES_FILE, cell_dir
from imagebuild.errors import OperationFailed
from imagebuild.gates.capture import load_capture
from imagebuild.gates.prompts import GateRequest, gate_requests
from imagebuild.gates.runrecord import Run
from imagebuild.gates.send import send_all
from imagebuild.gates.summary import passed, summary
from imagebuild.gates.verdict import GateResult, long_generation, lossless, not_applicable
from imagebuild.serving.container import Server, one_container, server_for
from imagebuild.serving.runspec import SPEC_FLAG, Limits, speculates
from imagebuild.spec.gates import GateSettings

if TYPE_CHECKING:
    from imagebuild.plan import Job

Log = Callable[[str], None]


def run_requests(image: str, info: dict[str, Any], expect: dict[str, Any],
                 reqs: list[GateRequest], *, seed: int, what: str,
                 drop_flags: tuple[str, ...] = (), log: Log = print,
                 serve: Server | None = None) -> Run:
    """Boot (`serve`, by default one container), send every request, take it down."""
    serve = serve or one_container(image, info, Limits.of(expect), log=log)
    run = Run(what)
    t0 = time.monotonic()
    try:
        with serve(drop_flags) as c:
            run.boot_s = time.monotonic() - t0
            send_all(run, c.name, c.base_url, reqs, seed=seed)
    except OperationFailed as exc:  # it did not boot: nothing measured, nothing passes
        run.untrusted = f"the {what} server did not serve: {exc.message[:600]}"
    run.seconds = time.monotonic() - t0
    return run


def judge(spec: Run | None, plain: Run, settings: GateSettings
          ) -> tuple[GateResult, GateResult]:
    """(lossless, long generation). `spec` None: the cell serves without a drafter, its
    own run (`plain`) is both the tested and the reference decoding."""
    untrusted = "; ".join(u for u in (spec.untrusted if spec else None, plain.untrusted) if u)
    eps = settings.lossless.tie_logprob_epsilon
    if spec is None:
        loss = not_applicable()
        tested, ref = plain, None
    else:
        loss = lossless(spec.gens, plain.gens, settings.lossless, untrusted=untrusted or None)
        tested, ref = spec, plain
    idx = [i for i, g in enumerate(tested.gens) if g.max_tokens == settings.long_generation.tokens
           and g.name == "long"]
    if not idx or (ref is not None and len(ref.gens) <= idx[0]):
        return loss, GateResult("untrusted", untrusted or "the long request was not answered",
                                {"tokens": 0})
    i = idx[0]
    lg = long_generation(tested.gens[i], ref.gens[i] if ref else None,
                         settings.long_generation, epsilon=eps, untrusted=untrusted or None)
    return loss, lg


def gate_image(image: str, info: dict[str, Any], expect: dict[str, Any],
               settings: GateSettings, out_dir: Path, *, cell: str | None = None,
               serve: Server | None = None, log: Log = print) -> dict[str, Any]:
    """Run and judge the gates for one local image; gates.json in out_dir; the document.
    `serve`: how the image is served (server_for); by default one container."""
    t0 = time.monotonic()
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    reqs = gate_requests(settings)
    seed = settings.lossless.seed

    shipped = "speculative" if speculates(info) else "plain"  # the image as it ships
    recorded = load_capture(out_dir / CAPTURE_FILE, str(info.get("Id")), settings)
    if recorded is not None and recorded.what == shipped:
        log(f"{image}: the {shipped} run is the one smoke recorded ({CAPTURE_FILE})")
    else:
        recorded = run_requests(image, info, expect, reqs, seed=seed, what=shipped,
                                log=log, serve=serve)
    spec = None
    if shipped == "speculative":
        spec = recorded
        plain = run_requests(image, info, expect, reqs, seed=seed, what="plain",
                             drop_flags=(SPEC_FLAG,), log=log, serve=serve)
    else:
        plain = recorded
    loss, lg = judge(spec, plain, settings)
    doc: dict[str, Any] = {
        "image_ref": image, "image_id": info.get("Id"), "cell": cell, "started": started,
        "seconds": round(time.monotonic() - t0, 2),
        "settings": settings.model_dump(),
        "lossless": {"status": loss.status, "reason": loss.reason, **loss.detail},
        "long_generation": {"status": lg.status, "reason": lg.reason, **lg.detail},
        "runs": [r.as_json() for r in (spec, plain) if r is not None],
    }
    doc["summary"] = summary(doc)
    doc["passed"] = passed(doc["summary"])
    out_dir.mkdir(parents=True, exist_ok=True)
    doc["path"] = str(out_dir / GATES_FILE)
    (out_dir / GATES_FILE).write_text(json.dumps(doc, indent=1))
    return doc


def gate_jobs(jobs: tuple[Job, ...], out_root: Path, *, log: Log = print
              ) -> dict[str, dict[str, Any]]:
    """`build.py gates --tag T` and the whole job: each job's local image, one at a time;
    gates.json in its smoke cell dir."""
    from imagebuild.docker import inspect_image

    docs = {}
    for job in jobs:
        info = inspect_image(job.release_ref)
        out = cell_dir(out_root, job.cell)
        with progress.stage("gates", job.id):
            serve = server_for(job.cell, job.release_ref, info, out,
                               limits=Limits.of(job.expect), log=log)
            docs[job.id] = gate_image(job.release_ref, info, dict(job.expect),
                                      job.cell.target.gates, out, cell=job.id,
                                      serve=serve, log=log)
    return docs
