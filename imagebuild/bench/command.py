"""`build.py bench IMAGE_REF|--tag T|--url URL`: measure, write JSON/markdown/plot, and
optionally compare with a stored baseline and store the results in the registry."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from imagebuild import REPO_ROOT, buildfolder, progress
from imagebuild.bench import apart, client, compare, placement, prompts, results, store
from imagebuild.bench.placement import Placement
from imagebuild.bench.plot import plot
from imagebuild.docker import inspect_image
from imagebuild.errors import UserError
from imagebuild.expectations import expectations_from_labels
from imagebuild.plan import ImageRef, Job
from imagebuild.registry.client import RegistryClient
from imagebuild.serving import container  # called as container.X: tests swap in doubles
from imagebuild.serving.container import Server
from imagebuild.serving.runspec import SPEC_FLAG, Limits, speculates
from imagebuild.spec.nodecmd import multi_node
from imagebuild.spec.tags import parse_release_tag

if TYPE_CHECKING:
    from imagebuild.plan import Plan


def measure(base_url: str, *, prompt_set: list[prompts.Prompt], levels: list[int],
            load_kw: dict[str, Any], log: Callable[[str], None] = print, run: str = ""
            ) -> tuple[list[dict[str, Any]], str]:
    """Run every level against a live server: (level summaries, served model name).
    `run` names it in progress and log lines (`plain`: the plain twin, bench_image)."""
    model = asyncio.run(client.served_model(base_url))
    load = client.Load(model=model, **load_kw)
    out = []
    name = f"{run} " if run else ""
    for c in levels:
        done = [0]

        def tick(c: int = c, done: list[int] = done) -> None:
            done[0] += 1
            of = f" of {load.requests}" if load.requests is not None else ""
            progress.wait(f"bench {name}c={c}", f"{done[0]}{of} requests")

        progress.wait(f"bench {name}c={c}", "warm-up request")
        # in a process of its own: nothing else this process runs delays its reads
        level = apart.run_level(base_url, prompt_set, c, load, tick=tick)
        out.append(results.summarize(level))
        lv = out[-1]
        flags = "; ".join(f["code"] for f in lv["flags"])
        log(f"{name}c={c}: {lv['output_tok_s']:,.1f} tok/s, {lv['errors']} errors"
            + (f", UNTRUSTED ({flags})" if flags else ""))
    return out, model


def _image_meta(ref: str, info: dict[str, Any]) -> dict[str, Any]:
    labels = info.get("Config", {}).get("Labels") or {}
    tag = ref.rsplit(":", 1)[-1] if ":" in ref.rsplit("/", 1)[-1] else None
    pins = {k.removeprefix("io.imagebuild."): v for k, v in labels.items()
            if k.startswith("io.imagebuild.") and "pin" in k}
    return {"ref": ref, "id": info.get("Id"), "tag": tag,
            "repo_digests": info.get("RepoDigests") or [],
            "cell": labels.get("io.imagebuild.cell"), "engine": labels.get("io.imagebuild.engine"),
            "target": (labels.get("io.imagebuild.cell") or "/").split("/")[0] or None,
            "labels": labels, "pins": pins}


def image_name(image: dict[str, Any]) -> str:
    """What a run's files are named after: the image (its cell's, else its reference's
    repository name), or the server's host and port for `--url`."""
    if image.get("cell"):
        return str(image["cell"]).rsplit("/", 1)[-1]
    ref = str(image.get("ref") or "server")
    if "://" in ref:
        return urlsplit(ref).netloc
    return ref.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]


