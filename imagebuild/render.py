"""Render the Jinja Dockerfile templates: base per target, engine per (target, patch set),
serve per cell. Output is byte-for-byte deterministic and headed as generated.

Templates hold no logic Python can compute: every value arrives ready (label dicts sorted,
weight files grouped into layers). No value can add an instruction: every string that
reaches a template is one line (the schema and the lock refuse line breaks and control
characters, and `_refuse_line_breaks` checks the whole context again before rendering);
values in shell lines go through `sh`, ARG/ENV/LABEL values through `dq` (a Dockerfile
double-quoted word, taken literally) and exec-form lists through `json`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import ipaddress
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from pydantic import BaseModel

from imagebuild import REPO_ROOT
from imagebuild.errors import UserError
from imagebuild.lock.lockfile import Lock, served_files
from imagebuild.serving.nodefiles import node_files
from imagebuild.serving.runspec import RunSpec, compose_yaml
from imagebuild.spec.config import CompileCache, EngineRealization
from imagebuild.spec.matrix import Cell, LoadedMatrix
from imagebuild.spec.names import LABEL_NS
from imagebuild.spec.servecmd import DRAFTER_DIR, MODEL_DIR, serve_command
from imagebuild.spec.yamlpos import unsafe_char
from imagebuild.vllmsource.fetchcontent import source_dir_var

CAVEAT_LABEL = f"{LABEL_NS}.engine.caveat"  # what users must know about the patch set
# Files the templates ship with (launcher, patch applier, arch gate): they belong to this
# tool, not to a matrix, so they come from the repository even for a matrix elsewhere.
TOOL_FILES = REPO_ROOT / "images"
MAX_LAYER_BYTES = 10 * 10**9  # no layer over 10 GB: weight shards are grouped under this
# vLLM source paths the gb10 engine recipe uses, by role (vLLM 0.23.0's own
# docker/Dockerfile uses the same files); checked in the build right after the patch
# series and, in CI, against the pinned sdist (tests/conformance).
VLLM_PATHS = {
    "build_requirements": "requirements/build/cuda.txt",
    "common_requirements": "requirements/common.txt",
    "cuda_requirements": "requirements/cuda.txt",
    "cmake": "CMakeLists.txt",
    "pyproject": "pyproject.toml",
    "setup": "setup.py",
}
# Where the engine's source stage puts the FetchContent sources (one directory each).
DEPS_DIR = "/src/deps"
# Build args that are read at run time, not by vLLM's build: set as ENV in the runtime
# stage too (CUTE_DSL_ARCH: the CuTe DSL compiles its kernels when they are first used).
RUNTIME_BUILD_ARGS = ("CUTE_DSL_ARCH",)
# The user serve images run as (a numeric USER: no name lookup at run time).
SERVE_USER = {"uid": 1000, "name": "vllm", "home": "/home/vllm"}
TEMPLATES = {
    "base": "Dockerfile.base",
    "engine": "images/engine/Dockerfile.j2",
    "serve": "images/serve/Dockerfile.j2",
}


def _sh(value: Any) -> str:
    return shlex.quote(str(value))


def _json(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": ") if isinstance(value, list) else (",", ":"))


def _dq(value: Any) -> str:
    """A Dockerfile double-quoted word (ARG, ENV and LABEL values): backslash, quote and
    `$` escaped, so BuildKit takes the value literally (no variable expansion)."""
    text = str(value)
    bad = unsafe_char(text)
    if bad:  # _refuse_line_breaks saw the context first; this is the last line of defence
        raise UserError(f"refusing to render {text[:60]!r}: it holds {bad}",
                        fix="remove the line break or control character from the value")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(REPO_ROOT)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["sh"] = _sh
    env.filters["json"] = _json
    env.filters["dq"] = _dq
    return env


def _strings(value: Any, path: str) -> Any:
    """(path, text) of every string reachable from a template's context value."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _strings(getattr(value, name), f"{path}.{name}")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _strings(getattr(value, f.name), f"{path}.{f.name}")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k, f"{path}[key]")
            yield from _strings(v, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]")


