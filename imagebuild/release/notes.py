"""`build.py notes --tag T`: the GitHub release notes of a release, as markdown.

Per image: `docker pull` by tag and by digest, the hardened `docker run` (docs/domain.md: weights
read-only inside the image, port on 127.0.0.1 through the host network, no credentials in
the container, `--ipc host` on GB10, vLLM's cache on a volume so restarts skip the
compile), the pins table, the smoke summary of the tested digest, the benchmark table
(deltas against the release before it, any accepted regression with its reason) and plot,
and the rollback command for the release before it. Formatting is pure (`release_notes`);
`gather` reads the registry.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imagebuild.bench import compare, history, results, store
from imagebuild.bench.plot import plot
from imagebuild.bench.store import A_ACCEPTED, A_ACCEPTED_DROP, A_UNCOMPARED, A_UNTRUSTED
from imagebuild.builder.archtable import NONE, Row, markdown
from imagebuild.buildfolder import record_path, verdict_path
from imagebuild.plan import UNRESOLVED
from imagebuild.registry import referrers
from imagebuild.registry.documents import bench_table
from imagebuild.registry.records import list_releases
from imagebuild.release.resume import recorded_verdict
from imagebuild.release.rollbacks import rolled_back
from imagebuild.render import render_compose
from imagebuild.safetext import safe
from imagebuild.serving.nodefiles import node_files
from imagebuild.serving.runspec import RunSpec, docker_run_argv, docker_run_text
from imagebuild.spec.nodecmd import MASTER_ADDR_VAR, NodeCommand, multi_node, node_commands
from imagebuild.spec.servecmd import with_listen
from imagebuild.spec.tags import ReleaseTag
from imagebuild.supplychain.attach import A_FINDINGS, A_SIGNING, GITHUB_SIGNED

if TYPE_CHECKING:
    from imagebuild.plan import Job
    from imagebuild.registry.records import Release
    from imagebuild.spec.matrix import LoadedMatrix


@dataclass(frozen=True)
class ImageFacts:
    """What the registry and the smoke run say about one cell of the release."""

    digest: str | None  # manifest digest of repo:release_tag (None: not pushed)
    previous: str | None  # the newest older release that passed (the rollback target)
    verdict: dict[str, Any] | None  # build/smoke/<target>/<engine>/<image>/verdict.json
    bench: dict[str, Any] | None = None  # results stored with this release
    bench_previous: dict[str, Any] | None = None  # ... with `previous`
    accepted_regression: str | None = None  # the reason promote was given
    accepted_untrusted: str | None = None  # why flagged figures were not compared
    accepted_drop: str | None = None  # why lower speculative acceptance was let through
    unmeasured: str | None = None  # why it was promoted without a measurement (its record)
    uncompared: str | None = None  # why it was promoted over a latest without results
    plot: str | None = None  # where the notes link the PNG (asset URL or file name)
    history: str | None = None  # where the notes link the bench history of every release
    gpu_code: list[dict[str, Any]] | None = None  # the serve build record's GPU-code table
    # the SBOM and provenance stored with the release: {"sbom": artifact digest,
    # "provenance": ..., "signing": how, "findings": count} (supplychain/attach.py)
    supply_chain: dict[str, str] | None = None
    latest: str | None = None  # the release tag `latest` is at now (None: no latest)
    rolled_back: dict[str, str] | None = None  # {"to", "at"}: this release was rolled back


def run_spec(job: Job, ref: str) -> RunSpec:
    """How users run the release: as smoke ran it, plus a named volume for vLLM's caches
    (restarts skip the compile: ~10-12 min first boot on a Spark, then ~3-5 min)."""
    return RunSpec(image=ref, command=tuple(job.serve.argv),
                   memory=job.cell.target.memory_limit, gpu=bool(job.cell.target.gpu),
                   port=job.serve.port, cache_volume=f"{job.cell.image}-cache")


def compose_file(lm: LoadedMatrix, job: Job, ref: str) -> str:
    """The cell's rendered compose file, pinned to `ref` (the release's digest)."""
    return render_compose(lm, job.cell, image=ref).text


def _node_run(job: Job, node: NodeCommand, ref: str) -> str:
    """One node's `docker run`: hardened as every image, plus the interconnect settings,
    MASTER_ADDR from the user's shell and the node's own command."""
    lines = docker_run_argv(run_spec(job, ref), name=f"{job.cell.image}-{node.name}")
    env = [["-e", f"{k}={v}"] for k, v in node.env] + [["-e", MASTER_ADDR_VAR]]
    text = " \\\n  ".join(shlex.join(line) for line in lines[:-1] + env + lines[-1:])
    argv = list(node.argv)
    if node.argv[:1] != ("sh",):  # mp: every node says where it listens, as compose does
        argv = with_listen(argv, job.serve.port)
    return text + " \\\n  " + NodeCommand(node.rank, tuple(argv), node.env).shell()


def _nodes(job: Job, ref: str) -> list[str]:
    """How to run a multi-node cell: per node, workers first (empty for one node)."""
    nodes = node_commands(job.cell)
    par = multi_node(job.cell)
    if not nodes or par is None:
        return []
    out = [f"Run it on {len(nodes)} nodes (tensor parallel size {par.tensor_parallel_size}, "
           f"vLLM's `{par.backend}` executor): the same image on every node (check that "
           "`docker image inspect --format '{{.Id}}'` agrees), `MASTER_ADDR` the head's "
           "address on the interconnect on every node, the workers first, then the head, "
           "which serves the API on "
           f"127.0.0.1:{job.serve.port}. `build.py launch` does all of it from one machine; "
           "the per-node compose files are release assets "
           f"(`{job.cell.image}.head.compose.yaml`, `{job.cell.image}.worker1.compose.yaml`"
           f"{', ...' if len(nodes) > 2 else ''}).", ""]
    for node in [*nodes[1:], nodes[0]]:
        role = ("Last, the head (node-rank 0, the API server):" if node.rank == 0 else
                f"{node.name} (node-rank {node.rank}, "
                + ("headless" if par.backend == "mp" else "joins the head's Ray cluster")
                + "):")
        out += [role, "", "```sh",
                "export MASTER_ADDR=<head address>  # the head's interconnect address",
                _node_run(job, node, ref), "```", ""]
    return out


def _pin(pin: dict[str, Any] | None) -> str:
    if not pin:
        return "-"
    if "repository" in pin:
        rev = pin.get("revision") or UNRESOLVED
        return f"`{pin['repository']}` @ `{rev}`"
    if "generated" in pin:
        return f"generated by `{pin['generated']}` (seed {pin.get('seed')})"
    return str(pin.get("method", "-"))


def _engine(e: dict[str, Any]) -> str:
    origin = (f"`{e['source']['repository']}` @ `{e['source']['commit']}`" if "source" in e
              else f"`{e.get('wheel', '?')}`")
    patches = ", ".join(f"`{p['file']}`" for p in e.get("patches", [])) or "none"
    return f"vLLM {e.get('vllm')} ({e.get('name')}): {origin}; patches {patches}"


def _smoke(v: dict[str, Any] | None) -> list[str]:
    if v is None:
        return ["_no smoke report was found for this cell_"]
    head = f"**{'PASSED' if v.get('passed') else 'FAILED'}** · {v.get('message', '')}"
    rows = [head, "", "| check | result |", "|---|---|"]
    for name, c in (v.get("checks") or {}).items():
        measured = ", ".join(f"{k} {x:g}" if isinstance(x, float) else f"{k} {x}"
                             for k, x in (c.get("measured") or {}).items())
        rows.append(f"| {name} | {c.get('outcome')}" + (f" ({measured})" if measured else "")
                    + " |")
    return rows


def _gpu_code(job: Job, f: ImageFacts) -> list[str]:
    """Which code each library with device code carries for the target (build record)."""
    if f.gpu_code is None:
        return []
    expect = job.cell.target.expect_cuda_arch or NONE
    return ["<details><summary>GPU code per library (build/archtable.py)</summary>", "",
            markdown([Row(**r) for r in f.gpu_code], expect), "", "</details>", ""]


def _supply_chain(job: Job, f: ImageFacts, owner: str | None) -> list[str]:
    """Where the SBOM and provenance are, the commands that fetch them, and whether they
    are signed (docs/supply-chain.md)."""
    sc = f.supply_chain
    if not f.digest:
        return []
    if not sc or not (sc.get("sbom") or sc.get("provenance")):
        return ["Supply chain: _no SBOM or provenance is stored with this release_", ""]
    image = job.image.by_digest(f.digest)
    out = ["Supply chain: an SBOM (CycloneDX JSON, read from the image) and the build "
           "provenance (in-toto SLSA v1) are stored with the image as OCI referrers of "
           f"`{f.digest}`"
           + (f"; **{sc['findings']} finding(s)** where the image and the lock disagree "
              "(listed in the SBOM)" if sc.get("findings") not in (None, "0") else "") + ".",
           "", "```sh", f"oras discover {image}"]
    for kind, name in (("sbom", "sbom.cdx.json"), ("provenance", "provenance.intoto.json")):
        if sc.get(kind):
            out.append(f"oras pull {job.image.name}@{sc[kind]}  # writes {name}")
    if sc.get("signing") == GITHUB_SIGNED:
        out += [f"gh attestation verify oci://{image} --owner {owner or 'OWNER'}",
                f"gh attestation verify oci://{image} --owner {owner or 'OWNER'} "
                "--predicate-type https://cyclonedx.org/bom"]
    out += ["```", ""]
    if sc.get("signing") != GITHUB_SIGNED:
        out += ["_Unsigned_: this release was built outside GitHub's release workflow "
                "(no Sigstore here), so the documents carry no signature; "
                "docs/supply-chain.md says what that means.", ""]
    else:
        out += ["Signed with GitHub artifact attestations (Sigstore, keyless) for the "
                "pushed digest; `gh attestation verify` checks them.", ""]
    return out


def _history(job: Job, f: ImageFacts) -> list[str]:
    if f.history:
        return [f"[Bench history of every release]({f.history}) (tok/s and TTFT per "
                "concurrency level, `latest` and rollbacks marked)", ""]
    return [f"Bench history of every release: `python build.py history --image "
            f"{job.cell.image}`", ""]


def _bench(f: ImageFacts) -> list[str]:
    if f.unmeasured:
        return [f"**UNMEASURED:** promoted without a measurement: {f.unmeasured}", ""]
    if f.bench is None:
        return ["_no benchmark results are stored with this release_ (`build.py bench "
                "--tag ... --store`)"]
    deltas = compare.deltas(f.bench, f.bench_previous) if f.bench_previous else None
    out = [results.markdown(f.bench, deltas).rstrip("\n"), ""]
    if deltas is not None:
        out += [f"vs baseline: output tok/s against `{f.previous}`.", ""]
    if f.accepted_regression:
        out += [f"**Accepted throughput regression:** {f.accepted_regression}", ""]
    if f.accepted_drop:
        out += [f"**Accepted drop in speculative acceptance:** {f.accepted_drop}", ""]
    if f.accepted_untrusted:
        out += ["**Promoted without comparing untrusted bench figures:** "
                f"{f.accepted_untrusted}", ""]
    if f.uncompared:
        out += ["**Promoted without a comparison** (the latest it replaced had no bench "
                f"results): {f.uncompared}", ""]
    if f.plot:
        out += [f"![tok/s and TTFT against concurrency]({f.plot})", ""]
    return out


def release_notes(lm: LoadedMatrix, jobs: tuple[Job, ...], facts: dict[str, ImageFacts],
                  compatibility: str | None = None, owner: str | None = None) -> str:
    """Markdown for the GitHub release of the jobs' release tag; `compatibility`: the
    compatibility table's markdown (release/compat.py), shown first; `owner`: the GitHub
    owner `gh attestation verify` names (GITHUB_REPOSITORY_OWNER in the workflow)."""
    tag = str(jobs[0].tag) if jobs else "?"
    empty = ImageFacts(None, None, None)
    serving = [j for j in jobs if facts.get(j.id, empty).latest == tag]
    latest = ("`latest` is at this release: moved last, after every check."
              if serving and len(serving) == len(jobs) else
              f"`latest` is at this release for {len(serving)} of {len(jobs)} image(s) (each "
              "says where it is)." if serving else
              "`latest` is not at this release (each image says where it is).")
    out = [f"# {tag}", "",
           f"{len(jobs)} image(s), each smoke-tested before push; {latest}", ""]
    if compatibility:
        out += ["## Compatibility", "", "Per cell: smoke, lossless speculative decoding, long "
                "generation, tok/s, drafter acceptance (rate / mean accepted length per "
                "concurrency level) and the verdict (`fail`, `incomplete`: not run or not "
                "trustworthy, `accepted`: passed with a written reason, `pass`).", "",
                compatibility.rstrip("\n"), ""]
    # a rollback is offered from a release `latest` is at, never to where it is already
    previous = sorted({f.previous for j in serving if (f := facts[j.id]).previous
                       and f.previous != f.latest})
    for job in jobs:
        cell = job.cell
        f = facts.get(job.id, empty)
        by_digest = job.image.by_digest(f.digest) if f.digest else None
        out += [f"## {cell.image}", "",
                f"`{job.id}` · {cell.target.platform} · model {cell.model_name} · drafter "
                f"{cell.speculation} · profile {cell.profile_name}", ""]
        if cell.engine.caveat:
            out += [f"> **Caveat (engine {cell.engine_name}):** {cell.engine.caveat}", ""]
        out += [
                "```sh", f"docker pull {job.release_ref}"]
        out += [f"docker pull {by_digest}"] if by_digest else [
            "# not pushed: no digest in the registry for this tag"]
        out += ["```", "", _latest_line(job, f), "",
                "Run it hardened (weights are read-only layers of the image, the "
                "server listens on 127.0.0.1 only, no credentials enter the container):", ""]
        # a multi-node cell runs on all its nodes at once: one command per node
        out += _nodes(job, by_digest or job.release_ref) or [
            "```sh", docker_run_text(run_spec(job, by_digest or job.release_ref),
                                     name=cell.image), "```", ""]
        out += ["<details><summary>compose file (`docker compose up -d`; the file the "
                "smoke test ran)</summary>", "", "```yaml",
                compose_file(lm, job, by_digest or job.release_ref).rstrip(), "```",
                "</details>", "",
                "<details><summary>serve command (the image's CMD)</summary>", "", "```sh",
                shlex.join(job.serve.argv), "```", "</details>", "",
                "| pin | value |", "|---|---|",
                f"| engine | {_engine(job.pins['engine'])} |",
                f"| model | {_pin(job.pins['model'])} |",
                f"| drafter | {_pin(job.pins['drafter'])} |", "", "Smoke:", ""]
        out += _smoke(f.verdict) + ["", "Benchmark:", ""] + _bench(f) + _history(job, f)
        out += _supply_chain(job, f, owner)
        out += _gpu_code(job, f)
    out += ["## Rollback", ""]
    if previous:
        out += ["```sh"] + [f"python build.py rollback --tag {p}" for p in previous] + ["```"]
    elif not serving:
        out.append("_`latest` is not at this release: there is nothing of it to roll back_")
    else:
        out.append("_no earlier passing release in the registry: nothing to roll back to_")
    return "\n".join(out) + "\n"


def _latest_line(job: Job, f: ImageFacts) -> str:
    """Where this image's `latest` is, as the registry says now."""
    tag = str(job.tag)
    if f.latest == tag:
        return "`latest` is at this release."
    if f.rolled_back:
        back = (f"`latest` is at `{f.latest}`: this release was rolled back to it"
                if f.latest else "this release was rolled back")
        at = f" ({safe(f.rolled_back.get('at', ''))})" if f.rolled_back.get("at") else ""
        return (f"{back}{at}; to serve it again on purpose: `python build.py promote --tag "
                f"{tag} --accept-rolled-back REASON`")
    if f.latest:
        return f"`latest` is at `{f.latest}`, not this release."
    return "`latest`: none in the registry."


