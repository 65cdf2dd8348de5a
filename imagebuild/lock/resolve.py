"""`build.py lock`: resolve every pin and write matrix.lock.json deterministically.

Hub pins go through hub.py (huggingface_hub); the small metadata files of each pinned
revision are stored under locked/ so preflight and builds run offline. Where the Hub
cannot be reached, the entry records what is known (a full SHA written in matrix.yaml)
and marks the rest unresolved; nothing is invented.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from imagebuild.errors import OperationFailed, UserError
from imagebuild.lock.inputs import Drift, expected_engine, lock_drift, sha256_file
from imagebuild.lock.lockfile import LOCK_NAME, LOCK_VERSION, Lock, hub_disagreement, read_lock
from imagebuild.lock.sourcepins import ResolveRef, SdistTree, resolve_ref, source_pins
from imagebuild.spec.config import Drafter, Model
from imagebuild.spec.matrix import Cell, LoadedMatrix

METADATA_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json",
                  "tokenizer_config.json", "hf_quant_config.json")
LOCKED_DIR = "locked"


def metadata_dir(root: Path, repository: str, sha: str) -> Path:
    return root / LOCKED_DIR / repository / sha


def _hub_entry(name: str, pin: Model | Drafter, root: Path, client: Any,
               log: Callable[[str], None]) -> dict[str, Any]:
    from imagebuild.lock.hub import (  # deferred: huggingface_hub (1.3 s), only `lock` asks the Hub
        HubUnreachable,
    )

    assert pin.repository, "only Hub pins are resolved here"
    base: dict[str, Any] = {"repository": pin.repository, "revision": pin.revision,
                            "track": pin.track}
    requested = pin.revision or pin.track or ""
    try:
        res = client.resolve(pin.repository, requested, allow_branch=pin.track is not None)
    except HubUnreachable as exc:
        known = pin.revision if pin.revision and len(pin.revision) == 40 else None
        log(f"  {name}: UNRESOLVED ({exc.message}); "
            + (f"keeping the full SHA from matrix.yaml {known}" if known else "no SHA known"))
        return {**base, "sha": known, "files": None, "status": "unresolved",
                "unresolved": (["files", "metadata"] if known else ["sha", "files", "metadata"]),
                "fix": f"run `python build.py lock --update {name}` where the Hub is reachable"}
    dest = metadata_dir(root, pin.repository, res.sha)
    stored = client.download_metadata(pin.repository, res.sha, list(METADATA_FILES), dest)
    log(f"  {name}: {pin.repository}@{res.sha} ({len(res.files)} files, "
        f"{res.total_size / 1e9:.2f} GB)" + (f" from track {pin.track}" if pin.track else ""))
    return {**base, "sha": res.sha, "status": "resolved",
            "files": [{"path": f.path, "size": f.size, "lfs_sha256": f.lfs_sha256,
                       "blob_id": f.blob_id} for f in res.files],
            "metadata": sorted(str(p.relative_to(root)) for p in stored)}


def _generated_entry(name: str, model: Model, root: Path) -> dict[str, Any]:
    """Run the generator (same bytes every time) and record every file's hash."""
    assert model.generate
    script = root / model.generate.script
    with tempfile.TemporaryDirectory(prefix="imagebuild-gen-") as tmp:
        out = Path(tmp) / "model"
        generate_model(script, model.generate.seed, out)
        files = sorted(out.rglob("*"))
        entries = [{"path": str(p.relative_to(out)), "size": p.stat().st_size,
                    "sha256": sha256_file(p)} for p in files if p.is_file()]
        digest = hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()
        dest = root / LOCKED_DIR / "generated" / name / digest[:16]
        dest.mkdir(parents=True, exist_ok=True)
        stored = []
        for meta in METADATA_FILES:
            if (out / meta).exists():
                (dest / meta).write_bytes((out / meta).read_bytes())
                stored.append(str((dest / meta).relative_to(root)))
    return {"generate": model.generate.script, "seed": model.generate.seed,
            "script_sha256": sha256_file(script), "files_digest": digest, "status": "resolved",
            "files": entries, "metadata": stored}


