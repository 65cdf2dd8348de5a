"""The whole job (`build.py --tag T`): plan -> lock check -> preflight -> build -> smoke
-> release gates (lossless, long generation) -> publish (push by digest, release tag) ->
bench (stored beside the release) -> regression and acceptance gates -> `latest`, last ->
the compatibility table (stored beside the release, also when a gate refused it).

Nothing is pushed unless every job of the tag passed smoke and the release gates; `latest`
moves only after the bench, past the regression gate, forward only. Each step is also its
own command, and the commands take their stage's functions from the stage: preflight
(preflight/run.py check_plan), whether a plan may build (buildable.py), the release gates
(gates/run.py), promotion (release/latest.py promote_plan); publish takes its helpers from
here.

A re-run resumes: after the build, each cell's release record is read once
(release/resume.py `decide`, the decision `resume --tag` gives the workflow too) and every
stage it already holds for this very image is skipped with one line naming that record;
`--resmoke` runs smoke and the gates again, `--dry-run` runs every stage.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# build_jobs, smoke_jobs, inspect_image and reap looked up per call: tests swap in doubles
from imagebuild import docker, progress, reaper
from imagebuild.bench import results, store
from imagebuild.bench.command import bench_image, load_settings, nodes_server, write_outputs
from imagebuild.buildable import buildable
from imagebuild.builder import builder
from imagebuild.buildfolder import bench_dir, cell_dir, gates_path, verdict_path
from imagebuild.errors import OperationFailed, UserError
from imagebuild.gates.run import run_gates
from imagebuild.gates.summary import load_summary, passed
from imagebuild.plan import Job, Plan, format_table, registry_client
from imagebuild.registry.client import RegistryClient
from imagebuild.registry.streams import encoding_for
from imagebuild.release import compat
from imagebuild.release.latest import promote_plan
from imagebuild.release.publish import load_verdict, publish_job
from imagebuild.release.resume import decide, record_files, recorded_gates, signing
from imagebuild.serving.runspec import Limits
from imagebuild.smoke import runner
from imagebuild.stagewatch import BuildWatch, SmokeWatch
from imagebuild.supplychain.attach import attach


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


def load_verdicts(jobs: tuple[Job, ...], out: Path) -> dict[str, dict[str, Any]]:
    return {j.id: load_verdict(verdict_path(out, j.cell)) for j in jobs}


def load_gates(jobs: tuple[Job, ...], out: Path) -> dict[str, dict[str, Any]]:
    """Each job's release-gates summary from its gates.json, for its local image exactly
    (a missing or stale one stops publish: exit 1, nothing pushed)."""
    return {j.id: load_summary(gates_path(out, j.cell),
                               docker.inspect_image(j.release_ref)["Id"]) for j in jobs}


def publish_jobs(client: RegistryClient, jobs: tuple[Job, ...], verdicts: dict[str, Any], *,
                 dry_run: bool, gates: dict[str, dict[str, Any]] | None = None,
                 out: Path | None = None) -> None:
    """Push and record every job (each gated on its own smoke verdict and release-gates
    summary); `latest` stays. `out`: the build folder (an engine handoff's ref)."""
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
    for job in jobs:
        b = job.cell.target.bench
        if b is None:
            print(f"{job.id}: target {job.cell.target_name} has no bench settings; "
                  "the regression gate will not apply")
            continue
        if skipped("bench", job, skip or {}):
            continue
        repo = job.image.repository
        info = docker.inspect_image(job.release_ref)
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


def resume_decisions(client: RegistryClient, plan: Plan,
                     opts: ReleaseOptions) -> dict[str, Any]:
    """Each job's release as the registry holds it for the image just built (one
    resume.decide per cell; a release of another image stops here, before smoke). A dry
    run reads nothing before publish: every stage runs."""
    if opts.dry_run:
        return {}
    return {j.id: decide(client, j, image_id=docker.inspect_image(j.release_ref)["Id"],
                         signed=signing(), force=opts.resmoke) for j in plan.jobs}


def smoke_or_resume(plan: Plan, out: Path, decisions: dict[str, Any],
                    skip: dict[str, dict[str, str]]) -> dict[str, dict[str, Any]]:
    """Each job's smoke verdict: run, or the release record's (written where publish and
    the notes read it) when the record says this image passed."""
    verdicts: dict[str, dict[str, Any]] = {}
    for job in plan.jobs:
        if skipped("smoke", job, skip):
            verdict = record_files(decisions[job.id].release, job, out, replace=True)
            assert verdict is not None  # decide skips smoke only for a smoke-passed record
            verdicts[job.id] = verdict
            continue
        with progress.stage("smoke", job.id, poll=SmokeWatch(cell_dir(out, job.cell)).poll):
            verdicts.update(runner.smoke_jobs(plan.lm, (job,), out_root=out))
    return verdicts


def gates_or_resume(plan: Plan, out: Path, decisions: dict[str, Any],
                    skip: dict[str, dict[str, str]]) -> dict[str, dict[str, Any]]:
    """Each job's release-gates summary: run, or the one its release records as passed
    (a record without gates, older than them, runs them)."""
    todo = tuple(j for j in plan.jobs if not skipped("gates", j, skip))
    gates = run_gates(todo, out) if todo else {}
    for job in plan.jobs:
        if job.id not in gates:
            recorded = recorded_gates(decisions[job.id].release)
            assert recorded is not None  # decide skips the gates only when recorded
            gates[job.id] = recorded
    return gates


def run_release(plan: Plan, opts: ReleaseOptions) -> int:

    refuse_unmeasured(plan, opts)
    encoding_for(plan.destination.registry)  # IMAGEBUILD_PUSH_COMPRESSION: refused now
    buildable(plan)
    reaper.reap()  # what a SIGKILLed run on this host left: before this run starts its own
    print(format_table(plan.jobs, plan.header()))
    for job in plan.jobs:  # one progress line per stage and cell (stagewatch.py)
        watch = BuildWatch()
        with progress.stage("build", job.id, poll=watch.poll):
            builder.build_jobs(plan.lm, plan.lock, (job,), out_dir=opts.out, log=watch.log)
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
            promote_plan(plan, client, accept_regression=opts.accept_regression,
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
    with progress.stage("table", plan.jobs[0].id if len(plan.jobs) == 1 else "all"):
        doc = compat.gather(client, plan.jobs, plan.lm.matrix.publish)
        compat.store_tables(client, plan.jobs, doc)
    print(compat.markdown(doc), end="")

