"""`plan`: the spine of every command. One frozen `Job` per cell of a release, made once.

A Job carries what every later stage needs, already parsed: the cell, the release tag as
a `ReleaseTag`, where the image lives as an `ImageRef` (built here, never split back
from a string), every pin and the serve command. Build, smoke, publish, bench, promote
and notes take Jobs; none re-parses a tag or a reference. Models: cibuildwheel's frozen
BuildOptions (options made once), docker-stacks' `Config.full_image()` (a reference is
composed in one place).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagebuild.errors import UserError
from imagebuild.expectations import expectations_for
from imagebuild.host import probe_host
from imagebuild.lock.lockfile import Lock, read_lock
from imagebuild.lock.resolve import sha256_file
from imagebuild.registry.client import RegistryClient
from imagebuild.registry.streams import encoding_for
from imagebuild.spec import hardware
from imagebuild.spec import matrix as mx
from imagebuild.spec.hardware import Host, runner
from imagebuild.spec.matrix import Cell, LoadedMatrix
from imagebuild.spec.nodecmd import NodeCommand, node_commands
from imagebuild.spec.servecmd import ServeCommand, serve_command
from imagebuild.spec.tags import ReleaseTag, parse_tag

UNRESOLVED = "UNRESOLVED"
LATEST = "latest"
ALL_TARGETS = "all"  # --target all: every target's cells (what a release workflow fans out)
REGISTRY_ENV = "IMAGEBUILD_REGISTRY"
NAMESPACE_ENV = "IMAGEBUILD_NAMESPACE"


@dataclass(frozen=True)
class ImageRef:
    """One image repository in one registry: `registry/repository`."""

    registry: str  # host[:port]
    repository: str  # namespace/image: the path the distribution API takes

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    def at(self, tag: str) -> str:
        return f"{self.name}:{tag}"

    def by_digest(self, digest: str) -> str:
        return f"{self.name}@{digest}"

    @classmethod
    def parse(cls, text: str) -> tuple[ImageRef, str | None]:
        """A reference a user typed (`host[:port]/path[:tag][@digest]`) -> (ImageRef, tag).
        The one place a reference string is taken apart; ours are composed, not parsed."""
        host, _, rest = text.partition("/")
        if not rest or not ("." in host or ":" in host or host == "localhost"):
            raise UserError(f"{text!r} does not start with a registry host",
                            fix="use REGISTRY/NAMESPACE/IMAGE:TAG, e.g. "
                                "127.0.0.1:5000/vllm-spark/cpu-tiny-ngram:latest")
        path = rest.split("@", 1)[0]
        repo, sep, tag = path.rpartition(":")
        if not sep or "/" in tag:
            repo, tag = path, ""
        return cls(host, repo), tag or None


@dataclass(frozen=True)
class Destination:
    """Where a matrix publishes: its registry and namespace (environment overrides)."""

    registry: str
    namespace: str

    def image(self, name: str) -> ImageRef:
        return ImageRef(self.registry, f"{self.namespace}/{name}")


def destination(lm: LoadedMatrix) -> Destination:
    pub = lm.matrix.publish
    return Destination(registry=os.environ.get(REGISTRY_ENV, pub.registry),
                       namespace=os.environ.get(NAMESPACE_ENV, pub.namespace))


@dataclass(frozen=True)
class Job:
    """One cell of one release, resolved once."""

    cell: Cell
    tag: ReleaseTag
    image: ImageRef
    pins: Mapping[str, Any]
    serve: ServeCommand
    expect: Mapping[str, Any]  # what a healthy container of it shows (smoke)
    nodes: tuple[NodeCommand, ...] = ()  # multi-node cells: head first (spec/nodecmd.py)

    @property
    def id(self) -> str:
        return self.cell.id

    @property
    def release_ref(self) -> str:
        """`registry/namespace/image:release-tag`: also the local tag `build` gives it."""
        return self.image.at(str(self.tag))

    @property
    def latest_ref(self) -> str:
        return self.image.at(LATEST)

    def as_json(self) -> dict[str, Any]:
        c = self.cell
        return {
            "cell": c.id, "family": c.family, "target": c.target_name,
            "platform": c.target.platform, "runner": runner(c.target),
            "image": c.image, "repository": self.image.name, "release_tag": str(self.tag),
            "refs": [self.release_ref, self.latest_ref],
            "engine": c.engine_name, "model": c.model_name, "drafter": c.drafter_name,
            "method": c.method, "profile": c.profile_name,
            "pins": dict(self.pins), "serve": list(self.serve.argv),
            "caveat": c.engine.caveat,
            **({"nodes": [{"rank": n.rank, "role": n.role, "command": list(n.argv),
                           "env": dict(n.env)} for n in self.nodes]} if self.nodes else {}),
        }


@dataclass(frozen=True)
class Plan:
    """The jobs of one command invocation and the context they were made in."""

    lm: LoadedMatrix
    lock: Lock | None
    tag: ReleaseTag | None
    target: str
    target_reason: str
    cells: tuple[Cell, ...]
    jobs: tuple[Job, ...] = field(default=())  # empty without a tag

    @property
    def destination(self) -> Destination:
        return destination(self.lm)

    def header(self) -> str:
        return (f"release {self.tag} · target {self.target} ({self.target_reason}) · "
                f"{len(self.jobs)} cell(s)")

    def meta(self) -> dict[str, Any]:
        return {"tag": None if self.tag is None else str(self.tag), "target": self.target,
                "target_reason": self.target_reason}


def registry_client(plan: Plan) -> RegistryClient:
    """A client of the registry the plan's images are published to; a bad
    IMAGEBUILD_PUSH_COMPRESSION is refused here too, before a command that may push asks it
    anything."""
    encoding_for(plan.destination.registry)
    return RegistryClient(plan.destination.registry)


def detect_target(lm: LoadedMatrix, host: Host | None = None) -> tuple[str, str]:
    """(target, why) when --target is not given: the target whose properties fit this
    host (platform, GPU compute capability; spec/hardware.match), or IMAGEBUILD_TARGET."""
    forced = os.environ.get("IMAGEBUILD_TARGET")
    if forced:
        if forced != ALL_TARGETS and forced not in lm.matrix.targets:
            raise UserError(f"environment variable IMAGEBUILD_TARGET={forced[:60]!r} is not a "
                            "target of matrix.yaml",
                            fix=f"use one of: {', '.join(lm.matrix.targets)} (or "
                                f"{ALL_TARGETS}), or unset it")
        return forced, f"IMAGEBUILD_TARGET={forced}"
    return hardware.match(lm.matrix.targets, host or probe_host())


# patch files are hashed once per run, not once per cell
file_sha256 = functools.lru_cache(maxsize=256)(sha256_file)


def _hub_pin(lock: Lock | None, kind: str, name: str, repository: str | None,
             revision: str | None, track: str | None) -> dict[str, Any] | None:
    if not repository:
        return None
    sha = lock.hub_sha(kind, name) if lock else None
    if revision and not sha and len(revision) == 40:
        sha = revision
    return {"repository": repository, "revision": sha or UNRESOLVED,
            "requested": revision or f"track:{track}"}


def cell_pins(cell: Cell, lm: LoadedMatrix, lock: Lock | None) -> dict[str, Any]:
    real = cell.realization
    engine: dict[str, Any] = {"name": cell.engine_name, "vllm": cell.engine.vllm_version}
    if real.source:
        engine["source"] = {"repository": real.source.repository, "commit": real.source.commit}
    if real.wheel:
        engine["wheel"] = f"{real.wheel.package}=={real.wheel.version}"
    engine["patches"] = [{"file": p, "sha256": file_sha256(lm.root / "patches" / p)}
                         for p in real.patches]
    if cell.engine.caveat:  # travels with the pins: plan, release record, notes
        engine["caveat"] = cell.engine.caveat
    m, d = cell.model, cell.drafter
    model = _hub_pin(lock, "models", cell.model_name, m.repository, m.revision, m.track)
    if model is None and m.generate:
        model = {"generated": m.generate.script, "seed": m.generate.seed}
    drafter = d and _hub_pin(lock, "drafters", cell.drafter_name, d.repository, d.revision,
                             d.track)
    return {"engine": engine, "model": model, "drafter": drafter or {"method": cell.method}}


def make_jobs(lm: LoadedMatrix, cells: list[Cell] | tuple[Cell, ...], tag: ReleaseTag,
              lock: Lock | None) -> tuple[Job, ...]:
    dest = destination(lm)
    return tuple(Job(cell=c, tag=tag, image=dest.image(c.image), pins=cell_pins(c, lm, lock),
                     serve=serve_command(c), expect=expectations_for(c, lock, lm.root),
                     nodes=node_commands(c)) for c in cells)


def load_plan(matrix: Path | None, tag: str | None, target: str | None = None,
              only: str | None = None) -> Plan:
    """Matrix -> cells of the target (and tag's engine) -> one Job per cell."""
    lm = mx.load(matrix.resolve() if matrix else None)
    cells = mx.expand(lm)
    rtag = parse_tag(tag, lm.engines_versions()) if tag is not None else None
    if target:
        if target != ALL_TARGETS and target not in lm.matrix.targets:
            raise UserError(f"--target {target[:60]!r} is not a target of matrix.yaml",
                            fix=f"use one of: {', '.join(lm.matrix.targets)} (or "
                                f"{ALL_TARGETS})")
        why = "--target"
    else:
        target, why = detect_target(lm)
    selected = mx.select(cells, engine=rtag.name if rtag else None,
                         target=None if target == ALL_TARGETS else target, only=only)
    if not selected:
        raise UserError(
            f"no cell matches (target {target}"
            + (f", engine {rtag.name}" if rtag else "")
            + (f", --image {only}" if only else "") + ")",
            fix="check --target/--image against `build.py plan --format json`")
    lock = read_lock(lm.root)
    jobs = make_jobs(lm, selected, rtag, lock) if rtag else ()
    return Plan(lm, lock, rtag, target, why, tuple(selected), jobs)


# ----------------------------------------------------------------------------- output


def github_matrix(jobs: tuple[Job, ...]) -> dict[str, Any]:
    """The object a workflow feeds to `strategy.matrix` via fromJSON: one entry per cell,
    with the runner labels of its target (`runs-on: ${{ matrix.runner }}`); a cell over
    several machines goes to a runner that drives its partners (hardware.cell_runner)."""
    return {"include": [{
        "cell": j.id, "image": j.cell.image, "target": j.cell.target_name,
        "platform": j.cell.target.platform, "accelerator": j.cell.target.accelerator,
        "runner": hardware.cell_runner(j.cell.target, len(j.nodes) or 1),
        "nodes": len(j.nodes) or 1,
        "bootstrap": j.cell.target.bootstrap is not None, "release_tag": str(j.tag),
    } for j in jobs]}


def target_matrix(plan: Plan) -> dict[str, Any]:
    """One entry per target the plan has cells of, for per-target workflow jobs (check,
    promote, notes): `strategy.matrix` via fromJSON, like github_matrix."""
    by_target: dict[str, int] = {}
    for cell in plan.cells:
        by_target[cell.target_name] = by_target.get(cell.target_name, 0) + 1
    out = []
    for name, count in by_target.items():
        t = plan.lm.matrix.targets[name]
        out.append({"target": name, "platform": t.platform, "accelerator": t.accelerator,
                    "compute_capability": t.compute_capability,
                    "unified_memory": t.unified_memory, "runner": runner(t),
                    # its base is bootstrapped on the runner, which then needs mmdebstrap
                    "bootstrap": t.bootstrap is not None,
                    "traits": sorted(hardware.traits(t)), "cells": count})
    return {"include": out}


def pin_text(pin: Mapping[str, Any] | None) -> str:
    if not pin:
        return "-"
    if "repository" in pin:
        rev = pin["revision"]
        rev = rev[:12] if rev != UNRESOLVED else f"{UNRESOLVED} ({pin['requested']})"
        return f"{pin['repository']}@{rev}"
    if "generated" in pin:
        return f"generated by {pin['generated']} seed {pin['seed']}"
    return str(pin.get("method", "-"))


def format_table(jobs: tuple[Job, ...], header: str) -> str:
    out = [header]
    for j in jobs:
        c, e = j.cell, j.pins["engine"]
        origin = (f"{e['source']['repository']}@{e['source']['commit'][:12]}" if "source" in e
                  else e["wheel"])
        patches = ", ".join(p["file"] for p in e["patches"]) or "no patches"
        out += [
            f"{j.id}  [{c.target.platform}; runs on {', '.join(runner(c.target))}]",
            f"  refs     {j.release_ref}",
            f"           {j.latest_ref} (moved last, after smoke)",
            f"  engine   {c.engine_name} vLLM {e['vllm']}: {origin} + {patches}",
            *([f"  CAVEAT   engine {c.engine_name} {c.engine.caveat}"] if c.engine.caveat
              else []),
            f"  model    {c.model_name}: {pin_text(j.pins['model'])}",
            f"  drafter  {c.speculation}"
            + (f": {pin_text(j.pins['drafter'])}" if c.drafter else ""),
            f"  profile  {c.profile_name}",
            *[f"  {n.name:<8} {n.shell()}" for n in j.nodes],
            *([f"           env: {' '.join(f'{k}={v}' for k, v in j.nodes[0].env)}"]
              if j.nodes and j.nodes[0].env else []),
        ]
    return "\n".join(out)


def format_json(plan: Plan) -> str:
    return json.dumps({**plan.meta(), "cells": [j.as_json() for j in plan.jobs]}, indent=2)
