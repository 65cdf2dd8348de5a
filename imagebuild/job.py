"""The whole job (`build.py --tag T`): plan -> lock check -> preflight -> build -> smoke
-> release gates (lossless, long generation) -> publish (push by digest, release tag) ->
bench (stored beside the release) -> regression and acceptance gates -> `latest`, last ->
the compatibility table (stored beside the release, also when a gate refused it).

Nothing is pushed unless every job of the tag passed smoke and the release gates; `latest`
moves only after the bench, past the regression gate, forward only. Each step is also its
own command; the helpers here are the ones those commands share.

A re-run resumes: after the build, each cell's release record is read once
(release/resume.py `decide`, the decision `resume --tag` gives the workflow too) and every
stage it already holds for this very image is skipped with one line naming that record;
`--resmoke` runs smoke and the gates again, `--dry-run` runs every stage.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagebuild import progress
from imagebuild.errors import OperationFailed, UserError
from imagebuild.plan import Job, Plan, format_table
from imagebuild.registry.client import RegistryClient
from imagebuild.registry.streams import encoding_for


@dataclass(frozen=True)
class ReleaseOptions:
    out: Path
    dry_run: bool = False
    bench: bool = True
    resmoke: bool = False  # smoke and the release gates again, whatever the record says
    accept_regression: str | None = None
    accept_untrusted: str | None = None
    accept_unmeasured: str | None = None
    accept_rolled_back: str | None = None
    accept_acceptance_drop: str | None = None


def unmeasured_jobs(plan: Plan, opts: ReleaseOptions) -> list[Job]:
    """The jobs the whole job would promote without a measurement: all of them under
    --no-bench, else those whose target has no `bench:` settings."""
    return [j for j in plan.jobs if not opts.bench or j.cell.target.bench is None]


def refuse_unmeasured(plan: Plan, opts: ReleaseOptions) -> None:
    """Before anything is built: the whole job would end at the regression gate with
    nothing to compare, so without --accept-unmeasured it does not start."""
    if opts.dry_run or opts.accept_unmeasured:
        return
    jobs = unmeasured_jobs(plan, opts)
    if jobs:
        why = ("--no-bench measures nothing" if not opts.bench else
               "target(s) " + ", ".join(sorted({j.cell.target_name for j in jobs}))
               + " have no `bench:` settings in matrix.yaml")
        raise UserError(
            f"{why}: latest would move to {len(jobs)} release(s) with no bench results, "
            "which the regression gate refuses",
            fix='say so explicitly: --accept-unmeasured "why" (recorded in each release and '
                "its notes)" + ("" if not opts.bench else ", or add `bench:` to the target"))


def preflight(plan: Plan, *, building: bool = False) -> None:
    """Errors block (exit 2), warnings print: what plan and build run before anything.
    `building`: unresolved pins are errors (the rule `check --tag` applies). A plan with a
    tag that does not build (`plan --tag`) sees the findings `check --tag` sees, in its
    words; the errors only a release raises (a rule that warns without a tag) are said to
    fail the release, and planning goes on: the release's own jobs stop on them."""
    from imagebuild.preflight.findings import format_table as findings_table
    from imagebuild.preflight.run import RULES, run_checks

    as_release = building or plan.tag is not None
    findings = run_checks(plan.lm, list(plan.cells), plan.lock, building=as_release)
    # -qq (our logger at errors only) leaves out the warnings: errors still block and print
    quiet = not logging.getLogger("imagebuild").isEnabledFor(logging.WARNING)
    shown = [f for f in findings if f.severity == "error" or
             (f.severity != "info" and not quiet)]
    if shown:
        print(findings_table(shown, show_info=False), file=sys.stderr)
    blocking = [f for f in findings if f.blocking]
    release_only = [f for f in blocking if not building and RULES[f.rule].severity != "error"]
    if len(blocking) > len(release_only):
        raise UserError("preflight found errors (listed above)",
                        fix="fix them, or waive a rule in matrix.yaml with a written reason; "
                            "`python build.py check --tag T` shows the details")
    if release_only:
        print(f"plan: {len(release_only)} error(s) above fail release {plan.tag} "
              "(its `build.py --tag` and `check --tag` stop on them); "
              "this plan lists its jobs anyway", file=sys.stderr)


