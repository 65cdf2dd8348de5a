"""Command line: `python build.py [SUBCOMMAND] ...`. Parses arguments, calls one module per
stage, turns ImagebuildError into one message and its exit code (DESIGN.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import ImagebuildError, UserError


def _common(p: argparse.ArgumentParser, *, tag_required: bool = True) -> None:
    p.add_argument("--matrix", type=Path, default=None,
                   help="matrix.yaml to read (default: the repository's)")
    p.add_argument("--tag", required=tag_required,
                   help="DATE-NAME, e.g. 2026-06-18-dflashfix (NAME: an engine patch set)")
    p.add_argument("--target", default=None, help="gb10 or cpu (default: detected)")
    p.add_argument("--only", default=None, metavar="GLOB",
                   help="only cells whose id (target/image) or image matches GLOB")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="build.py",
        description="matrix.yaml -> tested, tagged, rollback-able vLLM serving images.")
    sub = ap.add_subparsers(dest="command")
    p = sub.add_parser("release", help="the whole job (the default: `build.py --tag T`): "
                                       "plan, lock check, preflight, build, smoke, publish")
    _common(p)
    p.add_argument("--out", type=Path, default=None, help="build dir (default: build/)")
    p.add_argument("--dry-run", action="store_true", help="no registry writes")
    p.add_argument("--no-bench", action="store_true",
                   help="skip the benchmark (the regression gate then has nothing to compare)")
    p.add_argument("--accept-regression", default=None, metavar="REASON",
                   help="let a release slower than latest become latest; REASON goes into "
                        "its stored results and release notes")
    p = sub.add_parser("plan", help="the cells a tag builds, with refs, tags and pins")
    _common(p)
    p.add_argument("--format", choices=("table", "json", "github"), default="table")
    p = sub.add_parser("render", help="render Dockerfiles (base, engine, serve per cell)")
    _common(p, tag_required=False)
    p.add_argument("--out", type=Path, default=None, help="output dir (default: rendered/)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when the committed rendered files are stale")
    p = sub.add_parser("check", help="preflight: KV-cache layout, serve-flag traps, "
                                     "checkpoint and pin rules (exit 2 on any error)")
    _common(p)
    p.add_argument("--format", choices=("table", "json"), default="table")
    p = sub.add_parser("build", help="build base, engine and serve images per cell (BuildKit)")
    _common(p)
    p.add_argument("--out", type=Path, default=None,
                   help="where logs, contexts and build records go (default: build/)")
    p = sub.add_parser("smoke", help="run serve images hardened and check they serve "
                                     "correctly (exit 1 when one fails)")
    _common(p, tag_required=False)
    from .smoke.command import add_arguments as smoke_arguments

    smoke_arguments(p)
    p = sub.add_parser("bench", help="measure a serve image: TTFT, TPOT, tok/s per "
                                     "concurrency level, speculative acceptance; plot")
    _common(p, tag_required=False)
    from .bench.command import add_arguments as bench_arguments

    bench_arguments(p)
    p = sub.add_parser("publish", help="push cells that passed smoke by digest, verify, "
                                       "tag the release and move latest")
    _common(p)
    p.add_argument("--dry-run", action="store_true", help="say what would be written")
    p.add_argument("--no-latest", action="store_true", help="push and tag, keep latest")
    p = sub.add_parser("promote", help="move latest to an already pushed release")
    _common(p)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--accept-regression", default=None, metavar="REASON",
                   help="promote although its tok/s fell more than the threshold below "
                        "latest; the reason is recorded with the release")
    for name, helptext in (("rollback", "move latest back to an older release (server-side)"),
                           ("releases", "list releases in the registry, newest first"),
                           ("prune", "delete old releases (never latest or its rollback)")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--matrix", type=Path, default=None)
        p.add_argument("--image", default=None, metavar="GLOB",
                       help="image name or repository glob (default: every image)")
        if name == "rollback":
            p.add_argument("--to", required=True, help="release tag, full or DATE-NAME")
            p.add_argument("--all", action="store_true", help="every image (the default)")
        if name == "prune":
            p.add_argument("--keep", type=int, required=True, help="newest N releases to keep")
        if name != "releases":
            p.add_argument("--dry-run", action="store_true")
        else:
            p.add_argument("--format", choices=("table", "json"), default="table")
    p = sub.add_parser("notes", help="GitHub release notes of a release (markdown)")
    _common(p)
    p.add_argument("--smoke-dir", type=Path, default=None,
                   help="build dir holding smoke/<target>/<engine>/<image>/verdict.json "
                        "(default: build/)")
    p.add_argument("--plot-dir", type=Path, default=None, metavar="DIR",
                   help="write bench-<image>.png per image there and link it in the notes")
    p.add_argument("--asset-url", default=None, metavar="URL",
                   help="prefix of the plot links (the GitHub release's download URL; "
                        "default: the bare file name)")
    p = sub.add_parser("pins", help="watch pinned models and drafters for upstream moves")
    verbs = p.add_subparsers(dest="pins_command", required=True)
    w = verbs.add_parser("watch", help="compare each pin's upstream head with the lock and "
                                       "run preflight on a moved head")
    w.add_argument("--matrix", type=Path, default=None)
    w.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    w.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="also write one issue body (.md) and title (.title) per moved pin")
    w.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="only this model or drafter (repeatable)")
    p = sub.add_parser("rehearse", help="GB10 rehearsal on this machine (nvcc 13): vLLM's arch "
                                        "selection, sm_121a compiles through the arch gate, "
                                        "the package version, the runtime self-check")
    p.add_argument("--matrix", type=Path, default=None)
    p.add_argument("--target", default="gb10", help="a target built from source (default gb10)")
    p.add_argument("--engine", default=None,
                   help="engine patch set (default: the first built from source for it)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="scratch dir (default: build/rehearse/TARGET)")
    p.add_argument("--jobs", type=int, default=2, help="parallel compiles (default 2)")
    p = sub.add_parser("runner-clean", help="free this runner's disk by release age: keep the "
                                            "newest N releases, latest and its rollback "
                                            "target (with the images they are built from); "
                                            "never BuildKit's cache mounts")
    p.add_argument("--matrix", type=Path, default=None)
    p.add_argument("--keep", type=int, required=True, help="newest N local releases to keep")
    p.add_argument("--dry-run", action="store_true", help="say what would go")
    p = sub.add_parser("lock", help="resolve every pin into matrix.lock.json")
    p.add_argument("--matrix", type=Path, default=None)
    p.add_argument("--update", action="append", default=[], metavar="NAME",
                   help="re-resolve NAME (a model, drafter or target), moving a tracked branch")
    p.add_argument("--check", action="store_true",
                   help="exit 2 when the lock disagrees with matrix.yaml; resolve nothing")
    return ap


def _context(args: argparse.Namespace):
    from . import matrix as mx
    from .lockfile import read_lock
    from .plan import detect_target
    from .tags import parse_tag

    lm = mx.load(args.matrix.resolve() if args.matrix else None)
    cells = mx.expand(lm)
    tag = parse_tag(args.tag, lm.engines_versions()) if args.tag else None
    if args.target:
        if args.target not in lm.matrix.targets:
            raise UserError(f"unknown target {args.target!r}",
                            fix=f"use one of: {', '.join(lm.matrix.targets)}")
        target, why = args.target, "--target"
    else:
        target, why = detect_target()
    selected = mx.select(cells, engine=tag.name if tag else None, target=target,
                         only=args.only)
    if not selected:
        raise UserError(
            f"no cell matches (target {target}"
            + (f", engine {tag.name}" if tag else "")
            + (f", --only {args.only}" if args.only else "") + ")",
            fix="check --target/--only against `build.py plan --format json`")
    return lm, selected, tag, target, why, read_lock(lm.root)


def _preflight(lm, cells, lock) -> None:
    """Errors block (exit 2), warnings print: what plan and build run before anything."""
    from .preflight.findings import format_table, has_errors
    from .preflight.run import run_checks

    findings = run_checks(lm, cells, lock)
    shown = [f for f in findings if f.severity != "info"]
    if shown:
        print(format_table(shown, show_info=False), file=sys.stderr)
    if has_errors(findings):
        raise UserError("preflight found errors (listed above)",
                        fix="fix them, or waive a rule in matrix.yaml with a written reason; "
                            "`python build.py check --tag T` shows the details")


def cmd_check(args: argparse.Namespace) -> int:
    from .preflight.findings import has_errors
    from .preflight.run import render, run_checks

    lm, cells, tag, target, why, lock = _context(args)
    findings = run_checks(lm, cells, lock)
    print(render(findings, args.format, {"tag": str(tag), "target": target,
                                         "target_reason": why}))
    return 2 if has_errors(findings) else 0


def cmd_plan(args: argparse.Namespace) -> int:
    from .plan import format_json, format_table, github_matrix, plan_rows

    lm, cells, tag, target, why, lock = _context(args)
    _preflight(lm, cells, lock)
    rows = plan_rows(cells, lm, tag, lock)
    if args.format == "github":
        print(json.dumps(github_matrix(rows), separators=(",", ":")))
    elif args.format == "json":
        print(format_json(rows, {"tag": str(tag), "target": target, "target_reason": why}))
    else:
        print(format_table(rows, f"release {tag} · target {target} ({why}) · "
                                 f"{len(rows)} cell(s)"))
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from . import matrix as mx
    from .lockfile import read_lock
    from .render import render_all, stale, write

    lm = mx.load(args.matrix.resolve() if args.matrix else None)
    cells = mx.expand(lm)
    if args.tag:
        _, cells, _, _, _, _ = _context(args)
    elif args.target or args.only:
        cells = mx.select(cells, target=args.target, only=args.only)
    out_dir = args.out or lm.root / "rendered"
    rendered, skipped = render_all(lm, cells, read_lock(lm.root))
    if skipped:
        pins = sorted({exc.pin for exc in skipped})
        print(f"skipped {len(skipped)} serve Dockerfile(s) whose pins the lock has not "
              f"resolved ({', '.join(pins)}): run `python build.py lock --update NAME` where "
              "the Hub is reachable", file=sys.stderr)
    if args.check:
        bad = stale(rendered, out_dir)
        if bad:
            print("stale rendered files (run `python build.py render` and commit):",
                  file=sys.stderr)
            for path in bad:
                print(f"  {out_dir / path}", file=sys.stderr)
            return 1
        print(f"{len(rendered)} rendered file(s) up to date in {out_dir}")
        return 0
    write(rendered, out_dir)
    print(f"rendered {len(rendered)} file(s) into {out_dir}")
    return 0


def _buildable(args: argparse.Namespace):
    """Context of a command that builds: pins locked and resolved, preflight clean."""
    from .lock import verify_cells
    from .plan import plan_rows

    lm, cells, tag, target, why, lock = _context(args)
    verify_cells(lm, cells, lock)
    _preflight(lm, cells, lock)
    assert lock is not None and tag is not None
    return lm, cells, tag, target, why, lock, plan_rows(cells, lm, tag, lock)


def cmd_build(args: argparse.Namespace) -> int:
    from .builder import build_cells

    lm, cells, tag, target, why, lock, rows = _buildable(args)
    refs = {r["cell"]: r["refs"][0] for r in rows}
    print(f"building {len(cells)} cell(s) of {tag} for target {target} ({why})")
    records = build_cells(lm, lock, cells, refs, out_dir=args.out or lm.root / "build")
    for rec in records:
        how = ("reused (same inputs)" if rec.avoided else
               f"{rec.wall_s:.1f}s, {rec.steps_run} run / {rec.steps_cached} cached")
        size = f"{rec.size_bytes / 1e6:.0f} MB"
        print(f"  {rec.kind:6} {rec.ref}  {rec.image_id[:19]}  {size}  {how}")
    return 0


def cmd_lock(args: argparse.Namespace) -> int:
    from . import matrix as mx
    from .lock import build_lock, dumps, verify_cells, write_lock
    from .lockfile import LOCK_NAME, read_lock

    lm = mx.load(args.matrix.resolve() if args.matrix else None)
    cells = mx.expand(lm)
    if args.check:
        verify_cells(lm, cells, read_lock(lm.root), allow_unresolved=True)
        print(f"{LOCK_NAME} agrees with matrix.yaml")
        return 0
    from .hub import HubClient

    print(f"locking {lm.located.file}")
    data = build_lock(lm, HubClient(), update=set(args.update))
    path = write_lock(lm, data)
    unresolved = [f"{kind}/{name}" for kind in ("models", "drafters", "bases")
                  for name, e in data[kind].items() if e.get("status") != "resolved"]
    print(f"wrote {path.name} ({len(dumps(data))} bytes)")
    if unresolved:
        print(f"unresolved (cells using them refuse to build): {', '.join(unresolved)}")
        for name, e in data["bases"].items():
            if e.get("status") != "resolved":
                print(f"  bases/{name}: {e['fix']}")
    return 0


def _client(lm):
    from .plan import registry_for
    from .registry import RegistryClient

    reg = registry_for(lm)
    return reg, RegistryClient(reg.host)


def _repositories(lm, client, reg, pattern: str | None) -> list[str]:
    """Repositories to act on: the registry's catalog under our namespace where it serves
    one (so any machine can roll back), else the images matrix.yaml knows."""
    from . import matrix as mx
    from .errors import OperationFailed
    from .release import catalog_repositories, match_repositories

    try:
        repos = catalog_repositories(client, reg.namespace)
    except (UserError, OperationFailed):
        repos = sorted({f"{reg.namespace}/{c.image}" for c in mx.expand(lm)})
    chosen = match_repositories(repos, pattern)
    if not chosen:
        raise UserError(f"no repository under {reg.host}/{reg.namespace} matches "
                        f"{pattern or '*'}", fix="check --image against `build.py releases`")
    return chosen


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench.command import run

    return run(args, context=_context)


def cmd_smoke(args: argparse.Namespace) -> int:
    from .smoke.command import run

    return run(args, context=_context)


def _publish(lm, cells, rows, out: Path, *, dry_run: bool, latest: bool = True) -> None:
    from .publish import load_verdict, publish
    from .release import split_repository
    from .smoke.paths import verdict_path

    _, client = _client(lm)
    for cell, row in zip(cells, rows, strict=True):
        _, repo = split_repository(row["repository"])
        verdict = load_verdict(verdict_path(out, cell))
        result = publish(client, repo, local_ref=row["refs"][0], release_tag=row["release_tag"],
                         verdict=verdict, pins=row["pins"], move_to_latest=latest,
                         dry_run=dry_run)
        if dry_run:
            print(f"{row['cell']}: dry run, nothing written")
            continue
        print(f"{row['cell']}: {'pushed' if result.pushed else 'already pushed'} "
              f"{result.digest}; latest {'moved' if result.latest_moved else 'unchanged'}")


def cmd_release(args: argparse.Namespace) -> int:
    """The whole job. Nothing is pushed unless every cell of the tag passed smoke; latest
    moves only after the bench, past the regression gate."""
    from .builder import build_cells
    from .plan import format_table
    from .smoke.runner import smoke_cells

    lm, cells, tag, target, why, lock, rows = _buildable(args)
    print(format_table(rows, f"release {tag} · target {target} ({why}) · {len(rows)} cell(s)"))
    out = args.out or lm.root / "build"
    refs = {r["cell"]: r["refs"][0] for r in rows}
    build_cells(lm, lock, cells, refs, out_dir=out)
    verdicts = smoke_cells(lm, cells, refs, lock, out_root=out)
    failed = [v for v in verdicts if not v["passed"]]
    for v in verdicts:
        print(f"smoke {'PASS' if v['passed'] else 'FAIL'}  {v['image_ref']}  {v['message']}")
    if failed:
        print(f"{len(failed)} cell(s) failed smoke: nothing pushed, no tag moved", file=sys.stderr)
        return 1
    if args.dry_run:
        _publish(lm, cells, rows, out, dry_run=True)
        print("dry run: no bench stored, latest not moved")
        return 0
    _publish(lm, cells, rows, out, dry_run=False, latest=False)
    from .promotion import bench_release, promote_rows

    _, client = _client(lm)
    if not args.no_bench:
        bench_release(client, cells, rows, out / "bench")
    promote_rows(lm, client, cells, rows, accept_regression=args.accept_regression,
                 forward_only=True)
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from .plan import plan_rows

    lm, cells, tag, target, why, lock = _context(args)
    rows = plan_rows(cells, lm, tag, lock)
    _publish(lm, cells, rows, lm.root / "build", dry_run=args.dry_run, latest=not args.no_latest)
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    from .plan import plan_rows
    from .promotion import promote_rows

    lm, cells, tag, target, why, lock = _context(args)
    _, client = _client(lm)
    # a release slower than latest beyond the threshold needs a written reason
    promote_rows(lm, client, cells, plan_rows(cells, lm, tag, lock),
                 accept_regression=args.accept_regression, dry_run=args.dry_run)
    return 0


def _registry_args(args: argparse.Namespace):
    from . import matrix as mx

    lm = mx.load(args.matrix.resolve() if args.matrix else None)
    reg, client = _client(lm)
    return lm, reg, client, _repositories(lm, client, reg, args.image)


def cmd_rollback(args: argparse.Namespace) -> int:
    from .release import set_latest_many

    _, _, client, repos = _registry_args(args)
    moves = set_latest_many(client, repos, args.to, mode="rollback", dry_run=args.dry_run)
    total = sum(m.seconds for m in moves)
    print(f"rollback to {args.to}: {len(moves)} image(s) in {total:.2f} s")
    return 0


def cmd_releases(args: argparse.Namespace) -> int:
    from .release import format_releases, list_releases

    _, _, client, repos = _registry_args(args)
    if args.format == "json":
        print(json.dumps({r: [x.as_json() for x in list_releases(client, r)] for r in repos},
                         indent=2))
        return 0
    for repo in repos:
        print(format_releases(repo, list_releases(client, repo)))
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from .release import prune

    if args.keep < 1:
        raise UserError("--keep must be at least 1", fix="keep the newest N >= 1 releases")
    _, _, client, repos = _registry_args(args)
    for repo in repos:
        prune(client, repo, args.keep, dry_run=args.dry_run)
    return 0


def cmd_runner_clean(args: argparse.Namespace) -> int:
    from . import matrix as mx
    from .build.hygiene import (
        base_repo,
        docker_client,
        engine_repo,
        protected_releases,
        runner_clean,
    )
    from .release import split_repository

    if args.keep < 1:
        raise UserError("--keep must be at least 1", fix="keep the newest N >= 1 releases")
    lm = mx.load(args.matrix.resolve() if args.matrix else None)
    reg, client = _client(lm)
    cells = mx.expand(lm)
    serve = {reg.repo(c.image): split_repository(reg.repo(c.image))[1] for c in cells}
    chain = {base_repo(t) for t in lm.matrix.targets} | {
        engine_repo(c.target_name, c.engine_name) for c in cells}
    # latest and its rollback target come from the registry: never guessed
    protected = protected_releases(client, sorted(set(serve.values())))
    runner_clean(docker_client(), serve_repos=serve, chain_repos=chain, keep=args.keep,
                 protected=protected, dry_run=args.dry_run)
    return 0


def cmd_notes(args: argparse.Namespace) -> int:
    from .notes import cmd_notes as run

    return run(args, context=_context)


def cmd_rehearse(args: argparse.Namespace) -> int:
    from .rehearse.run import main as run

    return run(args)


def cmd_pins(args: argparse.Namespace) -> int:
    from .pinwatch import cmd_pins as run

    return run(args)


COMMANDS = {"plan": cmd_plan, "render": cmd_render, "lock": cmd_lock, "build": cmd_build,
            "check": cmd_check, "smoke": cmd_smoke, "release": cmd_release,
            "publish": cmd_publish, "promote": cmd_promote,
            "rollback": cmd_rollback, "releases": cmd_releases, "prune": cmd_prune,
            "notes": cmd_notes, "pins": cmd_pins, "bench": cmd_bench,
            "rehearse": cmd_rehearse, "runner-clean": cmd_runner_clean}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].startswith("--") and argv[0] not in ("--help", "--version"):
        argv.insert(0, "release")  # `build.py --tag T` is the whole job
    ap = parser()
    args = ap.parse_args(argv)
    if args.command is None:
        ap.print_help()
        return 2
    try:
        return COMMANDS[args.command](args)
    except ImagebuildError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


