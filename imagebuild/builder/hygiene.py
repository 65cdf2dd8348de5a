"""Runner hygiene: free a runner's disk by release age, never touching BuildKit's cache.

`build.py runner-clean --keep N` keeps, on this Docker engine, the serve images of the N
newest releases found locally, those of each image's `latest` and its rollback target (the
registry says which: release/runnerclean.py asks it), and every base and engine image they
were built from; it removes the older release tags, base/engine images only older releases
needed, and the `imagebuild/inputs:*` tags of whatever it removes. It removes tags only
(an image goes when its last tag does, so a user's own tag keeps it), and never prunes:
BuildKit's cache mounts (ccache, sccache, pip) and build cache are what make the next build
fast.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from imagebuild.errors import OperationFailed
from imagebuild.spec.tags import parse_release_tag

if TYPE_CHECKING:
    from imagebuild.docker import DockerEngine

INPUTS_REPO = "imagebuild/inputs"  # builder.INPUTS_REPO (no import: builder imports us)
PARENT_LABEL = "io.imagebuild.parent"
Log = Callable[[str], None]


def docker_engine() -> DockerEngine:
    """The one Docker seam (imagebuild/docker.py), once it answers."""
    from imagebuild.docker import engine  # deferred: the Docker SDK, only when a runner is cleaned

    seam = engine()
    seam.info()  # one clear error when no engine answers
    return seam


def _images(eng: DockerEngine, reference: str | None = None
            ) -> list[tuple[str, list[str], dict[str, Any]]]:
    """(id, tags, inspect document) of each local image (of `reference`'s repository)."""
    found = []
    for row in eng.images(reference=reference):
        attrs = eng.inspect_image(str(row["Id"]))
        if attrs is not None:  # not removed meanwhile
            tags = [t for t in attrs.get("RepoTags") or [] if t != "<none>:<none>"]
            found.append((str(attrs["Id"]), tags, attrs))
    return found


def base_repo(target: str) -> str:
    return f"imagebuild/base-{target}"


def engine_repo(target: str, engine: str) -> str:
    return f"imagebuild/engine-{target}-{engine}"


def _split(tag: str) -> tuple[str, str]:
    repo, _, name = tag.rpartition(":")
    return (repo, name) if repo and "/" not in name else (tag, "latest")


def _remove_tag(eng: DockerEngine, tag: str) -> str | None:
    """Untag; an image goes with its last tag. None when done (or gone), else why it was
    kept (the engine's reason: e.g. a container still uses the image)."""
    try:
        eng.remove_image(tag)
        return None
    except OperationFailed as exc:  # the line names the tag already: the reason alone
        return exc.message.removeprefix(f"cannot remove {tag}: ")


def drop_orphan_inputs_tags(eng: DockerEngine | None = None) -> list[str]:
    """Remove `imagebuild/inputs:*` tags from images that have no other tag: once every
    name of an image is gone, its build-avoidance tag must not keep it alive."""
    try:
        eng = eng or docker_engine()
        images = _images(eng, INPUTS_REPO)
    except OperationFailed:
        return []
    done = []
    for _id, tags, _attrs in images:
        if tags and all(_split(t)[0] == INPUTS_REPO for t in tags):
            kept = [why for t in tags if (why := _remove_tag(eng, t))]
            done.append(f"dropped {', '.join(tags)} (no other name left)"
                        + (f"; kept: {kept[0]}" if kept else ""))
    return done


@dataclass
class Local:
    """One local image in scope."""

    id: str
    tags: list[str]
    used: str  # last_used(): ISO time, compared as text
    layers: tuple[str, ...]
    parent: str | None
    size: int
    releases: list[tuple[str, str]] = field(default_factory=list)  # (repository, release tag)
    chain: bool = False  # a base or engine image of this matrix
    ours: list[str] = field(default_factory=list)  # the tags runner-clean may remove


@dataclass
class CleanPlan:
    keep: dict[str, str]  # release tag -> why
    drop: list[str]  # release tags
    remove: dict[str, list[str]]  # image id -> tags to remove
    kept_images: dict[str, str]  # image id -> why kept (in scope)
    orphans: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"keep release {t} ({why})" for t, why in sorted(self.keep.items())]
        out += [f"drop release {t}" for t in sorted(self.drop)]
        return out


def last_used(attrs: dict[str, Any]) -> str:
    """When this engine last tagged the image (a build, or build.py re-tagging an image it
    found by its inputs): the image's age on this runner. Its `Created` is no such thing:
    BuildKit takes it from cached steps, which may predate older images."""
    tagged = (attrs.get("Metadata") or {}).get("LastTagTime") or ""
    return tagged if tagged and not tagged.startswith("0001-") else attrs.get("Created", "")


