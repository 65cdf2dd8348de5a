"""Cross-references in matrix.yaml, and expansion of image families into cells.

Expansion follows GitHub Actions `strategy.matrix` semantics: the product of the axes,
minus every combination matching an `exclude` entry, then each `include` entry either
matches existing combinations (and changes nothing, since our entries only name axes) or
adds a new combination, which must then name every axis.
"""

from __future__ import annotations

import fnmatch
import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path

import imagebuild
from imagebuild import REPO_ROOT
from imagebuild.errors import UserError
from imagebuild.spec.config import (
    NO_SPECULATION,
    PARALLEL_ARGS,
    Drafter,
    Engine,
    EngineRealization,
    ImageFamily,
    Include,
    Matrix,
    Model,
    Profile,
    Target,
    Waiver,
    load_matrix,
)
from imagebuild.spec.names import NAME_MAX, check_path, check_registry
from imagebuild.spec.repopaths import inside
from imagebuild.spec.values import BadValue
from imagebuild.spec.yamlpos import Located, shorten

AXES = ("engine", "model", "drafter", "profile")
NAME_FIELDS = re.compile(r"{([^{}]*)}")
IMAGE_NAME = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*\Z")


@dataclass(frozen=True)
class Cell:
    """One image to build: a family's combination of engine x model x drafter x profile."""

    family: str
    image: str  # repository name of the serve image
    target_name: str
    target: Target
    engine_name: str
    engine: Engine
    realization: EngineRealization
    model_name: str
    model: Model
    drafter_name: str  # `none` when the cell serves without speculative decoding
    drafter: Drafter | None
    profile_name: str
    profile: Profile
    waivers: tuple[Waiver, ...]

    @property
    def id(self) -> str:
        return f"{self.target_name}/{self.image}"

    @property
    def method(self) -> str:
        """The speculative method it serves, `none` for plain serving."""
        return self.drafter.method if self.drafter else NO_SPECULATION

    @property
    def speculation(self) -> str:
        """How people read it: `zlab (dflash)`, or that the cell serves plainly."""
        if self.drafter is None:
            return "none (no speculative decoding)"
        return f"{self.drafter_name} ({self.drafter.method})"

    @property
    def drafter_model(self) -> str | None:
        """The drafter's Hub repository, when its method loads a drafter model."""
        return self.drafter.repository if self.drafter else None


@dataclass(frozen=True)
class LoadedMatrix:
    matrix: Matrix
    located: Located
    root: Path  # paths in matrix.yaml are relative to this

    def engines_versions(self) -> dict[str, str]:
        return {name: e.vllm_version for name, e in self.matrix.engines.items()}


def _err(located: Located, path: tuple, message: str, fix: str) -> UserError:
    return UserError(message, fix=fix, where=located.where(path))