def previous_release(rels: list[Release], tag: ReleaseTag) -> str | None:
    """The newest passing release before `tag` in the order promote, rollback and prune
    use (`Release.order_key`: when recorded, the tag's date only a bound), so the notes'
    rollback line names what `rollback` would take. A tag not recorded yet comes after
    every recorded release (it is recorded now)."""
    mine = next((r for r in rels if r.tag == str(tag)), None)
    older = [r for r in rels if r.passed and r.tag != str(tag)
             and (mine is None or r.order_key() < mine.order_key())]
    return max(older, key=lambda r: r.order_key()).tag if older else None


def _stored_bench(client: Any, repo: str, tag: str | None
                  ) -> tuple[dict[str, Any] | None, dict[str, str]]:
    found = store.release_stored(client, repo, tag) if tag else None
    return found if found else (None, {})


def _stored_documents(client: Any, repo: str, digest: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for key, kind in (("sbom", referrers.SBOM_TYPE), ("provenance", referrers.PROVENANCE_TYPE)):
        descs = referrers.listed(client, repo, digest, kind)
        if descs:
            ann = descs[0].get("annotations") or {}
            found[key] = str(descs[0]["digest"])
            found["signing"] = safe(str(ann.get(A_SIGNING, "unsigned")))
            found["findings"] = safe(str(ann.get(A_FINDINGS, "0")))
    return found


def gather(client: Any, jobs: tuple[Job, ...], smoke_dir: Path) -> dict[str, ImageFacts]:
    """Digests, earlier releases and stored bench results from the registry, verdicts
    from the smoke reports."""
    facts = {}
    for job in jobs:
        repo = job.image.repository
        rels = list_releases(client, repo)
        mine = next((r for r in rels if r.tag == str(job.tag)), None)
        path = verdict_path(smoke_dir, job.cell)
        verdict = json.loads(path.read_text()) if path.exists() else None
        # the registry's record is the release's state; a local report of this very image
        # (this checkout's smoke run) says the same with its measurements
        if mine is not None and (verdict is None or verdict.get("image_id") != mine.image_id):
            verdict = recorded_verdict(mine, job)
        previous = previous_release(rels, job.tag)
        bench, ann = _stored_bench(client, repo, mine.tag if mine else None)
        ann = {k: safe(v) for k, v in ann.items()}  # registry text, shown in the notes
        if bench:  # the table below indexes every figure: a bare document is a fault
            bench_table(bench, client.host, f"bench results of {repo}:{mine.tag if mine else ''}")
        record = record_path(smoke_dir, job.cell, "serve")
        gpu_code = json.loads(record.read_text()).get("gpu_code") if record.is_file() else None
        facts[job.id] = ImageFacts(
            digest=mine.digest if mine else None, previous=previous, verdict=verdict,
            bench=bench, bench_previous=_stored_bench(client, repo, previous)[0],
            accepted_regression=ann.get(A_ACCEPTED), accepted_untrusted=ann.get(A_UNTRUSTED),
            accepted_drop=ann.get(A_ACCEPTED_DROP),
            unmeasured=safe(mine.unmeasured) if mine and mine.unmeasured else None,
            uncompared=ann.get(A_UNCOMPARED), gpu_code=gpu_code,
            supply_chain=_stored_documents(client, repo, mine.digest) if mine else None,
            latest=next((r.tag for r in rels if r.is_latest), None),
            rolled_back=rolled_back(client, repo).get(str(job.tag)))
    return facts


def write_compose_files(lm: LoadedMatrix, facts: dict[str, ImageFacts], jobs: tuple[Job, ...],
                        out_dir: Path) -> list[Path]:
    """The compose file of each image, by digest where it was pushed, and a multi-node
    cell's per-node files: release assets."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for job in jobs:
        f = facts.get(job.id)
        ref = job.image.by_digest(f.digest) if f and f.digest else job.release_ref
        path = out_dir / f"{job.cell.image}.compose.yaml"
        path.write_text(compose_file(lm, job, ref))
        written.append(path)
        for rel, text in node_files(job.cell, ref):  # a multi-node cell's, one per node
            path = out_dir / Path(rel).name
            path.write_text(text)
            written.append(path)
    return written


def write_plots(facts: dict[str, ImageFacts], jobs: tuple[Job, ...], out_dir: Path,
                url_base: str) -> dict[str, ImageFacts]:
    """One PNG per image with benchmark results: this release and the one before it, one
    line each. The notes link `url_base + file name` (the release asset's URL on GitHub)."""

    done = dict(facts)
    for job in jobs:
        f = facts.get(job.id)
        if f is None or f.bench is None:
            continue
        name = f"bench-{job.cell.image}.png"
        runs = [f.bench] + ([f.bench_previous] if f.bench_previous else [])
        plot(runs, out_dir / name, title=f"{job.cell.image} - {job.tag}")
        done[job.id] = replace(f, plot=url_base + name)
    return done


def write_histories(client: Any, facts: dict[str, ImageFacts], jobs: tuple[Job, ...],
                    out_dir: Path, url_base: str) -> dict[str, ImageFacts]:
    """history-<image>.png/.md per image (every release's stored bench results), linked
    from the notes at `url_base + file name`."""

    done = dict(facts)
    for job in jobs:
        repo = job.image.repository
        paths = history.write(history.gather(client, repo, rolled_back(client, repo)), out_dir,
                              url_base)
        done[job.id] = replace(done.get(job.id, ImageFacts(None, None, None)),
                               history=url_base + paths["md"].name)
    return done


def not_promoted_notes(jobs: tuple[Job, ...], verdicts: dict[str, dict[str, Any] | None],
                       latest: dict[str, str | None]) -> str:
    """Markdown for a release run in which some cell job failed (the run's step summary):
    which cells failed and how, and that nothing was promoted (promote needs every cell,
    so `latest` stays where it was and no GitHub release is made). `verdicts`: each job's
    smoke verdict from the run's artifacts (None: its job failed before smoke ran);
    `latest`: the release each image's `latest` stays at (None: no latest yet)."""
    tag = jobs[0].tag.short if jobs else "?"  # the git tag the run was for
    failed = [j for j in jobs if not (verdicts.get(j.id) or {}).get("passed")]
    out = [f"# {tag}: not released", "",
           f"**Nothing was promoted**: `latest` moves only when every cell of the release "
           f"passed its job; {len(failed)} of {len(jobs)} cell(s) failed smoke or never "
           "reached it. No GitHub release was made.", "",
           "| cell | smoke | why | latest stays at |", "|---|---|---|---|"]
    for job in jobs:
        v = verdicts.get(job.id)
        if v is None:
            smoke, why = "no report", "the cell's job failed before smoke (see its log)"
        elif v.get("passed"):
            smoke, why = "passed", ("its job failed after smoke (release gates, push or "
                                    "bench: see its log)")
        else:
            smoke, why = f"FAILED: {v.get('outcome', '?')}", str(v.get("message", ""))
        why = safe(why).replace("|", "\\|").replace("\n", " ")
        out.append(f"| `{job.id}` | {smoke} | {why} | "
                   f"{latest.get(job.id) or '_no latest yet_'} |")
    out += ["", "Fix the cause, then run the release of this tag again (move the tag, or "
            "dispatch release.yml with it): cells already published and smoke-passed are "
            "not built again."]
    return "\n".join(out) + "\n"


def gather_not_promoted(client: Any, jobs: tuple[Job, ...], smoke_dir: Path
                        ) -> tuple[dict[str, dict[str, Any] | None], dict[str, str | None]]:
    """Each job's verdict from the run's smoke reports and where its `latest` stays."""
    verdicts: dict[str, dict[str, Any] | None] = {}
    latest: dict[str, str | None] = {}
    for job in jobs:
        path = verdict_path(smoke_dir, job.cell)
        verdicts[job.id] = json.loads(path.read_text()) if path.exists() else None
        rels = list_releases(client, job.image.repository)
        latest[job.id] = next((r.tag for r in rels if r.is_latest), None)
    return verdicts, latest