def write_outputs(doc: dict[str, Any], out_dir: Path, markdown: str,
                  others: list[dict[str, Any]] | None = None) -> dict[str, Path]:
    """JSON + markdown of the run; the plot has one line per run (this one, then `others`,
    e.g. the baseline release)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = buildfolder.bench_files(out_dir, image_name(doc["image"]))
    paths = {"json": files["json"], "md": files["md"]}
    paths["json"].write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    paths["md"].write_text(markdown)
    try:
        paths["png"] = plot([doc, *(others or [])], files["png"])
    except ImportError:  # matplotlib missing: the numbers still stand
        pass
    return paths


def bench_image(ref: str, info: dict[str, Any], *, limits: Limits,
                prompt_set: list[prompts.Prompt], levels: list[int], load_kw: dict[str, Any],
                settings: dict[str, Any], place: Placement | None = None,
                label: str | None = None, nodes: Server | None = None, plain: bool = False,
                log: Callable[[str], None] = print) -> dict[str, Any]:
    """Start `ref` hardened on loopback, measure every level, remove it: one results doc.
    `limits`: the memory limit, GPUs and boot timeout it runs with, from its Job's
    expectations (or, for an image known by reference only, the labels' and the matrix
    in effect's: `expectations_from_labels`); bench reads no matrix itself.
    Server and client run on separate CPUs (`place`, by default split automatically).
    `nodes`: a multi-node cell's server (serving/container.py server_for: its nodes as its
    smoke runs them), which places each node on its own cores itself; the client is not
    pinned. `plain`: when the image speculates, measure it once more right after without
    `--speculative-config` (its plain twin: the same weights and flags, placed the same,
    one more boot), kept under the document's `plain`: the baseline the advice compares
    its drafter with (release/advice.py)."""
    if nodes is not None:
        place = placement.Placement(None, None, "not placed: the cell's nodes are placed "
                                    "by their own run (serving/nodes.py)")
    place = place or placement.choose()
    log(f"placement: {place.why}")

    def levels_of(drop: tuple[str, ...], name: str) -> list[dict[str, Any]]:
        server = nodes(drop) if nodes is not None else container.serving(
            ref, info, limits, drop_flags=drop, cpuset=place.server_cpus, log=log)
        with server as c, place.client_pinned():
            measured, _model = measure(c.base_url, prompt_set=prompt_set, levels=levels,
                                       load_kw=load_kw, log=log, run=name)
        return measured

    meta = _image_meta(ref, info)
    meta["label"] = label
    started = _now()
    doc = results.document(image=meta, settings={**settings, **place.as_settings()},
                           levels=levels_of((), ""), started=started)
    if plain and speculates(info):
        started = _now()
        doc["plain"] = {"started": started, "without": [SPEC_FLAG],
                        "levels": levels_of((SPEC_FLAG,), "plain")}
    return doc


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H-%M-%SZ")


def nodes_server(job: Job, info: dict[str, Any], out_dir: Path) -> Server | None:
    """A multi-node cell's server for the bench (all its nodes), None for one container."""
    if multi_node(job.cell) is None:
        return None
    return container.server_for(job.cell, job.release_ref, info, out_dir / job.cell.image,
                      limits=Limits.of(job.expect), what="bench")


def load_settings(concurrency: list[int], prompt_arg: str, *, requests: int | None,
                  duration: float | None, max_tokens: int,
                  extra: dict[str, Any] | None = None
                  ) -> tuple[list[prompts.Prompt], dict[str, Any], dict[str, Any]]:
    """(prompts, client load, the settings recorded with the results)."""
    prompt_set = prompts.select(prompt_arg)
    load_kw = {"max_tokens": max_tokens, "requests": requests, "duration_s": duration}
    if duration is None and requests is None:
        load_kw["requests"] = 32
    settings = {"concurrency": concurrency, "prompts": prompt_arg,
                "prompt_count": len(prompt_set), **load_kw, "endpoint": "/v1/chat/completions",
                "ignore_eos": True, "temperature": 0.0, **(extra or {})}
    return prompt_set, load_kw, settings


