"""Every input of an image as the lock records it, and what changed since it was locked.

An image is built from: the engine's vLLM version and origin (source repository and
commit, or wheel package, version and sha256 with its requirement file's hash), its patch
series, the target settings that change the engine recipe (build args, arch gate,
compile cache), the base and runtime image references and digests (or the bootstrap
suite and mirror), the models and drafters (Hub pins, or a generator script and seed).
`build.py lock` writes them; `lock_drift` compares them with matrix.yaml and the files
now, so `lock --check`, `check` and every build name each change, old against new.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagebuild.lock.lockfile import LOCK_NAME, Lock, hub_disagreement
from imagebuild.spec.config import Drafter, Model, Target
from imagebuild.spec.matrix import Cell, LoadedMatrix

LOCK_FIX = "review the change, then run `python build.py lock` and commit the lock"


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def recipe(target: Target) -> dict[str, Any]:
    """The target settings a source-built engine's Dockerfile is rendered from (a wheel
    engine reads none of them)."""
    if target.engine_from != "source":
        return {}
    return {"build_args": dict(sorted(target.build_args.items())),
            "expect_cuda_arch": target.expect_cuda_arch,
            "compile_cache": target.compile_cache.model_dump(mode="json", exclude_none=True)}


def expected_engine(lm: LoadedMatrix, ename: str, tname: str) -> dict[str, Any]:
    """The lock entry of engine `ename` realized for target `tname`, from matrix.yaml and
    the files it names as they are now."""
    engine = lm.matrix.engines[ename]
    real = engine.realize[tname]
    entry: dict[str, Any] = {
        "vllm_version": engine.vllm_version,
        "patches": [{"file": p, "sha256": sha256_file(lm.root / "patches" / p)}
                    for p in real.patches]}
    if real.source:
        entry["source"] = {"repository": real.source.repository, "commit": real.source.commit}
    if real.wheel:
        entry["wheel"] = {"package": real.wheel.package, "version": real.wheel.version,
                          "sha256": real.wheel.sha256,
                          "requirements": real.wheel.requirements,
                          "requirements_sha256": sha256_file(lm.root / real.wheel.requirements)}
    entry["recipe"] = recipe(lm.matrix.targets[tname])
    entry["status"] = "resolved"
    return entry


@dataclass(frozen=True)
class Drift:
    """One input that differs between the lock and matrix.yaml (or the files now)."""

    what: str  # where in the lock, e.g. engines.dflashfix.cpu.wheel.sha256
    old: Any  # what the lock says
    new: Any  # what matrix.yaml / the file says now
    fix: str
    where: str | None = None  # the input's position in matrix.yaml (or the lock's)
    text: str | None = None  # a sentence instead of old -> new

    def line(self) -> str:
        if self.text:
            return f"{self.what} {self.text}"
        return f"{self.what}: {_show(self.old)} in the lock, now {_show(self.new)}"


def _show(value: Any) -> str:
    if value is None:
        return "nothing recorded"
    if isinstance(value, str):
        text = value
        if len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text):
            return text[:12] + "..."
        return repr(text) if len(text) <= 90 else repr(text[:80] + "...")
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "[" + ", ".join(value) + "]" if value else "[]"
    text = repr(value)
    return text if len(text) <= 120 else text[:110] + "..."


def _fields(prefix: str, old: dict[str, Any], new: dict[str, Any], keys: list[str],
            fix: str, where: str | None) -> list[Drift]:
    return [Drift(f"{prefix}.{k}", old.get(k), new.get(k), fix, where)
            for k in keys if old.get(k) != new.get(k)]


def engine_drift(lm: LoadedMatrix, lock: Lock, ename: str, tname: str) -> list[Drift]:
    where = lm.located.where(("engines", ename, "realize", tname))
    prefix = f"engines.{ename}.{tname}"
    old = (lock.entry("engines", ename) or {}).get(tname)
    if old is None:
        return [Drift(prefix, None, None, LOCK_FIX, where,
                      text=f"is not in {LOCK_NAME} (engine {ename} realized for {tname})")]
    new = expected_engine(lm, ename, tname)
    out = _fields(prefix, old, new, ["vllm_version"], LOCK_FIX,
                  lm.located.where(("engines", ename, "vllm_version")))
    for part, keys in (("source", ["repository", "commit"]),
                       ("wheel", ["package", "version", "sha256", "requirements",
                                  "requirements_sha256"])):
        o, n = old.get(part), new.get(part)
        if (o is None) != (n is None):
            out.append(Drift(f"{prefix}.{part}", o, n, LOCK_FIX, where))
        elif o is not None and n is not None:
            for d in _fields(f"{prefix}.{part}", o, n, keys, LOCK_FIX,
                             lm.located.where(("engines", ename, "realize", tname, part))):
                if d.what.endswith("requirements_sha256"):  # name the file that changed
                    d = Drift(d.what, d.old, d.new, d.fix, d.where,
                              text=f"({n['requirements']}): sha256 {_show(d.old)} in the "
                                   f"lock, now {_show(d.new)}: the file changed since it "
                                   "was locked")
                out.append(d)
    if new.get("source") and not out:
        out += _source_pin_drift(prefix, old, new, where)
    o_patches, n_patches = old.get("patches") or [], new["patches"]
    o_files, n_files = [p.get("file") for p in o_patches], [p["file"] for p in n_patches]
    if o_files != n_files:
        out.append(Drift(f"{prefix}.patches", o_files, n_files, LOCK_FIX,
                         lm.located.where(("engines", ename, "realize", tname, "patches"))))
    else:
        for i, (o, n) in enumerate(zip(o_patches, n_patches, strict=True)):
            if o.get("sha256") != n["sha256"]:
                out.append(Drift(
                    f"{prefix}.patches.{n['file']}", o.get("sha256"), n["sha256"], LOCK_FIX,
                    lm.located.where(("engines", ename, "realize", tname, "patches", i)),
                    text=f"changed since it was locked: sha256 {_show(o.get('sha256'))} in "
                         f"the lock, now {_show(n['sha256'])}"))
    o_recipe, n_recipe = old.get("recipe"), new["recipe"]
    if o_recipe is None:
        out.append(Drift(f"{prefix}.recipe", None, n_recipe, LOCK_FIX,
                         lm.located.where(("targets", tname))))
    else:
        out += _fields(f"{prefix}.recipe", o_recipe, n_recipe,
                       sorted(set(o_recipe) | set(n_recipe)), LOCK_FIX,
                       lm.located.where(("targets", tname)))
    return out


def _source_pin_drift(prefix: str, old: dict[str, Any], new: dict[str, Any],
                      where: str | None) -> list[Drift]:
    """A source engine's lock entry records the sdist's commit (which the pin must be) and
    the git sources its CMake fetches (lock/sourcepins.py)."""
    built_from = (old.get("source") or {}).get("sdist_commit")
    commit = new["source"]["commit"]
    if not built_from or old.get("dependencies") is None:
        return [Drift(f"{prefix}.source", None, None, LOCK_FIX, where,
                      text="records neither the commit the vLLM sdist was built from nor "
                           "the git sources its CMake fetches (an older lock)")]
    if not commit.startswith(built_from):
        return [Drift(f"{prefix}.source.commit", built_from, commit,
                      f"pin the commit the sdist was built from ({built_from}...)", where,
                      text=f"is {commit[:12]}, but the vLLM sdist the lock read was built "
                           f"from {built_from}: the image would not be the tested tree")]
    return []


def base_drift(lm: LoadedMatrix, lock: Lock, tname: str) -> list[Drift]:
    target = lm.matrix.targets[tname]
    fix = f"run `python build.py lock --update {tname}` and commit the lock"
    where = lm.located.where(("targets", tname, "base_image"))
    old = lock.entry("bases", tname)
    if old is None:
        return [Drift(f"bases.{tname}", None, None, fix, where,
                      text=f"is not in {LOCK_NAME} (target {tname})")]
    out: list[Drift] = []
    if target.bootstrap:
        return _fields(f"bases.{tname}", old, {"image": target.base_image,
                                               "bootstrap": target.bootstrap.settings()},
                       ["image", "bootstrap"], LOCK_FIX,
                       lm.located.where(("targets", tname, "bootstrap")))
    for key, ref, dkey, field in (("image", target.base_image, "digest", "base_image"),
                                  ("runtime_image", target.runtime_image, "runtime_digest",
                                   "runtime_image")):
        here = lm.located.where(("targets", tname, field))
        if old.get(key) != ref:
            out.append(Drift(f"bases.{tname}.{key}", old.get(key), ref, fix, here))
            continue
        pinned = ref.partition("@")[2] if ref else ""
        if pinned and old.get(dkey) and old.get(dkey) != pinned:
            out.append(Drift(f"bases.{tname}.{dkey}", old.get(dkey), pinned, fix, here))
    return out


def generated_drift(lm: LoadedMatrix, lock: Lock, name: str, model: Model) -> list[Drift]:
    assert model.generate
    fix = f"run `python build.py lock --update {name}` and commit the lock"
    where = lm.located.where(("models", name, "generate"))
    old = lock.entry("models", name)
    if old is None or "generate" not in old:
        return [Drift(f"models.{name}", None, None, fix, where,
                      text=f"has no generated-model entry in {LOCK_NAME}")]
    script = lm.root / model.generate.script
    new = {"generate": model.generate.script, "seed": model.generate.seed,
           "script_sha256": sha256_file(script)}
    out = _fields(f"models.{name}", old, new, ["generate", "seed"], fix, where)
    if old.get("script_sha256") != new["script_sha256"]:
        out.append(Drift(f"models.{name}.script_sha256", old.get("script_sha256"),
                         new["script_sha256"], fix, where,
                         text=f"({model.generate.script}): the generator script changed "
                              f"since it was locked: sha256 {_show(old.get('script_sha256'))}"
                              f" in the lock, now {_show(new['script_sha256'])}"))
    return out


def hub_drift(lm: LoadedMatrix, lock: Lock, kind: str, name: str,
              pin: Model | Drafter) -> list[Drift]:
    why = hub_disagreement(pin, lock.entry(kind, name))
    if why is None:
        return []
    return [Drift(f"{kind}.{name}", None, None, f"run `python build.py lock --update {name}`",
                  lm.located.where((kind, name)), text=f"{why} in {LOCK_NAME}")]


def _extras(lm: LoadedMatrix, lock: Lock) -> list[Drift]:
    """Entries of names matrix.yaml does not have: a lock written for another matrix."""
    m = lm.matrix
    known: dict[str, set[str]] = {
        "models": set(m.models), "drafters": {n for n, d in m.drafters.items() if d.repository},
        "engines": set(m.engines), "bases": set(m.targets)}
    out = []
    for kind, names in known.items():
        for name in lock.data.get(kind, {}):
            if name not in names:
                out.append(Drift(f"{kind}.{name}", None, None, LOCK_FIX,
                                 f"{LOCK_NAME}:1:1",
                                 text=f"is in {LOCK_NAME}, but matrix.yaml has no "
                                      f"{kind[:-1]} {name!r} (a lock of another matrix?)"))
    for ename, targets in lock.data.get("engines", {}).items():
        engine = m.engines.get(ename)
        for tname in targets if engine else ():
            if tname not in engine.realize:  # type: ignore[union-attr]
                out.append(Drift(f"engines.{ename}.{tname}", None, None, LOCK_FIX,
                                 lm.located.where(("engines", ename, "realize")),
                                 text=f"is in {LOCK_NAME}, but engine {ename} is not "
                                      f"realized for target {tname} in matrix.yaml"))
    return out


def lock_drift(lm: LoadedMatrix, lock: Lock, cells: list[Cell] | None = None) -> list[Drift]:
    """What the lock says differently from matrix.yaml and the files now: for `cells`
    (what they are built from), or for the whole matrix (None: `lock --check`, which also
    refuses entries matrix.yaml does not have)."""
    m = lm.matrix
    if cells is None:
        engines = sorted((e, t) for e, eng in m.engines.items() for t in eng.realize)
        targets = list(m.targets)
        models = list(m.models.items())
        drafters = [(n, d) for n, d in m.drafters.items()]
    else:
        engines = sorted({(c.engine_name, c.target_name) for c in cells})
        targets = sorted({c.target_name for c in cells})
        models = sorted({(c.model_name, id(c.model)): (c.model_name, c.model)
                         for c in cells}.values(), key=lambda x: x[0])
        drafters = sorted({c.drafter_name: (c.drafter_name, c.drafter) for c in cells
                           if c.drafter}.values(), key=lambda x: x[0])  # type: ignore[misc]
    out: list[Drift] = []
    for name, model in models:
        out += (generated_drift(lm, lock, name, model) if model.generate
                else hub_drift(lm, lock, "models", name, model))
    for name, drafter in drafters:
        if drafter is not None and drafter.repository:
            out += hub_drift(lm, lock, "drafters", name, drafter)
    for ename, tname in engines:
        out += engine_drift(lm, lock, ename, tname)
    for tname in targets:
        out += base_drift(lm, lock, tname)
    if cells is None:
        out += _extras(lm, lock)
    return out
