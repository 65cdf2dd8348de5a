"""Command line: `python build.py [COMMAND] ...`.

One small function per command that turns arguments into a call of the module that does
the work (the parser and its argument types are in cliparser.py). Each command imports its
stage inside its function (`# deferred: per command`): `--help` and the quick commands
(check, render --check, schema, lock --check) then load no Docker SDK, aiohttp, Hub client
or matplotlib, and no command pays for the stages it does not run. Every command that
works on a release gets its jobs the same way (`plan.load_plan`); ImagebuildError becomes
one message and its exit code (0 ok, 1 a build/test/publish step failed, 2 bad input,
130 interrupted).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import re
import sys
from pathlib import Path

from imagebuild.cliparser import UsageError, parser
from imagebuild.errors import ImagebuildError, OperationFailed, UserError, as_invoked
from imagebuild.safetext import safe_lines

# ---------------------------------------------------------------------------- commands


def _plan(args: argparse.Namespace):
    from imagebuild.plan import load_plan  # deferred: per command (docstring)

    return load_plan(args.matrix, args.tag, args.target, args.only)


def _writes_releases() -> None:
    """Commands that write releases read these before they ask the registry anything."""
    from imagebuild.release.lease import (  # deferred: per command (docstring)
        lease_settle,
        lease_ttl,
    )

    lease_ttl()
    lease_settle()


def _build_dir(plan) -> Path:
    from imagebuild import buildfolder  # deferred: per command (docstring)

    return buildfolder.default(plan.lm.root)


def _out(args: argparse.Namespace, plan) -> Path:
    return args.out or _build_dir(plan)


def cmd_release(args: argparse.Namespace) -> int:
    from imagebuild.job import ReleaseOptions, run_release  # deferred: per command (docstring)

    _writes_releases()

    plan = _plan(args)
    return run_release(plan, ReleaseOptions(out=_out(args, plan), dry_run=args.dry_run,
                                            bench=not args.no_bench, resmoke=args.resmoke,
                                            accept_regression=args.accept_regression,
                                            accept_untrusted=args.accept_untrusted,
                                            accept_unmeasured=args.accept_unmeasured,
                                            accept_rolled_back=args.accept_rolled_back,
                                            accept_acceptance_drop=args.accept_acceptance_drop))


def cmd_plan(args: argparse.Namespace) -> int:
    from imagebuild.plan import (  # deferred: per command (docstring)
        format_json,
        format_table,
        github_matrix,
        target_matrix,
    )
    from imagebuild.preflight.run import check_plan  # deferred: per command (docstring)

    plan = _plan(args)
    check_plan(plan)
    if args.format == "github":
        print(json.dumps(github_matrix(plan.jobs), separators=(",", ":")))
    elif args.format == "targets":
        print(json.dumps(target_matrix(plan), separators=(",", ":")))
    elif args.format == "json":
        print(format_json(plan))
    else:
        print(format_table(plan.jobs, plan.header()))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from imagebuild.preflight.findings import (  # deferred: per command (docstring)
        MATRIX,
        Finding,
        has_errors,
    )
    from imagebuild.preflight.run import render, run_checks  # deferred: per command (docstring)

    try:
        plan = _plan(args)
    except ImagebuildError as exc:
        if args.format != "json":
            raise
        # a script reading the JSON gets it on every exit path: the error as a finding
        print(f"error: {exc.render()}", file=sys.stderr)
        print(render([Finding(MATRIX, "matrix-invalid", "error", exc.message, exc.fix,
                              exc.where)], "json",
                     {"tag": args.tag, "target": args.target, "target_reason": None}))
        return exc.exit_code
    # with a tag, the selected cells are what `build --tag` builds: unresolved pins are
    # errors; without one the matrix is reviewed, not released, and they are warnings
    findings = run_checks(plan.lm, list(plan.cells), plan.lock, building=plan.tag is not None)
    print(as_invoked(render(findings, args.format, plan.meta())))
    return 2 if has_errors(findings) else 0


def cmd_render(args: argparse.Namespace) -> int:
    from imagebuild.lock.lockfile import read_lock  # deferred: per command (docstring)
    from imagebuild.preflight.patchset import (  # deferred: per command (docstring)
        refuse_unapplied,
    )
    from imagebuild.render import render_all, stale, write  # deferred: per command (docstring)
    from imagebuild.spec import matrix as mx  # deferred: per command (docstring)

    lm = mx.load(args.matrix.resolve() if args.matrix else None)
    cells = mx.expand(lm)
    if args.tag:
        cells = list(_plan(args).cells)
    elif args.target or args.only:
        cells = mx.select(cells, target=args.target, only=args.only)
    out_dir = args.out or lm.root / "rendered"
    # a patch that does not apply to its cached pinned vLLM: nothing rendered (exit 2)
    refuse_unapplied(lm, cells, fetch=False, say=lambda text: print(as_invoked(text),
                                                                     file=sys.stderr))
    rendered, skipped = render_all(lm, cells, read_lock(lm.root))
    pins = sorted({exc.pin for exc in skipped})
    if skipped and logging.getLogger("imagebuild").isEnabledFor(logging.WARNING):  # not -qq
        print(as_invoked(f"skipped {len(skipped)} serve Dockerfile(s) whose pins the lock "
                         f"has not resolved ({', '.join(pins)}): run `python build.py lock "
                         "--update NAME` where the Hub is reachable"), file=sys.stderr)
    doc = {"ok": True, "out": str(out_dir), "files": [r.path for r in rendered],
           "unresolved_pins": pins}
    if args.check:
        bad = stale(rendered, out_dir)
        if bad:  # stale committed files are what a stale lock is: exit 2, as `lock --check`
            raise UserError(f"{len(bad)} rendered file(s) differ from what matrix.yaml "
                            "renders:\n" + "\n".join(f"  {out_dir / path}" for path in bad),
                            fix="run `python build.py render` and commit the files",
                            details={"stale": bad})
        said = f"{len(rendered)} rendered file(s) up to date in {out_dir}"
    else:
        write(rendered, out_dir)
        said = f"rendered {len(rendered)} file(s) into {out_dir}"
    print(json.dumps({**doc, "stale": []} if args.check else doc, indent=2)
          if args.format == "json" else said)
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from imagebuild.buildable import buildable  # deferred: per command (docstring)
    from imagebuild.builder.builder import (  # deferred: per command (docstring)
        build_engines,
        build_jobs,
    )
    from imagebuild.builder.enginepull import parse_engine_ref  # deferred: per command (docstring)
    from imagebuild.builder.engineship import ship_engines  # deferred: per command (docstring)

    if args.push and not args.engine_only:
        raise UserError("--push goes with --engine-only",
                        fix="serve images are pushed by `build.py publish`, after smoke")
    if args.engine_only and args.engine_image:
        raise UserError("--engine-only builds the engine that --engine-image would pull",
                        fix="use one of them")
    if args.no_cache and args.push:
        raise UserError("--no-cache rebuilds here, but --push takes an engine the registry "
                        "already holds", fix="build with --no-cache without --push")
    if args.engine_image:
        parse_engine_ref(args.engine_image)  # a malformed reference: exit 2, nothing built
    plan = buildable(_plan(args))
    out = _out(args, plan)
    what = "the engine(s)" if args.engine_only else f"{len(plan.jobs)} cell(s)"
    print(f"building {what} of {plan.tag} for target {plan.target} ({plan.target_reason})")
    if args.engine_only and args.push:
        for target, ref in ship_engines(plan.lm, plan.lock, plan.jobs, plan.destination,
                                        out_dir=out).items():
            print(f"  engine {target}: {ref}")
        return 0
    if args.engine_only:
        records = build_engines(plan.lm, plan.lock, plan.jobs, out_dir=out,
                                no_cache=args.no_cache)
    else:
        records = build_jobs(plan.lm, plan.lock, plan.jobs, out_dir=out,
                             engine_image=args.engine_image, no_cache=args.no_cache)
    for rec in records:
        how = (f"pulled {rec.pulled_from}" if rec.pulled_from else
               "reused (same inputs)" if rec.avoided else
               f"{rec.wall_s:.1f}s, {rec.steps_run} run / {rec.steps_cached} cached")
        print(f"  {rec.kind:6} {rec.ref}  {rec.image_id[:19]}  "
              f"{rec.size_bytes / 1e6:.0f} MB  {how}")
    return 0


def reap() -> None:
    """What SIGKILLed runs on this host left on the engine goes before a run starts
    servers (reaper.py); a live run's and other hosts' stay."""
    from imagebuild.reaper import reap as reap_gone_runs  # deferred: per command (docstring)

    reap_gone_runs()


def cmd_smoke(args: argparse.Namespace) -> int:
    """0 when every image passed, 1 when one failed (its verdict says why)."""
    from imagebuild.smoke.runner import smoke_jobs, smoke_ref  # deferred: per command (docstring)

    kw = {"boot_timeout_s": args.boot_timeout, "stall_s": args.stall_limit}
    if bool(args.image) == bool(args.tag):
        raise UserError("give IMAGE_REF or --tag T (one of them)" + (
            f", not both (IMAGE_REF {args.image})" if args.image else ""),
                        fix="`build.py smoke IMAGE_REF` or `build.py smoke --tag T`")
    if args.image and (args.only or args.target):
        raise UserError("--image and --target select cells of --tag; IMAGE_REF is one image",
                        fix="drop --image/--target, or use --tag T")
    if args.image:
        reap()
        verdicts = [smoke_ref(args.image, out_dir=args.out, matrix=args.matrix, **kw)]
    else:
        plan = _plan(args)
        reap()
        verdicts = list(smoke_jobs(plan.lm, plan.jobs, out_root=_out(args, plan),
                                   **kw).values())
    for v in verdicts:
        print(f"{'PASS' if v['passed'] else 'FAIL'}  {v['image_ref']}  {v['message']}")
    return 0 if all(v["passed"] for v in verdicts) else 1


def cmd_gates(args: argparse.Namespace) -> int:
    """The release gates of a planned tag's local images: 0 when every cell passed (or a
    gate does not apply), 1 otherwise (its gates.json says why)."""
    from imagebuild.gates.run import run_gates  # deferred: per command (docstring)
    from imagebuild.gates.summary import passed  # deferred: per command (docstring)

    plan = _plan(args)
    if plan.tag is None:
        raise UserError("gates needs --tag", fix="pass the release's --tag")
    reap()
    summaries = run_gates(plan.jobs, _out(args, plan))
    return 0 if all(passed(s) for s in summaries.values()) else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from imagebuild.bench.command import run  # deferred: per command (docstring)

    plan = _plan(args) if args.tag else None
    return run(args, plan)


def cmd_publish(args: argparse.Namespace) -> int:
    from imagebuild.job import (  # deferred: per command (docstring)
        document_jobs,
        load_gates,
        load_verdicts,
        publish_jobs,
    )
    from imagebuild.plan import registry_client  # deferred: per command (docstring)
    from imagebuild.release.latest import promote_plan  # deferred: per command (docstring)

    _writes_releases()

    plan = _plan(args)
    if plan.tag is None:
        raise UserError("publish needs --tag", fix="pass the release's --tag")
    out = _build_dir(plan)
    client = registry_client(plan)
    publish_jobs(client, plan.jobs, load_verdicts(plan.jobs, out), dry_run=args.dry_run,
                 gates=load_gates(plan.jobs, out), out=out)
    if not args.dry_run:
        document_jobs(client, plan, out)
    if not args.no_latest:
        promote_plan(plan, client, accept_regression=args.accept_regression,
                     accept_untrusted=args.accept_untrusted,
                     accept_unmeasured=args.accept_unmeasured,
                     accept_rolled_back=args.accept_rolled_back, forward_only=True,
                     dry_run=args.dry_run, accept_acceptance_drop=args.accept_acceptance_drop)
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    from imagebuild.plan import registry_client  # deferred: per command (docstring)
    from imagebuild.release.latest import promote_plan  # deferred: per command (docstring)

    _writes_releases()

    plan = _plan(args)
    # a release slower than latest beyond the threshold needs a written reason
    with human_to_stderr(args):
        moves = promote_plan(plan, registry_client(plan),
                             accept_regression=args.accept_regression,
                             accept_untrusted=args.accept_untrusted,
                             accept_unmeasured=args.accept_unmeasured,
                             accept_rolled_back=args.accept_rolled_back,
                             forward_only=args.forward_only, dry_run=args.dry_run,
                             accept_acceptance_drop=args.accept_acceptance_drop)
    _moves_json(args, str(plan.tag), moves)
    return 0


def _repositories(args: argparse.Namespace):
    from imagebuild.plan import destination  # deferred: per command (docstring)
    from imagebuild.registry.client import RegistryClient  # deferred: per command (docstring)
    from imagebuild.release.repositories import repositories  # deferred: per command (docstring)
    from imagebuild.spec import matrix as mx  # deferred: per command (docstring)

    lm = mx.load(args.matrix.resolve() if args.matrix else None)
    dest = destination(lm)
    client = RegistryClient(dest.registry)
    return client, repositories(client, dest, [c.image for c in mx.expand(lm)], args.image)


def _published(client, repos: list[str]) -> list[str]:
    """The repositories holding a release (the matrix names images never published)."""
    from imagebuild.registry.records import list_releases  # deferred: per command (docstring)

    return [r for r in repos if list_releases(client, r)]


def _no_releases(args: argparse.Namespace, client) -> str:
    """What an empty answer says: where nothing was found."""
    return (f"no releases under {client.host}" + (f" matching {args.image}" if args.image
                                                   else ""))


def cmd_rollback(args: argparse.Namespace) -> int:
    from imagebuild.release.latest import (  # deferred: per command (docstring)
        Accept,
        set_latest_many,
    )

    _writes_releases()

    client, repos = _repositories(args)
    if not _published(client, repos):  # a state, not bad input: nothing published
        raise OperationFailed(f"rollback --tag {args.to}: {_no_releases(args, client)}; "
                              "nothing to roll back",
                              fix="publish a release first (`build.py releases` lists them)")
    with human_to_stderr(args):
        moves = set_latest_many(client, repos, args.to, mode="rollback", dry_run=args.dry_run,
                                accept=Accept(forward=args.accept_forward,
                                              unmeasured=args.accept_unmeasured))
        print(f"rollback to {args.to}: {len(moves)} image(s) in "
              f"{sum(m.seconds for m in moves):.2f} s")
    _moves_json(args, args.to, moves)
    return 0


def _moves_json(args: argparse.Namespace, tag: str, moves: list) -> None:
    """rollback/promote --format json: {ok, tag, dry_run, moves: [...]}."""
    if args.format == "json":
        print(json.dumps({"ok": True, "tag": tag, "dry_run": args.dry_run,
                          "moves": [m.as_json() for m in moves]}, indent=2))


def cmd_releases(args: argparse.Namespace) -> int:
    from imagebuild.release.listing import rows, table  # deferred: per command (docstring)

    client, repos = _repositories(args)
    found = {r: listed for r in repos if (listed := rows(client, r))}
    if args.format == "json":
        print(json.dumps(found, indent=2))
        return 0
    for repo, listed in found.items():
        print(safe_lines(table(repo, listed)))
    if not found:  # an empty namespace is an answer, not an error
        print(safe_lines(_no_releases(args, client)))
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    from imagebuild.plan import registry_client  # deferred: per command (docstring)
    from imagebuild.release import compat  # deferred: per command (docstring)

    plan = _plan(args)
    if plan.tag is None:
        raise UserError("table needs --tag", fix="pass the release's --tag")
    if args.store:
        _writes_releases()
    client = registry_client(plan)
    doc = compat.gather(client, plan.jobs, plan.lm.matrix.publish)
    if args.store:
        compat.store_tables(client, plan.jobs, doc, log=lambda m: print(m, file=sys.stderr))
    if args.format == "json":
        print(json.dumps(doc, indent=1, sort_keys=True))
    else:
        print(safe_lines(compat.markdown(doc)), end="")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """0 when everything stored with the release agrees with its image, 1 otherwise."""
    from imagebuild.release.verify import (  # deferred: per command (docstring)
        as_json,
        failed,
        summary,
        verify,
    )

    checks = verify(args.image)
    if args.format == "json":
        print(json.dumps(as_json(args.image, checks), indent=2))
    else:
        print("\n".join([*(check.line() for check in checks), summary(checks)]))
    return 1 if failed(checks) else 0


def cmd_launch(args: argparse.Namespace) -> int:
    """0 when every node started; 2 for disagreeing files or hosts, 1 for a host without
    the image (or another one), or a node that did not start."""
    from imagebuild.serving.launch import launch, parse_hosts  # deferred: per command (docstring)

    return launch(args.image, args.files, parse_hosts(args.hosts),
                  master_addr=args.master_addr, dry_run=args.dry_run)


def cmd_history(args: argparse.Namespace) -> int:
    from imagebuild import REPO_ROOT, buildfolder  # deferred: per command (docstring)
    from imagebuild.bench import history  # deferred: per command (docstring)
    from imagebuild.release.rollbacks import rolled_back  # deferred: per command (docstring)

    client, repos = _repositories(args)
    shown: dict[str, object] = {}
    for repo in repos:
        h = history.gather(client, repo, rolled_back(client, repo))
        if not h.points:
            continue
        paths = history.write(h, args.out or buildfolder.bench_dir(buildfolder.default(REPO_ROOT)))
        shown[repo] = {**h.as_json(), "png": str(paths["png"]), "md": str(paths["md"])}
        if args.format != "json":
            print(safe_lines(paths["md"].read_text()) +
                  f"png: {paths['png']}\nmd: {paths['md']}\n")
    if args.format == "json":
        print(json.dumps(shown, indent=2))  # {} for an empty namespace, as `releases`
    elif not shown:
        print(safe_lines(_no_releases(args, client)) + ": no history to show")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from imagebuild.release.prune import prune  # deferred: per command (docstring)

    _writes_releases()

    if args.keep < 1:
        raise UserError("--keep must be at least 1", fix="keep the newest N >= 1 releases")
    client, repos = _repositories(args)
    repos = _published(client, repos)
    with human_to_stderr(args):
        plans = {repo: prune(client, repo, args.keep, dry_run=args.dry_run) for repo in repos}
    if args.format == "json":
        print(json.dumps({r: p.as_json(args.dry_run) for r, p in plans.items()}, indent=2))
    elif not repos:
        print(safe_lines(_no_releases(args, client)) + ": nothing to prune")
    return 0


def cmd_unlock(args: argparse.Namespace) -> int:
    from imagebuild.release.lease import (  # deferred: per command (docstring)
        clear_lease,
        local_lock,
    )

    _writes_releases()
    client, repos = _repositories(args)
    removed = 0
    for repo in repos:
        with local_lock(client.host, repo):  # never under a run of this machine
            removed += clear_lease(client, repo, force=args.force, dry_run=args.dry_run)
    print(f"unlock: {removed} lease(s) {'would be ' if args.dry_run else ''}removed "
          f"of {len(repos)} image(s)")
    return 0


def cmd_runner_clean(args: argparse.Namespace) -> int:
    from imagebuild.release.runnerclean import clean_runner  # deferred: per command (docstring)
    from imagebuild.spec import matrix as mx  # deferred: per command (docstring)

    if args.keep < 1:
        raise UserError("--keep must be at least 1", fix="keep the newest N >= 1 releases")
    lm = mx.load(args.matrix.resolve() if args.matrix else None)
    clean_runner(lm, args.keep, dry_run=args.dry_run)
    return 0


def cmd_notes(args: argparse.Namespace) -> int:
    from imagebuild.plan import registry_client  # deferred: per command (docstring)
    from imagebuild.release import compat  # deferred: per command (docstring)
    from imagebuild.release.notes import (  # deferred: per command (docstring)
        gather,
        release_notes,
        write_compose_files,
        write_histories,
        write_plots,
    )

    if args.asset_url and not args.asset_dir:
        raise UserError("--asset-url is the prefix of the assets --asset-dir writes",
                        fix="give --asset-dir DIR too, or drop --asset-url")
    plan = _plan(args)
    client = registry_client(plan)
    if args.not_promoted:
        from imagebuild.release.notes import (  # deferred: per command (docstring)
            gather_not_promoted,
            not_promoted_notes,
        )

        verdicts, latest = gather_not_promoted(client, plan.jobs,
                                               args.smoke_dir or _build_dir(plan))
        print(safe_lines(not_promoted_notes(plan.jobs, verdicts, latest)), end="")
        return 0
    facts = gather(client, plan.jobs, args.smoke_dir or _build_dir(plan))
    if not any(f.digest for f in facts.values()):  # nothing to write notes of
        dest = plan.destination
        raise UserError(f"release {plan.tag} is not in the registry: none of its "
                        f"{len(plan.jobs)} image(s) under {dest.registry}/{dest.namespace} "
                        "holds it", fix="notes describe a published release: list them with "
                                        "`build.py releases`, or publish this one first")
    if args.asset_dir:
        write_compose_files(plan.lm, facts, plan.jobs, args.asset_dir)
        facts = write_plots(facts, plan.jobs, args.asset_dir, args.asset_url or "")
        facts = write_histories(client, facts, plan.jobs, args.asset_dir, args.asset_url or "")
    owner = os.environ.get("GITHUB_REPOSITORY_OWNER")  # whose attestations verify them
    table = compat.markdown(compat.gather(client, plan.jobs, plan.lm.matrix.publish))
    print(safe_lines(release_notes(plan.lm, plan.jobs, facts, table, owner=owner)), end="")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from imagebuild.plan import registry_client  # deferred: per command (docstring)
    from imagebuild.release.resume import (  # deferred: per command (docstring)
        cell_state,
        github_output,
        signing,
        write_recorded_verdict,
    )

    plan = _plan(args)
    client = registry_client(plan)
    signed = signing()  # release.yml's cell job signs what publish stores
    states = [cell_state(client, job, signed=signed) for job in plan.jobs]
    if args.verdict_dir:
        for job in plan.jobs:
            write_recorded_verdict(client, job, args.verdict_dir)
    if args.pull:
        from imagebuild.release.resume import pull_tested_image  # deferred: per command (docstring)

        for job, state in zip(plan.jobs, states, strict=True):
            # a bench, or the documents and signatures, still to make: from this image
            if state.tested and not (state.benched and state.attested) and \
                    pull_tested_image(client, job):
                print(f"{job.id}: pulled the tested image", file=sys.stderr)
    for s in states:
        print(f"{s.cell}: published={s.published} tested={s.tested} gated={s.gated} "
              f"attested={s.attested} benched={s.benched}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps({"tag": str(plan.tag), "cells": [dataclasses.asdict(s)
                                                          for s in states]}, indent=2))
    else:
        print(github_output(states), end="")
    return 0


def cmd_pins(args: argparse.Namespace) -> int:
    """Exit 0 whenever the watch ran: a failing head is news for an issue, not a CI error."""
    from imagebuild.pinwatch import run_watch  # deferred: per command (docstring)

    print(as_invoked(run_watch(args.matrix, args.only, args.out, args.format)))
    return 0


def cmd_lock(args: argparse.Namespace) -> int:
    from imagebuild.lock.lockfile import LOCK_NAME, read_lock  # deferred: per command (docstring)
    from imagebuild.lock.resolve import check_whole_lock  # deferred: per command (docstring)
    from imagebuild.spec import matrix as mx  # deferred: per command (docstring)

    lm = mx.load(args.matrix.resolve() if args.matrix else None)
    # an engine named: its requirement set is this run's to write
    writing = frozenset(n for n in args.update if n in lm.matrix.engines)
    cells = mx.expand(lm, writing)  # cross-references first: a lock cannot agree with a
    # broken matrix
    if args.check:
        if args.update:
            raise UserError("--check resolves nothing, --update re-resolves: not both",
                            fix="run `lock --update NAME`, then `lock --check`")
        check_whole_lock(lm, read_lock(lm.root))
        print(json.dumps({"ok": True, "lock": str(lm.root / LOCK_NAME), "stale": []})
              if args.format == "json" else f"{LOCK_NAME} agrees with matrix.yaml: every "
              "input of every image is as locked")
        return 0
    with human_to_stderr(args):
        unresolved = _write_lock(args, lm, cells, writing)
    if args.format == "json":
        print(json.dumps({"ok": True, "lock": str(lm.root / LOCK_NAME),
                          "unresolved": unresolved}, indent=2))
    return 0


def _write_lock(args: argparse.Namespace, lm, cells, writing: frozenset[str]) -> list[str]:
    """`lock [--update NAME]`: the named engines' requirement sets, then resolve, write,
    say what is still unresolved (returned)."""
    from imagebuild.lock.hub import HubClient  # deferred: per command (docstring)
    from imagebuild.lock.requirements import write_sets  # deferred: per command (docstring)
    from imagebuild.lock.resolve import (  # deferred: per command (docstring)
        build_lock,
        check_update_names,
        dumps,
        write_lock,
    )
    from imagebuild.preflight.patchset import (  # deferred: per command (docstring)
        refuse_unapplied,
    )

    print(f"locking {lm.located.file}")
    check_update_names(lm, set(args.update))
    # each engine's patches against the wheel or sdist it pins (fetched when missing)
    refuse_unapplied(lm, cells, fetch=True, say=print)
    # the engines named: their requirement sets first (the lock hashes them as inputs)
    write_sets(lm, sorted(writing), say=print)
    data = build_lock(lm, HubClient(), update=set(args.update))
    path = write_lock(lm, data)
    unresolved = [f"{kind}/{name}" for kind in ("models", "drafters", "bases")
                  for name, e in data[kind].items() if e.get("status") != "resolved"]
    engines = [(f"engines/{ename}/{tname}", e) for ename, per in data["engines"].items()
               for tname, e in per.items() if e.get("status") != "resolved"]
    unresolved += [name for name, _ in engines]
    print(f"wrote {path.name} ({len(dumps(data))} bytes)")
    if unresolved:
        print(f"unresolved (cells using them refuse to build): {', '.join(unresolved)}")
        for name, e in data["bases"].items():
            if e.get("status") != "resolved":
                print(as_invoked(f"  bases/{name}: {e['fix']}"))
        for name, e in engines:
            print(as_invoked(f"  {name}: {e['fix']}"))
    return unresolved


def cmd_schema(args: argparse.Namespace) -> int:
    from imagebuild.spec.reference import markdown, schema_text  # deferred: per command (docstring)

    if args.format == "markdown":
        from imagebuild import REPO_ROOT  # deferred: per command (docstring)

        print(markdown(REPO_ROOT), end="")
    else:
        print(schema_text(), end="")
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    from imagebuild.completion import script  # deferred: per command (docstring)

    print(script(parser(), args.shell), end="")
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from imagebuild.starter import init  # deferred: per command (docstring)

    written = init(args.dir)
    print(f"wrote {len(written)} file(s) into {args.dir}: matrix.yaml, {written[1].name}, "
          "locked/, rendered/ and the files the matrix names")
    print(as_invoked(f"next: cd {args.dir} && python build.py check"))
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from imagebuild.spec import matrix as mx  # deferred: per command (docstring)
    from imagebuild.spec.migrate import migrate  # deferred: per command (docstring)

    path = mx.matrix_path(args.matrix)
    changes = migrate(path, dry_run=args.dry_run)
    for line in changes:
        print(line)
    if not changes:
        print(f"{path}: already at the current schema; nothing to change")
    elif not args.dry_run:
        print(f"rewrote {path} ({len(changes)} change(s)); checking it:")
        mx.expand(mx.load(path))  # what the rewrite could not decide is named here
        print("ok")
    return 0


def _facts_root(args: argparse.Namespace) -> tuple[Path, list[Path]]:
    """(the matrix's own facts folder, the roots `check` reads) for --matrix."""
    from imagebuild.facts import locked_dir  # deferred: per command (docstring)
    from imagebuild.spec import matrix as mx  # deferred: per command (docstring)

    root = mx.matrix_path(args.matrix.resolve() if args.matrix else None).resolve().parent
    return locked_dir(root), [locked_dir(root)]


def _engine_wheel(args: argparse.Namespace, version: str) -> dict | None:
    """The wheel pin of a matrix engine on this vLLM version (the facts' identity)."""
    from imagebuild.spec import matrix as mx  # deferred: per command (docstring)

    try:
        lm = mx.load(args.matrix.resolve() if args.matrix else None)
    except UserError:
        return None
    for engine in lm.matrix.engines.values():
        for real in engine.realize.values():
            if real.wheel and engine.vllm_version == version:
                return {"package": real.wheel.package, "version": real.wheel.version,
                        "sha256": real.wheel.sha256}
    return None


def cmd_facts(args: argparse.Namespace) -> int:
    from imagebuild.facts import record_facts, versions  # deferred: per command (docstring)
    from imagebuild.facts.record import identify  # deferred: per command (docstring)

    own, roots = _facts_root(args)
    if args.facts_command == "list":
        for version, folder in sorted(versions(roots).items()):
            print(f"{version:<12} {folder}")
        return 0
    out = args.out.resolve() if args.out else own
    # absolute, not resolved: the recorder runs from a scratch folder, and a venv's python
    # is a symlink whose venv is found through the link's own path
    args.python = args.python.absolute()
    version = identify(args.python)["vllm_version"]
    written = record_facts(args.python, out, parts=args.part or None,
                           wheel=_engine_wheel(args, version), patches=args.patch,
                           jobs=args.jobs, say=print)
    print(f"wrote {len(written)} file(s) under {out / version}")
    return 0


def cmd_rehearse(args: argparse.Namespace) -> int:
    from imagebuild.rehearse.run import main as run  # deferred: per command (docstring)

    return run(args)


COMMANDS = {"plan": cmd_plan, "render": cmd_render, "lock": cmd_lock, "build": cmd_build,
            "check": cmd_check, "smoke": cmd_smoke, "gates": cmd_gates, "release": cmd_release,
            "publish": cmd_publish, "promote": cmd_promote,
            "rollback": cmd_rollback, "releases": cmd_releases, "prune": cmd_prune,
            "unlock": cmd_unlock,
            "notes": cmd_notes, "resume": cmd_resume, "pins": cmd_pins, "bench": cmd_bench,
            "history": cmd_history, "verify": cmd_verify, "launch": cmd_launch, "table": cmd_table,
            "rehearse": cmd_rehearse,
            "runner-clean": cmd_runner_clean, "schema": cmd_schema, "init": cmd_init,
            "completion": cmd_completion,
            "migrate": cmd_migrate,
            "facts": cmd_facts}
GLOBAL_OPTIONS = ("-v", "-vv", "-vvv", "--verbose", "-q", "-qq", "--quiet")


def _default_command(argv: list[str]) -> list[str]:
    """`build.py --tag T` (global options first or not) is `build.py release --tag T`."""
    i = next((n for n, a in enumerate(argv) if a not in GLOBAL_OPTIONS), len(argv))
    if i < len(argv) and argv[i].startswith("--") and argv[i] not in ("--help", "--version"):
        return [*argv[:i], "release", *argv[i:]]
    return argv


def _unknown_option(ap: argparse.ArgumentParser, argv: list[str]) -> None:
    """An option the command does not have is reported as such, before argparse would
    complain about a required option the typo left out (`plan --tga T`: not `--tag`)."""
    import difflib  # deferred: per command (docstring)

    p, i, names = ap, -1, []
    while True:  # down to the innermost command named (`pins watch`)
        subs = next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None)
        j = next((n for n, a in enumerate(argv) if n > i and subs and a in subs.choices), None)
        if subs is None or j is None:
            break
        p, i = subs.choices[argv[j]], j
        names.append(argv[j])
    if i < 0:
        return
    known = [o for a in p._actions for o in a.option_strings]
    for arg in argv[i + 1:]:
        if arg == "--":
            break
        if not arg.startswith("-") or arg == "-" or arg[1:2].isdigit():
            continue
        opt = arg.split("=", 1)[0]
        if re.fullmatch(r"-([a-zA-Z])\1+", opt) and f"-{opt[1]}" in known:
            continue  # -qq, -vv: a counted flag given twice
        if opt in known or (opt.startswith("--") and sum(k.startswith(opt) for k in known) == 1):
            continue
        near = difflib.get_close_matches(opt, known, n=1)
        p.error(f"{' '.join(names)} has no option {opt}" + (f" (did you mean {near[0]}?)" if near
                                                     else ""))


