"""Build images with BuildKit: base -> engine -> serve per cell.

The only module that drives `docker build`. `docker buildx build --builder <context> --load`
where the buildx plugin exists (the docker-driver builder of the active Docker context,
named: see buildx_builder), else `DOCKER_BUILDKIT=1 docker build` (the Debian 20.10
client). Each image
carries its inputs digest as a label; an image with that digest present locally is not
rebuilt (`no_cache`: every image is rebuilt, BuildKit's layer cache unused: a check that a
build reproduces, docs/reproducibility.md). Secrets (CA bundle, HF token, pip
configuration, compile-cache credentials) reach builds only as BuildKit secrets
(`--secret`), never as build args, labels or logs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from imagebuild import buildfolder, cache_dir
from imagebuild.builder import archtable, bootstrap, downloads, hygiene, timestamps
from imagebuild.builder.aptsources import MIRROR_ENV
from imagebuild.builder.buildjobs import choose_parallelism, host_resources
from imagebuild.builder.enginepull import pull_engine
from imagebuild.builder.hygiene import PARENT_LABEL, base_repo, engine_repo
from imagebuild.docker import DOCKER_CLI
from imagebuild.docker import engine as docker_engine
from imagebuild.errors import OperationFailed, UserError
from imagebuild.lock.lockfile import Lock
from imagebuild.lock.resolve import generate_model, sha256_file
from imagebuild.pipconfig import pip_indexes
from imagebuild.spec.matrix import Cell, LoadedMatrix
from imagebuild.spec.names import INPUTS_LABEL
from imagebuild.spec.values import BadValue, mirror_url

if TYPE_CHECKING:
    from imagebuild.plan import Job
from imagebuild.render import Rendered, render_base, render_engine, render_serve

# Build avoidance looks images up by this tag, never by the label: an image built FROM a
# serve image (a user's own layer, a test's derived image) inherits every label, and was
# once taken for the image it was derived from. Tags are not inherited.
INPUTS_REPO = hygiene.INPUTS_REPO  # "imagebuild/inputs"
# what the expensive steps (before the patch series) depend on; see prefix_digest
PREFIX_LABEL = "io.imagebuild.prefix"
DEFAULT_CA = "/etc/ssl/certs/ca-certificates.crt"
GiB = 2**30
# Free disk a build needs, by (how the target's engine is made: engine_from, kind):
# (nothing cached, expensive prefix cached). A cold wheel (cpu) engine's peak, measured
# with benchmarks/disk_peak.py from an empty BuildKit cache: 5.9 GB for vLLM 0.23 (its
# ~3 GB wheels stage, the install layers, the stubs stage), at most 6.0 GB for 0.32;
# 8 GiB leaves ~2 GB for the serve layers and logs after it. Once its pip layers exist, a
# patch change writes < 1 GB. A source (CUDA) engine compiles after the patches, so a
# warm build still needs its build tree (~30 GB on a GB10).
DISK_NEED = {("wheel", "engine"): (8 * GiB, 2 * GiB),
             ("source", "engine"): (60 * GiB, 30 * GiB)}
DISK_NEED_OTHER = 2 * GiB  # base (imported rootfs); serve on top of its weights
# A serve build writes its weights into BuildKit's snapshots and, where the builder is
# not the engine's own (buildx --load), once more as the loaded image: twice the locked
# bytes, plus the headroom above.
WEIGHT_COPIES = 2
# the first Docker Engine whose built-in Dockerfile frontend takes `RUN --network`
RUN_NETWORK_ENGINE = 23
CLEAN_FIX = ("free disk with `python build.py runner-clean --keep N`: it removes the images of "
             "older releases and keeps BuildKit's cache mounts (ccache, sccache, pip), which "
             "any system-wide prune would wipe")
SECRET_ENV = ("SCCACHE_REDIS_USERNAME", "SCCACHE_REDIS_PASSWORD", "AWS_ACCESS_KEY_ID",
              "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
# build args that decide how fast an image is built, never what it holds
SPEED_ARGS = frozenset({"MAX_JOBS", "NVCC_THREADS"})
STEP = re.compile(r"^#(\d+) \[(?:[\w.-]+ )?\s*\d+/\d+\] (?!FROM )")  # FROM is no step
CACHED = re.compile(r"^#(\d+) CACHED")
DONE = re.compile(r"^#(\d+) DONE")
Log = Callable[[str], None]


@dataclass
class BuildRecord:
    kind: str
    ref: str
    inputs_digest: str
    image_id: str
    size_bytes: int
    wall_s: float
    steps_run: int
    steps_cached: int
    avoided: bool  # found by inputs digest: docker build was not run at all
    log: str
    cell: str | None = None
    layers: list[dict] = field(default_factory=list)
    pulled_from: str | None = None  # an engine pulled by digest (build --engine-image)
    # serve: device code per library of its engine runtime (build/archtable.py; None: no
    # cuobjdump on this machine, a cpu target only)
    gpu_code: list[dict] | None = None


@dataclass(frozen=True)
class Pending:
    """One image as its inputs decide it, before (or instead of) building it."""

    kind: str
    rendered: Rendered
    ctx: Path
    ref: str  # the local tag, `{inputs}` filled in
    build_args: dict[str, str]
    parent: str | None  # what it is built FROM, as its inputs digest sees it
    lock_entries: list
    digest: str  # the inputs digest
    cell: str | None = None
    parent_image: str | None = None  # the parent's local image id (lineage label)


def stop_process(proc: subprocess.Popen[str], grace: float = 10.0) -> None:
    """Terminate a child (SIGTERM), kill it if it lingers; never raises."""
    try:
        proc.terminate()
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except (OSError, KeyboardInterrupt):
        proc.kill()


def uses_run_network(dockerfile: str) -> bool:
    """A `RUN --network=...` step (the source engine's offline compile)."""
    return re.search(r"^RUN\s+(?:--\S+\s+)*--network=", dockerfile, re.M) is not None


def buildx_builder() -> str:
    """The builder every buildx build names: the docker-driver builder buildx keeps for
    the active Docker context, named after it (`docker context show`: `default` unless a
    context is selected). Its builds read and write the daemon's own image store, so a
    FROM of an image built here (the bootstrapped base, the engine) resolves; a runner
    whose current builder is another (`docker buildx create --use`, a docker-container
    driver) would build in its own store, look those FROMs up in a registry, and `--load`
    through a tarball export."""
    try:
        proc = subprocess.run([DOCKER_CLI, "context", "show"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "default"
    name = proc.stdout.strip() if proc.returncode == 0 else ""
    return name or "default"


def preflight_engine(run_network: bool = False) -> tuple[str, str]:
    """Fail early, in one line, on a missing daemon or a daemon without BuildKit, or
    (`run_network`: the Dockerfile compiles vLLM from source offline) one whose built-in
    Dockerfile frontend rejects `RUN --network` (stable from frontend 1.3, built into
    Docker Engine 23.0; 20.10 says "Unknown flag: network", buildx or not).
    Returns the build command flavour ('buildx' or 'buildkit') and the daemon's data root."""
    data = docker_engine().info()
    version = str(data.get("ServerVersion", "0"))
    major = int(version.split(".")[0])
    if major < 19:
        raise OperationFailed(f"Docker engine {version} has no usable BuildKit",
                              fix="use Docker 20.10 or newer")
    if run_network and major < RUN_NETWORK_ENGINE:
        raise OperationFailed(
            f"Docker engine {version} cannot build a source engine: its Dockerfile frontend "
            "rejects the offline compile's `RUN --network=none`",
            fix=f"install Docker Engine {RUN_NETWORK_ENGINE}.0 or newer on this runner")
    return ("buildx" if docker_engine().has_buildx() else "buildkit",
            str(data.get("DockerRootDir", "/var/lib/docker")))


def disk_need(target: str, kind: str, prefix_cached: bool, weight_bytes: int = 0) -> int:
    """Free bytes a build needs; a serve build adds its weights (weight_bytes, from the
    sizes the lock records for its model and drafter files)."""
    cold, warm = DISK_NEED.get((target, kind), (DISK_NEED_OTHER, DISK_NEED_OTHER))
    return (warm if prefix_cached else cold) + WEIGHT_COPIES * weight_bytes


def locked_weight_bytes(entries: Iterable[dict | None]) -> int:
    """Total size of every file the lock lists for these model/drafter entries."""
    return sum(int(f.get("size") or 0) for e in entries if e for f in (e.get("files") or []))


def sccache_secret(environ: dict[str, str] | None = None) -> bytes:
    """Shared compile-cache credentials from this runner's environment, as KEY=VALUE lines
    (the sccache_env BuildKit secret): IMAGEBUILD_SCCACHE_ENV_FILE, else SECRET_ENV."""
    env = os.environ if environ is None else environ
    path = env.get("IMAGEBUILD_SCCACHE_ENV_FILE")
    if path:
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise UserError(f"IMAGEBUILD_SCCACHE_ENV_FILE={path}: {exc.strerror}",
                            fix="point it at a file of SCCACHE_*/AWS_* KEY=VALUE lines") from None
    return "".join(f"{k}={env[k]}\n" for k in SECRET_ENV if env.get(k)).encode()


def check_environment(environ: dict[str, str] | None = None) -> None:
    """The build's settings from the environment, checked before anything runs: a CA
    bundle or compile-cache credentials file that cannot be read, or a Debian mirror that
    is not a URL, would otherwise fail half-way (or reach a build as text)."""
    env = os.environ if environ is None else environ
    for var, what in (("IMAGEBUILD_CA_BUNDLE", "a PEM file of extra CA certificates"),
                      ("IMAGEBUILD_SCCACHE_ENV_FILE", "a file of SCCACHE_*/AWS_* KEY=VALUE "
                                                      "lines")):
        path = env.get(var)
        if not path:
            continue
        try:
            with open(path, "rb") as fh:
                fh.read(1)
        except OSError as exc:
            raise UserError(f"environment variable {var}={path[:80]!r}: "
                            f"{exc.strerror or exc}", fix=f"point {var} at {what}, or unset "
                                                          "it") from None
    if env.get(MIRROR_ENV):
        try:
            mirror_url(env[MIRROR_ENV])
        except BadValue as exc:
            raise UserError(f"environment variable {MIRROR_ENV}: {exc}",
                            fix=f"{exc.fix} (in {MIRROR_ENV})") from None


def check_disk(root: str, need: int, what: str) -> None:
    """Refuse a build that would run the disk full half-way, before it starts."""
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        free = shutil.disk_usage("/").free
    if free < need:
        raise OperationFailed(f"only {free / GiB:.1f} GiB free under {root}; {what} "
                              f"needs about {need / GiB:.0f} GiB", fix=CLEAN_FIX)


def prefix_digest(rendered: Rendered, context: Path, parent: str | None) -> str | None:
    """What the steps before `COPY patches/` depend on: the parent, the Dockerfile up to
    that line and every context file outside patches/ (conservative: a launcher change
    counts too). An image carrying it means BuildKit holds those layers, so a patch-only
    change rebuilds little. None for a Dockerfile without a patch series."""
    lines = rendered.text.splitlines(keepends=True)
    cut = next((i for i, line in enumerate(lines) if line.startswith("COPY patches/")), None)
    if cut is None:
        return None
    h = hashlib.sha256((parent or "").encode() + b"\0" + "".join(lines[:cut]).encode())
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        rel = path.relative_to(context)
        if rel.parts[0] not in ("patches", "Dockerfile"):
            h.update(str(rel).encode() + b"\0" + sha256_file(path).encode())
    return h.hexdigest()


def inputs_digest(rendered: Rendered, context: Path, build_args: dict[str, str],
                  parent: str | None, lock_entries: Iterable[object]) -> str:
    """What decides the image: Dockerfile, every context file, args, parent, lock entries.
    Not how fast it is built (SPEED_ARGS): two runners with different memory must agree
    on an engine's digest, or one could not use the engine the other pushed."""
    h = hashlib.sha256()
    h.update(rendered.text.encode())
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(context)).encode() + b"\0" + sha256_file(path).encode())
    h.update(json.dumps({k: v for k, v in build_args.items() if k not in SPEED_ARGS},
                        sort_keys=True).encode())
    h.update((parent or "").encode())
    h.update(json.dumps(list(lock_entries), sort_keys=True).encode())
    return h.hexdigest()


def upstream_identity(image: str, locked_digest: str | None) -> str:
    """What the base is built FROM, as the base's inputs digest sees it: the locked digest
    (also in the rendered FROM line), else the local image's content (its layers and the
    settings `docker import` gave it). Never its image id: `docker import` stamps a
    creation time into it, so the same bootstrapped rootfs has another id on every runner,
    and runners must agree on the digests of the base and engine built on it."""
    if locked_digest:
        return locked_digest
    info = docker_engine().inspect_image(image)
    if not info:
        return ""
    config = info.get("Config") or {}
    content = {"layers": (info.get("RootFS") or {}).get("Layers") or [],
               "config": {k: config.get(k) for k in ("Env", "Cmd", "Entrypoint", "User",
                                                     "WorkingDir")}}
    return "content:" + hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _find_by_inputs(digest: str) -> str | None:
    """The image built from exactly these inputs (by its inputs tag), or None."""
    return docker_engine().image_id(f"{INPUTS_REPO}:{digest}")


def _find_by_label(label: str, value: str) -> str | None:
    rows = docker_engine().images(label=f"{label}={value}")
    return str(rows[0]["Id"]) if rows else None


def _image_size(image_id: str) -> int:
    info = docker_engine().inspect_image(image_id)
    return int(info["Size"]) if info else 0


def layer_sizes(image_id: str) -> list[dict]:
    """Per-layer sizes (newest first) from the image history, for the bytes-new report."""
    return [{"id": row.get("Id"), "created_by": (row.get("CreatedBy") or "")[:120],
             "size": row.get("Size")} for row in docker_engine().history(image_id)]


def _gpu_code_cache() -> Path:
    """Where GPU-code tables of engine images are kept, by image id."""
    return cache_dir("gpu-code")


class Builder:
    def __init__(self, lm: LoadedMatrix, lock: Lock, *, out_dir: Path, log: Log = print,
                 ca_bundle: str | None = None, hf_token: str | None = None,
                 no_cache: bool = False):
        check_environment()
        self.lm, self.lock, self.log = lm, lock, log
        # rebuild every image from its Dockerfile: no build avoidance, no BuildKit layer
        # cache (its cache mounts, the pip cache, stay: they change no image's bytes)
        self.no_cache = no_cache
        # one build time for every image (timestamps.py): context mtimes, a label, and the
        # image config's times where BuildKit takes it
        self.epoch = timestamps.source_date_epoch(lm.root)
        self.config_epoch = False  # set with the flavour: this engine's BuildKit reads it
        self.out_dir = out_dir
        self.ca_bundle = ca_bundle if ca_bundle is not None else (
            os.environ.get("IMAGEBUILD_CA_BUNDLE") or
            (DEFAULT_CA if Path(DEFAULT_CA).exists() else ""))
        self.hf_token = hf_token if hf_token is not None else os.environ.get("HF_TOKEN", "")
        self.flavour: str | None = None
        self.data_root = "/var/lib/docker"
        self.records: list[BuildRecord] = []
        self._tables: dict[str, list] = {}  # engine image id -> its GPU-code table
        self._done: dict[str, BuildRecord] = {}
        self._target = "wheel"  # the target's engine_from: what the disk estimate reads
        self._target_name: str | None = None  # the cell's target (engine build secrets)

    # -- context assembly -------------------------------------------------------------
    def _context(self, rendered: Rendered, name: str) -> Path:
        ctx = self.out_dir / "context" / name
        if ctx.exists():
            shutil.rmtree(ctx)
        ctx.mkdir(parents=True)
        (ctx / "Dockerfile").write_text(rendered.text)
        for dst, src in rendered.context_files:
            target = ctx / dst
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.lm.root / src, target)
        return ctx

    def _serve_extras(self, cell: Cell, ctx: Path) -> None:
        """The generated model (checked against the lock) or the weight manifests."""
        if cell.model.generate:
            entry = self.lock.entry("models", cell.model_name) or {}
            generate_model(self.lm.root / cell.model.generate.script, cell.model.generate.seed,
                           ctx / "model")
            got = {str(p.relative_to(ctx / "model")): sha256_file(p)
                   for p in (ctx / "model").rglob("*") if p.is_file()}
            want = {f["path"]: f["sha256"] for f in entry.get("files", [])}
            if got != want:
                raise OperationFailed(
                    f"{cell.model.generate.script} produced files that differ from the lock",
                    fix=f"run `python build.py lock --update {cell.model_name}` if the "
                        "generator changed on purpose")
        for kind, name, pin in (("models", cell.model_name, cell.model),
                                ("drafters", cell.drafter_name, cell.drafter)):
            if pin is not None and pin.repository:
                entry = self.lock.entry(kind, name) or {}
                manifest = {"repository": pin.repository, "revision": entry["sha"],
                            "files": entry["files"]}
                (ctx / f"{kind[:-1]}-files.json").write_text(
                    json.dumps(manifest, indent=1, sort_keys=True))

    # -- one docker build ---------------------------------------------------------------
    def _pending(self, kind: str, rendered: Rendered, ctx: Path, ref: str,
                 build_args: dict[str, str], parent: str | None, lock_entries: list,
                 cell: str | None = None, parent_image: str | None = None) -> Pending:
        if self.epoch is not None:  # a COPY keeps these times (not part of any digest)
            timestamps.clamp_tree(ctx, self.epoch)
        digest = inputs_digest(rendered, ctx, build_args, parent, lock_entries)
        # base/engine refs are named after their inputs: a child's FROM names an immutable,
        # local tag (an image id in FROM would be read as an image named "sha256")
        return Pending(kind, rendered, ctx, ref.format(inputs=digest[:16]), build_args,
                       parent, lock_entries, digest, cell, parent_image)

    def _build(self, p: Pending) -> BuildRecord:
        record = self._build_one(p)
        # an image whose names are all gone (a ref tag moved to a newer build, a user's
        # rmi) is not kept alive by its inputs tag alone
        for line in hygiene.drop_orphan_inputs_tags():
            self.log(f"[{p.kind}] {line}")
        return record

    def _secrets(self, kind: str) -> dict[str, bytes]:
        secrets = {"ca_bundle": Path(self.ca_bundle).read_bytes() if self.ca_bundle else b"",
                   "hf_token": (self.hf_token or "").encode(), "pip_conf": b"",
                   "sccache_env": b""}
        target = self.lm.matrix.targets.get(self._target_name or "")
        if kind == "engine":
            # the runner's package indexes (and any credentials in their URLs) as a secret:
            # every engine's pip installs from them, and no image keeps them
            secrets["pip_conf"] = pip_indexes().pip_conf().encode()
            if target is not None and target.compile_cache.shared:
                secrets["sccache_env"] = sccache_secret()
        return secrets

    def _build_one(self, p: Pending) -> BuildRecord:
        kind, rendered, ctx, ref, digest = p.kind, p.rendered, p.ctx, p.ref, p.digest
        build_args, cell, parent_image = p.build_args, p.cell, p.parent_image
        log_path = self.out_dir / "logs" / f"{ref.replace('/', '_').replace(':', '_')}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        found = None if self.no_cache else _find_by_inputs(digest)
        if found:
            repository, _, tag = ref.rpartition(":")
            docker_engine().tag(found, repository, tag)
            self.log(f"[{kind}] {ref}: up to date (inputs {digest[:12]}), not rebuilt")
            return BuildRecord(kind, ref, digest, found, _image_size(found), 0.0, 0, 0, True,
                               str(log_path), cell)
        run_network = uses_run_network(rendered.text)
        if self.flavour is None or run_network:
            self.flavour, self.data_root = preflight_engine(run_network)
            self.config_epoch = timestamps.supports_config_epoch(
                str(docker_engine().info().get("ServerVersion", "0")))
        prefix = prefix_digest(rendered, ctx, p.parent)
        # (a derived image inheriting this label holds the same layers: fine here)
        warm = (not self.no_cache and prefix is not None
                and _find_by_label(PREFIX_LABEL, prefix) is not None)
        weights = locked_weight_bytes(p.lock_entries) if kind == "serve" else 0
        check_disk(self.data_root, disk_need(self._target, kind, warm, weights),
                   f"the {self._target} {kind} build of {ref}"
                   + (" (expensive steps cached)" if warm else "")
                   + (f" ({weights / 1e9:.1f} GB of locked weights)" if weights else ""))
        with tempfile.TemporaryDirectory(prefix="imagebuild-secrets-") as tmp:
            iid = Path(tmp) / "iid"
            cmd = (["buildx", "build", "--builder", buildx_builder(), "--load"]
                   if self.flavour == "buildx" else ["build"])
            cmd += ["--network", "host", "--progress", "plain", "--iidfile", str(iid),
                    "-t", ref, "-t", f"{INPUTS_REPO}:{digest}",
                    "--label", f"{INPUTS_LABEL}={digest}"]
            if self.no_cache:
                cmd.append("--no-cache")
            if self.epoch is not None:
                cmd += ["--label", f"{timestamps.LABEL}={self.epoch}"]
                if self.config_epoch:  # not declared by the Dockerfiles: no step's cache key
                    cmd += ["--build-arg", f"{timestamps.ENV}={self.epoch}"]
            if prefix:
                cmd += ["--label", f"{PREFIX_LABEL}={prefix}"]
            if parent_image:  # lineage for runner-clean (a gb10 engine's layers are not
                # its base's: its last stage starts FROM the runtime image)
                cmd += ["--label", f"{PARENT_LABEL}={parent_image}"]
            for key, value in sorted(build_args.items()):
                cmd += ["--build-arg", f"{key}={value}"]
            for sid, content in self._secrets(kind).items():
                src = Path(tmp) / sid
                src.write_bytes(content)
                src.chmod(0o600)
                cmd += ["--secret", f"id={sid},src={src}"]
            cmd.append(str(ctx))
            self.log(f"[{kind}] building {ref} (inputs {digest[:12]}); log: {log_path}")
            start = time.monotonic()
            run, cached, tail = self._stream(cmd, log_path, kind)
            wall = time.monotonic() - start
            if not iid.exists():
                raise OperationFailed(f"[{kind}] build of {ref} failed:\n{tail}",
                                      fix=f"see the full log: {log_path}")
            image_id = iid.read_text().strip()
        size = _image_size(image_id)
        self.log(f"[{kind}] built {ref} in {wall:.1f}s: {run} step(s) run, {cached} cached, "
                 f"{size / 1e6:.0f} MB")
        if kind == "engine" and self._target == "wheel":
            downloads.drop_download_stages(docker_engine(), self.log)
        return BuildRecord(kind, ref, digest, image_id, size, round(wall, 2), run, cached,
                           False, str(log_path), cell)

    def _stream(self, cmd: list[str], log_path: Path, kind: str) -> tuple[int, int, str]:
        steps: set[str] = set()
        cached: set[str] = set()
        last: list[str] = []
        with open(log_path, "w") as log_file, docker_engine().buildkit_build(cmd, {}) as proc:
            assert proc.stdout
            try:
                for line in proc.stdout:
                    log_file.write(line)
                    line = line.rstrip("\n")
                    last = (last + [line])[-25:]
                    if m := STEP.match(line):
                        steps.add(m.group(1))
                        if sys.stderr.isatty() or os.environ.get("IMAGEBUILD_VERBOSE"):
                            self.log(f"  [{kind}] {line[:150]}")
                    elif m := CACHED.match(line):
                        cached.add(m.group(1))
                proc.wait()
            except KeyboardInterrupt:
                # a signal sent to this process only (a CI cancel) must stop the build too:
                # the docker client cancels it on SIGTERM; leaving the `with` would wait
                stop_process(proc)
                raise
        # a step is a vertex with a [stage n/m] line; the ones marked CACHED were not run
        return len(steps - cached), len(steps & cached), "\n".join(last)

    # -- the flow per cell --------------------------------------------------------------
    def _base(self, cell: Cell) -> Pending:
        """The target's base as its inputs decide it (the upstream image made first where
        it is bootstrapped: its content is one of those inputs)."""
        t = cell.target
        if t.bootstrap:
            bootstrap.ensure_base_image(t.base_image, suite=t.bootstrap.suite,
                                        mirror=t.bootstrap.mirror,
                                        workdir=self.out_dir / "bootstrap", log=self.log)
        entry = self.lock.entry("bases", cell.target_name)
        rendered = render_base(self.lm, cell.target_name, self.lock)
        ctx = self._context(rendered, f"{cell.target_name}-base")
        return self._pending("base", rendered, ctx, f"{base_repo(cell.target_name)}:{{inputs}}",
                             {}, upstream_identity(t.base_image, (entry or {}).get("digest")),
                             [entry])

    def _engine(self, cell: Cell, base_digest: str, base_image: str | None) -> Pending:
        t = cell.target
        rendered = render_engine(self.lm, cell.target_name, cell.engine_name, self.lock)
        ctx = self._context(rendered, f"{cell.target_name}-{cell.engine_name}-engine")
        args = {"BASE_IMAGE": f"{base_repo(cell.target_name)}:{base_digest[:16]}"}
        if cell.realization.source:
            jobs, threads = choose_parallelism(*host_resources())
            args["MAX_JOBS"] = str(jobs if t.max_jobs == "auto" else t.max_jobs)
            args["NVCC_THREADS"] = str(t.nvcc_threads or threads)
        return self._pending(
            "engine", rendered, ctx,
            f"{engine_repo(cell.target_name, cell.engine_name)}:{{inputs}}", args, base_digest,
            [(self.lock.entry("engines", cell.engine_name) or {}).get(cell.target_name)],
            parent_image=base_image)

    def engine_digest(self, cell: Cell) -> str:
        """The inputs digest of the cell's engine as this checkout would build it, without
        building anything (the upstream of a bootstrapped base is made if missing)."""
        return self._engine(cell, self._base(cell).digest, None).digest

    def build_engine(self, cell: Cell) -> list[BuildRecord]:
        """Base and engine of the cell's (target, engine), once per run; their records."""
        self._target = cell.target.engine_from
        self._target_name = cell.target_name
        records = []
        base_key = f"base/{cell.target_name}"
        if base_key not in self._done:
            self._done[base_key] = self._build(self._base(cell))
            records.append(self._done[base_key])
        base = self._done[base_key]
        engine_key = f"engine/{cell.target_name}/{cell.engine_name}"
        if engine_key not in self._done:
            self._done[engine_key] = self._build(
                self._engine(cell, base.inputs_digest, base.image_id))
            records.append(self._done[engine_key])
        return records

    def engine_only(self, cell: Cell) -> BuildRecord:
        """build_engine with its records kept and written; the engine's record."""
        records = self.build_engine(cell)
        self.records.extend(records)
        self._write_records(cell, records)
        return self._done[f"engine/{cell.target_name}/{cell.engine_name}"]

    def use_engine(self, cell: Cell, ref: str) -> BuildRecord:
        """The cell's engine pulled from `ref` (REPOSITORY@sha256:...) instead of built: it
        must carry the inputs digest this checkout's engine has, else it is refused; then it
        is tagged as the local engine (and by its inputs), so serve builds FROM it."""
        engine_key = f"engine/{cell.target_name}/{cell.engine_name}"
        if engine_key in self._done:
            return self._done[engine_key]
        self._target = cell.target.engine_from
        self._target_name = cell.target_name
        want = self._engine(cell, self._base(cell).digest, None)
        start = time.monotonic()
        image_id = pull_engine(ref, want.digest, f"{cell.target_name}/{cell.engine_name}",
                               log=self.log)
        repository, _, tag = want.ref.rpartition(":")
        docker_engine().tag(image_id, repository, tag)
        docker_engine().tag(image_id, INPUTS_REPO, want.digest)
        wall = time.monotonic() - start
        self.log(f"[engine] {want.ref}: pulled {ref} in {wall:.1f}s (inputs "
                 f"{want.digest[:12]}, as this checkout builds it), not built here")
        rec = BuildRecord("engine", want.ref, want.digest, image_id, _image_size(image_id),
                          round(wall, 2), 0, 0, True, "", pulled_from=ref)
        self._done[engine_key] = rec
        return rec

    def build_cell(self, cell: Cell, local_ref: str, engine_image: str | None = None
                   ) -> list[BuildRecord]:
        """Base -> engine -> serve; with `engine_image` the engine is pulled from there
        (verified, see use_engine) and only the serve layers are built here."""
        if engine_image:
            records = [self.use_engine(cell, engine_image)]
        else:
            records = self.build_engine(cell)
        engine = self._done[f"engine/{cell.target_name}/{cell.engine_name}"]
        rendered = render_serve(self.lm, cell, self.lock)
        ctx = self._context(rendered, f"{cell.target_name}-{cell.engine_name}-{cell.image}")
        self._serve_extras(cell, ctx)
        serve = self._build(self._pending(
            "serve", rendered, ctx, local_ref, {"ENGINE_IMAGE": engine.ref},
            engine.inputs_digest,
            [self.lock.entry("models", cell.model_name),
             self.lock.entry("drafters", cell.drafter_name)], cell=cell.id,
            parent_image=engine.image_id))
        serve.layers = layer_sizes(serve.image_id)
        serve.gpu_code = self._gpu_code(cell, engine)
        records.append(serve)
        self.records.extend(records)
        self._write_records(cell, records)
        return records

    def _gpu_code(self, cell: Cell, engine: BuildRecord) -> list[dict] | None:
        """The engine's GPU-code table (once per engine image), refused when a kernel
        family the cell's profile selects has no code for its GPU."""
        expect = cell.target.expect_cuda_arch or archtable.NONE
        cache = self._tables
        # an image id is its content: the table of an engine listed once on this machine
        # stays true (an unchanged rebuild lists nothing again)
        stored = _gpu_code_cache() / f"{engine.image_id.split(':')[-1]}-{expect}.json"
        if engine.image_id not in cache and stored.is_file():
            try:
                cache[engine.image_id] = [archtable.Row(**r)
                                          for r in json.loads(stored.read_text())]
            except (ValueError, TypeError):
                stored.unlink(missing_ok=True)  # a damaged cache entry is listed again
        if engine.image_id not in cache:
            tool = archtable.find_cuobjdump()
            if tool is None:
                if cell.target.gpu:
                    raise OperationFailed(
                        f"cannot list the GPU code of {engine.ref}: no cuobjdump",
                        fix="install requirements-dev.txt (nvidia-cuda-cuobjdump) or set "
                            "IMAGEBUILD_CUOBJDUMP")
                self.log(f"[serve] {cell.id}: no cuobjdump here, GPU code not listed")
                return None
            start = time.monotonic()
            try:
                cache[engine.image_id] = archtable.table_for_image(
                    engine.ref, expect, tool, docker_engine().probe)
            except RuntimeError as exc:
                raise OperationFailed(str(exc), fix="see the engine image's python3 and "
                                                    "the cuobjdump named above") from None
            self.log(f"[engine] {engine.ref}: GPU code of {len(cache[engine.image_id])} "
                     f"librar(ies) listed in {time.monotonic() - start:.1f}s")
            stored.parent.mkdir(parents=True, exist_ok=True)
            stored.write_text(json.dumps(archtable.as_json(cache[engine.image_id])))
        rows = cache[engine.image_id]
        eb = cell.profile.expect_backends
        want = {k: v for k, v in (eb.model_dump() if eb else {}).items() if v}
        bad = archtable.problems(rows, want, gpu=bool(cell.target.gpu), expect=expect)
        if bad:
            raise OperationFailed(
                f"{cell.id}: a kernel family its profile selects has no code for {expect}: "
                + "; ".join(bad),
                fix="build the library for the target arch, or select another backend")
        return archtable.as_json(rows)

    def _write_records(self, cell: Cell, records: list[BuildRecord]) -> None:
        buildfolder.records_dir(self.out_dir, cell).mkdir(parents=True, exist_ok=True)
        for rec in records:
            buildfolder.record_path(self.out_dir, cell, rec.kind).write_text(
                json.dumps(asdict(rec), indent=2) + "\n")


