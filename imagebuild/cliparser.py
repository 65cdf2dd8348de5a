"""The command line's parser: every command, its options, and argument types that refuse a
bad value at parse time, naming the option and the fix (exit 2, like every bad input).
Commands themselves are in cli.py."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

from imagebuild import __version__
from imagebuild.errors import UserError
from imagebuild.errors import prog as invoked
from imagebuild.spec.names import check_reference
from imagebuild.spec.tags import check_tag_text
from imagebuild.spec.values import BadValue


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors read like every other error: the option, what is
    wrong, and the fix (subcommands inherit it)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        fix = f"see `{self.prog} --help`"
        sys.stderr.write(f"error: {message}\n  fix: {fix}\n")
        raise UsageError(message, fix)


class UsageError(SystemExit):
    """A usage error, said on stderr already; kept for `--format json`'s error document."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(2)
        self.message, self.fix = message, fix


# Argument types: each refuses a bad value at parse time, naming the option.
UNSAFE_TEXT = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# a path compose receives through pytest-docker's shell (in double quotes)
SHELL_SPECIAL = re.compile(r'["$`\\]')


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{value} is outside 1..1000000")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 7 * 86400:  # nan and inf fail too
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds in (0, 604800]")
    return value


def _reason(text: str) -> str:
    """An accepted reason: recorded in the registry and the release notes."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the reason is empty: say why, in words")
    if UNSAFE_TEXT.search(text) or len(text) > 500:
        raise argparse.ArgumentTypeError("the reason must be one line of up to 500 characters")
    return text.strip()


def _out_dir(text: str) -> Path:
    """A directory to write into: it may not exist yet, but nothing on its way may be a
    file (checked before anything runs, so nothing is half written)."""
    if not text or UNSAFE_TEXT.search(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory path")
    path = Path(text)
    for part in (path, *path.parents):
        if part.exists() or part.is_symlink():
            if not part.is_dir():
                what = "a file" if part.is_file() else "not a directory"
                raise argparse.ArgumentTypeError(
                    f"{part} is {what}; give a directory (created if missing)")
            break
    return path


def _run_dir(text: str) -> Path:
    """An output directory the smoke run's compose file lives in: compose is driven
    through a shell (pytest-docker), so no quote, `$`, backtick or backslash."""
    path = _out_dir(text)
    if SHELL_SPECIAL.search(str(path.resolve())):
        raise argparse.ArgumentTypeError(f"{text!r} holds a quote, $, ` or \\; the compose "
                                         "file inside it is passed through a shell")
    return path


def _image_ref(text: str) -> str:
    try:
        if UNSAFE_TEXT.search(text):
            raise BadValue("it holds a control character", "")
        return check_reference(text, "IMAGE_REF")
    except BadValue as exc:
        raise argparse.ArgumentTypeError(f"{str(exc)[:200]} (e.g. 127.0.0.1:5000/"
                                         "vllm-spark/cpu-tiny-ngram:latest)") from None


def _release_tag(text: str) -> str:
    try:
        return check_tag_text(text, "")
    except UserError as exc:
        raise argparse.ArgumentTypeError(f"{exc.message.strip()} ({exc.fix})") from None


def _url(text: str) -> str:
    if not re.fullmatch(r"https?://[A-Za-z0-9.\-\[\]:]+(?::\d{1,5})?/?", text):
        raise argparse.ArgumentTypeError(f"{text[:80]!r} is not a server's base URL "
                                         "(http://HOST:PORT, e.g. http://127.0.0.1:8000)")
    return text.rstrip("/")


class _Renamed(argparse.Action):
    """An option under its current name; an older spelling (`old`) still works, and the
    command says once that it was renamed (cli.main prints it: -qq leaves it out)."""

    def __init__(self, option_strings: list[str], dest: str, *, old: tuple[str, ...] = (),
                 **kw: Any) -> None:
        super().__init__(option_strings, dest, **kw)
        self.old = old

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        if option_string in self.old:
            said = list(getattr(namespace, "renamed_options", None) or [])
            namespace.renamed_options = [*said, (option_string, self.option_strings[0])]


def _matrix(p: argparse.ArgumentParser) -> None:
    p.add_argument("--matrix", type=Path, default=None,
                   help="matrix.yaml to read (default: $IMAGEBUILD_MATRIX, else ./matrix.yaml "
                        "in the current directory, else a checkout's own; installed, there "
                        "is no default: `init` starts one)")


def _release(p: argparse.ArgumentParser, *, tag_required: bool = True) -> None:
    _matrix(p)
    p.add_argument("--tag", required=tag_required,
                   help="DATE-NAME, e.g. 2026-06-18-dflashfix (NAME: an engine patch set)")
    p.add_argument("--target", default=None,
                   help="a target of matrix.yaml, or `all` (default: the target whose "
                        "properties fit this host)")
    # --image, as every command that selects images by a glob names it (was --only)
    p.add_argument("--image", "--only", dest="only", action=_Renamed, old=("--only",),
                   default=None, metavar="GLOB",
                   help="only cells whose image (or id, target/image) matches GLOB")


def _positive_ints(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("comma-separated positive integers, e.g. 1,8,32,64")
    return out


def _cpus(text: str) -> set[int]:
    """'0', '1,3' or '2-5' (the cpuset syntax docker takes) as a set of CPU numbers."""
    out: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            if not (lo.strip().isdigit() and (hi == "" or hi.strip().isdigit())):
                raise ValueError(part)
            if int(hi or lo) - int(lo) > 4096:
                raise ValueError(part)
            out.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        out = set()
    if not out or max(out) > 4096:
        raise argparse.ArgumentTypeError("CPU numbers such as 1, 1,3 or 2-5")
    return out


def _cpuset(text: str) -> str:
    """docker --cpuset-cpus: the same syntax, kept as text."""
    _cpus(text)
    return text.replace(" ", "")


def _smoke_args(p: argparse.ArgumentParser) -> None:
    _release(p, tag_required=False)
    p.add_argument("image", nargs="?", default=None, metavar="IMAGE_REF", type=_image_ref,
                   help="a local serve image; expectations from its labels and cell")
    p.add_argument("--out", type=_run_dir, default=None,
                   help="output dir (default: build/smoke/<target>/<engine>/<image>/, or "
                        "build/smoke/ref/<ref>/ for IMAGE_REF)")
    p.add_argument("--boot-timeout", type=_positive_seconds, default=None, metavar="S",
                   help="override the target's boot_timeout_s")
    p.add_argument("--stall-limit", type=_positive_seconds, default=None, metavar="S",
                   help="silent-log seconds before boot counts as the spawn hang "
                        "(default: boot timeout / 4, within 60..180)")


def _bench_args(p: argparse.ArgumentParser) -> None:
    _release(p, tag_required=False)
    p.add_argument("image", nargs="?", default=None, metavar="IMAGE_REF", type=_image_ref,
                   help="a local serve image (started hardened on loopback, then removed)")
    p.add_argument("--url", default=None, type=_url,
                   help="measure an already running server (http://127.0.0.1:PORT) instead")
    p.add_argument("--concurrency", type=_positive_ints, default=None, metavar="C,C,..",
                   help="levels (default: the target's bench settings with --tag, else "
                        "1,8,32,64)")
    p.add_argument("--prompts", default=None, metavar="SETS|FILE.jsonl",
                   help="built-in sets (structured,prose) or a JSONL file of your own")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--requests", type=_positive_int, default=None, metavar="N",
                      help="requests per level (default: the target's, else 32)")
    load.add_argument("--duration", type=_positive_seconds, default=None, metavar="S",
                      help="seconds per level instead of a request count")
    p.add_argument("--max-tokens", type=_positive_int, default=None, metavar="N",
                   help="output tokens per request, fixed by ignore_eos (default: the "
                        "target's, else 128)")
    p.add_argument("--baseline", default=None, metavar="TAG", type=_release_tag,
                   help="show deltas against the results stored with release TAG")
    p.add_argument("--store", action="store_true",
                   help="store the results in the registry next to the image's release")
    p.add_argument("--label", default=None, help="legend name of this run in the plot")
    p.add_argument("--plain-baseline", action=argparse.BooleanOptionalAction, default=None,
                   help="also measure a speculating image without --speculative-config, "
                        "stored with its results as the advice's baseline (default: the "
                        "target's bench.plain_baseline with --tag, else off)")
    p.add_argument("--server-cpus", default=None, metavar="LIST", type=_cpuset,
                   help="pin the server container to these CPUs (docker --cpuset-cpus; "
                        "default: every CPU but the client's)")
    p.add_argument("--client-cpus", type=_cpus, default=None, metavar="LIST",
                   help="pin this load generator to these CPUs (e.g. 1 or 2-3; default: the "
                        "last CPU), so client and server do not take each other's cores")
    p.add_argument("--out", type=_out_dir, default=None,
                   help="output dir (default build/bench/)")


def _gate_args(p: argparse.ArgumentParser) -> None:
    """The gates on moving latest a user may pass with a reason (release, publish, promote
    alike; tools/accept_overrides.py offers promote's to the release workflow)."""
    p.add_argument("--accept-regression", default=None, metavar="REASON", type=_reason,
                   help="let a release slower than latest (beyond the threshold) become "
                        "latest; REASON is recorded with the release and in its notes")
    p.add_argument("--accept-untrusted-bench", dest="accept_untrusted", default=None,
                   metavar="REASON", type=_reason,
                   help="promote although bench levels are flagged as untrusted (the gate "
                        "then compares the other levels only); REASON is recorded with the "
                        "release")
    p.add_argument("--accept-unmeasured", dest="accept_unmeasured", default=None,
                   metavar="REASON", type=_reason,
                   help="move latest although this release or latest has no bench results "
                        "(the regression gate then compares nothing); REASON is recorded in "
                        "the release record and its notes")
    p.add_argument("--accept-rolled-back", dest="accept_rolled_back", default=None,
                   metavar="REASON", type=_reason,
                   help="move latest to a release that was rolled back (re-runs never do); "
                        "takes it off the record of rollbacks")
    p.add_argument("--accept-acceptance-drop", dest="accept_acceptance_drop", default=None,
                   metavar="REASON", type=_reason,
                   help="let a release whose speculative acceptance falls below latest's "
                        "(beyond the target's acceptance_threshold) become latest; REASON "
                        "is recorded with the release and in its notes")


def _moves_format(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="json: {ok, tag, dry_run, moves: [{repository, from, to, digest, "
                        "moved, dry_run, seconds}]}")


def _registry_args(p: argparse.ArgumentParser, *, dry_run: bool = True) -> None:
    _matrix(p)
    p.add_argument("--image", default=None, metavar="GLOB",
                   help="image name or repository glob (default: every image)")
    if dry_run:
        p.add_argument("--dry-run", action="store_true", help="say what would be written")


# One example per command, shown at the end of its --help (PROG: the program as invoked).
EXAMPLES = {
    "release": "%(prog)s --tag 2026-07-01-dflashfix --target cpu",
    "plan": "%(prog)s --tag 2026-07-01-dflashfix --format json",
    "render": "%(prog)s --check",
    "check": "%(prog)s --format json",
    "build": "%(prog)s --tag 2026-07-01-dflashfix --image 'cpu-*'",
    "smoke": "%(prog)s --tag 2026-07-01-dflashfix     (or: %(prog)s 127.0.0.1:5000/vllm-spark/"
             "cpu-tiny-ngram:latest)",
    "gates": "%(prog)s --tag 2026-07-01-dflashfix --image 'cpu-*'",
    "bench": "%(prog)s --tag 2026-07-01-dflashfix --concurrency 1,8 --requests 16",
    "publish": "%(prog)s --tag 2026-07-01-dflashfix --dry-run",
    "promote": "%(prog)s --tag 2026-07-01-dflashfix --dry-run",
    "rollback": "%(prog)s --tag 2026-06-18-dflashfix --image 'cpu-*' --dry-run",
    "releases": "%(prog)s --image cpu-tiny-ngram",
    "table": "%(prog)s --tag 2026-07-01-dflashfix --store",
    "history": "%(prog)s --image cpu-tiny-ngram",
    "verify": "%(prog)s 127.0.0.1:5000/vllm-spark/cpu-tiny-ngram:latest",
    "launch": "%(prog)s 127.0.0.1:5000/spark-pair/pair-nvfp4-tp2@sha256:<digest> --hosts "
              "spark1,spark2 examples/two-spark-tp2/rendered/gb10/spark/pair-nvfp4-tp2.*"
              ".compose.yaml     (the files `render --matrix examples/two-spark-tp2/"
              "matrix.yaml` writes)",
    "prune": "%(prog)s --keep 5 --dry-run",
    "unlock": "%(prog)s --image cpu-tiny-ngram --dry-run",
    "resume": "%(prog)s --tag 2026-07-01-dflashfix",
    "notes": "%(prog)s --tag 2026-07-01-dflashfix > notes.md",
    "pins": "%(prog)s watch --format markdown",
    "rehearse": "%(prog)s --target gb10 --jobs 2",
    "runner-clean": "%(prog)s --keep 3 --dry-run",
    "lock": "%(prog)s --check     (or: %(prog)s --update tiny)",
    "schema": "%(prog)s > matrix.schema.json     (or: %(prog)s --format markdown)",
    "completion": "%(prog)s bash > ~/.imagebuild.bash     (or: %(prog)s zsh > "
                  "~/.zfunc/_imagebuild)",
    "init": "%(prog)s my-images     (then: cd my-images)",
    "migrate": "%(prog)s --matrix examples/cpu-tiny-llama/matrix.yaml --dry-run",
    "facts": "%(prog)s record --python .venv-vllm/bin/python     (or: %(prog)s list)",
}


def _verbosity(p: argparse.ArgumentParser, default: object) -> None:
    p.add_argument("-v", "--verbose", action="count", default=default,
                   help="say more: debugging detail, and every build step as it runs "
                        "(IMAGEBUILD_VERBOSE=1)")
    p.add_argument("-q", "--quiet", action="count", default=default,
                   help="say less: no line per registry retry or wait (-qq: errors only)")


def _version(p: argparse.ArgumentParser) -> None:
    p.add_argument("--version", action="version", version=f"imagebuild {__version__}",
                   help="print the version and exit")


def _subcommands(ap: argparse.ArgumentParser) -> Any:
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, **kw: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name, epilog="example:\n  " + EXAMPLES[name],
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           description=kw.get("help"), **kw)
        _verbosity(p, argparse.SUPPRESS)  # after the command as well as before it
        _version(p)  # the README's "everywhere"
        return p

    return add