def _command_parser(ap: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    subs = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return subs.choices[command] if command else ap


def _logging(verbose: int, quiet: int) -> None:
    """Our own loggers, one plain line each: by default each registry retry and wait;
    -q only warnings (-qq errors), -v debugging detail and every build step as it runs.
    Libraries' loggers (urllib3, docker, ...) stay at warnings whatever the level."""
    import logging  # deferred: per command (docstring)
    import os  # deferred: per command (docstring)

    level = (logging.DEBUG if verbose else logging.ERROR if quiet >= 2 else
             logging.WARNING if quiet else logging.INFO)
    if verbose:
        os.environ["IMAGEBUILD_VERBOSE"] = "1"  # build steps streamed, not only on a tty
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    own = logging.getLogger("imagebuild")
    own.handlers[:] = [handler]
    own.setLevel(level)
    own.propagate = False


def _wants_json(argv: list[str]) -> bool:
    """`--format json` was asked for (read from the words: a usage error has no args)."""
    return "--format=json" in argv or any(a == "--format" and b == "json"
                                          for a, b in zip(argv, argv[1:], strict=False))


def json_error(message: str, fix: str | None, where: str | None, code: int,
               details: dict | None = None) -> None:
    """What `--format json` prints on stdout when a command ends in an error: a script
    reads JSON on every exit path (its shape: docs/commands.md#json-output)."""
    print(json.dumps({"ok": False, "error": {
        "message": as_invoked(safe_lines(message)), "fix": as_invoked(safe_lines(fix))
        if fix else None, "where": where, "exit_code": code, **(details or {})}}, indent=2))


@contextlib.contextmanager
def human_to_stderr(args: argparse.Namespace):
    """With `--format json` the JSON document is the only thing on stdout: what the
    command says as it works goes to stderr."""
    if getattr(args, "format", None) == "json":
        with contextlib.redirect_stdout(sys.stderr):
            yield
    else:
        yield


def main(argv: list[str] | None = None) -> int:
    argv = _default_command(list(sys.argv[1:] if argv is None else argv))
    ap = parser()
    try:
        _unknown_option(ap, argv)
        args = ap.parse_args(argv)
    except UsageError as exc:  # said on stderr already
        if _wants_json(argv):
            json_error(exc.message, exc.fix, None, 2)
        return 2
    except SystemExit as exc:  # --help (0)
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    if args.command is None or (args.command == "pins" and args.pins_command is None) or (
            args.command == "facts" and args.facts_command is None):
        _command_parser(ap, args.command).print_help()  # its commands, as a missing one
        return 2
    _logging(args.verbose, args.quiet)
    for old, new in getattr(args, "renamed_options", None) or []:
        logging.getLogger("imagebuild").warning(
            f"warning: {old} is now {new} (named as in every other command); {old} still "
            "works for now")
    from imagebuild.interrupts import (  # deferred: per command (docstring)
        interrupts_as_keyboard_interrupt,
    )
    from imagebuild.runowner import children_marked  # deferred: per command (docstring)

    # every process a command starts carries its run's owner, so the next run can reap what
    # a SIGKILLed one left going (reaper.py); `launch` starts what is meant to outlive it
    marked = children_marked() if args.command != "launch" else contextlib.nullcontext()
    try:
        with interrupts_as_keyboard_interrupt(), marked:  # SIGTERM cleans up like Ctrl-C
            return COMMANDS[args.command](args)
    except ImagebuildError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        if getattr(args, "format", None) == "json":
            json_error(exc.message, exc.fix, exc.where, exc.exit_code, exc.details)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        if getattr(args, "format", None) == "json":
            json_error("interrupted", None, None, 130)
        return 130
    except BrokenPipeError:  # `build.py plan ... | head`: the reader left, nothing to say
        sys.stderr.close()
        return 141