def buildable(plan: Plan) -> Plan:
    """A plan that may build: a tag, the build's environment settings readable, pins
    locked and resolved, preflight clean; the same findings `check --tag` prints (lock
    agreement and unresolved pins: preflight/pins.py). The environment first: preflight
    may fetch the pinned vLLM, and bad input reaches no index."""
    from imagebuild.builder.builder import check_environment  # deferred: build stack

    if plan.tag is None:
        raise UserError("building needs a release tag", fix="pass --tag DATE-NAME")
    check_environment()
    preflight(plan, building=True)
    return plan


def registry_client(plan: Plan) -> RegistryClient:
    """The plan's registry; a bad IMAGEBUILD_PUSH_COMPRESSION is refused here too, before
    a command that may push asks it anything."""
    encoding_for(plan.destination.registry)
    return RegistryClient(plan.destination.registry)


def load_verdicts(jobs: tuple[Job, ...], out: Path) -> dict[str, dict[str, Any]]:
    from imagebuild.buildfolder import verdict_path
    from imagebuild.release.publish import load_verdict

    return {j.id: load_verdict(verdict_path(out, j.cell)) for j in jobs}


def load_gates(jobs: tuple[Job, ...], out: Path) -> dict[str, dict[str, Any]]:
    """Each job's release-gates summary from its gates.json, for its local image exactly
    (a missing or stale one stops publish: exit 1, nothing pushed)."""
    from imagebuild.buildfolder import gates_path
    from imagebuild.docker import inspect_image
    from imagebuild.gates.summary import load_summary

    return {j.id: load_summary(gates_path(out, j.cell),
                               inspect_image(j.release_ref)["Id"]) for j in jobs}


def publish_jobs(client: RegistryClient, jobs: tuple[Job, ...], verdicts: dict[str, Any], *,
                 dry_run: bool, gates: dict[str, dict[str, Any]] | None = None,
                 out: Path | None = None) -> None:
    """Push and record every job (each gated on its own smoke verdict and release-gates
    summary); `latest` stays. `out`: the build folder (an engine handoff's ref)."""
    from imagebuild.release.publish import publish_job

    for job in jobs:
        with progress.stage("publish", job.id):
            result = publish_job(client, job, verdicts[job.id], dry_run=dry_run,
                                 gates=(gates or {}).get(job.id), out=out)
        if dry_run:
            print(f"{job.id}: dry run, nothing written")
        else:
            print(f"{job.id}: {'pushed' if result.pushed else 'already pushed'} "
                  f"{result.digest}")


def skipped(stage: str, job: Job, skip: dict[str, dict[str, str]]) -> bool:
    """True when `job`'s release already holds `stage` (resume.decide), said in one line."""
    why = skip.get(job.id, {}).get(stage)
    if why:
        print(f"{stage} skipped  {job.id}: {why}")
    return why is not None


def document_jobs(client: RegistryClient, plan: Plan, out: Path,
                  skip: dict[str, dict[str, str]] | None = None) -> None:
    """Right after publish: each published image's SBOM and build provenance, read from
    the image, stored with its release (imagebuild/supplychain); nothing again on a
    re-run. A lock that disagrees with the image is printed as findings."""
    from imagebuild.supplychain.attach import attach

    if plan.lock is None:
        raise UserError("no matrix.lock.json: the SBOM compares the image with the lock",
                        fix="run `build.py lock`")
    for job in plan.jobs:
        if skipped("sbom", job, skip or {}):
            continue
        with progress.stage("sbom", job.id):
            attach(client, job, plan.lock, root=plan.lm.root, build_dir=out)