def parser(prog: str | None = None) -> argparse.ArgumentParser:
    ap = Parser(
        prog=prog or invoked(),
        description="matrix.yaml -> tested, tagged, rollback-able vLLM serving images. "
                    "Without a command, `--tag T` runs the whole job (release).",
        epilog="example:\n  %(prog)s plan --tag 2026-07-01-dflashfix\n"
               "environment variables: docs/environment.md; matrix.yaml: "
               "docs/matrix-reference.md",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _version(ap)
    _verbosity(ap, 0)
    add = _subcommands(ap)
    sub = argparse.Namespace(add_parser=add)

    p = sub.add_parser("release", help="the whole job (the default: `%(prog)s --tag T`): plan, "
                                       "lock check, preflight, build, smoke, publish, bench, "
                                       "regression gate, latest")
    _release(p)
    p.add_argument("--out", type=_run_dir, default=None, help="build dir (default: build/)")
    p.add_argument("--dry-run", action="store_true",
                   help="no registry writes (every stage runs: nothing is resumed)")
    p.add_argument("--no-bench", action="store_true",
                   help="skip the benchmark; latest then moves only with "
                        "--accept-unmeasured REASON (the gate has nothing to compare)")
    p.add_argument("--resmoke", action="store_true",
                   help="run smoke and the release gates again although the release "
                        "record says this very image passed them (a re-run skips them)")
    _gate_args(p)

    p = sub.add_parser("plan", help="the cells a tag builds, with refs, tags and pins")
    _release(p)
    p.add_argument("--format", choices=("table", "json", "github", "targets"), default="table",
                   help="github: one strategy.matrix entry per cell with its runner labels; "
                        "targets: one entry per target (properties, runner, cell count)")

    p = sub.add_parser("render", help="render Dockerfiles (base, engine, serve per cell)")
    _release(p, tag_required=False)
    p.add_argument("--out", type=_out_dir, default=None, help="output dir (default: rendered/)")
    p.add_argument("--check", action="store_true",
                   help="exit 2 when the committed rendered files are stale (as `lock "
                        "--check` does for a stale lock)")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="json: {ok, out, files, unresolved_pins} (--check: and stale)")

    p = sub.add_parser("check", help="preflight: KV-cache layout, serve-flag traps, "
                                     "checkpoint and pin rules (exit 2 on any error); with "
                                     "--tag the cells that release builds, whose unresolved "
                                     "pins are then errors")
    _release(p, tag_required=False)
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="json: one object per finding (rule, severity, cell, message, fix)")

    p = sub.add_parser("build", help="build base, engine and serve images per cell (BuildKit)")
    _release(p)
    p.add_argument("--out", type=_out_dir, default=None,
                   help="where logs, contexts and build records go (default: build/)")
    p.add_argument("--engine-only", action="store_true",
                   help="build base and engine of each target, no serve image (a release's "
                        "engine stage)")
    p.add_argument("--push", action="store_true",
                   help="with --engine-only: push each engine by digest to REGISTRY/NAMESPACE/"
                        "engine-TARGET-ENGINE (one the registry already holds is not built "
                        "again); prints REF@sha256:..., writes it to OUT/engines/TARGET.ref "
                        "and to $GITHUB_OUTPUT (engine_image)")
    p.add_argument("--engine-image", default=None, metavar="REF@sha256:DIGEST",
                   help="pull this engine (what --engine-only --push printed) instead of "
                        "building it, refused unless its inputs are this checkout's; only "
                        "the serve layers are built here")
    p.add_argument("--no-cache", action="store_true",
                   help="rebuild every image, even one whose inputs are built already, "
                        "without BuildKit's layer cache (its pip/ccache mounts stay): does "
                        "a build reproduce? (docs/reproducibility.md)")

    _smoke_args(sub.add_parser("smoke", help="run serve images hardened and check they serve "
                                             "correctly (exit 1 when one fails)"))
    p = sub.add_parser("gates", help="the release gates of a tag's built cells: speculative "
                                     "decoding lossless against plain decoding, long "
                                     "generation (exit 1 when a cell fails or is untrusted)")
    _release(p)
    p.add_argument("--out", type=_out_dir, default=None,
                   help="build dir; gates.json goes to its smoke/<target>/<engine>/<image>/ "
                        "(default: build/)")
    _bench_args(sub.add_parser("bench", help="measure a serve image: TTFT, TPOT, tok/s per "
                                             "concurrency level, speculative acceptance; plot"))

    p = sub.add_parser("publish", help="push cells that passed smoke by digest, verify, tag "
                                       "the release, then move latest (regression gate)")
    _release(p)
    p.add_argument("--dry-run", action="store_true", help="say what would be written")
    p.add_argument("--no-latest", action="store_true", help="push and tag, keep latest")
    _gate_args(p)

    p = sub.add_parser("promote", help="move latest to an already pushed release")
    _release(p)
    p.add_argument("--dry-run", action="store_true", help="say what would be written")
    p.add_argument("--forward-only", action="store_true",
                   help="when latest holds a newer release, or this one was rolled back, "
                        "leave latest and exit 0 (the release workflow: an older tag that "
                        "finishes after a newer one, a re-run after a rollback); without it "
                        "both refuse with exit 1")
    _gate_args(p)
    _moves_format(p)

    p = sub.add_parser("rollback", help="move latest back to an older release (server-side)")
    _registry_args(p)
    # --tag, as every command that names a release names it (was --to)
    p.add_argument("--tag", "--to", dest="to", action=_Renamed, old=("--to",), required=True,
                   type=_release_tag, help="the release to go back to: its tag, full or "
                                           "DATE-NAME")
    p.add_argument("--accept-unmeasured", dest="accept_unmeasured", default=None,
                   metavar="REASON", type=_reason,
                   help="roll back to a release that was never benched or was promoted "
                        "unmeasured")
    p.add_argument("--accept-forward", dest="accept_forward", default=None,
                   metavar="REASON", type=_reason,
                   help="let a rollback move latest forward (past the regression gate that "
                        "`promote` runs)")
    _moves_format(p)

    p = sub.add_parser("releases", help="list releases in the registry, newest first")
    _registry_args(p, dry_run=False)
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="json: {repository: [release, ...]} with each release's record")

    p = sub.add_parser("table", help="the compatibility table of a release: per cell smoke, "
                                     "lossless, long generation, tok/s, acceptance, verdict")
    _release(p)
    p.add_argument("--store", action="store_true",
                   help="store it with each cell's release (an OCI referrer of its manifest)")
    p.add_argument("--format", choices=("markdown", "json"), default="markdown",
                   help="json: the table's document, as stored")

    p = sub.add_parser("history", help="tok/s and TTFT per concurrency across every release "
                                       "of an image, from the registry (PNG + markdown)")
    _registry_args(p, dry_run=False)
    p.add_argument("--out", type=_out_dir, default=None,
                   help="where history-<image>.png/.md go (default: build/bench/)")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="json: {repository: {releases: [{tag, latest, rolled_back, smoke, "
                        "levels}], png, md}}")

    p = sub.add_parser("verify", help="check what is stored with a release against its "
                                      "image: record, SBOM, provenance, bench results, "
                                      "compatibility table, signatures (exit 1 when one is "
                                      "missing or disagrees)")
    p.add_argument("image", metavar="IMAGE_REF", type=_image_ref,
                   help="REGISTRY/NAMESPACE/IMAGE:TAG or REGISTRY/NAMESPACE/IMAGE@sha256:...")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="json: {image, ok, counts, checks: [{status, what, detail}]}")

    p = sub.add_parser("launch", help="start a multi-node cell: check that its per-node "
                                      "files agree and every host has the same image, then "
                                      "start workers and head (docs/multi-node.md)")
    p.add_argument("image", metavar="IMAGE_REF", type=_image_ref,
                   help="the image every node runs, best by digest (REF@sha256:...)")
    p.add_argument("files", metavar="NODE_FILE", nargs="+", type=Path,
                   help="the cell's per-node compose files (render writes "
                        "IMAGE.head.compose.yaml, IMAGE.worker1.compose.yaml, ...)")
    p.add_argument("--hosts", required=True, metavar="HEAD,WORKER1,...",
                   help="one Docker host per node, node-rank order: NAME (ssh://NAME) or a "
                        "Docker host URL (ssh://user@host, unix:///var/run/docker.sock)")
    p.add_argument("--master-addr", default=None, metavar="ADDRESS",
                   help="the head's address on the nodes' link (default: the first host's "
                        "name; 127.0.0.1 for a local engine)")
    p.add_argument("--dry-run", action="store_true",
                   help="check files and image digests, print each node's command, start "
                        "nothing")

    p = sub.add_parser("prune", help="delete old releases (never latest or its rollback)")
    _registry_args(p)
    p.add_argument("--keep", type=_positive_int, required=True,
                   help="newest N releases to keep")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="json: {repository: {dry_run, keep: [{tag, why}], delete, skipped}}")

    p = sub.add_parser("unlock", help="remove a registry lease that a gone run left "
                                      "behind (an unreadable or expired expiry; a live one "
                                      "only with --force)")
    _registry_args(p)
    p.add_argument("--force", action="store_true",
                   help="remove a lease that has not expired (only when you know its run "
                        "is gone: another run may be writing)")

    p = sub.add_parser("resume", help="read-only: is each cell already published under "
                                      "the tag, smoke-passed and benched? (name=value "
                                      "lines for $GITHUB_OUTPUT: a re-run skips what is done)")
    _release(p)
    p.add_argument("--verdict-dir", type=_out_dir, default=None, metavar="DIR",
                   help="for a cell done before: write its recorded smoke verdict where "
                        "`notes --smoke-dir DIR` reads it (none is overwritten)")
    p.add_argument("--pull", action="store_true",
                   help="for a cell done before but not benched: pull the tested image by "
                        "digest (its id checked) so `bench --tag` finds it here")
    p.add_argument("--format", choices=("github", "json"), default="github",
                   help="github: name=value lines for $GITHUB_OUTPUT; json: {tag, cells}")

    p = sub.add_parser("notes", help="GitHub release notes of a release (markdown)")
    _release(p)
    p.add_argument("--smoke-dir", type=_out_dir, default=None,
                   help="build dir holding smoke/<target>/<engine>/<image>/verdict.json "
                        "(default: build/)")
    p.add_argument("--asset-dir", "--plot-dir", dest="asset_dir", type=_out_dir, default=None,
                   metavar="DIR", help="write the release assets there: <image>.compose.yaml, "
                                       "bench-<image>.png and history-<image>.png/.md per "
                                       "image (linked in the notes)")
    p.add_argument("--asset-url", default=None, metavar="URL",
                   help="prefix of the plot links (the GitHub release's download URL; "
                        "default: the bare file name)")
    p.add_argument("--not-promoted", action="store_true",
                   help="a run in which a cell failed: which cells failed and how, and "
                        "that nothing was promoted (the release workflow's step summary)")

    p = sub.add_parser("pins", help="watch pinned models and drafters for upstream moves")
    verbs = p.add_subparsers(dest="pins_command", metavar="watch")
    w = verbs.add_parser("watch", help="compare each pin's upstream head with the lock and "
                                       "run preflight on a moved head",
                         epilog="example:\n  %(prog)s --format markdown --out issues/",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    _verbosity(w, argparse.SUPPRESS)
    _version(w)
    _matrix(w)
    w.add_argument("--format", choices=("text", "json", "markdown"), default="text",
                   help="markdown: the issue body per moved pin; json: the reports")
    w.add_argument("--out", type=_out_dir, default=None, metavar="DIR",
                   help="also write one issue body (.md) and title (.title) per moved pin")
    w.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="only this model or drafter (repeatable)")
    p = sub.add_parser("rehearse", help="GB10 rehearsal on this machine (nvcc 13): vLLM's arch "
                                        "selection, sm_121a compiles through the arch gate, "
                                        "the package version, the runtime self-check")
    _matrix(p)
    p.add_argument("--target", default="gb10", help="a target built from source (default gb10)")
    p.add_argument("--engine", default=None,
                   help="engine patch set (default: the first built from source for it)")
    p.add_argument("--workdir", type=_out_dir, default=None,
                   help="scratch dir (default: build/rehearse/TARGET)")
    p.add_argument("--jobs", type=_positive_int, default=2, help="parallel compiles (default 2)")
    p = sub.add_parser("runner-clean", help="free this runner's disk by release age: keep the "
                                            "newest N releases, latest and its rollback "
                                            "target (with the images they are built from); "
                                            "never BuildKit's cache mounts")
    _matrix(p)
    p.add_argument("--keep", type=_positive_int, required=True,
                   help="newest N local releases to keep")
    p.add_argument("--dry-run", action="store_true", help="say what would go")
    p = sub.add_parser("lock", help="resolve every pin into matrix.lock.json")
    _matrix(p)
    p.add_argument("--update", action="append", default=[], metavar="NAME",
                   help="re-resolve NAME (a model, drafter or target), moving a tracked "
                        "branch; an engine: write its wheel's hash-pinned requirement set")
    p.add_argument("--check", action="store_true",
                   help="exit 2 when the lock disagrees with matrix.yaml; resolve nothing")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="json: {ok, lock, unresolved} (--check: {ok, lock, stale})")

    p = sub.add_parser("schema", help="print matrix.yaml's JSON Schema (for editors) or its "
                                      "reference page, both generated from the models")
    p.add_argument("--format", choices=("json", "markdown"), default="json",
                   help="json: the JSON Schema; markdown: docs/matrix-reference.md")
    p = sub.add_parser("facts", help="record a vLLM version's facts from its own code (serve "
                                     "options, modalities, KV cache, kernels, envs, logs, "
                                     "metrics), or list the versions recorded")
    verbs = p.add_subparsers(dest="facts_command", metavar="record|list")
    r = verbs.add_parser("record", help="run the recorder inside an interpreter with vLLM "
                                        "installed; write <out>/<version>/*.json",
                         epilog="example:\n  %(prog)s --python .venv-vllm/bin/python --out "
                                "/tmp/facts",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    _verbosity(r, argparse.SUPPRESS)
    _version(r)
    _matrix(r)
    r.add_argument("--python", type=Path, required=True,
                   help="python of a venv with the vLLM to describe (its version decides "
                        "the folder)")
    r.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="root folder of the facts (default: locked/vllm beside the matrix, "
                        "where `check` finds them)")
    r.add_argument("--patch", action="append", default=[], type=Path, metavar="FILE",
                   help="a patch of the engine, in order (repeatable): a patch that changes "
                        "vLLM's KV unification is recorded from the patched code")
    r.add_argument("--part", action="append", default=[], metavar="NAME",
                   help="record only this part (repeatable; default: all)")
    r.add_argument("--jobs", type=_positive_int, default=2,
                   help="parts recorded at once (default 2)")
    ls = verbs.add_parser("list", help="the vLLM versions with recorded facts, and where",
                          epilog="example:\n  %(prog)s --matrix examples/cpu-tiny-llama/"
                                 "matrix.yaml",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    _verbosity(ls, argparse.SUPPRESS)
    _version(ls)
    _matrix(ls)
    p = sub.add_parser("completion", help="print shell completion for bash or zsh, made "
                                          "from this parser (commands, options, choices)")
    p.add_argument("shell", choices=("bash", "zsh"),
                   help="bash: eval it in ~/.bashrc; zsh: save it as _imagebuild in $fpath")
    p = sub.add_parser("init", help="start a project folder from the example matrix the "
                                    "package carries (the cpu target): matrix.yaml, its "
                                    "lock, the files it names, the rendered files")
    p.add_argument("dir", nargs="?", type=_out_dir, default=Path("."), metavar="DIR",
                   help="the folder to write (default: the current one); refused when it "
                        "already holds one of those files")
    p = sub.add_parser("migrate", help="rewrite an older matrix.yaml to the current schema "
                                       "in place (renamed fields; comments kept)")
    _matrix(p)
    p.add_argument("--dry-run", action="store_true", help="say what would change")
    return ap