def generate_model(script: Path, seed: int, out: Path) -> None:
    proc = subprocess.run([sys.executable, str(script), str(out), "--seed", str(seed)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise OperationFailed(f"{script.name} failed: {proc.stderr.strip()[-400:]}")


def _engine_entry(lm: LoadedMatrix, ename: str, previous: dict[str, Any] | None,
                  update: set[str], log: Callable[[str], None],
                  sdist: SdistTree | None, resolve_tag: ResolveRef) -> dict[str, Any]:
    """Every realization of engine `ename`: what its images are built from (inputs.py);
    a source build adds the sdist's commit and the git sources its CMake fetches
    (sourcepins.py), tags resolved to commits for the targets named in `update`."""
    out = {}
    for tname in lm.matrix.engines[ename].realize:
        entry = expected_engine(lm, ename, tname)
        if "source" in entry:
            entry = source_pins(lm, ename, tname, entry, (previous or {}).get(tname),
                                resolve=tname in update, sdist=sdist,
                                resolve_tag=resolve_tag, log=log)
        out[tname] = entry
    return out


def _base_entry(lm: LoadedMatrix, tname: str, previous: dict | None,
                resolve: Callable[[str], str] | None = None) -> dict[str, Any]:
    """The images a target's Dockerfiles start FROM, pinned by digest: the base and, for
    source builds, the runtime stage's image. Digests are kept from the previous lock
    while the image names agree, and looked up (`resolve`) only when asked to
    (`lock --update TARGET`), so a plain `lock` never needs the image registry."""
    target = lm.matrix.targets[tname]
    if target.bootstrap:
        return {"image": target.base_image, "bootstrap": target.bootstrap.settings(),
                "status": "resolved", "digest": None}
    prev = previous or {}
    entry: dict[str, Any] = {"image": target.base_image, "digest": None}
    if prev.get("image") == target.base_image:
        entry["digest"] = prev.get("digest")
    if target.runtime_image:
        entry["runtime_image"] = target.runtime_image
        entry["runtime_digest"] = (prev.get("runtime_digest")
                                   if prev.get("runtime_image") == target.runtime_image else None)
    if resolve is not None:
        entry["digest"] = resolve(target.base_image)
        if target.runtime_image:
            entry["runtime_digest"] = resolve(target.runtime_image)
    missing = [entry[k] for k, d in (("image", "digest"), ("runtime_image", "runtime_digest"))
               if k in entry and not entry[d]]
    entry["status"] = "unresolved" if missing else "resolved"
    if missing:
        entry["fix"] = (f"record the digest of {' and '.join(missing)}: `python build.py lock "
                        f"--update {tname}` on a machine whose Docker engine can reach that "
                        f"registry (e.g. a runner of target {tname}), then commit the lock")
    return entry


def resolve_image_digest(ref: str) -> str:
    """The digest `ref` has in its registry now (for a multi-platform image, that of its
    index), asked through the local Docker engine, which uses its own registry
    credentials, mirrors and proxy."""
    from imagebuild.docker import (  # deferred: the Docker SDK, only `lock` resolves base digests
        engine,
    )

    digest = engine().registry_digest(ref)
    if not str(digest).startswith("sha256:"):
        raise OperationFailed(f"the registry answered no digest for {ref}")
    return str(digest)


def check_update_names(lm: LoadedMatrix, update: set[str]) -> None:
    """`lock --update NAME...`: each a model, drafter, target or engine of the matrix
    (exit 2)."""
    known = (set(lm.matrix.models) | set(lm.matrix.drafters) | set(lm.matrix.targets)
             | set(lm.matrix.engines))
    unknown = update - known
    if unknown:
        raise UserError(f"--update names {', '.join(sorted(unknown))}, not a model, drafter, "
                        "target or engine", fix=f"use one of: {', '.join(sorted(known))}")


def build_lock(lm: LoadedMatrix, client: Any, *, update: set[str] | None = None,
               log: Callable[[str], None] = print,
               resolve_image: Callable[[str], str] = resolve_image_digest,
               sdist: SdistTree | None = None,
               resolve_tag: ResolveRef = resolve_ref) -> dict[str, Any]:
    """Every pin of matrix.yaml; entries already locked and agreeing are kept unless named
    in `update` (so a tracked branch only moves, and an image digest is only looked up,
    when asked to)."""
    previous = read_lock(lm.root)
    update = update or set()
    check_update_names(lm, update)
    data: dict[str, Any] = {"version": LOCK_VERSION, "models": {}, "drafters": {},
                            "engines": {}, "bases": {}}
    for kind, pins in (("models", lm.matrix.models), ("drafters", lm.matrix.drafters)):
        for name, pin in pins.items():
            old = previous.entry(kind, name) if previous else None
            if isinstance(pin, Model) and pin.generate:
                data[kind][name] = _generated_entry(name, pin, lm.root)
                log(f"  {name}: generated by {pin.generate.script} seed {pin.generate.seed}")
            elif not pin.repository:
                continue
            elif (old and name not in update and old.get("status") == "resolved"
                  and hub_disagreement(pin, old) is None):
                data[kind][name] = old
            else:
                data[kind][name] = _hub_entry(name, pin, lm.root, client, log)
    for ename in lm.matrix.engines:
        old_engine = previous.entry("engines", ename) if previous else None
        data["engines"][ename] = _engine_entry(lm, ename, old_engine, update, log, sdist,
                                               resolve_tag)
    for tname in lm.matrix.targets:
        old = previous.entry("bases", tname) if previous else None
        data["bases"][tname] = entry = _base_entry(
            lm, tname, old, resolve_image if tname in update else None)
        if tname in update and entry.get("digest"):
            log(f"  {tname}: {entry['image']}@{entry['digest']}"
                + (f", runtime {entry['runtime_image']}@{entry['runtime_digest']}"
                   if entry.get("runtime_image") else ""))
    return data


def dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_lock(lm: LoadedMatrix, data: dict[str, Any]) -> Path:
    path = lm.root / LOCK_NAME
    text = dumps(data)
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(".json.part")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def drift_error(drifts: list[Drift], subject: str) -> UserError:
    """One message naming every input that changed since the lock was written."""
    fixes = list(dict.fromkeys(d.fix for d in drifts))
    head = (f"{subject}: {LOCK_NAME} does not match what it is built from "
            f"({len(drifts)} input(s) changed since it was locked)")
    return UserError("\n".join([head] + [f"  {d.line()}" for d in drifts]),
                     fix="; ".join(fixes), where=drifts[0].where)


def check_whole_lock(lm: LoadedMatrix, lock: Lock | None) -> None:
    """`lock --check`: every input of every image matrix.yaml describes agrees with the
    lock, and the lock has nothing matrix.yaml does not (unresolved pins are fine here)."""
    if lock is None:
        raise UserError(f"no {LOCK_NAME}", fix="run `python build.py lock`",
                        where=lm.located.where(()))
    drifts = lock_drift(lm, lock)
    if drifts:
        raise drift_error(drifts, "lock --check")


def verify_cells(lm: LoadedMatrix, cells: list[Cell], lock: Lock | None, *,
                 allow_unresolved: bool = False) -> None:
    """Refuse (exit 2) cells whose inputs the lock lacks, contradicts or (unless allowed,
    as `lock --check` does offline) has unresolved."""
    if lock is None:
        raise UserError(f"no {LOCK_NAME} beside {lm.located.file}",
                        fix="run `python build.py lock` and commit the lock",
                        where=lm.located.where(()))
    for cell in cells:
        drifts = lock_drift(lm, lock, [cell])
        if drifts:
            raise drift_error(drifts, f"cell {cell.id} ({cell.engine_name})")
        for kind, name, pin in (("models", cell.model_name, cell.model),
                                ("drafters", cell.drafter_name, cell.drafter)):
            if pin is None or not pin.repository:
                continue
            entry = lock.entry(kind, name)
            if entry and entry.get("status") != "resolved" and not allow_unresolved:
                raise UserError(
                    f"cell {cell.id}: {kind[:-1]} {name} ({pin.repository}) is unresolved in "
                    f"{LOCK_NAME} (missing: {', '.join(entry.get('unresolved', []))})",
                    fix=f"run `python build.py lock --update {name}` on a machine that can "
                        "reach the Hugging Face Hub, and commit the lock")
        eng = (lock.entry("engines", cell.engine_name) or {}).get(cell.target_name) or {}
        if eng.get("status") != "resolved" and not allow_unresolved:
            raise UserError(f"cell {cell.id}: engine source is unresolved in {LOCK_NAME}",
                            fix=eng.get("fix", "run `python build.py lock`"))
        base = lock.entry("bases", cell.target_name) or {}
        target = cell.target
        if base.get("status") != "resolved" and not allow_unresolved:
            unpinned = [image for image, digest in (
                (target.base_image, base.get("digest")),
                (target.runtime_image, base.get("runtime_digest"))) if image and not digest]
            raise UserError(
                f"cell {cell.id}: a release builds only FROM images pinned by digest; "
                f"{' and '.join(unpinned) or 'the base image'} of target {cell.target_name} "
                f"{'has' if len(unpinned) < 2 else 'have'} no digest in {LOCK_NAME}",
                fix=base.get("fix", f"run `python build.py lock --update {cell.target_name}`"),
                where=lm.located.where(("targets", cell.target_name, "base_image")))