def _check_refs(lm: LoadedMatrix, unwritten: frozenset[str] = frozenset()) -> None:
    m, loc = lm.matrix, lm.located
    seen_names: dict[str, str] = {}
    for mname, model in m.models.items():
        for i, served in enumerate(model.served_names):
            if served in seen_names:
                raise _err(loc, ("models", mname, "served_names", i),
                           f"served name {served!r} of model {mname!r} is already used by "
                           f"model {seen_names[served]!r}",
                           "give each served name to one model only")
            seen_names[served] = mname
        for i, t in enumerate(model.targets):
            if t not in m.targets:
                raise _err(loc, ("models", mname, "targets", i), f"unknown target {t!r}",
                           f"use one of: {', '.join(m.targets)}")
        if model.generate:
            _repo_file(lm, ("models", mname, "generate", "script"), lm.root,
                       model.generate.script, "generator script")
    if NO_SPECULATION in m.drafters:
        raise _err(loc, ("drafters", NO_SPECULATION),
                   f"{NO_SPECULATION!r} is the reserved drafter name for serving without "
                   "speculative decoding", "give this drafter another name")
    for dname, drafter in m.drafters.items():
        for i, t in enumerate(drafter.targets):
            if t not in m.targets:
                raise _err(loc, ("drafters", dname, "targets", i), f"unknown target {t!r}",
                           f"use one of: {', '.join(m.targets)}")
    for pname, prof in m.profiles.items():
        if prof.target is not None and prof.target not in m.targets:
            raise _err(loc, ("profiles", pname, "target"), f"unknown target {prof.target!r}",
                       f"use one of: {', '.join(m.targets)}")
        _check_parallel_args(loc, pname, prof)
    for ename, engine in m.engines.items():
        for tname, real in engine.realize.items():
            if tname not in m.targets:
                raise _err(loc, ("engines", ename, "realize", tname),
                           f"engine {ename!r} is realized for unknown target {tname!r}",
                           f"use one of: {', '.join(m.targets)}")
            origin = m.targets[tname].engine_from
            if (origin == "source") != (real.source is not None):
                raise _err(loc, ("engines", ename, "realize", tname),
                           f"target {tname!r} builds engines from {origin} but this "
                           f"realization gives {'a source pin' if real.source else 'a wheel'}",
                           f"give `{origin}:` for target {tname!r}")
            for i, patch in enumerate(real.patches):
                _repo_file(lm, ("engines", ename, "realize", tname, "patches", i),
                           lm.root / "patches", patch, "patch")
            # a requirement set is written by `lock --update ENGINE` (`unwritten`: that run)
            if real.wheel and not (ename in unwritten
                                   and not (lm.root / real.wheel.requirements).exists()):
                _repo_file(lm, ("engines", ename, "realize", tname, "wheel", "requirements"),
                           lm.root, real.wheel.requirements, "requirements file",
                           fix=f"write it: `python build.py lock --update {ename}` (the "
                               "wheel's requirements, resolved by pip and hash-pinned)")


def _check_parallel_args(loc: Located, pname: str, prof: Profile) -> None:
    """`parallel:` derives the distributed serve flags; the same flag in `args` would be a
    second, disagreeing source (and a per-node flag baked into every node)."""
    if prof.parallel is None:
        return
    for key in prof.args:
        if key.removeprefix("no-") in PARALLEL_ARGS:
            field = {"tensor-parallel-size": "tensor_parallel_size", "nnodes": "nodes",
                     "master-port": "master_port",
                     "distributed-executor-backend": "backend"}.get(key)
            fix = (f"remove it from args and set parallel.{field}" if field else
                   "remove it from args: each node's value comes from `parallel` (the "
                   "head's address from the launcher's --hosts at run time)")
            raise _err(loc, ("profiles", pname, "args", key),
                       f"profile {pname!r} sets --{key} in args, but its `parallel:` block "
                       "derives that flag for every node", fix)


def _repo_file(lm: LoadedMatrix, path: tuple, folder: Path, rel: str, what: str,
               fix: str | None = None) -> None:
    """A file matrix.yaml names must exist inside the repository (symlinks included);
    `fix`: what writes it, when it is missing."""
    try:
        inside(lm.root, folder, rel, what)
    except BadValue as exc:
        missing = fix is not None and not (folder / rel).exists()
        raise _err(lm.located, path, str(exc), fix if missing and fix else exc.fix) from None


# Environment overrides of `publish:` (plan.registry_for reads them), checked like the file
PUBLISH_ENV = (("IMAGEBUILD_REGISTRY", "registry", check_registry),
               ("IMAGEBUILD_NAMESPACE", "namespace", check_path))


def publish_names(lm: LoadedMatrix) -> tuple[str, str]:
    """(registry, namespace) in effect: the environment's when set, else matrix.yaml's;
    an override that is not a valid name is an error naming the variable."""
    chosen = {"registry": lm.matrix.publish.registry, "namespace": lm.matrix.publish.namespace}
    for var, key, check in PUBLISH_ENV:
        value = os.environ.get(var)
        if value is None:
            continue
        try:
            if not value:
                raise BadValue(f"{key} is empty", f"unset {var} or give a {key}")
            chosen[key] = check(value)
        except BadValue as exc:
            raise UserError(f"environment variable {var}={shorten(value)} (overriding "
                            f"publish.{key}): {exc}", fix=f"{exc.fix} (in {var})",
                            where=lm.located.where(("publish", key))) from None
    return chosen["registry"], chosen["namespace"]