def _refuse_line_breaks(template: str, ctx: dict[str, Any]) -> None:
    """Every string a template may print is a single line of text: a line break would
    start a new Dockerfile instruction wherever the value lands (a comment included)."""
    for key, value in ctx.items():
        if key == "header":  # ours, several comment lines on purpose
            continue
        for path, text in _strings(value, key):
            bad = unsafe_char(text)
            if bad:
                raise UserError(f"refusing to render {template}: {path} = {text[:60]!r} "
                                f"holds {bad}", fix="remove the line break or control "
                                "character (matrix.yaml or matrix.lock.json)")


def _render(kind: str, ctx: dict[str, Any]) -> str:
    _refuse_line_breaks(TEMPLATES[kind], ctx)
    return _env().get_template(TEMPLATES[kind]).render(**ctx)


def healthcheck(host: str, port: int) -> list[str]:
    """The image's HEALTHCHECK command, exec form: the URL is a Python literal (repr) in
    a JSON list, so no host value can reach a shell or break the list."""
    try:
        shown = f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        shown = host
    url = f"http://{shown}:{port}/health"
    return ["python3", "-c", f"import urllib.request; urllib.request.urlopen({url!r}, timeout=3)"]


@dataclass(frozen=True)
class Rendered:
    kind: str  # base | engine | serve
    path: str  # relative to the output dir
    text: str
    # (path in build context, source): relative sources are the matrix's (patches,
    # requirements), absolute ones the tool's own (TOOL_FILES)
    context_files: tuple[tuple[str, str], ...]
    cell: str | None = None


class Unresolved(UserError):
    """A cell whose pins the lock does not fully know yet; `pin` names the entry."""

    def __init__(self, message: str, *, pin: str, fix: str):
        super().__init__(message, fix=fix)
        self.pin = pin


def weight_groups(files: list[dict[str, Any]], limit: int = MAX_LAYER_BYTES) -> list[list[str]]:
    """Small files first in one layer, then shards packed in order into layers <= limit."""
    small = sorted(f["path"] for f in files if f["size"] < 50 * 2**20)
    big = sorted((f for f in files if f["size"] >= 50 * 2**20), key=lambda f: f["path"])
    groups: list[list[str]] = [small] if small else []
    current: list[str] = []
    size = 0
    for f in big:
        if f["size"] > limit:
            raise UserError(f"{f['path']} is {f['size']} bytes, over the {limit}-byte layer cap",
                            fix="a single file cannot be split across layers; raise the cap")
        if current and size + f["size"] > limit:
            groups.append(current)
            current, size = [], 0
        current.append(f["path"])
        size += f["size"]
    if current:
        groups.append(current)
    return groups


def _header(template: str) -> str:
    return (f"# GENERATED by `python build.py render` from {template}; do not edit.\n"
            "# Change matrix.yaml or the template and re-render.\n")


def _hub_source(cell: Cell, kind: str, name: str, lock: Lock | None, dest: str) -> dict:
    pin = cell.model if kind == "models" else cell.drafter
    assert pin is not None  # called for a drafter only when the cell has a drafter model
    entry = lock.entry(kind, name) if lock else None
    if not entry or not entry.get("sha") or entry.get("files") is None:
        raise Unresolved(
            f"cell {cell.id} ({cell.engine_name}): {kind[:-1]} {name} ({pin.repository}) is "
            "not resolved in the lock", pin=name,
            fix=f"run `python build.py lock --update {name}` where the Hub is reachable")
    return {"kind": "hub", "repository": pin.repository, "revision": entry["sha"],
            "dest": dest, "groups": weight_groups(served_files(entry["files"], pin.exclude)),
            "manifest": f"{kind[:-1]}-files.json"}


def _patchset_digest(lm: LoadedMatrix, patches: list[str]) -> str:
    return _patchset_digest_of(lm.root, tuple(patches))