def bench_jobs(client: RegistryClient, jobs: tuple[Job, ...], out: Path,
               skip: dict[str, dict[str, str]] | None = None) -> None:
    """Measure each job's tested image with its target's `bench:` settings (and, with
    `plain_baseline`, a speculating image's plain twin) and store the results with the
    release (kept when the registry already has them: a re-run)."""
    from imagebuild.bench import results, store
    from imagebuild.bench.command import (
        bench_image,
        load_settings,
        nodes_server,
        write_outputs,
    )
    from imagebuild.docker import inspect_image
    from imagebuild.serving.runspec import Limits

    for job in jobs:
        b = job.cell.target.bench
        if b is None:
            print(f"{job.id}: target {job.cell.target_name} has no bench settings; "
                  "the regression gate will not apply")
            continue
        if skipped("bench", job, skip or {}):
            continue
        repo = job.image.repository
        info = inspect_image(job.release_ref)
        if store.stored(client, repo, str(job.tag)) is not None:
            print(f"{job.id}: bench results for {job.tag} already stored")
            continue
        prompt_set, load_kw, settings = load_settings(
            b.concurrency, b.prompts, requests=b.requests, duration=None,
            max_tokens=b.max_tokens)
        with progress.stage("bench", job.id):
            doc = bench_image(job.release_ref, info, limits=Limits.of(job.expect),
                              prompt_set=prompt_set,
                              levels=b.concurrency, load_kw=load_kw, settings=settings,
                              label=str(job.tag), nodes=nodes_server(job, info, out),
                              plain=b.plain_baseline)
        digest = store.put_results(client, repo, str(job.tag), doc)
        md = results.markdown(doc)
        print(md + f"stored with {repo}:{job.tag} ({digest[:19]})")
        write_outputs(doc, out, md)


def promote(plan: Plan, client: RegistryClient, *, accept_regression: str | None,
            accept_untrusted: str | None = None, accept_unmeasured: str | None = None,
            accept_rolled_back: str | None = None, forward_only: bool = False,
            dry_run: bool = False, accept_acceptance_drop: str | None = None) -> list[Any]:
    """The moves of latest (release/latest.py Move), one per image."""
    from imagebuild.release.latest import promote_jobs

    return promote_jobs(client, plan.jobs,
                 default_threshold=plan.lm.matrix.publish.regression_threshold,
                 default_acceptance_threshold=plan.lm.matrix.publish.acceptance_threshold,
                 accept_acceptance_drop=accept_acceptance_drop,
                 accept_regression=accept_regression, accept_untrusted=accept_untrusted,
                 accept_unmeasured=accept_unmeasured, accept_rolled_back=accept_rolled_back,
                 forward_only=forward_only,
                 dry_run=dry_run)


def run_gates(jobs: tuple[Job, ...], out: Path) -> dict[str, dict[str, Any]]:
    """The release gates of every job (gates/run.py), one line per gate and cell; the
    summaries, by job id."""
    from imagebuild.gates.run import gate_jobs
    from imagebuild.gates.summary import passed

    docs = gate_jobs(jobs, out)
    for job_id, doc in docs.items():
        s = doc["summary"]
        for gate, v in s.items():
            print(f"gates {v['status'].upper():<14} {job_id}  {gate}: {v['reason']}")
        if not passed(s):
            print(f"  details: {doc.get('path', '')}", file=sys.stderr)
    return {job_id: doc["summary"] for job_id, doc in docs.items()}


def resume_decisions(client: RegistryClient, plan: Plan,
                     opts: ReleaseOptions) -> dict[str, Any]:
    """Each job's release as the registry holds it for the image just built (one
    resume.decide per cell; a release of another image stops here, before smoke). A dry
    run reads nothing before publish: every stage runs."""
    from imagebuild.docker import inspect_image
    from imagebuild.release.resume import decide, signing

    if opts.dry_run:
        return {}
    return {j.id: decide(client, j, image_id=inspect_image(j.release_ref)["Id"],
                         signed=signing(), force=opts.resmoke) for j in plan.jobs}


def smoke_or_resume(plan: Plan, out: Path, decisions: dict[str, Any],
                    skip: dict[str, dict[str, str]]) -> dict[str, dict[str, Any]]:
    """Each job's smoke verdict: run, or the release record's (written where publish and
    the notes read it) when the record says this image passed."""
    from imagebuild.buildfolder import cell_dir
    from imagebuild.release.resume import record_files
    from imagebuild.smoke.runner import smoke_jobs
    from imagebuild.stagewatch import SmokeWatch

    verdicts: dict[str, dict[str, Any]] = {}
    for job in plan.jobs:
        if skipped("smoke", job, skip):
            verdict = record_files(decisions[job.id].release, job, out, replace=True)
            assert verdict is not None  # decide skips smoke only for a smoke-passed record
            verdicts[job.id] = verdict
            continue
        with progress.stage("smoke", job.id, poll=SmokeWatch(cell_dir(out, job.cell)).poll):
            verdicts.update(smoke_jobs(plan.lm, (job,), out_root=out))
    return verdicts