def _matches(combo: dict[str, str], entry: Include) -> bool:
    return all(getattr(entry, a) in (None, combo[a]) for a in AXES)


def _expand_family(lm: LoadedMatrix, fname: str, fam: ImageFamily) -> list[Cell]:
    m, loc = lm.matrix, lm.located
    base = ("images", fname)
    if fam.target not in m.targets:
        raise _err(loc, base + ("target",), f"unknown target {fam.target!r}",
                   f"use one of: {', '.join(m.targets)}")
    pools: dict[str, dict[str, object]] = {
        "engine": dict(m.engines), "model": dict(m.models),
        "drafter": {**m.drafters, NO_SPECULATION: None}, "profile": dict(m.profiles)}
    for axis in AXES:
        for i, value in enumerate(getattr(fam.matrix, axis)):
            if value not in pools[axis]:
                raise _err(loc, base + ("matrix", axis, i),
                           f"axis {axis} names {value!r}, which is not defined under "
                           f"`{axis}s:`", f"define it or use one of: {', '.join(pools[axis])}"
                           + (f" ({NO_SPECULATION}: no speculative decoding)"
                              if axis == "drafter" else ""))
    for kind in ("include", "exclude"):
        for i, entry in enumerate(getattr(fam.matrix, kind)):
            for axis in AXES:
                value = getattr(entry, axis)
                if value is not None and value not in pools[axis]:
                    raise _err(loc, base + ("matrix", kind, i, axis),
                               f"{kind} names {axis} {value!r}, which is not defined",
                               f"use one of: {', '.join(pools[axis])}")
    combos = [dict(zip(AXES, values, strict=True)) for values in
              itertools.product(*(getattr(fam.matrix, a) for a in AXES))]
    combos = [c for c in combos if not any(_matches(c, e) for e in fam.matrix.exclude)]
    for i, entry in enumerate(fam.matrix.include):
        if any(_matches(c, entry) for c in combos):
            continue
        missing = [a for a in AXES if getattr(entry, a) is None]
        if missing:
            raise _err(loc, base + ("matrix", "include", i),
                       f"include entry matches no combination and leaves {', '.join(missing)} "
                       "unset", "name every axis in an include that adds a new combination")
        combos.append({a: getattr(entry, a) for a in AXES})

    fields = set(NAME_FIELDS.findall(fam.name))
    allowed = {"family", *AXES}
    if fields - allowed:
        raise _err(loc, base + ("name",),
                   f"image name template uses unknown variable(s) "
                   f"{', '.join(sorted(fields - allowed))}",
                   f"use only {{{'}, {'.join(sorted(allowed))}}}")
    cells = []
    for combo in combos:
        ctx = {"family": fname, **combo}
        where = f"{fname} {combo}"
        engine, model = m.engines[combo["engine"]], m.models[combo["model"]]
        drafter, profile = m.drafters.get(combo["drafter"]), m.profiles[combo["profile"]]
        method = drafter.method if drafter else NO_SPECULATION
        checks = [
            (fam.target in engine.realize, "engine", f"engine {combo['engine']} has no "
             f"realization for target {fam.target}"),
            (fam.target in model.targets, "model", f"model {combo['model']} is not built for "
             f"target {fam.target}"),
            (drafter is None or fam.target in drafter.targets, "drafter", f"drafter "
             f"{combo['drafter']} is not built for target {fam.target}"),
            (profile.target in (None, fam.target), "profile", f"profile {combo['profile']} is "
             f"for target {profile.target}, not {fam.target}"),
            (method in profile.methods, "profile", f"profile {combo['profile']} serves "
             f"{', '.join(profile.methods)}, not {method}"
             + (" (plain serving: no drafter)" if method == NO_SPECULATION else "")),
        ]
        for ok, axis, message in checks:
            if not ok:
                raise _err(loc, base + ("matrix", axis),
                           f"combination {where}: {message}",
                           "exclude this combination or change the axis values")
        try:
            image = fam.name.format(**ctx)
        except (ValueError, IndexError, KeyError, AttributeError) as exc:
            raise _err(loc, base + ("name",), f"image name template {shorten(fam.name)} "
                       f"cannot be filled in ({type(exc).__name__}: {exc})",
                       "use only {family}, {engine}, {model}, {drafter} and {profile} "
                       "between braces") from None
        if not IMAGE_NAME.match(image):
            raise _err(loc, base + ("name",), f"image name {image!r} is not a valid "
                       "repository name", "use lowercase letters, digits and separators")
        cells.append(Cell(
            family=fname, image=image, target_name=fam.target, target=m.targets[fam.target],
            engine_name=combo["engine"], engine=engine,
            realization=engine.realize[fam.target], model_name=combo["model"], model=model,
            drafter_name=combo["drafter"], drafter=drafter, profile_name=combo["profile"],
            profile=profile, waivers=tuple(fam.waivers)))
    return cells