@functools.lru_cache(maxsize=256)
def _patchset_digest_of(root: Path, patches: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for p in patches:
        h.update(p.encode() + b"\0" + (root / "patches" / p).read_bytes() + b"\0")
    return h.hexdigest()


def _vllm_origin(real: EngineRealization) -> str:
    """Where the engine's vLLM comes from: `repo@commit` or `package==version`."""
    if real.source:
        return f"{real.source.repository}@{real.source.commit}"
    assert real.wheel, "a realization has a source pin or a wheel (config.py)"
    return f"{real.wheel.package}=={real.wheel.version}"


def render_base(lm: LoadedMatrix, target_name: str, lock: Lock | None) -> Rendered:
    target = lm.matrix.targets[target_name]
    digest = (lock.entry("bases", target_name) or {}).get("digest") if lock else None
    ctx = {"header": _header(TEMPLATES["base"]), "target_name": target_name, "target": target,
           "base_ref": pinned_ref(target.base_image, digest)}
    text = _render("base", ctx)
    return Rendered("base", f"{target_name}/base.Dockerfile", text, ())


def pinned_ref(image: str, digest: str | None) -> str:
    """`image@digest` when the lock has the digest (FROM then ignores the tag's moves)."""
    return f"{image}@{digest}" if digest else image


def sccache_settings(cache: CompileCache) -> list[tuple[str, str]]:
    """sccache's environment for the shared backend: endpoints only, never credentials."""
    shared = cache.shared
    if shared is None:
        return []
    if shared.backend == "redis":
        assert shared.endpoint
        return [("SCCACHE_REDIS_ENDPOINT", shared.endpoint),
                ("SCCACHE_REDIS_KEY_PREFIX", shared.key_prefix)]
    env = [("SCCACHE_BUCKET", shared.bucket or ""), ("SCCACHE_S3_KEY_PREFIX", shared.key_prefix)]
    if shared.endpoint:
        env += [("SCCACHE_ENDPOINT", shared.endpoint),
                ("SCCACHE_S3_USE_SSL", "false" if shared.endpoint.startswith("http://")
                 else "true")]
    if shared.region:
        env.append(("SCCACHE_REGION", shared.region))
    return env


def source_dependencies(lock: Lock | None, engine_name: str, target_name: str
                        ) -> list[dict[str, Any]]:
    """The git sources vLLM's CMake fetches, as the lock pins them (lock/sourcepins.py):
    where the source stage puts each, and the fetch script's arguments. A tag the lock has
    not resolved yet is rendered as `unresolved:<tag>`, which the fetch refuses (builds
    refuse the unresolved engine before that)."""
    entry = ((lock.entry("engines", engine_name) or {}).get(target_name) or {}) if lock else {}
    if entry.get("dependencies") is None:
        raise UserError(f"the lock records no FetchContent sources for engine {engine_name} "
                        f"on {target_name}", fix="run `python build.py lock` and commit the lock")
    out = []
    for name, dep in sorted(entry["dependencies"].items()):
        subs = dep["submodules"]
        out.append({"name": name, "repository": dep["repository"], "ref": dep["ref"],
                    "declared_in": dep["declared_in"], "dest": f"{DEPS_DIR}/{name}",
                    "commit_arg": dep["commit"] or f"unresolved:{dep['ref']}",
                    "submodule_args": [subs] if isinstance(subs, str) else list(subs),
                    "source_dir_var": source_dir_var(name)})
    return out


def cmake_args(deps: list[dict[str, Any]]) -> str:
    """CMAKE_ARGS (vLLM's setup.py appends it to its cmake command): each FetchContent
    source from /src/deps, and no download for anything else (a FetchContent the lock
    does not know fails at configure, minutes in, naming itself)."""
    if not deps:
        return ""
    return " ".join(["-DFETCHCONTENT_FULLY_DISCONNECTED=ON"]
                    + [f"-D{d['source_dir_var']}={d['dest']}" for d in deps])


def render_engine(lm: LoadedMatrix, target_name: str, engine_name: str,
                  lock: Lock | None = None) -> Rendered:
    target = lm.matrix.targets[target_name]
    engine = lm.matrix.engines[engine_name]
    real = engine.realize[target_name]
    files = [(f"patches/{p}", f"patches/{p}") for p in real.patches]
    files.append(("files/apply-patches.sh", str(TOOL_FILES / "engine/files/apply-patches.sh")))
    for name in ("vllm-serve.py", "bake-modelinfos.py"):  # the launcher, on every engine
        files.append((f"files/{name}", str(TOOL_FILES / "engine/files" / name)))
    if real.wheel:
        files.append(("files/requirements.txt", real.wheel.requirements))
        for name in ("slim-torch-cuda.py", "strip-native.py", "download-wheels.py"):
            files.append((f"files/{name}", str(TOOL_FILES / "engine/files" / name)))
    if target.expect_cuda_arch:
        files.append(("files/check-cuda-arch.py",
                      str(TOOL_FILES / "engine/files/check-cuda-arch.py")))
    if real.source:
        for name in ("fetch-vllm-source.sh", "fetch-git-commit.sh", "check-source-tree.sh",
                     "build-vllm-wheel.sh",
                     "check-vllm-version.py", "runtime-selfcheck.py"):
            files.append((f"files/{name}", str(TOOL_FILES / "engine/files" / name)))
        files.append(("files/ensure-serve-user.sh",
                      str(TOOL_FILES / "serve/files/ensure-serve-user.sh")))
        if target.compile_cache.shared:
            files.append(("files/requirements-sccache.txt",
                          str(TOOL_FILES / "engine/files/requirements-sccache.txt")))
    base = (lock.entry("bases", target_name) or {}) if lock else {}
    deps = source_dependencies(lock, engine_name, target_name) if real.source else []
    ctx = {
        "header": _header(TEMPLATES["engine"]), "target_name": target_name, "target": target,
        "engine_name": engine_name, "engine": engine, "real": real,
        "build_args": sorted(target.build_args.items()),
        "patches": [f"patches/{p}" for p in real.patches],
        "runtime_ref": pinned_ref(target.runtime_image or "", base.get("runtime_digest")),
        "source_paths": sorted(VLLM_PATHS.values()), "source_paths_by_role": VLLM_PATHS,
        "cache": target.compile_cache, "sccache_env": sccache_settings(target.compile_cache),
        "serve_user": SERVE_USER, "dependencies": deps, "cmake_args": cmake_args(deps),
        "runtime_env": [(k, target.build_args[k]) for k in RUNTIME_BUILD_ARGS
                        if k in target.build_args],
        "labels": sorted({
            f"{LABEL_NS}.engine": engine_name,
            f"{LABEL_NS}.vllm.version": engine.vllm_version,
            f"{LABEL_NS}.vllm.origin": _vllm_origin(real),
            f"{LABEL_NS}.patchset.sha256": _patchset_digest(lm, real.patches),
            **({CAVEAT_LABEL: engine.caveat} if engine.caveat else {}),
        }.items()),
    }
    text = _render("engine", ctx)
    return Rendered("engine", f"{target_name}/{engine_name}/engine.Dockerfile", text,
                    tuple(sorted(files)))


def serve_labels(cell: Cell, lm: LoadedMatrix, model: dict, drafter: dict | None) -> list:
    real = cell.realization
    labels = {
        "org.opencontainers.image.title": cell.image,
        "org.opencontainers.image.description": cell.model.description,
        "org.opencontainers.image.version": cell.engine.vllm_version,
        "org.opencontainers.image.vendor": "imagebuild",
        f"{LABEL_NS}.cell": cell.id,
        f"{LABEL_NS}.engine": cell.engine_name,
        f"{LABEL_NS}.vllm.origin": _vllm_origin(real),
        f"{LABEL_NS}.patchset.sha256": _patchset_digest(lm, real.patches),
        f"{LABEL_NS}.profile": cell.profile_name,
        f"{LABEL_NS}.served-names": ",".join(cell.model.served_names),
        f"{LABEL_NS}.speculative.method": cell.method,
        f"{LABEL_NS}.model.repository": model.get("repository", model.get("script", "")),
        f"{LABEL_NS}.model.revision": model.get("revision", f"seed-{model.get('seed', '')}"),
    }
    if cell.target.build_args.get("TORCH_CUDA_ARCH_LIST"):
        labels[f"{LABEL_NS}.cuda.arch-list"] = cell.target.build_args["TORCH_CUDA_ARCH_LIST"]
    if cell.engine.caveat:
        labels[CAVEAT_LABEL] = cell.engine.caveat
    if drafter:
        labels[f"{LABEL_NS}.drafter.repository"] = drafter["repository"]
        labels[f"{LABEL_NS}.drafter.revision"] = drafter["revision"]
    return sorted(labels.items())


def render_serve(lm: LoadedMatrix, cell: Cell, lock: Lock | None) -> Rendered:
    files = [("files/ensure-serve-user.sh", str(TOOL_FILES / "serve/files/ensure-serve-user.sh"))]
    if cell.model.generate:
        model = {"kind": "generated", "script": cell.model.generate.script,
                 "seed": cell.model.generate.seed, "dest": MODEL_DIR}
    else:
        model = _hub_source(cell, "models", cell.model_name, lock, MODEL_DIR)
    drafter = (_hub_source(cell, "drafters", cell.drafter_name, lock, DRAFTER_DIR)
               if cell.drafter_model else None)
    if model["kind"] == "hub" or drafter:
        files.append(("files/fetch-hub-files.py",
                      str(TOOL_FILES / "serve/files/fetch-hub-files.py")))
    cmd = serve_command(cell)
    ctx = {
        "header": _header(TEMPLATES["serve"]), "cell": cell, "target": cell.target,
        "model": model, "drafter": drafter, "argv": list(cmd.argv), "env": list(cmd.env),
        "port": cmd.port, "healthcheck": healthcheck(cmd.host, cmd.port),
        "serve_user": SERVE_USER, "labels": serve_labels(cell, lm, model, drafter),
    }
    text = _render("serve", ctx)
    return Rendered("serve", f"{cell.target_name}/{cell.engine_name}/{cell.image}.Dockerfile",
                    text, tuple(sorted(files)), cell=cell.id)


def render_compose(lm: LoadedMatrix, cell: Cell, image: str | None = None) -> Rendered:
    """The cell's compose file: how users run its image (serving/runspec.py), the file smoke runs
    and every release ships (`image`: the release's digest there). The image defaults to
    the matrix's own `latest` reference; IMAGEBUILD_IMAGE picks another, IMAGEBUILD_PORT
    the port."""
    pub = lm.matrix.publish
    cmd = serve_command(cell)
    spec = RunSpec(image=image or f"{pub.registry}/{pub.namespace}/{cell.image}:latest",
                   command=cmd.argv, memory=cell.target.memory_limit, gpu=cell.target.gpu,
                   port=cmd.port, cache_volume=f"{cell.image}-cache")
    header = (f"# GENERATED by `python build.py render` for cell {cell.id} "
              f"({cell.engine_name}); do not edit.\n"
              "# `docker compose up -d`; IMAGEBUILD_IMAGE=<ref@digest> runs a given release.\n")
    return Rendered("compose", f"{cell.target_name}/{cell.engine_name}/{cell.image}"
                    ".compose.yaml", compose_yaml(spec, name=cell.image, header=header), (),
                    cell=cell.id)


def render_node_composes(lm: LoadedMatrix, cell: Cell, image: str | None = None
                         ) -> list[Rendered]:
    """A multi-node cell's compose files, one per node (serving/nodefiles.py), in place of
    the single one; empty for a single-node cell."""
    pub = lm.matrix.publish
    ref = image or f"{pub.registry}/{pub.namespace}/{cell.image}:latest"
    return [Rendered("compose", path, text, (), cell=cell.id)
            for path, text in node_files(cell, ref)]


def render_all(lm: LoadedMatrix, cells: list[Cell], lock: Lock | None
               ) -> tuple[list[Rendered], list[Unresolved]]:
    out: list[Rendered] = []
    skipped: list[Unresolved] = []
    for target_name in sorted({c.target_name for c in cells}):
        out.append(render_base(lm, target_name, lock))
    for target_name, engine_name in sorted({(c.target_name, c.engine_name) for c in cells}):
        out.append(render_engine(lm, target_name, engine_name, lock))
    for cell in cells:
        out += render_node_composes(lm, cell) or [render_compose(lm, cell)]
        try:
            out.append(render_serve(lm, cell, lock))
        except Unresolved as exc:
            skipped.append(exc)
    return out, skipped


def write(rendered: list[Rendered], out_dir: Path) -> list[Path]:
    written = []
    for r in rendered:
        path = out_dir / r.path
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != r.text:
            path.write_text(r.text)
        written.append(path)
    return written


def stale(rendered: list[Rendered], out_dir: Path) -> list[str]:
    """Rendered files whose committed copy differs or is missing."""
    return [r.path for r in rendered
            if not (out_dir / r.path).exists() or (out_dir / r.path).read_text() != r.text]