def run(args: argparse.Namespace, plan: Plan | None) -> int:
    """`plan`: the jobs of --tag (None for IMAGE_REF or --url)."""
    if sum(bool(x) for x in (args.image, args.tag, args.url)) != 1:
        raise UserError("give one of IMAGE_REF, --tag T or --url URL",
                        fix="e.g. `build.py bench 127.0.0.1:5000/vllm-spark/cpu-tiny-ngram:TAG`")
    if args.plain_baseline and args.url:
        raise UserError("--plain-baseline starts the image without --speculative-config, "
                        "and --url measures a server this command did not start",
                        fix="give the image's IMAGE_REF or --tag T, or drop --plain-baseline")
    if args.store and args.url:
        raise UserError("--store keeps results with a release, and --url measures a server "
                        "of no release", fix="give the release's IMAGE_REF or --tag T")
    if (args.store or args.baseline) and args.image:
        _, tag = ImageRef.parse(args.image)
        if args.store and (tag is None or parse_release_tag(tag) is None):
            raise UserError(f"--store: IMAGE_REF {args.image} is not a release "
                            "(REGISTRY/NAMESPACE/IMAGE:DATE-vX.Y.Z-NAME)",
                            fix="give the release's reference, or drop --store")
    prompts.select(args.prompts or "structured")  # a bad prompts file stops here, early
    refs = [args.image] if args.image else []
    target = None
    if plan is not None:
        refs = [j.release_ref for j in plan.jobs]
        target = plan.jobs[0].cell.target.bench if plan.jobs else None
    # flags win; then the target's bench settings in matrix.yaml (with --tag); then defaults
    concurrency = args.concurrency or (target.concurrency if target else [1, 8, 32, 64])
    requests = args.requests if args.requests is not None or args.duration else (
        target.requests if target else None)
    max_tokens = args.max_tokens or (target.max_tokens if target else 128)
    prompt_arg = args.prompts or (target.prompts if target else "structured,prose")
    plain = args.plain_baseline if args.plain_baseline is not None else bool(
        target and target.plain_baseline)
    place = placement.choose(args.server_cpus, args.client_cpus)
    prompt_set, load_kw, settings = load_settings(
        concurrency, prompt_arg, requests=requests, duration=args.duration,
        max_tokens=max_tokens)
    out_root = args.out or buildfolder.bench_dir(
        buildfolder.default(plan.lm.root if plan else REPO_ROOT))
    if not args.url:  # it starts servers: SIGKILLed runs' first (reaper.py)
        from imagebuild.reaper import reap

        reap()
    if args.url:
        started = _now()
        # a server we did not start: only the client can be placed
        place = placement.choose(client_cpus=args.client_cpus) if args.client_cpus else \
            placement.Placement(None, None, "not placed: --url")
        with progress.stage("bench", args.url), place.client_pinned():
            levels, _model = measure(args.url, prompt_set=prompt_set, levels=concurrency,
                                     load_kw=load_kw)
        docs: Iterable[tuple[str, dict[str, Any]]] = [(args.url, results.document(
            image={"ref": args.url, "id": None, "tag": None, "label": args.label},
            settings={**settings, **place.as_settings()}, levels=levels, started=started))]
    else:  # one image at a time: each is written (and stored) before the next boots
        jobs = {j.release_ref: j for j in plan.jobs} if plan is not None else {}

        def one(ref: str) -> dict[str, Any]:
            info = inspect_image(ref)
            job = jobs.get(ref)
            # --tag: the Job's expectations; IMAGE_REF: its labels and the matrix in effect
            expect = job.expect if job else expectations_from_labels(ref, info,
                                                                     matrix=args.matrix)
            with progress.stage("bench", ref):
                return bench_image(ref, info, limits=Limits.of(expect), prompt_set=prompt_set,
                                   levels=concurrency, load_kw=load_kw, settings=settings,
                                   place=place, label=args.label, plain=plain,
                                   nodes=nodes_server(job, info, out_root) if job else None)
        docs = ((ref, one(ref)) for ref in refs)
    for ref, doc in docs:
        deltas, baseline = None, None
        if args.baseline or args.store:
            deltas, baseline = _registry_steps(args, ref, doc)
        md = results.markdown(doc, deltas)
        print(md)
        for kind, path in write_outputs(doc, out_root, md,
                                        [baseline] if baseline else []).items():
            print(f"{kind}: {path}")
    return 0


def _registry_steps(args: argparse.Namespace, ref: str, doc: dict[str, Any]
                    ) -> tuple[dict[int, dict[str, float]] | None, dict[str, Any] | None]:
    """Baseline deltas (and the baseline's results) and/or storing this run."""
    image, tag = ImageRef.parse(ref)
    repo = image.repository
    reg = RegistryClient(image.registry)
    deltas, base = None, None
    if args.baseline:
        base = store.release_results(reg, repo, args.baseline)
        if base is None:
            raise UserError(f"{repo}:{args.baseline} has no stored bench results",
                            fix="run `build.py bench --store` on that release first")
        deltas = compare.deltas(doc, base)
    if args.store:
        if not doc["image"].get("id") or not tag:
            raise UserError("--store needs a released image (REGISTRY/REPO:RELEASE-TAG), "
                            "not --url", fix="give the release's IMAGE_REF or --tag T")
        digest = store.put_results(reg, repo, tag, doc)
        print(f"stored with {repo}:{tag} as a referrer of its manifest ({digest[:19]})")
    return deltas, base
