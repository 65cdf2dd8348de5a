"""The engine handoff of a release: an engine is compiled once, not once per runner
(the cells' pull of it is enginepull.py).

The release workflow's engine job builds a (target, engine) once and pushes it by digest
(`build.py build --engine-only --push`); each cell job pulls exactly that digest and
builds only its serve layers on it (`build.py build --engine-image REF@sha256:...`).

Push: the engine goes to `<registry>/<namespace>/engine-<target>-<engine>` under the tag
`inputs-<inputs digest>` (the tag keeps it from the registry's garbage collection and
lets a re-run find it: an engine the registry already holds is not built again), the
registry's copy is read back (its config must be the local image), and
`REPOSITORY@sha256:...` is printed, written to `<out>/engines/<target>.ref` and, in a
workflow, to $GITHUB_OUTPUT.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from imagebuild import buildfolder
from imagebuild.builder.builder import Builder, BuildRecord
from imagebuild.errors import OperationFailed, UserError
from imagebuild.registry.client import RegistryClient
from imagebuild.registry.push import push_with_retries, verify_pushed
from imagebuild.spec.names import INPUTS_LABEL

if TYPE_CHECKING:
    from imagebuild.lock.lockfile import Lock
    from imagebuild.plan import Destination, ImageRef, Job
    from imagebuild.spec.matrix import LoadedMatrix

Log = Callable[[str], None]


def engine_image(dest: Destination, target: str, engine: str) -> ImageRef:
    """Where a (target, engine) is pushed: beside the serve images, one repository each."""
    return dest.image(f"engine-{target}-{engine}")


def inputs_tag(digest: str) -> str:
    return f"inputs-{digest}"


def registry_engine(client: RegistryClient, image: ImageRef, digest: str) -> str | None:
    """`REPOSITORY@sha256:...` of the engine with these inputs the registry already holds
    (pushed by an earlier run), or None."""
    found = client.head_manifest(image.repository, inputs_tag(digest))
    if found is None:
        return None
    labels = client.image_labels(image.repository, found[0])
    if labels.get(INPUTS_LABEL) != digest:
        return None  # a tag someone moved by hand: build and push our own
    return image.by_digest(found[0])


def push_engine(client: RegistryClient, record: BuildRecord, image: ImageRef, *,
                log: Log = print) -> str:
    """Push the built engine under its inputs tag, read it back, return REPO@digest."""
    tag = inputs_tag(record.inputs_digest)
    pushed = push_with_retries(client, image.repository, tag, record.image_id, log=log)
    verify_pushed(client, image.repository, tag, record.image_id, pushed)
    return image.by_digest(pushed)


def write_handoff(out_dir: Path, refs: dict[str, str],
                  environ: dict[str, str] | None = None) -> None:
    """<out>/engines/<target>.ref per engine, and `engine_image=REF` (one engine) or
    `engine_image_<target>=REF` lines in $GITHUB_OUTPUT when a workflow runs us."""
    buildfolder.engines_dir(out_dir).mkdir(parents=True, exist_ok=True)
    for target, ref in refs.items():
        buildfolder.engine_ref_path(out_dir, target).write_text(ref + "\n")
    env = os.environ if environ is None else environ
    if env.get("GITHUB_OUTPUT"):
        lines = ([f"engine_image={next(iter(refs.values()))}"] if len(refs) == 1 else
                 [f"engine_image_{t.replace('.', '_')}={r}" for t, r in refs.items()])
        with open(env["GITHUB_OUTPUT"], "a") as fh:
            fh.write("".join(line + "\n" for line in lines))


def ship_engines(lm: LoadedMatrix, lock: Lock | None, jobs: tuple[Job, ...], dest: Destination,
                 *, out_dir: Path, log: Log = print) -> dict[str, str]:
    """Each (target, engine) of the jobs once: taken from the registry when it already holds
    these inputs, else built (local build avoidance applies) and pushed. target -> ref."""
    if not jobs:
        raise UserError("nothing to build", fix="check --target/--image")
    assert lock is not None, "buildable() refuses a plan without a lock"
    client = RegistryClient(dest.registry)
    builder = Builder(lm, lock, out_dir=out_dir, log=log)
    refs: dict[str, str] = {}
    for job in jobs:
        cell = job.cell
        if cell.target_name in refs:
            continue
        image = engine_image(dest, cell.target_name, cell.engine_name)
        digest = builder.engine_digest(cell)
        ref = registry_engine(client, image, digest)
        if ref:
            log(f"[engine] {cell.target_name}/{cell.engine_name}: {ref} already holds inputs "
                f"{digest[:12]}: not built, not pushed")
        else:
            record = builder.engine_only(cell)
            if record.inputs_digest != digest:
                raise OperationFailed(f"the engine built for {cell.target_name} has inputs "
                                      f"{record.inputs_digest[:12]}, not {digest[:12]}")
            ref = push_engine(client, record, image, log=log)
            log(f"[engine] {cell.target_name}/{cell.engine_name}: pushed {ref}")
        refs[cell.target_name] = ref
    write_handoff(out_dir, refs)
    return refs