def expand(lm: LoadedMatrix, unwritten: frozenset[str] = frozenset()) -> list[Cell]:
    """Every cell of every family, in matrix.yaml order; duplicate images are an error.
    `unwritten`: engines whose requirement sets this run writes (`lock --update ENGINE`)."""
    _check_refs(lm, unwritten)
    registry, namespace = publish_names(lm)
    cells: list[Cell] = []
    seen: dict[tuple[str, str], str] = {}
    for fname, fam in lm.matrix.images.items():
        for cell in _expand_family(lm, fname, fam):
            key = (cell.engine_name, cell.image)
            if key in seen:
                raise _err(lm.located, ("images", fname, "name"),
                           f"two cells of engine {cell.engine_name} are named image "
                           f"{cell.image!r} ({seen[key]} and {fname})",
                           "make `name` include every axis that varies, e.g. "
                           "{family}-{model}-{drafter}-{profile}")
            seen[key] = fname
            repository = f"{registry}/{namespace}/{cell.image}"
            if len(repository) > NAME_MAX:
                raise _err(lm.located, ("images", fname, "name"),
                           f"repository {shorten(repository)} is {len(repository)} "
                           f"characters; Docker allows {NAME_MAX}",
                           "shorten the image name template, the namespace or the registry")
            cells.append(cell)
    return cells


def select(cells: list[Cell], *, engine: str | None = None, target: str | None = None,
           only: str | None = None) -> list[Cell]:
    out = [c for c in cells
           if (engine is None or c.engine_name == engine)
           and (target is None or c.target_name == target)
           and (only is None or fnmatch.fnmatch(c.id, only) or fnmatch.fnmatch(c.image, only))]
    return out


MATRIX_ENV = "IMAGEBUILD_MATRIX"


def matrix_path(given: Path | None = None) -> Path:
    """--matrix, else $IMAGEBUILD_MATRIX, else ./matrix.yaml, else a checkout's own (its
    build.py and matrix.yaml are one project). An installed package has no project of its
    own: the example it carries is read only when asked for (`init` copies it), never in
    place of a matrix the user forgot (its rendered files would be site-packages')."""
    if given is not None:
        return given
    env = os.environ.get(MATRIX_ENV)
    if env:
        if not Path(env).is_file():
            raise UserError(f"{MATRIX_ENV}={shorten(env)} is not a file",
                            fix=f"point {MATRIX_ENV} at a matrix.yaml, or unset it")
        return Path(env)
    here = Path.cwd() / "matrix.yaml"
    if here.is_file():
        return here
    if not imagebuild.installed():
        return REPO_ROOT / "matrix.yaml"
    raise UserError(f"no matrix.yaml in {Path.cwd()}",
                    fix="run where your matrix.yaml is, or give --matrix FILE (or "
                        f"{MATRIX_ENV}); to start from the example the package carries: "
                        "`python build.py init DIR`")


def load(path: Path | None = None) -> LoadedMatrix:
    path = matrix_path(path)
    display = path.name if path.parent.resolve() == Path.cwd().resolve() else str(path)
    matrix, located = load_matrix(path, display)
    lm = LoadedMatrix(matrix=matrix, located=located, root=path.parent.resolve())
    publish_names(lm)  # every command: a bad IMAGEBUILD_REGISTRY/_NAMESPACE stops here
    return lm