def build_jobs(lm: LoadedMatrix, lock: Lock | None, jobs: tuple[Job, ...], *,
               out_dir: Path, log: Log = print, engine_image: str | None = None,
               no_cache: bool = False) -> list[BuildRecord]:
    """Base -> engine -> serve for every job; each serve image is tagged `job.release_ref`
    locally, the reference smoke, publish and bench then use. With `engine_image` (the
    digest an engine job pushed) the jobs' one engine is pulled, not built."""
    if not jobs:
        raise UserError("nothing to build", fix="check --target/--image")
    assert lock is not None, "buildable() refuses a plan without a lock"
    if engine_image:
        engines = sorted({f"{j.cell.target_name}/{j.cell.engine_name}" for j in jobs})
        if len(engines) > 1:
            raise UserError(f"--engine-image is one engine, but these cells use "
                            f"{len(engines)}: {', '.join(engines)}",
                            fix="choose one target with --target (a release tag names one "
                                "engine per target)")
    builder = Builder(lm, lock, out_dir=out_dir, log=log, no_cache=no_cache)
    for job in jobs:
        builder.build_cell(job.cell, job.release_ref, engine_image)
    return builder.records


def build_engines(lm: LoadedMatrix, lock: Lock | None, jobs: tuple[Job, ...], *,
                  out_dir: Path, log: Log = print, no_cache: bool = False
                  ) -> list[BuildRecord]:
    """Base and engine of each (target, engine) the jobs use, once each; no serve image
    (`build --engine-only`: a release's engine stage)."""
    if not jobs:
        raise UserError("nothing to build", fix="check --target/--image")
    assert lock is not None, "buildable() refuses a plan without a lock"
    builder = Builder(lm, lock, out_dir=out_dir, log=log, no_cache=no_cache)
    for job in jobs:
        builder.engine_only(job.cell)  # once per (target, engine): the rest are remembered
    return builder.records