def _locals(eng: DockerEngine, serve_repos: set[str], chain_repos: set[str]
            ) -> dict[str, Local]:
    found: dict[str, Local] = {}
    for image_id, tags, attrs in _images(eng):
        releases, chain, ours = [], False, []
        for tag in tags:
            repo, name = _split(tag)
            if repo in serve_repos and parse_release_tag(name) is not None:
                releases.append((repo, name))
                ours.append(tag)
            elif repo in chain_repos:
                chain = True
                ours.append(tag)
            elif repo == INPUTS_REPO:
                ours.append(tag)
        if not releases and not chain:
            continue
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        found[image_id] = Local(image_id, tags, last_used(attrs),
                                tuple((attrs.get("RootFS") or {}).get("Layers") or ()),
                                labels.get(PARENT_LABEL), int(attrs.get("Size") or 0),
                                releases, chain, ours)
    return found


def _ancestors(image: Local, images: dict[str, Local]) -> set[str]:
    """Ids of the in-scope images `image` was built from: the parent label the builder
    sets, else (older builds) any chain image whose layers start `image`'s layers."""
    out: set[str] = set()
    todo = [image]
    while todo:
        cur = todo.pop()
        parents = []
        if cur.parent and cur.parent in images:
            parents = [images[cur.parent]]
        elif not cur.parent:
            parents = [c for c in images.values() if c.chain and c.id != cur.id and c.layers
                       and len(c.layers) <= len(cur.layers)
                       and cur.layers[:len(c.layers)] == c.layers]
        for p in parents:
            if p.id not in out:
                out.add(p.id)
                todo.append(p)
    return out


def plan_clean(images: dict[str, Local], keep: int,
               protected: dict[tuple[str, str], str]) -> CleanPlan:
    """What to remove. `protected`: (repository, release tag) -> why (latest, rollback)."""
    tags = {t for img in images.values() for _, t in img.releases}
    newest = sorted(tags, key=lambda t: parse_release_tag(t).sort_key(),  # type: ignore[union-attr]
                    reverse=True)
    why: dict[str, str] = {t: f"newest {keep}" for t in newest[:keep]}
    for (_, tag), reason in sorted(protected.items()):
        if tag not in tags:
            continue
        if tag not in why:
            why[tag] = reason
        elif reason not in why[tag]:
            why[tag] += f", {reason}"
    kept_images: dict[str, str] = {}
    for img in images.values():
        mine = [t for _, t in img.releases if t in why]
        if mine:
            kept_images[img.id] = f"release {mine[0]}"
    for img_id in list(kept_images):
        for anc in _ancestors(images[img_id], images):
            kept_images.setdefault(anc, f"built into {kept_images[img_id]}")
    kept_serve = [images[i] for i in kept_images if images[i].releases]
    cutoff = min((i.used for i in kept_serve), default=None)
    remove: dict[str, list[str]] = {}
    for img in images.values():
        if img.id in kept_images:
            # the same image tagged for an older release too (an avoided rebuild)
            stale = [f"{r}:{t}" for r, t in img.releases if t not in why]
            if stale:
                remove[img.id] = stale
            continue
        if img.releases:
            remove[img.id] = img.ours
        elif img.chain and cutoff is not None and img.used < cutoff:
            # last used before every kept release and built into none of them
            remove[img.id] = img.ours
    drop = sorted(tags - set(why))
    return CleanPlan(why, drop, remove, kept_images)


def runner_clean(eng: DockerEngine, *, serve_repos: dict[str, str], chain_repos: set[str],
                 keep: int, protected: dict[tuple[str, str], str], dry_run: bool = False,
                 log: Log = print) -> CleanPlan:
    """serve_repos: local repository ("host/ns/image") -> registry path ("ns/image")."""
    images = _locals(eng, set(serve_repos), chain_repos)
    local_protected = {(local, tag): why for local, path in serve_repos.items()
                       for (p, tag), why in protected.items() if p == path}
    plan = plan_clean(images, keep, local_protected)
    for line in plan.lines():
        log(line)
    root = eng.info().get("DockerRootDir", "/var/lib/docker")
    before = shutil.disk_usage(root).free if os.path.isdir(root) else None
    verb = "would remove" if dry_run else "removed"
    for img_id, tags in sorted(plan.remove.items(), key=lambda kv: images[kv[0]].used):
        img = images[img_id]
        what = ", ".join(tags) or img_id[:19]
        others = [t for t in img.tags if t not in tags]
        if dry_run:
            log(f"{verb} {what} ({img.size / 1e9:.2f} GB)"
                + (f"; the image stays tagged {', '.join(others)}" if others else ""))
            continue
        kept = [why for t in tags if (why := _remove_tag(eng, t))]
        note = (f" (image kept: {plan.kept_images[img_id]})" if img_id in plan.kept_images
                else f"; the image stays tagged {', '.join(others)}" if others
                else f"; kept: {kept[0]}" if kept else "")
        log(f"{verb} {what}{note}")
    if not dry_run:
        plan.orphans = drop_orphan_inputs_tags(eng)
        for line in plan.orphans:
            log(line)
    if not plan.remove:
        log("nothing to remove")
    if before is not None and not dry_run:
        after = shutil.disk_usage(root).free
        log(f"free disk under {root}: {before / 2**30:.1f} GiB -> {after / 2**30:.1f} GiB "
            "(BuildKit cache mounts kept)")
    return plan