def gates_or_resume(plan: Plan, out: Path, decisions: dict[str, Any],
                    skip: dict[str, dict[str, str]]) -> dict[str, dict[str, Any]]:
    """Each job's release-gates summary: run, or the one its release records as passed
    (a record without gates, older than them, runs them)."""
    from imagebuild.release.resume import recorded_gates

    todo = tuple(j for j in plan.jobs if not skipped("gates", j, skip))
    gates = run_gates(todo, out) if todo else {}
    for job in plan.jobs:
        if job.id not in gates:
            recorded = recorded_gates(decisions[job.id].release)
            assert recorded is not None  # decide skips the gates only when recorded
            gates[job.id] = recorded
    return gates


def run_release(plan: Plan, opts: ReleaseOptions) -> int:
    from imagebuild.builder.builder import build_jobs
    from imagebuild.buildfolder import bench_dir
    from imagebuild.gates.summary import passed
    from imagebuild.reaper import reap
    from imagebuild.stagewatch import BuildWatch

    refuse_unmeasured(plan, opts)
    encoding_for(plan.destination.registry)  # IMAGEBUILD_PUSH_COMPRESSION: refused now
    buildable(plan)
    reap()  # what a SIGKILLed run on this host left: before this run starts its own
    print(format_table(plan.jobs, plan.header()))
    for job in plan.jobs:  # one progress line per stage and cell (stagewatch.py)
        watch = BuildWatch()
        with progress.stage("build", job.id, poll=watch.poll):
            build_jobs(plan.lm, plan.lock, (job,), out_dir=opts.out, log=watch.log)
    client = registry_client(plan)
    decisions = resume_decisions(client, plan, opts)
    skip = {job_id: d.skip for job_id, d in decisions.items()}
    verdicts = smoke_or_resume(plan, opts.out, decisions, skip)
    failed = [v for v in verdicts.values() if not v["passed"]]
    for v in verdicts.values():
        print(f"smoke {'PASS' if v['passed'] else 'FAIL'}  {v['image_ref']}  {v['message']}")
    if failed:
        print(f"{len(failed)} cell(s) failed smoke: nothing pushed, no tag moved",
              file=sys.stderr)
        return 1
    gates = gates_or_resume(plan, opts.out, decisions, skip)
    if not all(passed(s) for s in gates.values()):
        print(f"{sum(not passed(s) for s in gates.values())} cell(s) did not pass the "
              "release gates: nothing pushed, no tag moved", file=sys.stderr)
        return 1
    if opts.dry_run:
        publish_jobs(client, plan.jobs, verdicts, dry_run=True, gates=gates)
        print("dry run: no bench stored, latest not moved")
        return 0
    publish_jobs(client, plan.jobs, verdicts, dry_run=False, gates=gates, out=opts.out)
    document_jobs(client, plan, opts.out, skip)
    if opts.bench:
        bench_jobs(client, plan.jobs, bench_dir(opts.out), skip)
    try:
        # latest already at every cell's release (a set moves together): nothing to move
        if all("latest" in skip.get(job.id, {}) for job in plan.jobs):
            for job in plan.jobs:
                skipped("latest", job, skip)
        else:
            promote(plan, client, accept_regression=opts.accept_regression,
                    accept_untrusted=opts.accept_untrusted,
                    accept_unmeasured=opts.accept_unmeasured,
                    accept_rolled_back=opts.accept_rolled_back, forward_only=True,
                    accept_acceptance_drop=opts.accept_acceptance_drop)
    except (UserError, OperationFailed):
        compatibility_table(plan, client)  # a refused release's table says why
        raise
    compatibility_table(plan, client)
    return 0


def compatibility_table(plan: Plan, client: RegistryClient) -> None:
    """The release's compatibility table from the registry: printed, and stored with each
    cell's release (release/compat.py)."""
    from imagebuild.release import compat

    with progress.stage("table", plan.jobs[0].id if len(plan.jobs) == 1 else "all"):
        doc = compat.gather(client, plan.jobs, plan.lm.matrix.publish)
        compat.store_tables(client, plan.jobs, doc)
    print(compat.markdown(doc), end="")

