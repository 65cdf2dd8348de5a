"""Run the gates for one serve image: the image as it ships (the run smoke recorded,
capture.py, else a boot of its own) and, when it speculates, once more without
`--speculative-config` (serving/container.py's `serving`: the hardened run of
serving/runspec.py, a free loopback port, always removed); both get the same greedy
requests (send.py: the plan the shipped server's shape decided, conditions.py); judge
(verdict.py, condverdict.py); write gates.json. A multi-node cell is served on all its
nodes, as its smoke runs them (serving/container.py server_for).

One server at a time. The fresh requests go one at a time (a batch of one is the shape
both runs share); the condition loads put both servers in the same condition (the same
cached prefixes, the same concurrency), and the plain run is the reference the
speculative one must reproduce token for token."""

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
from imagebuild.gates.client import Generation
from imagebuild.gates.conditions import Plan
from imagebuild.gates.condverdict import combine, judge_conditions
from imagebuild.gates.prompts import FRESH, LONG_PROMPT
from imagebuild.gates.runrecord import Run
from imagebuild.gates.send import send_all
from imagebuild.gates.shape import prefix_caching_source
from imagebuild.gates.summary import passed, summary
from imagebuild.gates.verdict import GateResult, long_generation, lossless, not_applicable
from imagebuild.serving.container import Server, one_container, server_for
from imagebuild.serving.runspec import SPEC_FLAG, Limits, speculates
from imagebuild.spec.gates import GateSettings
from imagebuild.spec.names import LABEL_NS

if TYPE_CHECKING:
    from imagebuild.plan import Job

Log = Callable[[str], None]


def run_requests(image: str, info: dict[str, Any], expect: dict[str, Any],
                 settings: GateSettings, *, what: str, plan: Plan | None = None,
                 drop_flags: tuple[str, ...] = (), log: Log = print,
                 serve: Server | None = None) -> Run:
    """Boot (`serve`, by default one container), send `plan` (None: the plan cut for this
    server, the shipped one), take it down."""
    serve = serve or one_container(image, info, Limits.of(expect), log=log)
    run = Run(what)
    t0 = time.monotonic()
    try:
        with serve(drop_flags) as c:
            run.boot_s = time.monotonic() - t0
            send_all(run, c.name, c.base_url, settings, plan=plan,
                     command=[a for a in (info.get("Config") or {}).get("Cmd") or ()])
    except OperationFailed as exc:  # it did not boot: nothing measured, nothing passes
        run.untrusted = f"the {what} server did not serve: {exc.message[:600]}"
    run.seconds = time.monotonic() - t0
    return run


def _fresh(run: Run) -> list[Generation]:
    """The answers to the fresh requests (each prompt once, alone); a run without a plan
    holds nothing else."""
    if run.plan is None:
        return list(run.gens)
    names = {r.name for p in run.plan.phases if p.condition == FRESH for r in p.requests}
    return [g for g in run.gens if g.name in names]


def judge(spec: Run | None, plain: Run, settings: GateSettings, *, prefix_said: str = ""
          ) -> tuple[GateResult, GateResult]:
    """(lossless, long generation). `spec` None: the cell serves without a drafter, its
    own run (`plain`) is both the tested and the reference decoding. The lossless gate
    covers the fresh requests and every condition (condverdict.py)."""
    untrusted = "; ".join(u for u in (spec.untrusted if spec else None, plain.untrusted) if u)
    eps = settings.lossless.tie_logprob_epsilon
    if spec is None:
        loss = not_applicable()
        tested, ref = plain, None
    else:
        asked = _fresh(spec)
        answered = [plain.gen(g.name) or Generation(g.name, g.max_tokens, error="no answer "
                                                    "from the plain server") for g in asked]
        fresh = lossless(asked, answered, settings.lossless, untrusted=untrusted or None)
        loss = combine(fresh, judge_conditions(spec, plain, settings, prefix_said=prefix_said))
        tested, ref = spec, plain
    long_name = LONG_PROMPT[0]
    mine, theirs = tested.gen(long_name), ref.gen(long_name) if ref else None
    if mine is None or mine.max_tokens != settings.long_generation.tokens or (
            ref is not None and theirs is None):
        return loss, GateResult("untrusted", untrusted or "the long request was not answered",
                                {"tokens": 0})
    lg = long_generation(mine, theirs, settings.long_generation, epsilon=eps,
                         untrusted=untrusted or None)
    return loss, lg


def gate_image(image: str, info: dict[str, Any], expect: dict[str, Any],
               settings: GateSettings, out_dir: Path, *, cell: str | None = None,
               serve: Server | None = None, log: Log = print) -> dict[str, Any]:
    """Run and judge the gates for one local image; gates.json in out_dir; the document.
    `serve`: how the image is served (server_for); by default one container."""
    t0 = time.monotonic()
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")

    shipped = "speculative" if speculates(info) else "plain"  # the image as it ships
    recorded = load_capture(out_dir / CAPTURE_FILE, str(info.get("Id")), settings)
    if recorded is not None and recorded.what == shipped:
        log(f"{image}: the {shipped} run is the one smoke recorded ({CAPTURE_FILE})")
    else:
        recorded = run_requests(image, info, expect, settings, what=shipped, log=log,
                                serve=serve)
    spec = None
    if shipped == "speculative":
        spec = recorded
        # exactly the requests the shipped server was sent (its plan, cut to its shape)
        plain = run_requests(image, info, expect, settings, what="plain", plan=spec.plan,
                             drop_flags=(SPEC_FLAG,), log=log, serve=serve)
    else:
        plain = recorded
    cmd = (info.get("Config") or {}).get("Cmd") or ()
    said = prefix_caching_source(cmd, ((info.get("Config") or {}).get("Labels") or {}).get(
        f"{LABEL_NS}.vllm.version"))
    loss, lg = judge(spec, plain, settings, prefix_said=said)
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
